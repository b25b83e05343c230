// The drafter engine serving a DFlash drafter: it asks for the DFlash model's target layers,
// turns each session's hidden rows into context K/V, and answers every Open/Advance whose
// tokens lag the rows by 1 .. max_anchor with one block's drafts (more lag: no chain, and an
// error once tokens arrive without rows). End to end over loopback gRPC, a verifier engine
// decoding `spec` against it gives AR's output while the drafter drafts from the rows it sends.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "services/common/server.h"
#include "services/drafter/drafter_service.h"
#include "services/verifier/grpc_draft_channel.h"
#include "tests/services/drafter/chain_collector.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/engine/draft_engine.h"
#include "worker/engine/engine.h"

namespace tandem {
namespace {

using ::tandem::testing::ChainCollector;
using ::tandem::testing::TinyArch;

// Rows [offset, offset + tokens) of `layers` layers, bf16, deterministic.
HiddenRows Rows(int layers, int offset, int tokens, int hidden_size) {
  HiddenRows rows{.layers = layers, .tokens = tokens, .hidden_size = hidden_size, .offset = offset};
  for (int l = 0; l < layers; ++l) {
    for (int t = 0; t < tokens; ++t) {
      for (int h = 0; h < hidden_size; ++h) {
        rows.bf16.push_back(
            FloatToBf16(static_cast<float>((l * 7 + (offset + t) * 3 + h) % 11) - 5));
      }
    }
  }
  return rows;
}

std::vector<float> Floats(const HiddenRows& rows) {
  std::vector<float> out;
  for (uint16_t v : rows.bf16) out.push_back(Bf16ToFloat(v));
  return out;
}

TEST(DFlashDraftEngine, DraftsOneBlockFromTheRowsAndNoneWhenTheyLagTooFar) {
  std::unique_ptr<Transformer> target = testing::TinyModel(TinyArch::kQwen3, 8);
  std::unique_ptr<DFlashModel> dflash = testing::TinyDFlash(target.get(), 4, 5);
  ASSERT_NE(dflash, nullptr);
  DraftEngineOptions options;
  options.dflash = dflash.get();
  auto engine = DraftEngine::Create(target.get(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->options().hidden_layers, dflash->config().target_layer_ids);
  ChainCollector chains;
  const uint64_t stream = (*engine)->AddStream(chains.Callback());
  const int layers = static_cast<int>(dflash->config().target_layer_ids.size());
  const int h = target->config().hidden_size;

  // Session 1: 6 tokens, rows of the first 5 (a = 1): a chain of the block's 4 drafts.
  const std::vector<int32_t> tokens = {3, 14, 15, 92, 65, 35};
  const HiddenRows rows = Rows(layers, 0, 5, h);
  (*engine)->Open(stream, 1, tokens, 4, rows);
  DFlashContext context;
  ASSERT_TRUE(dflash->AppendContext(context, Floats(rows), 5).ok());
  auto want = dflash->Draft(context, std::span(tokens).subspan(5));
  ASSERT_TRUE(want.ok());
  auto got = chains.WaitCovered(1, 6, 4);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, *want);

  // Session 2: no rows for 6 tokens (> max_anchor 2): no chain. Its rows then arrive alone
  // (as a verifier's prefill sends them), leaving a = 1: now it drafts.
  (*engine)->Open(stream, 2, tokens, 4);
  // Session 3 (a = 2) drafts; once its chain is here the engine has handled session 2's open.
  (*engine)->Open(stream, 3, tokens, 4, Rows(layers, 0, 4, h));
  ASSERT_TRUE(chains.WaitCovered(3, 6, 3).has_value());
  EXPECT_EQ(chains.Get(2).messages, 0);
  (*engine)->Advance(stream, 2, 6, {}, 0, Rows(layers, 0, 5, h));
  auto late = chains.WaitCovered(2, 6, 4);
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(*late, *want);  // the same rows and tokens as session 1

  // Advancing session 1 by an accepted draft and a bonus token (rows of the next two tokens).
  std::vector<int32_t> append = {(*want)[0], 7};
  (*engine)->Advance(stream, 1, 6, append, 0, Rows(layers, 5, 2, h));
  std::vector<int32_t> all = tokens;
  all.insert(all.end(), append.begin(), append.end());
  ASSERT_TRUE(dflash->AppendContext(context, Floats(Rows(layers, 5, 2, h)), 2).ok());
  auto next = dflash->Draft(context, std::span(all).subspan(7));
  ASSERT_TRUE(next.ok());
  auto advanced = chains.WaitCovered(1, 8, 4);
  ASSERT_TRUE(advanced.has_value());
  EXPECT_EQ(*advanced, *next);
  const DraftEngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.hidden_rows, 5 + 5 + 4 + 2);
  EXPECT_EQ(stats.forwards, 4);

