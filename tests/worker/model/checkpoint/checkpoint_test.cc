#include "worker/model/checkpoint/checkpoint.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/model/checkpoint/temp_dir.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

class CheckpointTest : public ::testing::Test {
 protected:
  void WriteShard(const std::string& name, const std::vector<TensorToWrite>& tensors,
                  DType dtype = DType::kF32) {
    ASSERT_TRUE(WriteSafetensors(dir_.File(name), tensors, dtype).ok());
  }
  // Two shards: embed + layer 0 in the first, layer 1 + norm in the second.
  void WriteShardedCheckpoint(const std::string& index_json) {
    WriteShard("model-00001-of-00002.safetensors",
               {{"model.embed_tokens.weight", {2, 2}, embed_},
                {"model.layers.0.mlp.up_proj.weight", {1, 2}, up0_}},
               DType::kBF16);
    WriteShard(
        "model-00002-of-00002.safetensors",
        {{"model.layers.1.mlp.up_proj.weight", {1, 2}, up1_}, {"model.norm.weight", {2}, norm_}});
    dir_.Write("model.safetensors.index.json", index_json);
  }
  static std::string StandardIndex() {
    return R"({"metadata": {"total_size": 28}, "weight_map": {
      "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "model.layers.0.mlp.up_proj.weight": "model-00001-of-00002.safetensors",
      "model.layers.1.mlp.up_proj.weight": "model-00002-of-00002.safetensors",
      "model.norm.weight": "model-00002-of-00002.safetensors"}})";
  }

  test::TempDir dir_;
  const std::vector<float> embed_ = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> up0_ = {0.5f, -0.5f};
  const std::vector<float> up1_ = {0.25f, 8.0f};
  const std::vector<float> norm_ = {1.0f, 1.5f};
};

TEST_F(CheckpointTest, OpensSingleFileAndLoadsF32) {
  WriteShard("model.safetensors",
             {{"lm_head.weight", {2, 2}, embed_}, {"model.norm.weight", {2}, norm_}}, DType::kF16);
  auto checkpoint = Checkpoint::Open(dir_.path().string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_THAT((*checkpoint)->TensorNames(), ElementsAre("lm_head.weight", "model.norm.weight"));
  EXPECT_TRUE((*checkpoint)->Has("model.norm.weight"));
  EXPECT_FALSE((*checkpoint)->Has("model.embed_tokens.weight"));
  const TensorView* view = (*checkpoint)->Find("lm_head.weight");
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(view->dtype, DType::kF16);
  auto values = (*checkpoint)->LoadF32("lm_head.weight", {2, 2});
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, embed_);
}

TEST_F(CheckpointTest, WrongShapeNamesTensorFileAndBothShapes) {
  WriteShard("model.safetensors", {{"model.norm.weight", {2}, norm_}});
  auto checkpoint = Checkpoint::Open(dir_.path().string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto values = (*checkpoint)->LoadF32("model.norm.weight", {3});
  ASSERT_FALSE(values.ok());
  EXPECT_EQ(values.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(values.status()),
              AllOf(HasSubstr("'model.norm.weight'"), HasSubstr("model.safetensors"),
                    HasSubstr("has shape [2]"), HasSubstr("expected [3]")));
  auto missing = (*checkpoint)->LoadF32("model.layers.0.self_attn.q_proj.weight", {2, 2});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()), HasSubstr("model.layers.0.self_attn.q_proj.weight"));
}

