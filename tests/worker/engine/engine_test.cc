// The batching engine on the bundled target model: every mode's output through a mixed,
// concurrent batch equals its single-sequence RunSequence output (with preemption, chunked
// prefill and a remote-style drafter included), request endings (cancel, deadline, stop
// strings and tokens, max_tokens, migration), input validation, admission limits, drain and
// backlogged sinks. The drafter's failures and hidden states: engine_drafter_test.cc.
#include "worker/engine/engine.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/worker/engine/engine_test_fixture.h"

namespace tandem {
namespace {

using testing::CollectingSink;
using testing::EngineTest;
using testing::InProcessDraftChannel;
using testing::Job;
using testing::kDrafter;
using testing::kGamma;
using testing::kNewTokens;
using testing::kPrompts;

TEST_F(EngineTest, EveryModeInOneMixedBatchEqualsRunSequence) {
  EngineOptions options;
  options.draft_timeout = absl::Seconds(10);  // chains always arrive: spec really drafts
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  ExpectMatchesReference(*engine, Jobs(ImplementedModes()));
  const EngineLoad load = engine->Load();
  EXPECT_GT(load.steps, 0);
  EXPECT_GT(load.step_seconds_ewma, 0);
  EXPECT_GT(load.batch_tokens_ewma, 1);  // sequences really shared forwards
  EXPECT_EQ(load.running, 0);
  EXPECT_EQ(load.queued, 0);
}

TEST_F(EngineTest, PreemptionKeepsOutputsExact) {
  EngineOptions options;
  options.context = 128;  // 8 x (64 + 24) tokens against a cache of 128 + 256
  options.kv_tokens = 128 + kEngineKvHeadroom;
  options.draft_timeout = absl::Seconds(10);
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  const std::vector<Job> jobs = Jobs({"ar", "jacobi", "spec", "self_spec", "diffusion"}, 4);
  const auto sinks = ExpectMatchesReference(*engine, jobs);
  int64_t preemptions = 0;
  for (const auto& sink : sinks) preemptions += sink->usage().preemptions;
  EXPECT_GT(preemptions, 0);
  EXPECT_EQ(engine->Load().preemptions, preemptions);
}

// Which sequences of a mixed batch get preempted depends on timing (a spec sequence waiting
// for its chain sits a step out and is the first victim), so each mode that keeps state across
// steps (blocks in flight, drafts) is preempted here on its own. Even alone, whether the cache
// runs out depends on how far the first sequences got before the last ones came (seen once
// without a preemption for spec, whose sequences finish in few steps): each mode gets up to three
// runs to be preempted, every one of them exact.
TEST_F(EngineTest, PreemptionKeepsEveryStatefulModeExact) {
  for (const std::string mode : {"jacobi", "spec", "self_spec", "diffusion"}) {
    SCOPED_TRACE(mode);
    int64_t preemptions = 0;
    for (int attempt = 0; attempt < 3 && preemptions == 0; ++attempt) {
      EngineOptions options;
      options.context = 128;  // as above: kPrompts x (64 + 24) tokens against 128 + 256
      options.kv_tokens = 128 + kEngineKvHeadroom;
      options.draft_timeout = absl::Seconds(10);
      auto engine = MakeEngine(options);
      ASSERT_NE(engine, nullptr);
      const auto sinks = ExpectMatchesReference(*engine, Jobs({mode}));
      for (const auto& sink : sinks) preemptions += sink->usage().preemptions;
    }
    EXPECT_GT(preemptions, 0);
  }
}

TEST_F(EngineTest, ChunkedPrefillIsExact) {
  EngineOptions options;
  options.prefill_chunk = 7;
  options.max_batch_tokens = 40;
  options.draft_timeout = absl::Seconds(10);
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  ExpectMatchesReference(*engine, Jobs({"ar", "spec", "self_spec", "jacobi"}, 3));
}

TEST_F(EngineTest, SeededSamplingEqualsRunSequence) {
  EngineOptions options;
  options.draft_timeout = absl::Seconds(10);
  // A sampled spec step's random draws depend on how many drafts it verifies (the reference's
  // fixed γ); the distribution does not, but this test compares tokens.
  options.adaptive_gamma = false;
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  std::vector<Job> jobs;
  for (const char* mode : {"ar", "spec"}) {
    for (int p = 0; p < 4; ++p) {
      jobs.push_back({.mode = mode,
                      .prompt = p,
                      .sampling = {.temperature = 0.8f, .seed = static_cast<uint64_t>(11 + p)}});
    }
  }
  ExpectMatchesReference(*engine, jobs);
}

TEST_F(EngineTest, MaxTokensAndUsage) {
  auto engine = MakeEngine({});
  ASSERT_NE(engine, nullptr);
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(Request({.mode = "ar", .prompt = 0}, 5), sink).ok());
  ASSERT_TRUE(sink->Wait());
  EXPECT_EQ(sink->finish(), FinishReason::kLength);
  EXPECT_EQ(sink->tokens().size(), 5u);
  const SequenceUsage usage = sink->usage();
  EXPECT_EQ(usage.completion_tokens, 5);
  EXPECT_EQ(usage.prompt_tokens, static_cast<int>((*prompts_)[0].size()));
  EXPECT_EQ(usage.forwards, 5);
  EXPECT_GE(usage.total_seconds, usage.ttft_seconds);
  EXPECT_GE(usage.ttft_seconds, usage.queue_seconds);
  EXPECT_FALSE(sink->text().empty());
}

TEST_F(EngineTest, StopTokenInsideAMultiTokenStep) {
  const Job job{.mode = "spec", .prompt = 1};
  const std::vector<int32_t> full = Reference(job);
  ASSERT_GT(full.size(), 12u);
  const int32_t stop = full[10];
  const auto first = std::find(full.begin(), full.end(), stop);
  const std::vector<int32_t> want(full.begin(), first + 1);
  EngineOptions options;
  options.draft_timeout = absl::Seconds(10);
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  auto sink = std::make_shared<CollectingSink>();
  SequenceRequest request = Request(job);
  request.stop_token_ids = {stop};
  ASSERT_TRUE(engine->Submit(request, sink).ok());
  ASSERT_TRUE(sink->Wait());
  EXPECT_EQ(sink->finish(), FinishReason::kStop);
  EXPECT_EQ(sink->tokens(), want);
  EXPECT_GT(sink->usage().accepted, 0);
}

TEST_F(EngineTest, StopStringIsWithheld) {
  auto engine = MakeEngine({});
  ASSERT_NE(engine, nullptr);
  auto plain = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(Request({.mode = "ar", .prompt = 2}), plain).ok());
  ASSERT_TRUE(plain->Wait());
  const std::string text = plain->text();
  ASSERT_GT(text.size(), 12u);
  const std::string stop = text.substr(text.size() / 2, 3);
  const std::string want = text.substr(0, text.find(stop));
  auto sink = std::make_shared<CollectingSink>();
  SequenceRequest request = Request({.mode = "ar", .prompt = 2});
  request.stop_strings = {stop};
  ASSERT_TRUE(engine->Submit(request, sink).ok());
  ASSERT_TRUE(sink->Wait());
  EXPECT_EQ(sink->finish(), FinishReason::kStop);
  EXPECT_EQ(sink->text(), want);
}

