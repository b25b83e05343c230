// What requests do to the target's logits and read from them, through the engine on the bundled
// target model. Logit bias, penalties and min_tokens: AR with
// them equals a hand-written decode loop that adjusts each step's logits from their definitions
// (tests/worker/sampling/logit_adjust_reference.h); every lossless mode reproduces that AR output
// exactly with them on, in one mixed batch; lossy modes run with them; min_tokens holds stop
// tokens back and the adjustments change the output. Logprobs: every lossless mode streams
// AR's, the log-softmax of the (adjusted) row, without changing a token.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/engine/bundled_model_test.h"
#include "tests/worker/engine/collecting_sink.h"
#include "tests/worker/engine/test_draft_channel.h"
#include "tests/worker/sampling/logit_adjust_reference.h"
#include "worker/engine/engine.h"
#include "worker/sampling/grammar.h"

namespace tandem {
namespace {

using testing::CollectingSink;
using testing::InProcessDraftChannel;

constexpr int kNewTokens = 40;
constexpr int kPrompts = 6;
constexpr char kDrafter[] = "in-process";

class EngineLogitsTest : public testing::BundledModelTest {
 protected:
  // `hidden_layers`: the drafter asks for the target's hidden states of these layers.
  static std::unique_ptr<Engine> MakeEngine(std::vector<int32_t> hidden_layers = {}) {
    EngineOptions options;
    options.default_drafter = kDrafter;
    options.draft_timeout = absl::Seconds(10);  // chains always arrive: spec really drafts
    options.adaptive_gamma = false;             // and verifies γ drafts every step
    Transformer* target = model_->model.get();
    DraftChannelFactory drafters =
        [target, hidden_layers](
            const std::string& address,
            DraftChannel::ChainCallback on_chain) -> absl::StatusOr<std::unique_ptr<DraftChannel>> {
      if (address != kDrafter) return absl::NotFoundError("no such drafter");
      return std::make_unique<InProcessDraftChannel>(target, 512, std::move(on_chain),
                                                     InProcessDraftChannel::Failure::kNone, 0,
                                                     hidden_layers);
    };
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(model_, std::move(options), std::move(drafters));
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  // Every adjustment at once; the model's EOS ignored, so the stop tokens are the request's.
  static SequenceRequest Request(const std::string& mode, int prompt, const LogitAdjust& adjust,
                                 std::vector<int32_t> stop_token_ids = {}) {
    SequenceRequest r;
    r.prompt_ids = (*prompts_)[prompt];
    r.mode = mode;
    r.mode_options.spec_gamma = 3;
    if (mode == "jacobi") r.mode_options.jacobi_block_size = 4;
    r.max_tokens = kNewTokens;
    r.ignore_eos = true;
    r.stop_token_ids = std::move(stop_token_ids);
    r.adjust = adjust;
    return r;
  }

  static LogitAdjust Adjust() {
    LogitAdjust a;
    a.presence_penalty = 0.8f;
    a.frequency_penalty = 1.0f;
    a.repetition_penalty = 1.3f;
    a.logit_bias = {{(*prompts_)[0][3], 2.0f}, {(*prompts_)[1][2], -3.0f}};
    return a;
  }

  // Greedy AR by hand: one forward per token on one KV cache, each step's logits adjusted from
  // the definitions; ends at a stop token (which the engine's token stream includes, as here) or
  // after kNewTokens.
  static std::vector<int32_t> HandDecode(int prompt, LogitAdjust adjust,
                                         const std::vector<int32_t>& stop_token_ids,
                                         std::vector<float>* logprobs = nullptr) {
    adjust.min_tokens_ban = stop_token_ids;
    Transformer& model = *model_->model;
    const int vocab = model.config().vocab_size;
    const std::vector<int32_t>& prompt_ids = (*prompts_)[prompt];
    KvCache kv(model.KvOptions(static_cast<int64_t>(prompt_ids.size()) + kNewTokens + 64));
    EXPECT_TRUE(kv.AddSequence(1).ok());
    std::vector<int32_t> pending = prompt_ids;
    std::vector<int32_t> generated;
    int length = 0;
    while (static_cast<int>(generated.size()) < kNewTokens) {
      const int n = static_cast<int>(pending.size());
      std::vector<int32_t> positions(n);
      std::iota(positions.begin(), positions.end(), length);
      const std::vector<int32_t> outputs = {n - 1};
      EXPECT_TRUE(kv.Reserve(1, n));
      const Extend extend{.seq = 1, .tokens = pending, .positions = positions, .outputs = outputs};
      absl::StatusOr<std::vector<ExtendOutput>> out = model.Forward({&extend, 1}, kv);
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) return {};
      std::vector<int32_t> keep(n);
      std::iota(keep.begin(), keep.end(), 0);
      EXPECT_TRUE(kv.Commit(1, keep).ok());
      length += n;
      const std::vector<float> row = testing::ReferenceAdjust(
          adjust, std::vector<float>((*out)[0].logits.begin(), (*out)[0].logits.begin() + vocab),
          prompt_ids, generated);
      const int32_t token = Argmax(row);
      if (logprobs != nullptr) {
        double sum = 0;
        for (float x : row) sum += std::exp(static_cast<double>(x) - row[token]);
        logprobs->push_back(static_cast<float>(-std::log(sum)));
      }
      generated.push_back(token);
      if (std::find(stop_token_ids.begin(), stop_token_ids.end(), token) != stop_token_ids.end()) {
        break;
      }
      pending = {token};
    }
    return generated;
  }

