// KvCache's prefix caching: attach takes the longest indexed run of whole blocks, blocks are
// shared by reference and never written while shared, idle indexed blocks stay until the pool
// needs them and then go least recently released first.
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "worker/kv/kv_cache.h"

namespace tandem {
namespace {

constexpr int kBlock = 4;

KvCacheOptions Options(int32_t blocks, bool prefix_cache = true) {
  return {.num_layers = 2,
          .num_kv_heads = 1,
          .head_dim = 2,
          .block_size = kBlock,
          .num_blocks = blocks,
          .prefix_cache = prefix_cache};
}

std::vector<int32_t> Tokens(int n, int32_t first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Commits `tokens` to a new sequence, writing each slot's K and V rows with values that name the
// sequence and slot, and publishes them.
void Prefill(KvCache& kv, SeqId seq, const std::vector<int32_t>& tokens, uint64_t salt = 0) {
  ASSERT_TRUE(kv.AddSequence(seq).ok());
  const int n = static_cast<int>(tokens.size());
  ASSERT_EQ(kv.Reserve(seq, n), 0);
  for (int l = 0; l < 2; ++l) {
    for (int i = 0; i < n; ++i) {
      float* k = kv.KeyRow(seq, l, i);
      k[0] = k[1] = 1000.0f * seq + 10.0f * i + l;
      kv.ValueRow(seq, l, i)[0] = k[0] + 0.5f;
    }
  }
  ASSERT_TRUE(kv.Commit(seq, Tokens(n, 0)).ok());
  kv.PublishPrefix(seq, tokens, salt);
}

float KeyAt(KvCache& kv, SeqId seq, int layer, int slot) { return kv.KeyRow(seq, layer, slot)[0]; }

TEST(PrefixCacheTest, AttachTakesTheLongestIndexedRunOfWholeBlocks) {
  KvCache kv(Options(16));
  const std::vector<int32_t> a = Tokens(10);
  Prefill(kv, 1, a);  // blocks [0, 4) and [4, 8) indexed; [8, 10) is not a whole block
  EXPECT_EQ(kv.prefix_stats().cached_blocks, 2);

  auto attach = [&](SeqId seq, std::vector<int32_t> tokens) {
    EXPECT_TRUE(kv.AddSequence(seq).ok());
    return kv.AttachPrefix(seq, tokens, 0);
  };
  EXPECT_EQ(attach(10, a), 8);                           // both blocks
  EXPECT_EQ(attach(11, {a.begin(), a.begin() + 8}), 8);  // exactly two blocks
  EXPECT_EQ(attach(12, {a.begin(), a.begin() + 7}), 4);  // a partial second block
  std::vector<int32_t> diverges = a;
  diverges[5] = 7;
  EXPECT_EQ(attach(13, diverges), 4);  // differs in block 2
  diverges[0] = 7;
  EXPECT_EQ(attach(14, diverges), 0);                    // differs at once
  EXPECT_EQ(attach(15, {a.begin(), a.begin() + 3}), 0);  // less than a block
  // The attached tokens are committed, in the first sequence's blocks, with its rows.
  EXPECT_EQ(kv.CommittedLength(10), 8);
  EXPECT_EQ(kv.BlockTable(10)[0], kv.BlockTable(1)[0]);
  EXPECT_EQ(kv.BlockTable(10)[1], kv.BlockTable(1)[1]);
  EXPECT_EQ(KeyAt(kv, 10, 1, 6), 1000.0f * 1 + 10.0f * 6 + 1);
  // A sequence that holds blocks already attaches nothing.
  EXPECT_EQ(kv.AttachPrefix(10, a, 0), 0);

  const PrefixCacheStats stats = kv.prefix_stats();
  EXPECT_EQ(stats.lookups, 6);
  EXPECT_EQ(stats.lookup_tokens, 8 + 8 + 4 + 8 + 8 + 0);
  EXPECT_EQ(stats.hit_tokens, 8 + 8 + 4 + 4);
}

TEST(PrefixCacheTest, TheSaltSeparatesWhatElseMakesKvDiffer) {
  KvCache kv(Options(16));
  Prefill(kv, 1, Tokens(8), /*salt=*/1);
  ASSERT_TRUE(kv.AddSequence(2).ok());
  EXPECT_EQ(kv.AttachPrefix(2, Tokens(8), 2), 0);
  ASSERT_TRUE(kv.AddSequence(3).ok());
  EXPECT_EQ(kv.AttachPrefix(3, Tokens(8), 1), 8);
}

TEST(PrefixCacheTest, OffAttachesAndIndexesNothing) {
  KvCache kv(Options(16, /*prefix_cache=*/false));
  Prefill(kv, 1, Tokens(8));
  ASSERT_TRUE(kv.AddSequence(2).ok());
  EXPECT_EQ(kv.AttachPrefix(2, Tokens(8), 0), 0);
  kv.RemoveSequence(1);
  EXPECT_EQ(kv.prefix_stats().cached_blocks, 0);
  EXPECT_EQ(kv.free_blocks(), 16);
}

TEST(PrefixCacheTest, IdleBlocksStayUntilThePoolNeedsThemThenLeastRecentFirst) {
  KvCache kv(Options(6));
  const std::vector<int32_t> a = Tokens(8), b = Tokens(8, 500);
  Prefill(kv, 1, a);
  kv.RemoveSequence(1);
  Prefill(kv, 2, b);
  kv.RemoveSequence(2);
  // Four idle indexed blocks: still free for anyone, still a hit for their prefixes.
  EXPECT_EQ(kv.free_blocks(), 6);
  EXPECT_EQ(kv.FreeTokenCapacity(), 6 * kBlock);
  EXPECT_EQ(kv.UsageRatio(), 0.0);
  EXPECT_EQ(kv.prefix_stats().idle_blocks, 4);
  // Three blocks for a new sequence: two never used, then one eviction: the least recently
  // released, the first sequence's last block (a sequence releases its last block first).
  ASSERT_TRUE(kv.AddSequence(3).ok());
  ASSERT_TRUE(kv.Reserve(3, 12).has_value());
  EXPECT_EQ(kv.prefix_stats().evictions, 1);
  EXPECT_EQ(kv.prefix_stats().cached_blocks, 3);
  ASSERT_TRUE(kv.AddSequence(4).ok());
  EXPECT_EQ(kv.AttachPrefix(4, a, 0), 4);
  ASSERT_TRUE(kv.AddSequence(5).ok());
  EXPECT_EQ(kv.AttachPrefix(5, b, 0), 8);
  // Held blocks are not idle; the pool has nothing left to give.
  EXPECT_EQ(kv.prefix_stats().idle_blocks, 0);
  EXPECT_EQ(kv.free_blocks(), 0);
  ASSERT_TRUE(kv.AddSequence(6).ok());
  EXPECT_FALSE(kv.Reserve(6, 1).has_value());
  // Released by both holders, a shared block goes idle once.
  kv.RemoveSequence(5);
  EXPECT_EQ(kv.prefix_stats().idle_blocks, 2);
}

TEST(PrefixCacheTest, ASharedBlockIsNeverWritten) {
  KvCache kv(Options(16));
  const std::vector<int32_t> a = Tokens(8);
  Prefill(kv, 1, a);
  ASSERT_TRUE(kv.AddSequence(2).ok());
  ASSERT_EQ(kv.AttachPrefix(2, a, 0), 8);
  // Rolled back into the shared second block, the sequence gets its own copy of it, rows
  // included, and everything it writes from there on lands in its own blocks.
  ASSERT_TRUE(kv.Truncate(2, 6).ok());
  EXPECT_EQ(kv.BlockTable(2)[0], kv.BlockTable(1)[0]);
  EXPECT_NE(kv.BlockTable(2)[1], kv.BlockTable(1)[1]);
  EXPECT_EQ(KeyAt(kv, 2, 1, 5), KeyAt(kv, 1, 1, 5));
  ASSERT_EQ(kv.Reserve(2, 6), 6);
  for (int l = 0; l < 2; ++l) {
    for (int slot = 6; slot < 12; ++slot) {
      kv.KeyRow(2, l, slot)[0] = -1.0f;
      kv.ValueRow(2, l, slot)[0] = -1.0f;
    }
  }
  ASSERT_TRUE(kv.Commit(2, Tokens(6, 0)).ok());
  for (int l = 0; l < 2; ++l) {
    for (int slot = 0; slot < 8; ++slot) {
      EXPECT_EQ(KeyAt(kv, 1, l, slot), 1000.0f + 10.0f * slot + l) << l << " " << slot;
      EXPECT_EQ(kv.ValueRow(1, l, slot)[0], 1000.0f + 10.0f * slot + l + 0.5f);
    }
  }
  // The first sequence's blocks are still what a new sequence attaches.
  ASSERT_TRUE(kv.AddSequence(3).ok());
  EXPECT_EQ(kv.AttachPrefix(3, a, 0), 8);
  EXPECT_EQ(KeyAt(kv, 3, 0, 7), 1070.0f);
}

TEST(PrefixCacheTest, TruncatingIntoAnIndexedBlockItAloneHoldsUnindexesIt) {
  KvCache kv(Options(16));
  const std::vector<int32_t> a = Tokens(8);
  Prefill(kv, 1, a);
  const int32_t second = kv.BlockTable(1)[1];
  ASSERT_TRUE(kv.Truncate(1, 6).ok());
  EXPECT_EQ(kv.BlockTable(1)[1], second);  // no copy needed
  EXPECT_EQ(kv.prefix_stats().cached_blocks, 1);
  ASSERT_TRUE(kv.AddSequence(2).ok());
  EXPECT_EQ(kv.AttachPrefix(2, a, 0), 4);
}

TEST(PrefixCacheTest, TruncateWithNoBlockForTheCopyChangesNothing) {
  KvCache kv(Options(3));
  const std::vector<int32_t> a = Tokens(8);
  Prefill(kv, 1, a);
  ASSERT_TRUE(kv.AddSequence(2).ok());
  ASSERT_EQ(kv.AttachPrefix(2, a, 0), 8);
  ASSERT_TRUE(kv.AddSequence(3).ok());
  ASSERT_TRUE(kv.Reserve(3, 4).has_value());  // the last free block
  EXPECT_EQ(kv.Truncate(2, 6).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.CommittedLength(2), 8);
  EXPECT_EQ(kv.BlockTable(2)[1], kv.BlockTable(1)[1]);
}

TEST(PrefixCacheTest, PublishingAPrefixIndexedElsewhereKeepsTheSequencesOwnBlock) {
  KvCache kv(Options(16));
  const std::vector<int32_t> a = Tokens(8);
  Prefill(kv, 1, a);
  Prefill(kv, 2, a);  // computed again by another sequence (no attach)
  EXPECT_EQ(kv.prefix_stats().cached_blocks, 2);
  kv.RemoveSequence(2);  // its unindexed blocks are free again, not idle
  EXPECT_EQ(kv.prefix_stats().idle_blocks, 0);
  EXPECT_EQ(kv.free_blocks(), 14);
  // Publishing continues the chain past the duplicate: a longer prefix indexes its new block.
  ASSERT_TRUE(kv.AddSequence(3).ok());
  ASSERT_EQ(kv.AttachPrefix(3, a, 0), 8);
  ASSERT_EQ(kv.Reserve(3, 4), 8);
  ASSERT_TRUE(kv.Commit(3, Tokens(4, 0)).ok());
  std::vector<int32_t> longer = a;
  longer.insert(longer.end(), {1, 2, 3, 4});
  kv.PublishPrefix(3, longer, 0);
  ASSERT_TRUE(kv.AddSequence(4).ok());
  EXPECT_EQ(kv.AttachPrefix(4, longer, 0), 12);
}

// Random operations on a small pool against an oracle: a committed slot's K row must always hold
// the value of its whole prefix (what a causal forward computes from it), whoever wrote it, after
// any mix of attaches, extends with dropped tentative tokens, publishes, rollbacks (copies of
// shared blocks included), evictions and removals.
TEST(PrefixCacheTest, RandomOperationsKeepEveryCommittedRowThatOfItsPrefix) {
  KvCacheOptions options = Options(24);
  options.num_layers = 1;
  options.head_dim = 1;
  KvCache kv(options);
  // The row a prefix's last token gets: a hash of the whole prefix, exact in a float.
  auto value = [](const std::vector<int32_t>& tokens, size_t end) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < end; ++i) h = (h ^ static_cast<uint32_t>(tokens[i])) * 16777619u;
    return static_cast<float>(h % (1u << 20));
  };
  std::mt19937 rng(7);
  auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  const std::vector<std::vector<int32_t>> bases = {Tokens(40, 100), Tokens(40, 500),
                                                   Tokens(40, 900)};
  std::map<SeqId, std::vector<int32_t>> live;  // committed tokens of each sequence
  SeqId next = 1;
  int attached = 0, copies_refused = 0, reserves_refused = 0;
  auto check = [&] {
    for (const auto& [seq, tokens] : live) {
      ASSERT_EQ(kv.CommittedLength(seq), static_cast<int>(tokens.size())) << seq;
      for (size_t slot = 0; slot < tokens.size(); ++slot) {
        ASSERT_EQ(kv.KeyRow(seq, 0, static_cast<int>(slot))[0], value(tokens, slot + 1))
            << "sequence " << seq << " slot " << slot;
      }
    }
  };
  // Extends `seq` by `fresh` tentative tokens of which the ones in `keep` are committed; the
  // others are drafts whose rows are garbage. False when the pool has no room.
  auto extend = [&](SeqId seq, const std::vector<int32_t>& fresh, const std::vector<bool>& keep) {
    std::vector<int32_t>& tokens = live[seq];
    const int base = static_cast<int>(tokens.size());
    if (!kv.Reserve(seq, static_cast<int>(fresh.size())).has_value()) return false;
    std::vector<int32_t> kept_tokens = tokens, keep_index;
    for (size_t i = 0; i < fresh.size(); ++i) {
      float row = -1.0f;
      if (keep[i]) {
        kept_tokens.push_back(fresh[i]);
        row = value(kept_tokens, kept_tokens.size());
        keep_index.push_back(static_cast<int32_t>(i));
      }
      kv.KeyRow(seq, 0, base + static_cast<int>(i))[0] = row;
    }
    EXPECT_TRUE(kv.Commit(seq, keep_index).ok());
    tokens = kept_tokens;
    kv.PublishPrefix(seq, tokens, 0);
    return true;
  };
  for (int step = 0; step < 3000; ++step) {
    const int op = live.empty() ? 0 : pick(10);
    if (op <= 2) {  // a new sequence: a shared base prompt cut anywhere, then its own tokens
      const SeqId seq = next++;
      const std::vector<int32_t>& base = bases[pick(3)];
      std::vector<int32_t> prompt(base.begin(), base.begin() + 1 + pick(40));
      for (int extra = pick(6); extra > 0; --extra) prompt.push_back(pick(50));
      ASSERT_TRUE(kv.AddSequence(seq).ok());
      const int taken =
          kv.AttachPrefix(seq, std::span<const int32_t>(prompt).first(prompt.size() - 1), 0);
      attached += taken;
      live[seq] = std::vector<int32_t>(prompt.begin(), prompt.begin() + taken);
      const std::vector<int32_t> rest(prompt.begin() + taken, prompt.end());
      if (!extend(seq, rest, std::vector<bool>(rest.size(), true))) {
        ++reserves_refused;
        kv.RemoveSequence(seq);
        live.erase(seq);
      }
    } else if (op <= 6) {  // a step: a few tentative tokens, some kept
      auto it = std::next(live.begin(), pick(static_cast<int>(live.size())));
      std::vector<int32_t> fresh(1 + pick(5));
      std::vector<bool> keep(fresh.size());
      for (size_t i = 0; i < fresh.size(); ++i) {
        fresh[i] = pick(50);
        keep[i] = pick(3) != 0;
      }
      if (!extend(it->first, fresh, keep)) ++reserves_refused;
    } else if (op <= 8) {  // a rollback
      auto it = std::next(live.begin(), pick(static_cast<int>(live.size())));
      const int length = pick(static_cast<int>(it->second.size()) + 1);
      const absl::Status truncated = kv.Truncate(it->first, length);
      if (truncated.ok()) {
        it->second.resize(length);
      } else {
        ASSERT_EQ(truncated.code(), absl::StatusCode::kResourceExhausted) << truncated;
        ++copies_refused;
      }
    } else {  // a sequence ends
      auto it = std::next(live.begin(), pick(static_cast<int>(live.size())));
      kv.RemoveSequence(it->first);
      live.erase(it);
    }
    check();
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The run exercised what it is for.
  EXPECT_GT(attached, 500);
  EXPECT_GT(kv.prefix_stats().evictions, 10);
  EXPECT_GT(reserves_refused, 0);
}

}  // namespace
}  // namespace tandem