TEST_F(EngineTest, MigratedTokensContinueTheOutput) {
  auto engine = MakeEngine({});
  ASSERT_NE(engine, nullptr);
  for (const char* mode : {"ar", "jacobi"}) {
    const Job job{.mode = mode, .prompt = 3};
    const std::vector<int32_t> full = Reference(job);
    ASSERT_EQ(full.size(), static_cast<size_t>(kNewTokens));
    SequenceRequest request = Request(job);
    request.committed.assign(full.begin(), full.begin() + 10);
    auto sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE(engine->Submit(request, sink).ok());
    ASSERT_TRUE(sink->Wait());
    EXPECT_EQ(sink->tokens(), std::vector<int32_t>(full.begin() + 10, full.end())) << mode;
    EXPECT_EQ(sink->finish(), FinishReason::kLength);
    EXPECT_EQ(sink->usage().completion_tokens, kNewTokens - 10);
  }
}

// A migrated sampled stream continues as it would have: the engine rebuilds the migrated tokens'
// KV (ReplaySlice) and the mode carries on from their end, prompts past the few-rows products'
// 16 rows, several seeds. A prefill's rounding (about 1e-6 of a logit) flips a sampled token
// only rarely, so what pins the replay's bits are ReplaySliceTest (the extends' shapes) and
// TransformerTest.ExactExtendsEqualOneTokenExtendsBitForBit (those shapes' outputs).
TEST_F(EngineTest, MigratedSampledStreamContinuesExactly) {
  auto engine = MakeEngine({});
  ASSERT_NE(engine, nullptr);
  constexpr int kTokens = 72, kCommitted = 48;
  int compared = 0;
  for (int p = 0; p < 4; ++p) {
    SequenceRequest request = Request({.mode = "ar", .prompt = p}, kTokens);
    const std::vector<int32_t>& more = (*prompts_)[p + 4];
    request.prompt_ids.insert(request.prompt_ids.end(), more.begin(), more.end());
    ASSERT_GT(request.prompt_ids.size(), 16u);
    request.sampling = {.temperature = 1.0f, .top_p = 0.95f, .seed = 17u + p};
    auto full = std::make_shared<CollectingSink>();
    ASSERT_TRUE(engine->Submit(request, full).ok());
    ASSERT_TRUE(full->Wait());
    const std::vector<int32_t> tokens = full->tokens();
    if (tokens.size() < kCommitted + 8) continue;  // a stop token came early
    request.committed.assign(tokens.begin(), tokens.begin() + kCommitted);
    auto moved = std::make_shared<CollectingSink>();
    ASSERT_TRUE(engine->Submit(request, moved).ok());
    ASSERT_TRUE(moved->Wait());
    EXPECT_EQ(moved->tokens(), std::vector<int32_t>(tokens.begin() + kCommitted, tokens.end()))
        << "prompt " << p;
    ++compared;
  }
  EXPECT_GE(compared, 2);
}