  // Submits every request at once; returns each one's sink, every one checked to have ended
  // without an error.
  static std::vector<std::shared_ptr<CollectingSink>> Submit(
      Engine& engine, const std::vector<SequenceRequest>& requests) {
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (const SequenceRequest& r : requests) {
      sinks.push_back(std::make_shared<CollectingSink>());
      absl::StatusOr<uint64_t> id = engine.Submit(r, sinks.back());
      EXPECT_TRUE(id.ok()) << id.status();
    }
    for (size_t i = 0; i < sinks.size(); ++i) {
      EXPECT_TRUE(sinks[i]->Wait());
      EXPECT_TRUE(sinks[i]->error().ok()) << requests[i].mode << ": " << sinks[i]->error();
    }
    return sinks;
  }

  // Each request's output tokens (Submit).
  static std::vector<std::vector<int32_t>> RunAll(Engine& engine,
                                                  const std::vector<SequenceRequest>& requests) {
    std::vector<std::vector<int32_t>> outputs;
    for (const auto& sink : Submit(engine, requests)) outputs.push_back(sink->tokens());
    return outputs;
  }

  // The modes that are lossless under the requests' options.
  static std::vector<std::string> LosslessModes() {
    std::vector<std::string> lossless;
    for (const std::string& mode : ImplementedModes()) {
      absl::StatusOr<std::unique_ptr<DecodingMode>> created = CreateMode(
          mode, Request(mode, 0, {}).mode_options, model_->model->config(), SamplingParams{});
      if (created.ok() && (*created)->lossless()) lossless.push_back(mode);
    }
    return lossless;
  }

  // Structured output over every lossless mode: each gives AR's constrained tokens, and each
  // completion passes CountWhole. Returns how many completions were whole.
  int CheckStructured(Engine& engine, const GrammarSpec& spec, const LogitAdjust& adjust,
                      int max_tokens, const std::function<void(const nlohmann::json&)>& valid) {
    std::vector<SequenceRequest> requests;
    for (const std::string& mode : LosslessModes()) {
      for (int p = 0; p < kPrompts; ++p) {
        requests.push_back(Request(mode, p, adjust));
        requests.back().grammar = spec;
        requests.back().max_tokens = max_tokens;
        requests.back().ignore_eos = false;  // the model's EOS ends a whole document
      }
    }
    const auto sinks = Submit(engine, requests);
    for (size_t i = 0; i < sinks.size(); ++i) {
      const int p = static_cast<int>(i) % kPrompts;
      EXPECT_EQ(sinks[i]->tokens(), sinks[p]->tokens())  // the first kPrompts are ar's
          << requests[i].mode << " prompt " << p;
    }
    return CountWhole(spec, requests, sinks, valid);
  }

