// The engine's prefix caching on the bundled target model: every mode's greedy output, and seeded
// sampling (ar, spec), is the same with the cache on and off, over prompts that share prefixes of
// every length relative to the block size, under concurrency and under preemption; a sequence takes
// exactly the cached whole blocks its prompt begins with.
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/engine/bundled_model_test.h"
#include "tests/worker/engine/collecting_sink.h"
#include "tests/worker/engine/test_draft_channel.h"
#include "worker/engine/engine.h"

namespace tandem {
namespace {

using testing::CollectingSink;
using testing::InProcessDraftChannel;

constexpr int kBlock = 16;
constexpr int kNewTokens = 24;
constexpr int kSeedLength = 40;  // two whole blocks and half of a third
constexpr char kDrafter[] = "in-process";

struct Job {
  std::string mode;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
};

struct Outcome {
  std::vector<int32_t> tokens;
  SequenceUsage usage;
};

class EnginePrefixCacheTest : public testing::BundledModelTest {
 protected:
  void SetUp() override {
    BundledModelTest::SetUp();
    if (IsSkipped()) return;
    // Text to cut prompts from: the fixture's prompts one after another.
    base_.clear();
    for (const std::vector<int32_t>& ids : *prompts_)
      base_.insert(base_.end(), ids.begin(), ids.end());
    ASSERT_GE(base_.size(), 200u);
  }

  // Tokens [from, to) of the base text.
  static std::vector<int32_t> Base(int from, int to) {
    return std::vector<int32_t>(base_.begin() + from, base_.begin() + to);
  }
  static std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  std::unique_ptr<Engine> MakeEngine(EngineOptions options) {
    options.default_drafter = kDrafter;
    options.draft_timeout = absl::Seconds(10);  // chains always arrive: spec really drafts
    // A sampled spec step's draws depend on how many drafts it verifies: a fixed γ, so that
    // seeded spec runs compare token for token.
    options.adaptive_gamma = false;
    Transformer* target = model_->model.get();
    DraftChannelFactory drafters =
        [target](
            const std::string& address,
            DraftChannel::ChainCallback on_chain) -> absl::StatusOr<std::unique_ptr<DraftChannel>> {
      if (address != kDrafter) return absl::NotFoundError("no such drafter");
      return std::make_unique<InProcessDraftChannel>(target, 512, std::move(on_chain));
    };
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(model_, std::move(options), std::move(drafters));
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  // Runs every job of a wave at once on `engine`, the waves one after another.
  static std::vector<Outcome> RunWave(Engine& engine, const std::vector<Job>& jobs) {
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (const Job& job : jobs) {
      SequenceRequest r;
      r.prompt_ids = job.prompt;
      r.mode = job.mode;
      r.mode_options.spec_gamma = 3;
      r.sampling = job.sampling;
      r.max_tokens = kNewTokens;
      sinks.push_back(std::make_shared<CollectingSink>());
      absl::StatusOr<uint64_t> id = engine.Submit(r, sinks.back());
      EXPECT_TRUE(id.ok()) << id.status();
    }
    std::vector<Outcome> outcomes;
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_TRUE(sinks[i]->Wait());
      EXPECT_TRUE(sinks[i]->error().ok()) << jobs[i].mode << ": " << sinks[i]->error();
      outcomes.push_back({sinks[i]->tokens(), sinks[i]->usage()});
    }
    return outcomes;
  }

  // The prompts of the second wave, after the seed prompt (the first wave) ran with `mode`
  // and gave `seed_output`; what a sequence should take from the cache is in the comments.
  static std::vector<std::vector<int32_t>> SharingPrompts(const std::vector<int32_t>& seed_output) {
    const std::vector<int32_t> other = Base(150, 160);
    return {
        Concat(Base(0, kSeedLength), other),  // the seed's two whole blocks, a partial third
        Concat(Base(0, 2 * kBlock), other),   // ends its share at a block boundary: two blocks
        Base(0, kSeedLength),                 // the whole prompt cached: two blocks
        Base(0, 2 * kBlock),                  // a cached prefix, whole blocks: one (a token left)
        Base(0, 20),                          // a prefix of a cached prompt: one block
        Base(0, kBlock - 1),                  // less than a block: nothing
        Base(100, 140),                       // shares nothing
        Concat(Base(0, kSeedLength), seed_output),  // the conversation's next turn
    };
  }

