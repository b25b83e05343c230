// The jacobi mode against an exact fake language model (integer predictions, no float ties),
// which also checks every position, visibility row and kept KV entry: losslessness over many
// configurations, rejection recycling and multi-block bookkeeping actually engaging, the
// first-draft rule, limits, option validation and the n-gram pool.
#include "worker/decoding/jacobi.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/decoding/modes.h"

namespace tandem {
namespace {

// Next token = table[second-to-last][last] of the context a token sees: the KV it committed
// (tracked from the keep lists) followed by the new tokens its Visibility row allows. Small
// vocabularies make greedy outputs cycle, like repetitive code. Each new token must sit at
// position = length of its context, see only earlier new tokens, and be kept only when the
// context it saw is exactly the committed sequence before it.
class FakeLm {
 public:
  FakeLm(int vocab, uint64_t seed) : vocab_(vocab), table_(static_cast<size_t>(vocab) * vocab) {
    std::mt19937_64 rng(seed);
    for (int32_t& t : table_) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  }

  int vocab() const { return vocab_; }

  int32_t Next(std::span<const int32_t> context) const {
    const int32_t last = context.back();
    const int32_t before = context.size() > 1 ? context[context.size() - 2] : 0;
    return table_[static_cast<size_t>(before) * vocab_ + last];
  }

  std::vector<int32_t> Greedy(std::vector<int32_t> seq, int count) const {
    std::vector<int32_t> out;
    for (int i = 0; i < count; ++i) {
      out.push_back(Next(seq));
      seq.push_back(out.back());
    }
    return out;
  }

  void Reset() { kv_.clear(); }
  const std::vector<int32_t>& kv() const { return kv_; }

  absl::StatusOr<ExtendOutput> Forward(const StepPlan& plan) {
    const int n = static_cast<int>(plan.tokens.size());
    if (static_cast<int>(plan.positions.size()) != n) return absl::InternalError("positions");
    contexts_.assign(n, kv_);
    for (int i = 0; i < n; ++i) {
      if (!plan.visible.Sees(i, i)) return absl::InternalError(absl::StrCat(i, " blind to itself"));
      for (int j = 0; j < n; ++j) {
        if (j == i || !plan.visible.Sees(i, j)) continue;
        if (j > i) return absl::InternalError(absl::StrCat(i, " sees later token ", j));
        contexts_[i].push_back(plan.tokens[j]);
      }
      if (plan.positions[i] != static_cast<int>(contexts_[i].size())) {
        return absl::InternalError(absl::StrCat("token ", i, " at position ", plan.positions[i],
                                                " sees a context of ", contexts_[i].size()));
      }
      contexts_[i].push_back(plan.tokens[i]);
    }
    ExtendOutput out;
    out.logits.assign(plan.outputs.size() * static_cast<size_t>(vocab_), 0.0f);
    for (size_t r = 0; r < plan.outputs.size(); ++r) {
      out.logits[r * vocab_ + Next(contexts_[plan.outputs[r]])] = 1.0f;
    }
    return out;
  }

  absl::Status Commit(const StepPlan& plan, std::span<const int32_t> keep) {
    for (int32_t i : keep) {
      std::vector<int32_t> want = kv_;
      want.push_back(plan.tokens[i]);
      if (contexts_[i] != want) {
        return absl::InternalError(
            absl::StrCat("kept token ", i, " was computed in another context"));
      }
      kv_.push_back(plan.tokens[i]);
    }
    return absl::OkStatus();
  }

