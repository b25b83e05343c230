// In-process generation over a random-weight model with a real tokenizer: the KV-cached loop
// against full recomputation, limits, stop strings, seeds and input errors.
#include "worker/engine/local_generator.h"

#include <map>
#include <set>

#include "gtest/gtest.h"
#include "worker/model/weights.h"

namespace tandem {
namespace {

class LocalGeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::FromFile(std::string(TANDEM_SOURCE_DIR) +
                                   "/tests/fixtures/tokenizer/qwen2_style/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    ModelConfig c;
    c.arch = Arch::kQwen3;
    c.vocab_size = (*tok)->vocab_size();
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.qk_norm = true;
    c.max_position_embeddings = 96;
    c.tie_word_embeddings = true;
    loaded_.tokenizer = std::move(*tok);
    loaded_.model = Transformer::FromWeights(c, RandomWeights(c, 99, 0.3f));
  }

  // Greedy next token by re-running the whole sequence without reusing any cache.
  int32_t RecomputeArgmax(const std::vector<int32_t>& seq) { return Argmax(RecomputeLogits(seq)); }

  // The last position's logits, by re-running the whole sequence without reusing any cache.
  std::vector<float> RecomputeLogits(const std::vector<int32_t>& seq) {
    KvCache kv(loaded_.model->KvOptions(static_cast<int64_t>(seq.size())));
    EXPECT_TRUE(kv.AddSequence(1).ok());
    EXPECT_TRUE(kv.Reserve(1, static_cast<int>(seq.size())).has_value());
    std::vector<int32_t> pos(seq.size());
    for (size_t i = 0; i < seq.size(); ++i) pos[i] = static_cast<int32_t>(i);
    const std::vector<int32_t> out = {static_cast<int32_t>(seq.size() - 1)};
    Extend e{.seq = 1, .tokens = seq, .positions = pos, .outputs = out};
    auto r = loaded_.model->Forward({&e, 1}, kv);
    EXPECT_TRUE(r.ok());
    const auto& logits = (*r)[0].logits;
    return std::vector<float>(logits.begin(), logits.end());
  }

  LoadedModel loaded_;
};

TEST_F(LocalGeneratorTest, GreedyMatchesFullRecomputationEachStep) {
  LocalGenerator gen(&loaded_);
  GenerateOptions opt;
  opt.max_tokens = 12;
  std::string streamed;
  auto r = gen.Generate("def main():", opt, [&](std::string_view t) { streamed += t; });
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> seq = r->prompt_ids;
  for (int32_t token : r->tokens) {
    EXPECT_EQ(token, RecomputeArgmax(seq));
    seq.push_back(token);
  }
  EXPECT_EQ(r->forwards, static_cast<int>(r->tokens.size()));
  EXPECT_EQ(streamed, r->text);
  // The first token's time is part of the whole run's, and the decode of 11 tokens takes some.
  EXPECT_GT(r->first_token_seconds, 0.0);
  EXPECT_LT(r->first_token_seconds, r->seconds);
}

TEST_F(LocalGeneratorTest, MaxTokensAndContextLimitEndWithLength) {
  LocalGenerator gen(&loaded_);
  GenerateOptions opt;
  opt.max_tokens = 5;
  auto r = gen.Generate("x = 1", opt);
  ASSERT_TRUE(r.ok());
  // A random model may hit a stop token (ChatML end or EOS) first; otherwise exactly 5 tokens.
  if (r->finish == FinishReason::kStop) {
    EXPECT_LT(r->tokens.size(), 5u);
    EXPECT_TRUE(loaded_.tokenizer->IsSpecial(r->tokens.back()));
  } else {
    EXPECT_EQ(r->finish, FinishReason::kLength);
    EXPECT_EQ(r->tokens.size(), 5u);
  }
  opt.max_tokens = 1000;  // beyond the 96-token context: capped by it
  auto capped = gen.Generate("x = 1", opt);
  ASSERT_TRUE(capped.ok());
  EXPECT_LE(capped->prompt_ids.size() + capped->tokens.size(), 96u);
}

TEST_F(LocalGeneratorTest, StopStringEndsTheTextBeforeIt) {
  LocalGenerator gen(&loaded_);
  GenerateOptions opt;
  opt.max_tokens = 24;
  auto full = gen.Generate("import os", opt);
  ASSERT_TRUE(full.ok());
  ASSERT_GE(full->text.size(), 6u) << "random model produced too little text to test";
  opt.stop_strings = {full->text.substr(3, 3)};
  auto stopped = gen.Generate("import os", opt);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->finish, FinishReason::kStop);
  EXPECT_EQ(stopped->text, full->text.substr(0, full->text.find(opt.stop_strings[0])));
}