  // Each completion is text the grammar accepts (checked by a cursor of the test's own), and
  // one the stop token ended is whole JSON, which `valid` checks. Returns how many were whole.
  static int CountWhole(const GrammarSpec& spec, const std::vector<SequenceRequest>& requests,
                        const std::vector<std::shared_ptr<CollectingSink>>& sinks,
                        const std::function<void(const nlohmann::json&)>& valid) {
    const int vocab = model_->model->config().vocab_size;
    const std::vector<int32_t> eos = model_->model->config().eos_token_ids;
    GrammarCompiler compiler(GrammarTokenBytes(*model_->tokenizer, vocab), vocab, eos);
    absl::StatusOr<std::shared_ptr<const Grammar>> grammar = compiler.Compile(spec);
    EXPECT_TRUE(grammar.ok()) << grammar.status();
    if (!grammar.ok()) return 0;
    int whole = 0;
    for (size_t i = 0; i < sinks.size(); ++i) {
      SCOPED_TRACE(requests[i].mode + " request " + std::to_string(i));
      std::vector<int32_t> text_tokens = sinks[i]->tokens();
      const bool stopped = sinks[i]->finish() == FinishReason::kStop;
      if (stopped && !text_tokens.empty()) text_tokens.pop_back();
      GrammarCursor cursor(*grammar, eos);
      EXPECT_TRUE(cursor.MoveTo(text_tokens, {})) << sinks[i]->text();
      if (!stopped) continue;
      EXPECT_TRUE(cursor.complete()) << sinks[i]->text();
      const nlohmann::json parsed = nlohmann::json::parse(sinks[i]->text(), nullptr, false);
      EXPECT_FALSE(parsed.is_discarded()) << sinks[i]->text();
      if (!parsed.is_discarded()) valid(parsed);
      ++whole;
    }
    return whole;
  }

  static const GrammarSpec& Schema() {
    static const GrammarSpec schema{.kind = GrammarSpec::Kind::kJsonSchema, .text = R"({
      "type": "object",
      "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]},
                     "n": {"type": "integer"}},
      "required": ["ok", "level", "n"]})"};
    return schema;
  }

  static void ValidatesAgainstSchema(const nlohmann::json& j) {
    ASSERT_TRUE(j.is_object()) << j.dump();
    EXPECT_EQ(j.size(), 3u) << j.dump();
    EXPECT_TRUE(j.contains("ok") && j["ok"].is_boolean()) << j.dump();
    EXPECT_TRUE(j.contains("level") && (j["level"] == "low" || j["level"] == "high")) << j.dump();
    // An integer, as JSON Schema counts them: no fraction (a long one parses as a double).
    EXPECT_TRUE(j.contains("n") && j["n"].is_number() &&
                std::trunc(j["n"].get<double>()) == j["n"].get<double>())
        << j.dump();
  }
};

TEST_F(EngineLogitsTest, ArEqualsTheDefinitionsAndTheAdjustmentsChangeTheOutput) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  std::vector<SequenceRequest> requests;
  for (int p = 0; p < kPrompts; ++p) {
    requests.push_back(Request("ar", p, Adjust()));
    requests.push_back(Request("ar", p, LogitAdjust{}));
  }
  const std::vector<std::vector<int32_t>> outputs = RunAll(*engine, requests);
  int changed = 0;
  for (int p = 0; p < kPrompts; ++p) {
    SCOPED_TRACE("prompt " + std::to_string(p));
    EXPECT_EQ(outputs[2 * p], HandDecode(p, Adjust(), {}));
    EXPECT_EQ(outputs[2 * p + 1], HandDecode(p, LogitAdjust{}, {}));
    changed += outputs[2 * p] != outputs[2 * p + 1];
  }
  EXPECT_EQ(changed, kPrompts);
}