// ignore_eos: the model's end-of-sequence tokens are emitted like any other and the sequence goes
// on. The bundled model hardly ever ends a sequence, so a copy of it whose EOS is a token of its
// own greedy output shows the difference, in every mode that keeps AR's output.
TEST_F(EngineTest, IgnoreEosGoesOnPastTheModelsEndOfSequence) {
  const Job job{.mode = "ar", .prompt = 1};
  const std::vector<int32_t> full = Reference(job);
  ASSERT_EQ(full.size(), static_cast<size_t>(kNewTokens));
  const int32_t eos = full[5];
  const size_t first = std::find(full.begin(), full.end(), eos) - full.begin();
  ModelConfig config = target().config();
  config.eos_token_ids = {eos};
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromFile(testing::kBundledModelDir + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  LoadedModel copy{.dir = testing::kBundledModelDir,
                   .model = Transformer::FromWeights(config, target().weights()),
                   .tokenizer = std::move(*tokenizer)};
  EngineOptions options;
  options.default_drafter = kDrafter;
  options.draft_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&copy, options, Drafters());
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (const char* mode : {"ar", "spec", "jacobi"}) {
    for (bool ignore : {false, true}) {
      SequenceRequest request = Request({.mode = mode, .prompt = 1});
      request.ignore_eos = ignore;
      auto sink = std::make_shared<CollectingSink>();
      ASSERT_TRUE((*engine)->Submit(request, sink).ok());
      ASSERT_TRUE(sink->Wait());
      SCOPED_TRACE(std::string(mode) + (ignore ? " ignoring EOS" : ""));
      if (ignore) {
        EXPECT_EQ(sink->tokens(), full);
        EXPECT_EQ(sink->finish(), FinishReason::kLength);
      } else {
        EXPECT_EQ(sink->tokens(), std::vector<int32_t>(full.begin(), full.begin() + first + 1));
        EXPECT_EQ(sink->finish(), FinishReason::kStop);
      }
    }
  }
}

