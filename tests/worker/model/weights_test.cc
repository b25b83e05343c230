// ModelWeights::PackForCpu: the packed matrices give back exactly the checkpoint's values (the
// CUDA uploads and the references read them so), the row-major copies are released, embeddings
// come from a tied head's panels, and the counts a benchmark reports do not change.
#include "worker/model/weights.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/transformer.h"

namespace tandem {
namespace {

// Odd sizes: 97 vocabulary rows and 48-row MLP halves do not fill their last panels.
ModelConfig Config(bool tied) {
  ModelConfig c;
  c.arch = Arch::kQwen3;
  c.vocab_size = 97;
  c.hidden_size = 40;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 3;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.qk_norm = true;
  c.attention_bias = true;
  c.mlp_bias = true;
  c.tie_word_embeddings = tied;
  return c;
}

void ExpectSameLayer(const LayerWeights& got, const LayerWeights& want) {
  EXPECT_EQ(got.input_norm, want.input_norm);
  EXPECT_EQ(got.qkv, want.qkv);
  EXPECT_EQ(got.qkv_bias, want.qkv_bias);
  EXPECT_EQ(got.q_norm, want.q_norm);
  EXPECT_EQ(got.k_norm, want.k_norm);
  EXPECT_EQ(got.o, want.o);
  EXPECT_EQ(got.o_bias, want.o_bias);
  EXPECT_EQ(got.post_norm, want.post_norm);
  EXPECT_EQ(got.gate_up, want.gate_up);
  EXPECT_EQ(got.gate_up_bias, want.gate_up_bias);
  EXPECT_EQ(got.down, want.down);
  EXPECT_EQ(got.down_bias, want.down_bias);
}

class WeightsTest : public ::testing::TestWithParam<bool> {};

TEST_P(WeightsTest, PackingKeepsEveryValueAndReleasesTheRows) {
  const bool tied = GetParam();
  const ModelConfig c = Config(tied);
  const ModelWeights original = RandomWeights(c, 5);
  ModelWeights w = original;
  ASSERT_FALSE(w.packed());
  w.PackForCpu();
  ASSERT_TRUE(w.packed());
  EXPECT_EQ(w.head_tied, tied);
  EXPECT_TRUE(w.lm_head.empty());
  EXPECT_EQ(w.embed.empty(), tied) << "an untied model keeps its embedding rows";
  for (const LayerWeights& l : w.layers) {
    EXPECT_TRUE(l.qkv.empty() && l.o.empty() && l.gate_up.empty() && l.down.empty());
    EXPECT_FALSE(l.qkv_bias.empty()) << "biases and norms stay as they are";
  }
  EXPECT_EQ(w.packed_head.rows(), c.vocab_size);
  EXPECT_EQ(w.packed_layers[0].down.cols(), c.intermediate_size);

  const ModelWeights back = w.Unpacked();
  EXPECT_FALSE(back.packed());
  EXPECT_EQ(back.embed, original.embed);
  EXPECT_EQ(back.lm_head, original.lm_head);
  EXPECT_EQ(back.final_norm, original.final_norm);
  ASSERT_EQ(back.layers.size(), original.layers.size());
  for (size_t i = 0; i < back.layers.size(); ++i)
    ExpectSameLayer(back.layers[i], original.layers[i]);
  EXPECT_EQ(w.EmbedRowMajor(), original.embed);
  EXPECT_EQ(w.HeadRowMajor(), original.lm_head);

  std::vector<float> row(c.hidden_size);
  for (int token = 0; token < c.vocab_size; ++token) {
    w.EmbedRow(token, row.data());
    ASSERT_TRUE(std::equal(row.begin(), row.end(),
                           original.embed.begin() + static_cast<ptrdiff_t>(token) * c.hidden_size))
        << "token " << token;
  }

  EXPECT_EQ(w.ParameterCount(), original.ParameterCount());
  // The padding of each packed matrix's last panel, at most 15 rows each.
  EXPECT_GE(w.StepBytes(), original.StepBytes());
  const size_t padding = sizeof(float) * (kernels::cpu::kPanelRows - 1) *
                         (c.hidden_size + 4 * static_cast<size_t>(c.num_layers) *
                                              std::max(c.hidden_size, c.intermediate_size));
  EXPECT_LE(w.StepBytes(), original.StepBytes() + padding);

  const ModelWeights again = [&] {
    ModelWeights copy = w;
    copy.PackForCpu();  // already packed: nothing changes
    return copy;
  }();
  EXPECT_EQ(again.packed_head.RowMajor(), w.packed_head.RowMajor());
  EXPECT_EQ(again.embed, w.embed);
}

TEST_P(WeightsTest, ATransformerHoldsItsWeightsPacked) {
  const ModelConfig c = Config(GetParam());
  auto model = Transformer::FromWeights(c, RandomWeights(c, 9));
  EXPECT_TRUE(model->weights().packed());
  EXPECT_EQ(model->weights().packed_layers.size(), static_cast<size_t>(c.num_layers));
}

INSTANTIATE_TEST_SUITE_P(Head, WeightsTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Tied" : "Untied"; });

}  // namespace
}  // namespace tandem