TEST_F(EngineLogitsTest, EveryLosslessModeReproducesAdjustedArInOneBatch) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  const std::vector<std::string> lossless = LosslessModes();
  ASSERT_GE(lossless.size(), 5u);
  std::vector<SequenceRequest> requests;
  for (const std::string& mode : ImplementedModes()) {
    for (int p = 0; p < kPrompts; ++p) requests.push_back(Request(mode, p, Adjust()));
  }
  const std::vector<std::vector<int32_t>> outputs = RunAll(*engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    const int p = static_cast<int>(i) % kPrompts;
    const std::string& mode = requests[i].mode;
    SCOPED_TRACE(mode + " prompt " + std::to_string(p));
    if (std::find(lossless.begin(), lossless.end(), mode) != lossless.end()) {
      EXPECT_EQ(outputs[i], outputs[p]);  // the first kPrompts requests are ar's
    } else {
      EXPECT_EQ(outputs[i].size(), static_cast<size_t>(kNewTokens));
    }
  }
}

TEST_F(EngineLogitsTest, MinTokensHoldsStopTokensBackInEveryLosslessMode) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  // A stop token the unadjusted output reaches early: its second token.
  const std::vector<int32_t> plain = HandDecode(2, LogitAdjust{}, {});
  ASSERT_GE(plain.size(), 2u);
  const std::vector<int32_t> stop = {plain[1]};
  LogitAdjust held;
  held.min_tokens = 8;
  const std::vector<int32_t> expected = HandDecode(2, held, stop);
  ASSERT_GT(expected.size(), 8u);
  EXPECT_EQ(HandDecode(2, LogitAdjust{}, stop).size(), 2u);
  std::vector<SequenceRequest> requests;
  for (const char* mode : {"ar", "spec", "jacobi", "self_spec"}) {
    requests.push_back(Request(mode, 2, held, stop));
  }
  const std::vector<std::vector<int32_t>> outputs = RunAll(*engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(outputs[i], expected) << requests[i].mode;
  }
}

TEST_F(EngineLogitsTest, RefusesAdjustmentsPastTheirBounds) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  const int vocab = model_->model->config().vocab_size;
  std::vector<SequenceRequest> bad;
  bad.push_back(Request("ar", 0, {.presence_penalty = 3}));
  bad.push_back(Request("ar", 0, {.repetition_penalty = -1}));
  LogitAdjust outside;
  outside.logit_bias = {{vocab, 1.0f}};
  bad.push_back(Request("ar", 0, outside));
  bad.push_back(Request("ar", 0, {.min_tokens = kNewTokens + 1}));
  for (const SequenceRequest& r : bad) {
    absl::StatusOr<uint64_t> id = engine->Submit(r, std::make_shared<CollectingSink>());
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << id.status();
  }
}

// Every lossless mode streams, for each token, the log-probability AR decoding gives it (the
// target's row in the token's own context) and the top alternatives of that row; asking for
// them changes no token; the values are log-softmax of the (adjusted) row.
TEST_F(EngineLogitsTest, EveryLosslessModeStreamsArsLogprobs) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  constexpr int kTop = 5;
  const std::vector<std::string> lossless = LosslessModes();
  std::vector<SequenceRequest> requests;
  for (int p = 0; p < kPrompts; ++p) requests.push_back(Request("ar", p, {}));  // no logprobs
  for (const std::string& mode : lossless) {
    for (int p = 0; p < kPrompts; ++p) {
      requests.push_back(Request(mode, p, p % 2 == 0 ? LogitAdjust{} : Adjust()));
      requests.back().logprobs = true;
      requests.back().top_logprobs = kTop;
    }
  }
  const auto sinks = Submit(*engine, requests);
  for (int p = 0; p < kPrompts; ++p) {
    std::vector<float> hand;
    const std::vector<int32_t> tokens =
        HandDecode(p, p % 2 == 0 ? LogitAdjust{} : Adjust(), {}, &hand);
    if (p % 2 == 0) {
      EXPECT_EQ(sinks[p]->tokens(), tokens) << "prompt " << p;
    }
    for (size_t m = 0; m < lossless.size(); ++m) {
      const size_t i = kPrompts + m * kPrompts + p;
      SCOPED_TRACE(lossless[m] + " prompt " + std::to_string(p));
      EXPECT_EQ(sinks[i]->tokens(), tokens);
      const std::vector<TokenLogprob> logprobs = sinks[i]->logprobs();
      ASSERT_EQ(logprobs.size(), tokens.size());
      for (size_t k = 0; k < logprobs.size(); ++k) {
        const TokenLogprob& l = logprobs[k];
        EXPECT_EQ(l.token, tokens[k]);
        EXPECT_NEAR(l.logprob, hand[k], 1e-4) << "token " << k;
        ASSERT_EQ(l.top.size(), static_cast<size_t>(kTop));
        EXPECT_EQ(l.top[0].first, l.token);  // greedy: the token is the row's most likely
        EXPECT_EQ(l.top[0].second, l.logprob);
        for (int t = 1; t < kTop; ++t) EXPECT_LE(l.top[t].second, l.top[t - 1].second);
      }
    }
  }
}