TEST_F(EngineTest, CancelEndsASequenceMidGeneration) {
  auto engine = MakeEngine({});
  ASSERT_NE(engine, nullptr);
  auto sink = std::make_shared<CollectingSink>();
  absl::StatusOr<uint64_t> id = engine->Submit(Request({.mode = "ar", .prompt = 0}, 400), sink);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(sink->WaitForTokens(3));
  engine->Cancel(*id);
  engine->Cancel(*id + 1000);  // unknown: ignored
  ASSERT_TRUE(sink->Wait());
  EXPECT_EQ(sink->finish(), FinishReason::kCancelled);
  EXPECT_TRUE(sink->error().ok());
  EXPECT_LT(sink->tokens().size(), 400u);
  EXPECT_EQ(sink->after_done(), 0);
}

TEST_F(EngineTest, DeadlineCancelsWithDeadlineExceeded) {
  auto engine = MakeEngine({});
  ASSERT_NE(engine, nullptr);
  auto sink = std::make_shared<CollectingSink>();
  SequenceRequest request = Request({.mode = "ar", .prompt = 0}, 400);
  request.deadline = absl::Now() + absl::Milliseconds(30);
  ASSERT_TRUE(engine->Submit(request, sink).ok());
  ASSERT_TRUE(sink->Wait());
  EXPECT_EQ(sink->finish(), FinishReason::kCancelled);
  EXPECT_EQ(sink->error().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(sink->tokens().size(), 400u);
}

TEST_F(EngineTest, RejectsBadInput) {
  auto engine = MakeEngine({});
  ASSERT_NE(engine, nullptr);
  auto sink = std::make_shared<CollectingSink>();
  const SequenceRequest good = Request({.mode = "ar", .prompt = 0});
  auto expect_invalid = [&](SequenceRequest r, const std::string& what) {
    absl::StatusOr<uint64_t> id = engine->Submit(std::move(r), sink);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << what;
  };
  SequenceRequest r = good;
  r.prompt_ids.clear();
  expect_invalid(r, "no input");
  r = good;
  r.prompt = "hello";
  expect_invalid(r, "two inputs");
  r = good;
  r.mode = "telepathy";
  expect_invalid(r, "unknown mode");
  r = good;
  r.max_tokens = 0;
  expect_invalid(r, "max_tokens 0");
  r = good;
  r.prompt_ids.assign(target().config().max_position_embeddings, 5);
  expect_invalid(r, "prompt fills the context");
  r = good;
  r.prompt_ids[3] = target().config().vocab_size;
  expect_invalid(r, "token outside the vocabulary");
  r = good;
  r.mode = "jacobi";
  r.sampling.temperature = 0.8f;
  expect_invalid(r, "jacobi cannot sample");
  r = good;
  r.committed.assign(kNewTokens, 5);
  expect_invalid(r, "committed reach max_tokens");
  EXPECT_EQ(sink->events(), 0);

  // spec without a drafter.
  absl::StatusOr<std::unique_ptr<Engine>> bare = Engine::Create(model_, {}, nullptr);
  ASSERT_TRUE(bare.ok());
  r = good;
  r.mode = "spec";
  absl::StatusOr<uint64_t> id = (*bare)->Submit(r, sink);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("mode spec needs a drafter"), std::string::npos);

  // Options that cannot work.
  EngineOptions small;
  small.kv_tokens = target().config().max_position_embeddings;
  EXPECT_EQ(Engine::Create(model_, small, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EngineOptions unknown;
  unknown.default_mode = "telepathy";
  EXPECT_EQ(Engine::Create(model_, unknown, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Every size a request controls is bounded before a mode plans with it (the step that froze a
// verifier for minutes: self_spec_quadratic with a draft length of 100000), and every float is
// finite: INVALID_ARGUMENT naming the field and the bound, and nothing reaches the sink.
TEST_F(EngineTest, RefusesModeOptionsAndSamplingPastTheirBounds) {
  auto engine = MakeEngine({});
  ASSERT_NE(engine, nullptr);
  auto sink = std::make_shared<CollectingSink>();
  constexpr float inf = std::numeric_limits<float>::infinity();
  const SequenceRequest good = Request({.mode = "ar", .prompt = 0});
  auto expect_invalid = [&](const std::string& mode, auto set, const std::string& message) {
    SequenceRequest r = good;
    r.mode = mode;
    set(r);
    absl::StatusOr<uint64_t> id = engine->Submit(std::move(r), sink);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_NE(id.status().message().find(message), std::string::npos) << id.status();
  };
  expect_invalid(
      "self_spec_quadratic",
      [](SequenceRequest& r) { r.mode_options.self_spec_draft_len = 100000; },
      "self_spec_draft_len must be in [0, 64] (0 = the default) for mode");
  expect_invalid(
      "self_spec", [](SequenceRequest& r) { r.mode_options.self_spec_draft_len = 100000; },
      "self_spec_draft_len must be in [0, 64] (0 = the default) for mode");
  // A mode that does not read the option still refuses a size past the model's context.
  expect_invalid(
      "ar", [](SequenceRequest& r) { r.mode_options.self_spec_draft_len = 100000; },
      "(the model's context)");
  expect_invalid(
      "self_spec", [](SequenceRequest& r) { r.mode_options.self_spec_draft_len = -1; },
      "self_spec_draft_len must be in [0, 64] (0 = the default) for mode");
  expect_invalid(
      "diffusion", [](SequenceRequest& r) { r.mode_options.diffusion_block_size = 100000; },
      "diffusion_block_size must be in [0, 64] (0 = the default) for mode");
  expect_invalid(
      "diffusion", [](SequenceRequest& r) { r.mode_options.diffusion_block_size = -1; },
      "diffusion_block_size must be in [0, 64] (0 = the default) for mode");
  expect_invalid(
      "nsp", [](SequenceRequest& r) { r.mode_options.nsp_block = 100000; },
      "nsp_block must be in [0, 64] (0 = the default) for mode nsp");
  expect_invalid(
      "isd", [](SequenceRequest& r) { r.mode_options.isd_tau = inf; }, "isd_tau must be a finite");
  expect_invalid(
      "ar", [](SequenceRequest& r) { r.sampling.temperature = inf; }, "temperature must be");
  expect_invalid(
      "ar", [](SequenceRequest& r) { r.stop_token_ids = {1 << 30}; },
      "stop_token_ids has token id 1073741824 outside the vocabulary");
  // Within --max-mode-block but wider than the step budget: k (k + 2) > max_batch_tokens.
  expect_invalid(
      "self_spec_quadratic", [](SequenceRequest& r) { r.mode_options.self_spec_draft_len = 40; },
      "needs 1680 tokens per step, more than this verifier's step budget of 1024");
  expect_invalid(
      "nsp",
      [](SequenceRequest& r) {
        r.mode_options.nsp_quadratic = true;
        r.mode_options.nsp_block = 40;
      },
      "nsp with nsp_block 40 needs 1680 tokens per step");
  EXPECT_EQ(sink->events(), 0);

  // The bound is the engine's option: a smaller --max-mode-block refuses a smaller block.
  EngineOptions tight;
  tight.max_mode_block = 4;
  auto strict = MakeEngine(tight);
  ASSERT_NE(strict, nullptr);
  SequenceRequest r = good;
  r.mode = "self_spec";
  r.mode_options.self_spec_draft_len = 8;
  EXPECT_EQ(strict->Submit(r, sink).status().code(), absl::StatusCode::kInvalidArgument);
  r.mode_options.self_spec_draft_len = 4;
  EXPECT_TRUE(strict->Submit(r, sink).ok());
}

TEST_F(EngineTest, FullQueueIsResourceExhaustedAndBackloggedSinksWait) {
  EngineOptions options;
  options.max_running = 1;
  options.max_queued = 2;
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  auto first = std::make_shared<CollectingSink>();
  first->SetBacklogged(true);
  ASSERT_TRUE(engine->Submit(Request({.mode = "ar", .prompt = 0}), first).ok());
  for (int i = 0; i < 500 && engine->Load().running == 0; ++i)
    absl::SleepFor(absl::Milliseconds(2));
  ASSERT_EQ(engine->Load().running, 1);
  std::vector<std::shared_ptr<CollectingSink>> queued;
  for (int i = 0; i < 2; ++i) {
    queued.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE(engine->Submit(Request({.mode = "ar", .prompt = 1 + i}), queued.back()).ok());
  }
  auto rejected = std::make_shared<CollectingSink>();
  EXPECT_EQ(engine->Submit(Request({.mode = "ar", .prompt = 3}), rejected).status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(first->events(), 0);  // backlogged: never stepped
  EXPECT_EQ(engine->Load().steps, 0);
  EXPECT_EQ(engine->Load().queued, 2);
  first->SetBacklogged(false);
  ASSERT_TRUE(first->Wait());
  EXPECT_EQ(first->tokens(), Reference({.mode = "ar", .prompt = 0}));
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(queued[i]->Wait());
    EXPECT_EQ(queued[i]->tokens(), Reference({.mode = "ar", .prompt = 1 + i}));
  }
  EXPECT_EQ(rejected->events(), 0);
}

TEST_F(EngineTest, DrainRefusesNewRequestsAndFinishesRunningOnes) {
  auto engine = MakeEngine({});
  ASSERT_NE(engine, nullptr);
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(Request({.mode = "ar", .prompt = 4}), sink).ok());
  engine->Drain();
  EXPECT_TRUE(engine->Load().draining);
  auto late = std::make_shared<CollectingSink>();
  EXPECT_EQ(engine->Submit(Request({.mode = "ar", .prompt = 5}), late).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sink->Wait());
  EXPECT_EQ(sink->finish(), FinishReason::kLength);
  EXPECT_EQ(sink->tokens(), Reference({.mode = "ar", .prompt = 4}));
}

TEST_F(EngineTest, DestructorCancelsEverySequence) {
  EngineOptions options;
  options.max_running = 2;
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int p = 0; p < 4; ++p) {
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE(
        engine->Submit(Request({.mode = p % 2 ? "spec" : "ar", .prompt = p}, 400), sinks.back())
            .ok());
  }
  ASSERT_TRUE(sinks[0]->WaitForTokens(2));
  engine.reset();
  for (const auto& sink : sinks) {
    ASSERT_TRUE(sink->Wait());
    EXPECT_EQ(sink->finish(), FinishReason::kCancelled);
    EXPECT_EQ(sink->after_done(), 0);
  }
}

// Counts what the engine reports (on its thread; the test reads after the sequences ended).
class CountingObserver final : public EngineObserver {
 public:
  void OnStep(double seconds, int batch_tokens) override {
    absl::MutexLock lock(&mu_);
    ++steps_;
    step_seconds_ += seconds;
    batch_tokens_ += batch_tokens;
  }
  void OnDraftVerified(std::string_view mode, int drafted, int accepted) override {
    absl::MutexLock lock(&mu_);
    drafted_[std::string(mode)] += drafted;
    accepted_[std::string(mode)] += accepted;
    ++verified_steps_[std::string(mode)];
    if (accepted > drafted || accepted < 0) ++bad_counts_;
  }
  void OnChainArrival(bool /*waited*/) override {
    absl::MutexLock lock(&mu_);
    ++chain_arrivals_;
  }
  void OnFallback(std::string_view reason) override {
    absl::MutexLock lock(&mu_);
    ++fallbacks_[std::string(reason)];
  }

  mutable absl::Mutex mu_;
  int steps_ ABSL_GUARDED_BY(mu_) = 0;
  double step_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t batch_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> drafted_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> accepted_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> fallbacks_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> verified_steps_ ABSL_GUARDED_BY(mu_);
  int chain_arrivals_ ABSL_GUARDED_BY(mu_) = 0;  // spec steps whose drafts came from a chain
  int bad_counts_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(EngineTest, ObserverSeesStepsDraftsAndFallbacks) {
  CountingObserver observer;
  {
    EngineOptions options;
    options.draft_timeout = absl::Seconds(10);  // chains always arrive: spec really drafts
    options.observer = &observer;
    auto engine = MakeEngine(options);
    ASSERT_NE(engine, nullptr);
    const std::vector<std::shared_ptr<CollectingSink>> sinks =
        ExpectMatchesReference(*engine, Jobs({"ar", "spec", "jacobi"}, 1));
    int forwards = 0;
    for (const auto& sink : sinks) forwards = std::max(forwards, sink->usage().forwards);
    absl::MutexLock lock(&observer.mu_);
    EXPECT_GE(observer.steps_, forwards);  // every forward of every sequence was in some step
    EXPECT_EQ(observer.steps_, engine->Load().steps);
    EXPECT_GT(observer.step_seconds_, 0);
    // The prompts and every generated token went through some forward.
    EXPECT_GE(observer.batch_tokens_, static_cast<int64_t>((*prompts_)[0].size()));
    EXPECT_GT(observer.drafted_["spec"], 0);
    EXPECT_GT(observer.accepted_["spec"], 0);
    EXPECT_GT(observer.drafted_["jacobi"], 0);
    EXPECT_EQ(observer.drafted_.count("ar"), 0u);
    // Every spec step that verified drafts had a chain, ready or waited for; jacobi has none.
    EXPECT_EQ(observer.chain_arrivals_, observer.verified_steps_["spec"]);
    EXPECT_EQ(observer.bad_counts_, 0);
    EXPECT_TRUE(observer.fallbacks_.empty());
  }
  // A drafter that fails at once: every spec step that could verify drafts falls back to AR.
  failure_ = InProcessDraftChannel::Failure::kError;
  chains_before_failure_ = 0;
  EngineOptions options;
  options.observer = &observer;
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(Request({.mode = "spec", .prompt = 0}), sink).ok());
  ASSERT_TRUE(sink->Wait());
  EXPECT_EQ(sink->usage().drafted, 0);
  absl::MutexLock lock(&observer.mu_);
  EXPECT_GT(observer.fallbacks_["drafter_down"], 0);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Blocks the engine thread in its first step until released: a wedged step loop.
class BlockingObserver final : public EngineObserver {
 public:
  void OnStep(double, int) override {
    if (!entered.HasBeenNotified()) entered.Notify();
    release.WaitForNotification();
  }
  absl::Notification entered;
  absl::Notification release;
};

TEST_F(EngineTest, LoadReportsHowLongAStuckStepLoopHasHadWork) {
  BlockingObserver observer;
  EngineOptions options;
  options.observer = &observer;
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  // Destroyed before the engine, whose thread must not stay blocked when an assertion fails.
  absl::Cleanup unblock = [&observer] {
    if (!observer.release.HasBeenNotified()) observer.release.Notify();
  };
  EXPECT_EQ(engine->Load().stalled_seconds, 0);  // idle is not stalled
  auto sink = std::make_shared<CollectingSink>();
  ASSERT_TRUE(engine->Submit(Request({.mode = "ar", .prompt = 0}), sink).ok());
  ASSERT_TRUE(observer.entered.WaitForNotificationWithTimeout(absl::Seconds(60)));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_GE(engine->Load().stalled_seconds, 0.25);
  observer.release.Notify();
  ASSERT_TRUE(sink->Wait());
  // Finished and idle again: nothing stalls, however long the engine now waits.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_LT(engine->Load().stalled_seconds, 0.25);
}

}  // namespace
}  // namespace tandem