  static inline std::vector<int32_t> base_;
};

TEST_F(EnginePrefixCacheTest, EveryModeIsExactWithTheCacheOnAndOffAndTakesWholeCachedBlocks) {
  std::vector<std::vector<Outcome>> runs;
  std::vector<Job> jobs;
  for (bool cache : {false, true}) {
    EngineOptions options;
    options.prefix_cache = cache;
    auto engine = MakeEngine(options);
    ASSERT_NE(engine, nullptr);
    std::vector<Job> seeds;
    for (const std::string& mode : ImplementedModes()) {
      seeds.push_back({mode, Base(0, kSeedLength), {}});
    }
    for (const char* mode : {"ar", "spec"}) {
      seeds.push_back({mode, Base(0, kSeedLength), {.temperature = 0.8f, .seed = 7}});
    }
    const std::vector<Outcome> first = RunWave(*engine, seeds);
    jobs.clear();
    for (size_t s = 0; s < seeds.size(); ++s) {
      for (std::vector<int32_t>& prompt : SharingPrompts(first[s].tokens)) {
        jobs.push_back({seeds[s].mode, std::move(prompt), seeds[s].sampling});
      }
    }
    runs.push_back(RunWave(*engine, jobs));
    const PrefixCacheStats stats = engine->Load().prefix_cache;
    if (cache) {
      EXPECT_GT(stats.hit_tokens, 0);
      EXPECT_GT(stats.cached_blocks, 0);
    } else {
      EXPECT_EQ(stats.lookups, 0);
      EXPECT_EQ(stats.cached_blocks, 0);
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(jobs[i].mode + (jobs[i].sampling.greedy() ? " greedy" : " seeded") + " prompt " +
                 std::to_string(i % 8));
    EXPECT_EQ(runs[1][i].tokens, runs[0][i].tokens);
    EXPECT_EQ(runs[0][i].usage.cached_tokens, 0);
    if (jobs[i].mode != "ar" || !jobs[i].sampling.greedy()) continue;
    // AR commits every token's KV but the last: what each prompt takes is known.
    const int history = static_cast<int>(jobs[i].prompt.size()) - 1;
    const std::vector<int> want = {32, 32, 32, 16, 16, 0, 0, history / kBlock * kBlock};
    EXPECT_EQ(runs[1][i].usage.cached_tokens, want[i % 8]);
  }
}

// Preempted sequences take their own blocks back from the cache when the pool still has them.
TEST_F(EnginePrefixCacheTest, PreemptionAndSeededSamplingAreExactWithTheCache) {
  std::vector<std::vector<Outcome>> runs;
  std::vector<Job> jobs;
  const SamplingParams seeded{.temperature = 0.8f, .seed = 7};
  for (bool cache : {false, true}) {
    EngineOptions options;
    options.prefix_cache = cache;
    options.context = 128;  // every sequence fits; together they do not, several times over
    options.kv_tokens = 128 + kEngineKvHeadroom;
    auto engine = MakeEngine(options);
    ASSERT_NE(engine, nullptr);
    std::vector<Job> seeds;
    jobs.clear();
    for (const char* mode : {"ar", "spec", "jacobi", "self_spec", "diffusion"}) {
      seeds.push_back({mode, Base(0, kSeedLength), {}});
    }
    seeds.push_back({"ar", Base(0, kSeedLength), seeded});
    seeds.push_back({"spec", Base(0, kSeedLength), seeded});
    const std::vector<Outcome> first = RunWave(*engine, seeds);
    for (size_t s = 0; s < seeds.size(); ++s) {
      for (std::vector<int32_t>& prompt : SharingPrompts(first[s].tokens)) {
        jobs.push_back({seeds[s].mode, std::move(prompt), seeds[s].sampling});
      }
    }
    runs.push_back(RunWave(*engine, jobs));
    int64_t preemptions = 0;
    for (const Outcome& o : runs.back()) preemptions += o.usage.preemptions;
    EXPECT_GT(preemptions, 0) << "the small pool forced no preemption";
    if (cache) {
      EXPECT_GT(engine->Load().prefix_cache.evictions, 0);
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(jobs[i].mode + (jobs[i].sampling.greedy() ? " greedy" : " seeded") + " prompt " +
                 std::to_string(i % 8));
    EXPECT_EQ(runs[1][i].tokens, runs[0][i].tokens);
  }
}

// Requests that arrive together with one prompt prefill it once: the first computes the whole
// blocks, the others wait for them and take them from the cache, with the same outputs.
TEST_F(EnginePrefixCacheTest, ConcurrentRequestsWithOnePromptPrefillItOnce) {
  EngineOptions options;
  options.prefill_chunk = kBlock;  // the leader's prompt takes several steps
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  std::vector<Job> jobs;
  for (int i = 0; i < 4; ++i) jobs.push_back({"ar", Base(0, kSeedLength), {}});
  jobs.push_back({"spec", Base(0, kSeedLength), {}});
  jobs.push_back({"ar", Base(100, 100 + kSeedLength), {}});  // shares nothing: never waits
  const std::vector<Outcome> together = RunWave(*engine, jobs);
  EXPECT_EQ(together[0].usage.cached_tokens, 0);
  for (int i = 1; i < 5; ++i) {
    EXPECT_EQ(together[i].usage.cached_tokens, 2 * kBlock) << i;
    EXPECT_EQ(together[i].tokens.size(), static_cast<size_t>(kNewTokens)) << i;
  }
  EXPECT_EQ(together[5].usage.cached_tokens, 0);
  for (int i = 1; i < 5; ++i) EXPECT_EQ(together[i].tokens, together[0].tokens);
  // The same requests alone, each on an engine of its own: the same outputs.
  for (size_t i : {size_t{0}, size_t{5}}) {
    auto alone = MakeEngine(options);
    ASSERT_NE(alone, nullptr);
    EXPECT_EQ(RunWave(*alone, {jobs[i]})[0].tokens, together[i].tokens) << i;
  }
}

}  // namespace
}  // namespace tandem