// A drafter that reads the target's hidden states adds taps to the verify forward; the logprobs
// still come from the rows the mode consumed.
TEST_F(EngineLogitsTest, LogprobsWithAHiddenStateDrafter) {
  auto engine = MakeEngine({1});
  ASSERT_NE(engine, nullptr);
  SequenceRequest r = Request("spec", 0, {});
  r.logprobs = true;
  SequenceRequest ar = Request("ar", 0, {});
  ar.logprobs = true;
  const auto sinks = Submit(*engine, {r, ar});
  EXPECT_GT(sinks[0]->usage().drafted, 0);
  EXPECT_EQ(sinks[0]->tokens(), sinks[1]->tokens());
  const std::vector<TokenLogprob> spec = sinks[0]->logprobs();
  const std::vector<TokenLogprob> want = sinks[1]->logprobs();
  ASSERT_EQ(spec.size(), want.size());
  for (size_t k = 0; k < spec.size(); ++k) EXPECT_NEAR(spec[k].logprob, want[k].logprob, 1e-4);
}

TEST_F(EngineLogitsTest, SampledTokensAreTheSameWithLogprobs) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  std::vector<SequenceRequest> requests;
  for (const char* mode : {"ar", "spec", "self_spec"}) {
    for (bool logprobs : {false, true}) {
      requests.push_back(Request(mode, 1, {}));
      requests.back().sampling = {.temperature = 0.9f, .top_k = 40, .seed = 11};
      requests.back().logprobs = logprobs;
    }
  }
  const auto sinks = Submit(*engine, requests);
  for (size_t i = 0; i < sinks.size(); i += 2) {
    SCOPED_TRACE(requests[i].mode);
    EXPECT_EQ(sinks[i]->tokens(), sinks[i + 1]->tokens());
    EXPECT_TRUE(sinks[i]->logprobs().empty());
    const std::vector<TokenLogprob> logprobs = sinks[i + 1]->logprobs();
    ASSERT_EQ(logprobs.size(), sinks[i + 1]->tokens().size());
    for (const TokenLogprob& l : logprobs) {
      EXPECT_LE(l.logprob, 0.0f);
      EXPECT_TRUE(l.top.empty());
    }
  }
}

TEST_F(EngineLogitsTest, LogprobsAreRefusedForLossyModesAndPastTheirLimit) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  SequenceRequest lossy = Request("diffusion", 0, {});
  lossy.logprobs = true;
  absl::StatusOr<uint64_t> id = engine->Submit(lossy, std::make_shared<CollectingSink>());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("lossy"), std::string::npos) << id.status();
  SequenceRequest many = Request("ar", 0, {});
  many.logprobs = true;
  many.top_logprobs = kMaxTopLogprobs + 1;
  id = engine->Submit(many, std::make_shared<CollectingSink>());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("top_logprobs"), std::string::npos) << id.status();
}

// The log-softmax of one forward of `tokens` with every row an output: row i's logprob of
// token i + 1.
std::vector<float> HandPromptLogprobs(Transformer& model, const std::vector<int32_t>& tokens) {
  const int vocab = model.config().vocab_size;
  KvCache kv(model.KvOptions(static_cast<int64_t>(tokens.size()) + 64));
  EXPECT_TRUE(kv.AddSequence(1).ok());
  const int n = static_cast<int>(tokens.size());
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<int32_t> outputs(n - 1);
  std::iota(outputs.begin(), outputs.end(), 0);
  EXPECT_TRUE(kv.Reserve(1, n));
  const Extend extend{.seq = 1, .tokens = tokens, .positions = positions, .outputs = outputs};
  absl::StatusOr<std::vector<ExtendOutput>> out = model.Forward({&extend, 1}, kv);
  EXPECT_TRUE(out.ok()) << out.status();
  std::vector<float> logprobs;
  for (int r = 0; r + 1 < n && out.ok(); ++r) {
    const float* row = (*out)[0].logits.data() + static_cast<size_t>(r) * vocab;
    double sum = 0;
    const float target = row[tokens[r + 1]];
    for (int t = 0; t < vocab; ++t) sum += std::exp(static_cast<double>(row[t]) - target);
    logprobs.push_back(static_cast<float>(-std::log(sum)));
  }
  return logprobs;
}

