// PrefixAffinity: chained chunk keys, the longest known prefix wins, bounded memory.
#include "router/prefix_affinity.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

constexpr size_t kChunk = PrefixAffinity::kChunkBytes;

std::string Text(size_t bytes, char fill) { return std::string(bytes, fill); }

TEST(PrefixAffinityTest, KeysChainTheWholeChunksOfAPrompt) {
  EXPECT_TRUE(PrefixAffinity::Keys(Text(kChunk - 1, 'a')).empty());
  const std::string system = Text(2 * kChunk, 's');
  const std::vector<uint64_t> short_keys = PrefixAffinity::Keys(system + "user: hi");
  ASSERT_EQ(short_keys.size(), 2u);
  // A longer prompt with the same beginning has the same first keys, then its own.
  const std::vector<uint64_t> long_keys = PrefixAffinity::Keys(system + Text(kChunk + 5, 'u'));
  ASSERT_EQ(long_keys.size(), 3u);
  EXPECT_EQ(long_keys[0], short_keys[0]);
  EXPECT_EQ(long_keys[1], short_keys[1]);
  // A key names the whole prefix: the same chunk after another beginning keys differently.
  const std::vector<uint64_t> other = PrefixAffinity::Keys(Text(kChunk, 'x') + Text(kChunk, 's'));
  EXPECT_NE(other[1], short_keys[1]);
  EXPECT_NE(other[1], short_keys[0]);
  // Bounded: the first kMaxChunks chunks decide.
  EXPECT_EQ(PrefixAffinity::Keys(Text(kChunk * (PrefixAffinity::kMaxChunks + 3), 'z')).size(),
            PrefixAffinity::kMaxChunks);
}

TEST(PrefixAffinityTest, FindsTheVerifierOfTheLongestKnownPrefix) {
  PrefixAffinity affinity;
  const std::string system = Text(kChunk, 's');
  const std::vector<uint64_t> turn1 = PrefixAffinity::Keys(system + Text(kChunk, '1'));
  const std::vector<uint64_t> turn2 =
      PrefixAffinity::Keys(system + Text(kChunk, '1') + Text(kChunk, '2'));
  EXPECT_FALSE(affinity.Find(turn1).has_value());
  affinity.Record(PrefixAffinity::Keys(system), 7);  // another conversation, same system prompt
  affinity.Record(turn1, 3);
  EXPECT_EQ(affinity.Find(turn2), 3u);  // the conversation's own history beats the system prompt
  EXPECT_EQ(affinity.Find(PrefixAffinity::Keys(system + Text(kChunk, '9'))), 3u);
  affinity.Record(turn2, 5);  // the conversation moved
  EXPECT_EQ(affinity.Find(turn2), 5u);
  EXPECT_EQ(affinity.Find(turn1), 5u);
}

TEST(PrefixAffinityTest, ForgetsTheLeastRecentlyUsedKeysBeyondItsBound) {
  PrefixAffinity affinity(/*max_keys=*/4);
  std::vector<std::vector<uint64_t>> prompts;
  for (char c : {'a', 'b', 'c', 'd'}) prompts.push_back(PrefixAffinity::Keys(Text(kChunk, c)));
  for (size_t i = 0; i < prompts.size(); ++i) affinity.Record(prompts[i], i);
  EXPECT_EQ(affinity.Find(prompts[0]), 0u);  // now the most recent
  affinity.Record(PrefixAffinity::Keys(Text(kChunk, 'e')), 9);
  EXPECT_EQ(affinity.size(), 4u);
  EXPECT_FALSE(affinity.Find(prompts[1]).has_value());  // the least recently used went
  EXPECT_EQ(affinity.Find(prompts[0]), 0u);
}

}  // namespace
}  // namespace tandem::router