  // Session 4 never gets rows: once a decode step's tokens arrive without them, it ends with an
  // error (its verifier then decodes without waiting for drafts).
  (*engine)->Open(stream, 4, tokens, 4);
  (*engine)->Advance(stream, 4, 6, {1, 2}, 0);
  const absl::Status ended = chains.WaitError(4);
  EXPECT_EQ(ended.code(), absl::StatusCode::kFailedPrecondition) << ended;
}

// Stands in for rows a GPU-to-GPU transport left in device memory; counts its reads.
class FakeDevicePayload final : public DeviceHiddenPayload {
 public:
  int device() const override { return 0; }
  absl::Status Read(const Reader& read) const override {
    ++reads_;
    return read(nullptr, nullptr);
  }
  int reads() const { return reads_; }

 private:
  mutable std::atomic<int> reads_{0};
};

HiddenRows DeviceRows(int layers, int offset, int tokens, int hidden_size,
                      std::shared_ptr<const DeviceHiddenPayload> payload) {
  return HiddenRows{.layers = layers,
                    .tokens = tokens,
                    .hidden_size = hidden_size,
                    .offset = offset,
                    .device = std::move(payload)};
}

TEST(DFlashDraftEngine, RowsInGpuMemoryEndTheSessionOfADrafterOnTheCpu) {
  std::unique_ptr<Transformer> target = testing::TinyModel(TinyArch::kQwen3, 8);
  std::unique_ptr<DFlashModel> dflash = testing::TinyDFlash(target.get(), 4, 5);
  ASSERT_NE(dflash, nullptr);
  ASSERT_EQ(dflash->device(), Device::kCpu);
  DraftEngineOptions options;
  options.dflash = dflash.get();
  auto engine = DraftEngine::Create(target.get(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ChainCollector chains;
  const uint64_t stream = (*engine)->AddStream(chains.Callback());
  const int layers = static_cast<int>(dflash->config().target_layer_ids.size());
  const int h = target->config().hidden_size;
  const std::vector<int32_t> tokens = {3, 14, 15, 92, 65, 35};
  auto payload = std::make_shared<FakeDevicePayload>();

  // Session 1 (host rows) drafts; session 2 opens with rows in GPU memory and ends at once.
  (*engine)->Open(stream, 1, tokens, 4, Rows(layers, 0, 5, h));
  (*engine)->Open(stream, 2, tokens, 4, DeviceRows(layers, 0, 5, h, payload));
  const absl::Status opened = chains.WaitError(2);
  EXPECT_EQ(opened.code(), absl::StatusCode::kFailedPrecondition) << opened;
  EXPECT_NE(opened.message().find("GPU memory"), std::string::npos) << opened;
  EXPECT_NE(opened.message().find("runs on the cpu"), std::string::npos) << opened;
  DFlashContext context;
  ASSERT_TRUE(dflash->AppendContext(context, Floats(Rows(layers, 0, 5, h)), 5).ok());
  auto want = dflash->Draft(context, std::span(tokens).subspan(5));
  ASSERT_TRUE(want.ok());
  auto got = chains.WaitCovered(1, 6, 4);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, *want);

  // Session 3 takes host rows, then device rows on an Advance: it ends; session 1 goes on.
  (*engine)->Open(stream, 3, tokens, 4, Rows(layers, 0, 4, h));
  ASSERT_TRUE(chains.WaitCovered(3, 6, 3).has_value());
  (*engine)->Advance(stream, 3, 6, {1, 2}, 0, DeviceRows(layers, 4, 2, h, payload));
  const absl::Status advanced = chains.WaitError(3);
  EXPECT_EQ(advanced.code(), absl::StatusCode::kFailedPrecondition) << advanced;
  (*engine)->Advance(stream, 3, 8, {4}, 0);
  std::vector<int32_t> append = {(*want)[0], 7};
  (*engine)->Advance(stream, 1, 6, append, 0, Rows(layers, 5, 2, h));
  std::vector<int32_t> all = tokens;
  all.insert(all.end(), append.begin(), append.end());
  ASSERT_TRUE(dflash->AppendContext(context, Floats(Rows(layers, 5, 2, h)), 2).ok());
  auto next = dflash->Draft(context, std::span(all).subspan(7));
  ASSERT_TRUE(next.ok());
  auto extended = chains.WaitCovered(1, 8, 4);
  ASSERT_TRUE(extended.has_value());
  EXPECT_EQ(*extended, *next);
  EXPECT_TRUE(chains.Get(1).error.ok()) << chains.Get(1).error;

  // The rows were never read, and the engine let go of them.
  EXPECT_EQ(payload->reads(), 0);
  EXPECT_EQ(payload.use_count(), 1);
  EXPECT_EQ((*engine)->Stats().hidden_rows, 5 + 4 + 2);
}

TEST(DFlashDraftEngine, RejectsADFlashModelOfAnotherTarget) {
  std::unique_ptr<Transformer> target = testing::TinyModel(TinyArch::kQwen3, 8);
  std::unique_ptr<Transformer> other = testing::TinyModel(TinyArch::kQwen3, 9);
  std::unique_ptr<DFlashModel> dflash = testing::TinyDFlash(target.get(), 4, 5);
  DraftEngineOptions options;
  options.dflash = dflash.get();
  EXPECT_FALSE(DraftEngine::Create(other.get(), options).ok());
}

// Collects one sequence's tokens.
class TokenSink : public SequenceSink {
 public:
  void OnEvent(SequenceEvent event) override {
    absl::MutexLock lock(&mu_);
    tokens_.insert(tokens_.end(), event.tokens.begin(), event.tokens.end());
    if (event.finish != FinishReason::kNone || !event.error.ok()) {
      error_ = event.error;
      done_ = true;
    }
  }
  bool Wait() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(60));
  }
  std::vector<int32_t> tokens() {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  absl::Status error() {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(DFlashEndToEnd, SpecAgainstADFlashDrafterServiceEqualsAr) {
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-target";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no bundled model";
  absl::StatusOr<LoadedModel> target = LoadModelDir(dir);
  ASSERT_TRUE(target.ok()) << target.status();
  // A random-weight DFlash drafter for the bundled target: blocks of 4, taps 1 and 4.
  std::unique_ptr<DFlashModel> dflash = testing::TinyDFlash(target->model.get(), 12, 4);
  ASSERT_NE(dflash, nullptr);
  DraftEngineOptions draft_options;
  draft_options.dflash = dflash.get();
  auto draft_engine = DraftEngine::Create(target->model.get(), draft_options);
  ASSERT_TRUE(draft_engine.ok()) << draft_engine.status();
  DrafterService service(draft_engine->get(), {.model_id = "tandem-dflash"});
  auto server = StartServer({.listen = "127.0.0.1:0"}, {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  {
    EngineOptions options;
    options.default_drafter = server->address;
    options.draft_timeout = absl::Seconds(10);
    options.prefill_chunk = 8;  // the prompt's rows come in several runs
    auto engine = Engine::Create(&*target, options, MakeGrpcDraftChannelFactory({}));
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto run = [&](const std::vector<int32_t>& prompt, const std::string& mode) {
      const absl::Time t0 = absl::Now();
      SequenceRequest r;
      r.prompt_ids = prompt;
      r.mode = mode;
      r.mode_options.spec_gamma = 3;
      r.max_tokens = 16;
      auto sink = std::make_shared<TokenSink>();
      absl::StatusOr<uint64_t> id = (*engine)->Submit(std::move(r), sink);
      EXPECT_TRUE(id.ok()) << id.status();
      EXPECT_TRUE(sink->Wait());
      EXPECT_TRUE(sink->error().ok()) << sink->error();
      return std::pair(sink->tokens(), absl::Now() - t0);
    };
    // The second prompt is longer than a prefill chunk: its first decode step still has
    // pending prompt tokens without rows, which the verifier must not wait for drafts on.
    const std::vector<std::vector<int32_t>> prompts = {
        {10, 200, 31, 4000, 52, 7, 7, 7, 19}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}};
    // The first request makes the channel, whose GetInfo answer may come after its session
    // opened (then it gets no rows, waits for drafts once and decodes by AR steps); later
    // sessions get rows for sure.
    EXPECT_EQ(run(prompts[0], "spec").first, run(prompts[0], "ar").first);
    for (const std::vector<int32_t>& prompt : prompts) {
      const auto [spec, spec_time] = run(prompt, "spec");
      EXPECT_EQ(spec, run(prompt, "ar").first);
      // Far below the draft timeout: no step waited for a chain that was not coming.
      EXPECT_LT(spec_time, options.draft_timeout / 2);
    }
    const DraftEngineStats stats = (*draft_engine)->Stats();
    EXPECT_GT(stats.hidden_rows, static_cast<int64_t>(prompts[0].size() + prompts[1].size()));
    EXPECT_GT(stats.forwards, 0);
    EXPECT_GT(stats.drafted_tokens, 0);
  }
  server->server->Shutdown(std::chrono::system_clock::now());
  server->server->Wait();
}

}  // namespace
}  // namespace tandem