// echo: the prompt's tokens come first with their logprobs (the first has none), over several
// slices for a long prompt and past a cached prefix; max_tokens 0 scores without generating;
// the completion is the same as without echo.
TEST_F(EngineLogitsTest, EchoStreamsThePromptsLogprobs) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  std::vector<int32_t> prompt;
  for (int p = 0; p < kPrompts; ++p) {
    prompt.insert(prompt.end(), (*prompts_)[p].begin(), (*prompts_)[p].end());
  }
  ASSERT_GT(prompt.size(), 64u + 16u);  // more than one echo slice
  const std::vector<float> hand = HandPromptLogprobs(*model_->model, prompt);
  // The prompt cached first: an echo computes it anyway.
  SequenceRequest plain = Request("ar", 0, {});
  plain.prompt_ids = prompt;
  const std::vector<int32_t> warm = Submit(*engine, {plain})[0]->tokens();
  ASSERT_GE(warm.size(), 8u);
  std::vector<SequenceRequest> requests;
  for (const char* mode : {"ar", "spec", "diffusion"}) {
    for (int max_tokens : {0, 8}) {
      SequenceRequest r = Request(mode, 0, {});
      r.prompt_ids = prompt;
      r.echo = true;
      r.logprobs = std::string(mode) != "diffusion";  // the prompt alone needs no lossless mode
      r.top_logprobs = r.logprobs ? 2 : 0;
      r.max_tokens = max_tokens;
      requests.push_back(r);
    }
  }
  const auto sinks = Submit(*engine, requests);
  for (size_t i = 0; i < sinks.size(); ++i) {
    SCOPED_TRACE(requests[i].mode + " max_tokens " + std::to_string(requests[i].max_tokens));
    const std::vector<TokenLogprob> echoed = sinks[i]->prompt_logprobs();
    ASSERT_EQ(echoed.size(), prompt.size());
    EXPECT_FALSE(echoed[0].has_logprob);
    EXPECT_EQ(echoed[0].token, prompt[0]);
    for (size_t k = 1; k < echoed.size(); ++k) {
      EXPECT_EQ(echoed[k].token, prompt[k]);
      EXPECT_TRUE(echoed[k].has_logprob);
      EXPECT_NEAR(echoed[k].logprob, hand[k - 1], 2e-4) << "prompt token " << k;
      EXPECT_EQ(echoed[k].top.size(), requests[i].logprobs ? 2u : 0u);
    }
    if (requests[i].max_tokens == 0) {
      EXPECT_TRUE(sinks[i]->tokens().empty());
      EXPECT_EQ(sinks[i]->finish(), FinishReason::kLength);
    } else if (requests[i].mode != "diffusion") {
      EXPECT_EQ(sinks[i]->tokens(), std::vector<int32_t>(warm.begin(), warm.begin() + 8));
    }
  }
}