TEST_F(LocalGeneratorTest, SeededSamplingIsReproducible) {
  LocalGenerator gen(&loaded_);
  GenerateOptions opt;
  opt.max_tokens = 16;
  opt.sampling = {.temperature = 1.5f, .seed = 42};
  auto a = gen.Generate("class A:", opt);
  auto b = gen.Generate("class A:", opt);
  opt.sampling.seed = 43;
  auto c = gen.Generate("class A:", opt);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_NE(a->tokens, c->tokens);
}

// The penalties act as the API defines them (repetition over prompt and output, then frequency
// and presence over the output), and a lossless mode stays exact with them on.
TEST_F(LocalGeneratorTest, PenaltiesShapeGreedyDecodingAndLosslessModesFollow) {
  LocalGenerator gen(&loaded_);
  GenerateOptions opt;
  opt.max_tokens = 16;
  opt.adjust.repetition_penalty = 1.5f;
  opt.adjust.frequency_penalty = 0.4f;
  opt.adjust.presence_penalty = 0.3f;
  auto r = gen.Generate("def main():", opt);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> seq = r->prompt_ids;
  std::map<int32_t, int> generated;
  for (int32_t token : r->tokens) {
    std::vector<float> logits = RecomputeLogits(seq);
    for (int32_t seen : std::set<int32_t>(seq.begin(), seq.end())) {
      float& l = logits[seen];
      l = l > 0 ? l / 1.5f : l * 1.5f;
    }
    for (const auto& [id, count] : generated) logits[id] -= 0.4f * count + 0.3f;
    EXPECT_EQ(token, Argmax(logits));
    seq.push_back(token);
    ++generated[token];
  }
  GenerateOptions plain = opt;
  plain.adjust = LogitAdjust{};
  auto unpenalised = gen.Generate("def main():", plain);
  ASSERT_TRUE(unpenalised.ok());
  EXPECT_NE(unpenalised->tokens, r->tokens) << "the penalties changed nothing";
  for (const char* mode : {"jacobi", "spec"}) {
    GenerateOptions lossless = opt;
    lossless.mode = mode;
    lossless.drafter = &loaded_;
    auto m = gen.Generate("def main():", lossless);
    ASSERT_TRUE(m.ok()) << mode << ": " << m.status();
    EXPECT_EQ(m->tokens, r->tokens) << mode;
  }
  opt.adjust.repetition_penalty = 0.0f;
  EXPECT_EQ(gen.Generate("def main():", opt).status().code(), absl::StatusCode::kInvalidArgument);
}

// min_tokens holds back every stop token, the request's own ones included, until it is reached.
TEST_F(LocalGeneratorTest, MinTokensHoldsBackTheStopTokens) {
  LocalGenerator gen(&loaded_);
  GenerateOptions opt;
  opt.max_tokens = 12;
  auto free = gen.Generate("def main():", opt);
  ASSERT_TRUE(free.ok()) << free.status();
  ASSERT_EQ(free->tokens.size(), 12u) << "the random model stopped early";
  const int32_t stop = free->tokens[3];
  opt.extra_stop_token_ids = {stop};
  auto stopped = gen.Generate("def main():", opt);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->finish, FinishReason::kStop);
  EXPECT_LE(stopped->tokens.size(), 4u);
  opt.adjust.min_tokens = 12;
  auto held = gen.Generate("def main():", opt);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->finish, FinishReason::kLength);
  ASSERT_EQ(held->tokens.size(), 12u);
  for (int32_t token : held->tokens) EXPECT_NE(token, stop);
}

TEST_F(LocalGeneratorTest, BadInputIsInvalidArgument) {
  LocalGenerator gen(&loaded_);
  GenerateOptions opt;
  EXPECT_EQ(gen.Generate("", opt).status().code(), absl::StatusCode::kInvalidArgument);
  opt.max_tokens = 0;
  EXPECT_EQ(gen.Generate("hi", opt).status().code(), absl::StatusCode::kInvalidArgument);
  opt.max_tokens = 4;
  EXPECT_EQ(gen.Generate(std::string(2000, 'z') + " q w e r t y u i o p", opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gen.Generate("\xff\xfe", opt).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