 private:
  int vocab_;
  std::vector<int32_t> table_;
  std::vector<int32_t> kv_;
  std::vector<std::vector<int32_t>> contexts_;  // per new token of the last Forward
};

struct FakeRun {
  std::vector<int32_t> tokens;
  int forwards = 0;
  int drafted = 0;
  int accepted = 0;
};

// The runner's loop over the fake, with the step contract checked.
absl::StatusOr<FakeRun> RunFake(FakeLm& lm, DecodingMode& mode, std::span<const int32_t> prompt,
                                int max_tokens, int max_positions = 0) {
  lm.Reset();
  SamplingParams greedy;
  FakeRun run;
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  int kv_len = 0;
  while (static_cast<int>(run.tokens.size()) < max_tokens) {
    DecodeState state{.tokens = tokens,
                      .prompt_len = static_cast<int>(prompt.size()),
                      .kv_len = kv_len,
                      .budget = max_tokens - static_cast<int>(run.tokens.size()),
                      .sampling = &greedy};
    StepPlan plan = mode.Plan(state);
    for (int32_t p : plan.positions) {
      if (max_positions > 0 && p >= max_positions) {
        return absl::InternalError(absl::StrCat("position ", p, " >= ", max_positions));
      }
    }
    absl::StatusOr<ExtendOutput> out = lm.Forward(plan);
    if (!out.ok()) return out.status();
    ++run.forwards;
    absl::StatusOr<StepResult> r = mode.Consume(state, plan, *out);
    if (!r.ok()) return r.status();
    for (int i = 0; i < state.pending(); ++i) {
      if (i >= static_cast<int>(r->keep.size()) || r->keep[i] != i) {
        return absl::InternalError("pending tokens not kept first");
      }
    }
    if (r->append.empty() || static_cast<int>(r->append.size()) > state.budget) {
      return absl::InternalError(
          absl::StrCat("appended ", r->append.size(), " with budget ", state.budget));
    }
    if (absl::Status s = lm.Commit(plan, r->keep); !s.ok()) return s;
    kv_len += static_cast<int>(r->keep.size());
    tokens.insert(tokens.end(), r->append.begin(), r->append.end());
    run.tokens.insert(run.tokens.end(), r->append.begin(), r->append.end());
    if (!std::equal(lm.kv().begin(), lm.kv().end(), tokens.begin()) ||
        static_cast<int>(lm.kv().size()) != kv_len || kv_len >= static_cast<int>(tokens.size())) {
      return absl::InternalError("KV does not hold the sequence minus its pending tokens");
    }
    run.drafted += r->drafted;
    run.accepted += r->accepted;
  }
  return run;
}

std::vector<std::vector<int32_t>> Prompts(int vocab, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < count; ++p) {
    std::vector<int32_t> prompt(1 + rng() % 20);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

JacobiOptions Options(int n, int blocks, int candidates, int pool = 64, bool lookup = false) {
  return {.block_size = n,
          .blocks = blocks,
          .pool_size = pool,
          .candidates = candidates,
          .prompt_lookup = lookup};
}

struct Totals {
  JacobiStats stats;
  int forwards = 0;
  int tokens = 0;
  int accepted = 0;
};

// Decodes every prompt with a fresh mode and checks it against the fake's greedy output.
void ExpectLossless(const JacobiOptions& options, int vocab, uint64_t seed, Totals* totals,
                    int max_tokens = 60) {
  FakeLm lm(vocab, seed);
  for (const std::vector<int32_t>& prompt : Prompts(vocab, 40, seed + 1)) {
    JacobiMode mode(options, vocab, 0);
    absl::StatusOr<FakeRun> run = RunFake(lm, mode, prompt, max_tokens);
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_EQ(run->tokens, lm.Greedy(prompt, max_tokens))
        << "n " << options.block_size << " K " << options.blocks << " candidates "
        << options.candidates << " pool " << options.pool_size;
    // Each step gains its accepted drafts and one more token (no stop cut any step short).
    EXPECT_EQ(static_cast<int>(run->tokens.size()), run->accepted + run->forwards);
    totals->forwards += run->forwards;
    totals->tokens += static_cast<int>(run->tokens.size());
    totals->accepted += run->accepted;
    const JacobiStats& s = mode.stats();
    totals->stats.candidate_wins += s.candidate_wins;
    totals->stats.candidates_verified += s.candidates_verified;
    totals->stats.spawns += s.spawns;
    totals->stats.promotions += s.promotions;
    totals->stats.frozen_fed += s.frozen_fed;
  }
}

TEST(JacobiTest, ReproducesGreedyAcrossConfigurations) {
  for (int n : {1, 2, 3, 5, 8}) {
    for (int blocks : {1, 2, 3}) {
      for (auto [candidates, pool] : {std::pair{0, 0}, {1, 8}, {3, 64}}) {
        for (int vocab : {7, 12, 29}) {
          Totals totals;
          const bool lookup = (n + vocab) % 2 == 0;  // half the combinations
          ExpectLossless(Options(n, blocks, candidates, pool, lookup), vocab, 100 + vocab, &totals);
          if (n > 1) {
            EXPECT_GT(totals.accepted, 0);
          }
        }
      }
    }
  }
}

TEST(JacobiTest, RejectionRecyclingWinsSomeSteps) {
  Totals totals;
  ExpectLossless(Options(6, 1, 3, 64), 12, 7, &totals);
  EXPECT_GT(totals.stats.candidates_verified, 0);
  EXPECT_GT(totals.stats.candidate_wins, 0);
  Totals plain;
  ExpectLossless(Options(6, 1, 0, 0), 12, 7, &plain);
  EXPECT_EQ(plain.stats.candidates_verified, 0);
  std::printf("[ tpf      ] fake n6: plain %.3f, recycling %.3f tokens/forward\n",
              static_cast<double>(plain.tokens) / plain.forwards,
              static_cast<double>(totals.tokens) / totals.forwards);
}

TEST(JacobiTest, PromptLookupCandidateFollowsRepeatedBigrams) {
  // The fake predicts from the last two tokens, so once its output cycles the continuation of
  // the last bigram's earlier occurrence is exactly right.
  Totals lookup;
  ExpectLossless(Options(6, 1, 0, 0, /*lookup=*/true), 12, 21, &lookup, 120);
  EXPECT_GT(lookup.stats.candidate_wins, 0);
  Totals plain;
  ExpectLossless(Options(6, 1, 0, 0), 12, 21, &plain, 120);
  EXPECT_EQ(plain.stats.candidates_verified, 0);
  EXPECT_GT(lookup.accepted, plain.accepted);
}

TEST(JacobiTest, MultiBlockSpawnsFreezesAndPromotes) {
  Totals totals;
  ExpectLossless(Options(4, 3, 2), 12, 9, &totals, 120);
  EXPECT_GT(totals.stats.spawns, 0);
  EXPECT_GT(totals.stats.promotions, 0);
  EXPECT_GT(totals.stats.frozen_fed, 0);
  Totals single;
  ExpectLossless(Options(4, 1, 2), 12, 9, &single, 120);
  EXPECT_EQ(single.stats.spawns, 0);
  EXPECT_EQ(single.stats.frozen_fed, 0);
}

TEST(JacobiTest, FirstDraftContinuesTheLastPromptTokenFromThePrompt) {
  JacobiMode mode(Options(5, 1, 0, 0), 16, 0);
  const std::vector<int32_t> prompt = {5, 6, 7, 5};
  SamplingParams greedy;
  StepPlan plan = mode.Plan({.tokens = prompt, .kv_len = 0, .budget = 100, .sampling = &greedy});
  EXPECT_EQ(plan.tokens, (std::vector<int32_t>{5, 6, 7, 5, 6, 7, 5, 6, 7}));
  EXPECT_EQ(plan.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(plan.outputs, (std::vector<int32_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(plan.visible.kind, Visibility::Kind::kCausal);

  JacobiMode fresh(Options(3, 1, 0, 0), 16, 0);
  const std::vector<int32_t> once = {1, 2, 3};
  plan = fresh.Plan({.tokens = once, .kv_len = 0, .budget = 100, .sampling = &greedy});
  EXPECT_EQ(plan.tokens, (std::vector<int32_t>{1, 2, 3, 3, 3, 3}));  // no earlier 3: repeat it
}

TEST(JacobiTest, CandidatesBranchOffThePendingTokensAtTheWindowPositions) {
  FakeLm lm(12, 7);
  JacobiMode mode(Options(6, 1, 3, 64), 12, 0);
  SamplingParams greedy;
  std::vector<int32_t> tokens = {3, 1, 4, 1, 5};
  int kv_len = 0;
  bool checked = false;
  for (int step = 0; step < 40 && !checked; ++step) {
    DecodeState state{.tokens = tokens, .kv_len = kv_len, .budget = 1000, .sampling = &greedy};
    StepPlan plan = mode.Plan(state);
    const int pending = state.pending();
    const int main_end = pending + 6;
    if (static_cast<int>(plan.tokens.size()) > main_end) {
      ASSERT_EQ(plan.visible.kind, Visibility::Kind::kExplicit);
      for (int i = main_end; i < static_cast<int>(plan.tokens.size()); ++i) {
        for (int j = 0; j < pending; ++j) EXPECT_TRUE(plan.visible.Sees(i, j));
        for (int j = pending; j < main_end; ++j) EXPECT_FALSE(plan.visible.Sees(i, j));
        EXPECT_TRUE(plan.visible.Sees(i, i));
        EXPECT_GE(plan.positions[i], static_cast<int>(tokens.size()));
        EXPECT_LT(plan.positions[i], static_cast<int>(tokens.size()) + 6);
      }
      checked = true;
    }
    absl::StatusOr<ExtendOutput> out = lm.Forward(plan);
    ASSERT_TRUE(out.ok()) << out.status();
    absl::StatusOr<StepResult> r = mode.Consume(state, plan, *out);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(lm.Commit(plan, r->keep).ok());
    kv_len += static_cast<int>(r->keep.size());
    tokens.insert(tokens.end(), r->append.begin(), r->append.end());
  }
  EXPECT_TRUE(checked) << "no step verified a recycled candidate";
}

TEST(JacobiTest, StaysWithinBudgetAndContext) {
  FakeLm lm(12, 3);
  const std::vector<int32_t> prompt = {1, 2, 3, 1, 2, 3, 1, 2};
  for (int room : {1, 2, 3, 4, 5, 9, 17}) {
    JacobiMode mode(Options(4, 3, 2), 12, static_cast<int>(prompt.size()) + room);
    absl::StatusOr<FakeRun> run =
        RunFake(lm, mode, prompt, room, static_cast<int>(prompt.size()) + room);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->tokens, lm.Greedy(prompt, room));
  }
  // Budget below the draft length: drafts shrink to budget - 1, down to an AR step.
  for (int budget : {1, 2, 3}) {
    JacobiMode mode(Options(8, 2, 2), 12, 0);
    absl::StatusOr<FakeRun> run = RunFake(lm, mode, prompt, budget);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->tokens, lm.Greedy(prompt, budget));
  }
}

TEST(JacobiTest, DraftsStopAtTheContextEvenWithBudgetLeft) {
  SamplingParams greedy;
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  for (int room : {0, 1, 2, 3, 7}) {
    JacobiMode mode(Options(4, 3, 2), 16, static_cast<int>(tokens.size()) + room);
    const StepPlan plan =
        mode.Plan({.tokens = tokens, .kv_len = 9, .budget = 100, .sampling = &greedy});
    // The pending token, then n = 4 drafts (a first step has no pseudo-active block yet), cut
    // to positions below the context.
    ASSERT_EQ(static_cast<int>(plan.positions.size()), 1 + std::min(room, 4));
    for (size_t i = 0; i < plan.positions.size(); ++i) EXPECT_EQ(plan.positions[i], 9 + i);
  }
}

TEST(JacobiTest, OneInstanceDecodesSequencesOneAfterAnother) {
  FakeLm lm(12, 5);
  JacobiMode mode(Options(4, 2, 2), 12, 0);
  for (const std::vector<int32_t>& prompt : Prompts(12, 6, 77)) {
    absl::StatusOr<FakeRun> run = RunFake(lm, mode, prompt, 30);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->tokens, lm.Greedy(prompt, 30));
  }
}

TEST(JacobiTest, ConsumeRejectsSamplingAndForeignPlans) {
  JacobiMode mode(Options(4, 1, 0, 0), 16, 0);
  const std::vector<int32_t> prompt = {1, 2, 3};
  SamplingParams greedy;
  const DecodeState state{.tokens = prompt, .kv_len = 0, .budget = 10, .sampling = &greedy};
  StepPlan plan = mode.Plan(state);
  ExtendOutput out;
  out.logits.assign(plan.outputs.size() * 16, 0.0f);

  SamplingParams hot;
  hot.temperature = 0.8f;
  DecodeState sampled = state;
  sampled.sampling = &hot;
  absl::StatusOr<StepResult> r = mode.Consume(sampled, plan, out);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "jacobi decodes greedily; use temperature 0");

  StepPlan other = plan;
  other.tokens.push_back(0);
  other.positions.push_back(99);
  EXPECT_EQ(mode.Consume(state, other, out).status().code(), absl::StatusCode::kInternal);
  ExtendOutput short_out;
  EXPECT_EQ(mode.Consume(state, plan, short_out).status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(mode.Consume(state, plan, out).ok());
}

TEST(JacobiTest, CreateModeValidates) {
  ModelConfig config;
  config.vocab_size = 32;
  config.max_position_embeddings = 64;
  SamplingParams greedy;
  auto ok = CreateMode("jacobi", ModeOptions{}, config, greedy);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->name(), "jacobi");
  EXPECT_TRUE((*ok)->lossless());
  const std::vector<std::string> modes = ImplementedModes();
  EXPECT_NE(std::find(modes.begin(), modes.end(), "jacobi"), modes.end());

  SamplingParams hot;
  hot.temperature = 1.0f;
  auto sampled = CreateMode("jacobi", ModeOptions{}, config, hot);
  EXPECT_EQ(sampled.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sampled.status().message(), "jacobi decodes greedily; use temperature 0");

  const std::vector<std::pair<std::string, ModeOptions>> bad = {
      {"jacobi_block_size", {.jacobi_block_size = 0}},
      {"jacobi_block_size", {.jacobi_block_size = 300}},
      {"jacobi_blocks", {.jacobi_blocks = 0}},
      {"jacobi_blocks", {.jacobi_blocks = 9}},
      {"jacobi_spawn_ratio", {.jacobi_spawn_ratio = 0.0f}},
      {"jacobi_spawn_ratio", {.jacobi_spawn_ratio = 1.5f}},
      {"jacobi_spawn_ratio", {.jacobi_spawn_ratio = std::nanf("")}},
      {"jacobi_pool_size", {.jacobi_pool_size = -1}},
      {"jacobi_candidates", {.jacobi_candidates = -1}},
      {"jacobi_candidates", {.jacobi_candidates = 17}},
      {"draft tokens per step",
       {.jacobi_block_size = 64, .jacobi_blocks = 3, .jacobi_candidates = 2}},
  };
  for (const auto& [field, options] : bad) {
    auto r = CreateMode("jacobi", options, config, greedy);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status();
  }
  // Candidates do not count toward the limit when the pool is off.
  EXPECT_TRUE(CreateMode("jacobi",
                         {.jacobi_block_size = 128,
                          .jacobi_blocks = 2,
                          .jacobi_pool_size = 0,
                          .jacobi_candidates = 2},
                         config, greedy)
                  .ok());
}

TEST(NgramPoolTest, LooksUpByKeyMostRecentFirstAndEvictsTheOldest) {
  NgramPool pool(3);
  const std::vector<int32_t> a = {1, 2}, b = {3}, c = {4, 5, 6}, d = {7};
  pool.Add(9, a);
  pool.Add(9, b);
  pool.Add(8, c);
  EXPECT_EQ(pool.Lookup(9, 5), (std::vector<std::vector<int32_t>>{b, a}));
  EXPECT_EQ(pool.Lookup(9, 1), (std::vector<std::vector<int32_t>>{b}));
  pool.Add(9, a);  // refreshed, not duplicated
  EXPECT_EQ(pool.size(), 3);
  EXPECT_EQ(pool.Lookup(9, 5), (std::vector<std::vector<int32_t>>{a, b}));
  pool.Add(7, d);  // evicts b, the least recent
  EXPECT_EQ(pool.Lookup(9, 5), (std::vector<std::vector<int32_t>>{a}));
  EXPECT_EQ(pool.Lookup(7, 5), (std::vector<std::vector<int32_t>>{d}));
  EXPECT_TRUE(pool.Lookup(5, 5).empty());
  pool.Add(5, {});  // empty runs are not recorded
  EXPECT_TRUE(pool.Lookup(5, 5).empty());

  NgramPool off(0);
  off.Add(1, a);
  EXPECT_EQ(off.size(), 0);
  EXPECT_TRUE(off.Lookup(1, 5).empty());
}

}  // namespace
}  // namespace tandem