// JSON mode: every lossless mode gives AR's constrained output, which is a prefix of a JSON
// object (and one, parsed, when the stop token ended it).
TEST_F(EngineLogitsTest, JsonModeIsExactInEveryLosslessModeAndStaysJson) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  const GrammarSpec object{.kind = GrammarSpec::Kind::kJsonObject};
  const int whole = CheckStructured(*engine, object, {}, kNewTokens, [](const nlohmann::json& j) {
    EXPECT_TRUE(j.is_object()) << j.dump();
  });
  RecordProperty("complete_objects", whole);

  // A bias toward '}' closes the object at once: then only the end of the sequence may follow.
  const std::optional<int32_t> close = model_->tokenizer->TokenId("}");
  ASSERT_TRUE(close.has_value());
  for (const char* mode : {"ar", "spec"}) {
    SequenceRequest r = Request(mode, 0, {});
    r.grammar = object;
    r.ignore_eos = false;
    r.adjust.logit_bias = {{*close, 100.0f}};
    const auto closed = Submit(*engine, {r});
    std::string text;
    for (int32_t token : closed[0]->tokens()) text += *model_->tokenizer->Decode({&token, 1});
    EXPECT_EQ(closed[0]->finish(), FinishReason::kStop) << mode << ": " << text;
    EXPECT_EQ(closed[0]->text(), "{}") << mode;
  }

  // Nothing could end the completion once the object closes.
  SequenceRequest endless = Request("ar", 0, {});
  endless.grammar = object;
  absl::StatusOr<uint64_t> id = engine->Submit(endless, std::make_shared<CollectingSink>());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("stop_token_ids"), std::string::npos) << id.status();
  SequenceRequest held = Request("ar", 0, {.min_tokens = 4});
  held.grammar = object;
  held.ignore_eos = false;
  id = engine->Submit(held, std::make_shared<CollectingSink>());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("min_tokens"), std::string::npos) << id.status();
}

// A JSON schema with every logit adjustment on: each lossless mode reproduces AR exactly, and
// every completion the stop token ended validates against the schema.
TEST_F(EngineLogitsTest, JsonSchemaIsExactInEveryLosslessModeAndValidates) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  const int whole = CheckStructured(*engine, Schema(), Adjust(), 160, ValidatesAgainstSchema);
  RecordProperty("complete_documents", whole);
  EXPECT_GT(whole, 0) << "no completion reached the end of the schema";

  SequenceRequest bad = Request("ar", 0, {});
  bad.ignore_eos = false;
  bad.grammar = GrammarSpec{.kind = GrammarSpec::Kind::kJsonSchema, .text = R"({"type": 5})"};
  absl::StatusOr<uint64_t> id = engine->Submit(bad, std::make_shared<CollectingSink>());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << id.status();
}

// The lossy modes under a JSON schema, greedy and sampled: each draws every token from a row
// masked for the text before it, so every completion is text the grammar accepts and one the
// stop token ended validates.
TEST_F(EngineLogitsTest, JsonSchemaHoldsInEveryLossyMode) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  struct Variant {
    std::string mode;
    std::function<void(ModeOptions&)> set;
  };
  std::vector<Variant> variants = {
      {"diffusion", [](ModeOptions&) {}},
      {"diffusion", [](ModeOptions& o) { o.diffusion_threshold = 0.3f; }},
      {"simsd", [](ModeOptions&) {}},
      {"nsp", [](ModeOptions& o) { o.nsp_tau = 0.3f; }},
      {"isd", [](ModeOptions& o) { o.isd_tau = 0.5f; }},
      {"isd",
       [](ModeOptions& o) {
         o.isd_tau = 0.5f;
         o.isd_argmax_proposals = false;
       }},
      {"self_spec_quadratic", [](ModeOptions& o) { o.quadratic_lambda = 0.5f; }},
  };
  if (model_->sampler != nullptr) {
    variants.push_back({"diffusion", [](ModeOptions& o) { o.diffusion_sampler = 0.3f; }});
  }
  std::vector<SequenceRequest> requests;
  for (const Variant& v : variants) {
    for (int p = 0; p < kPrompts / 2; ++p) {
      for (const float temperature : {0.0f, 0.8f}) {
        SequenceRequest r = Request(v.mode, p, {});
        v.set(r.mode_options);
        r.grammar = Schema();
        r.max_tokens = 160;
        r.ignore_eos = false;
        r.sampling.temperature = temperature;
        r.sampling.seed = 7 + p;
        requests.push_back(std::move(r));
      }
    }
  }
  const auto sinks = Submit(*engine, requests);
  const int whole = CountWhole(Schema(), requests, sinks, ValidatesAgainstSchema);
  RecordProperty("complete_documents", whole);
  EXPECT_GT(whole, 0) << "no completion reached the end of the schema";
}

}  // namespace
}  // namespace tandem