TEST_F(CheckpointTest, OpensShardsThroughTheIndex) {
  WriteShardedCheckpoint(StandardIndex());
  auto checkpoint = Checkpoint::Open(dir_.path().string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ((*checkpoint)->TensorNames().size(), 4u);
  auto embed = (*checkpoint)->LoadF32("model.embed_tokens.weight", {2, 2});
  ASSERT_TRUE(embed.ok()) << embed.status();
  EXPECT_EQ(*embed, embed_);  // BF16-exact values
  auto up1 = (*checkpoint)->LoadF32("model.layers.1.mlp.up_proj.weight", {1, 2});
  ASSERT_TRUE(up1.ok()) << up1.status();
  EXPECT_EQ(*up1, up1_);
  auto up0 = (*checkpoint)->LoadF32("model.layers.0.mlp.up_proj.weight", {2, 1});
  EXPECT_THAT(Message(up0.status()), HasSubstr("model-00001-of-00002.safetensors"));
}

TEST_F(CheckpointTest, IndexWinsOverAStrayModelSafetensors) {
  WriteShardedCheckpoint(StandardIndex());
  WriteShard("model.safetensors", {{"unrelated", {1}, {norm_.data(), 1}}});
  auto checkpoint = Checkpoint::Open(dir_.path().string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_FALSE((*checkpoint)->Has("unrelated"));
}

TEST_F(CheckpointTest, MissingShardIsAnErrorNamingTheFile) {
  WriteShardedCheckpoint(StandardIndex());
  std::filesystem::remove(dir_.File("model-00002-of-00002.safetensors"));
  auto checkpoint = Checkpoint::Open(dir_.path().string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(Message(checkpoint.status()), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(CheckpointTest, TruncatedShardIsAnErrorNamingTheFile) {
  WriteShardedCheckpoint(StandardIndex());
  const std::string shard = dir_.File("model-00001-of-00002.safetensors");
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 2);
  auto checkpoint = Checkpoint::Open(dir_.path().string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(Message(checkpoint.status()), AllOf(HasSubstr(shard), HasSubstr("truncated")));
}

TEST_F(CheckpointTest, TensorListedInIndexButMissingFromShardIsAnError) {
  WriteShardedCheckpoint(R"({"weight_map": {
      "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "model.layers.7.mlp.up_proj.weight": "model-00002-of-00002.safetensors"}})");
  auto checkpoint = Checkpoint::Open(dir_.path().string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(Message(checkpoint.status()), AllOf(HasSubstr("model.layers.7.mlp.up_proj.weight"),
                                                  HasSubstr("model-00002-of-00002.safetensors")));
}

TEST_F(CheckpointTest, TensorListedForTheWrongShardIsAnError) {
  WriteShardedCheckpoint(R"({"weight_map": {
      "model.embed_tokens.weight": "model-00002-of-00002.safetensors",
      "model.norm.weight": "model-00002-of-00002.safetensors"}})");
  auto checkpoint = Checkpoint::Open(dir_.path().string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(Message(checkpoint.status()), HasSubstr("model.embed_tokens.weight"));
}

TEST_F(CheckpointTest, BadIndexFilesAreErrors) {
  WriteShardedCheckpoint("{not json");
  auto bad_json = Checkpoint::Open(dir_.path().string());
  EXPECT_THAT(Message(bad_json.status()), HasSubstr("model.safetensors.index.json"));

  dir_.Write("model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_THAT(Message(Checkpoint::Open(dir_.path().string()).status()), HasSubstr("weight_map"));

  dir_.Write("model.safetensors.index.json", R"({"weight_map": {"a": "../../etc/passwd"}})");
  EXPECT_THAT(Message(Checkpoint::Open(dir_.path().string()).status()),
              HasSubstr("not a relative file name"));

  dir_.Write("model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
  EXPECT_FALSE(Checkpoint::Open(dir_.path().string()).ok());
}

TEST_F(CheckpointTest, DuplicateTensorAcrossFilesIsAnError) {
  WriteShard("a.safetensors", {{"x", {2}, norm_}});
  WriteShard("b.safetensors", {{"x", {2}, norm_}});
  auto checkpoint = Checkpoint::OpenFiles({dir_.File("a.safetensors"), dir_.File("b.safetensors")});
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(Message(checkpoint.status()),
              AllOf(HasSubstr("'x'"), HasSubstr("a.safetensors"), HasSubstr("b.safetensors")));
}

TEST_F(CheckpointTest, OpenFilesMergesFiles) {
  WriteShard("a.safetensors", {{"x", {2}, norm_}});
  WriteShard("b.safetensors", {{"y", {2}, up0_}});
  auto checkpoint = Checkpoint::OpenFiles({dir_.File("a.safetensors"), dir_.File("b.safetensors")});
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_THAT((*checkpoint)->TensorNames(), ElementsAre("x", "y"));
  EXPECT_EQ(*(*checkpoint)->LoadF32("y", {2}), up0_);
}

TEST_F(CheckpointTest, DirectoryWithoutWeightsIsNotFound) {
  dir_.Write("config.json", "{}");
  auto checkpoint = Checkpoint::Open(dir_.path().string());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(checkpoint.status()), HasSubstr("model.safetensors"));
}

TEST_F(CheckpointTest, IntegerTensorCannotBeLoadedAsF32) {
  // Hand-made file with an I32 tensor.
  std::string header = R"({"ids":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})";
  std::string image(8, '\0');
  image[0] = static_cast<char>(header.size());
  image += header + std::string(8, '\1');
  dir_.Write("model.safetensors", image);
  auto checkpoint = Checkpoint::Open(dir_.path().string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto values = (*checkpoint)->LoadF32("ids", {2});
  EXPECT_EQ(values.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(values.status()), AllOf(HasSubstr("'ids'"), HasSubstr("I32")));
}

}  // namespace
}  // namespace tandem
