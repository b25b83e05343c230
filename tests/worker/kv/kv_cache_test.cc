#include "worker/kv/kv_cache.h"

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

KvCacheOptions SmallOptions(int32_t blocks) {
  return {.num_layers = 2, .num_kv_heads = 1, .head_dim = 2, .block_size = 4, .num_blocks = blocks};
}

// Writes a recognisable value into every tentative slot: 1000 * layer + 10 * slot (+1 for V).
void FillTentative(KvCache& kv, SeqId seq) {
  const int first = kv.CommittedLength(seq);
  for (int l = 0; l < 2; ++l) {
    for (int i = 0; i < kv.TentativeLength(seq); ++i) {
      float* k = kv.KeyRow(seq, l, first + i);
      float* v = kv.ValueRow(seq, l, first + i);
      k[0] = k[1] = 1000.0f * l + 10.0f * (first + i);
      v[0] = v[1] = k[0] + 1.0f;
    }
  }
}

TEST(BlockAllocatorTest, HandsOutEveryBlockOnceThenNothing) {
  BlockAllocator alloc(3);
  std::vector<int32_t> got;
  while (auto b = alloc.Allocate()) got.push_back(*b);
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(alloc.num_free(), 0);
  alloc.Free(got[1]);
  EXPECT_EQ(alloc.Allocate(), got[1]);
}

TEST(KvCacheTest, ReserveReportsNoRoomAndChangesNothing) {
  KvCache kv(SmallOptions(3));  // 12 token slots
  ASSERT_TRUE(kv.AddSequence(1).ok());
  ASSERT_TRUE(kv.AddSequence(2).ok());
  ASSERT_EQ(kv.Reserve(1, 9), 0);  // 3 blocks
  EXPECT_EQ(kv.free_blocks(), 0);
  EXPECT_FALSE(kv.Reserve(2, 1).has_value());
  EXPECT_EQ(kv.TentativeLength(2), 0);
  kv.RemoveSequence(1);
  EXPECT_EQ(kv.free_blocks(), 3);
  EXPECT_EQ(kv.Reserve(2, 1), 0);
  EXPECT_DOUBLE_EQ(kv.UsageRatio(), 1.0 / 3.0);
}

TEST(KvCacheTest, CommitCompactsKeptTokensInOrderAndFreesTheRest) {
  KvCache kv(SmallOptions(8));
  ASSERT_TRUE(kv.AddSequence(7).ok());
  ASSERT_EQ(kv.Reserve(7, 3), 0);
  FillTentative(kv, 7);
  ASSERT_TRUE(kv.Commit(7, std::vector<int32_t>{0, 1, 2}).ok());
  ASSERT_EQ(kv.Reserve(7, 9), 3);  // slots 3..11
  FillTentative(kv, 7);
  EXPECT_EQ(kv.free_blocks(), 5);
  const std::vector<int32_t> keep = {1, 4, 8};  // slots 4, 7, 11 -> 3, 4, 5
  ASSERT_TRUE(kv.Commit(7, keep).ok());
  EXPECT_EQ(kv.CommittedLength(7), 6);
  EXPECT_EQ(kv.free_blocks(), 6);  // 6 tokens fit in 2 blocks
  const float expected_slots[] = {0, 10, 20, 40, 70, 110};
  for (int l = 0; l < 2; ++l) {
    for (int s = 0; s < 6; ++s) {
      EXPECT_EQ(kv.KeyRow(7, l, s)[1], 1000.0f * l + expected_slots[s])
          << "layer " << l << " slot " << s;
      EXPECT_EQ(kv.ValueRow(7, l, s)[0], 1000.0f * l + expected_slots[s] + 1.0f);
    }
  }
}

TEST(KvCacheTest, CommitRejectsUnorderedOrOutOfRangeIndices) {
  KvCache kv(SmallOptions(4));
  ASSERT_TRUE(kv.AddSequence(1).ok());
  ASSERT_TRUE(kv.Reserve(1, 3).has_value());
  EXPECT_EQ(kv.Commit(1, std::vector<int32_t>{1, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Commit(1, std::vector<int32_t>{3}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Commit(99, {}).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(kv.Commit(1, {}).ok());
  EXPECT_EQ(kv.CommittedLength(1), 0);
  EXPECT_EQ(kv.free_blocks(), 4);
}

TEST(KvCacheTest, TruncateDropsTailAndReserveAgainReplacesTentative) {
  KvCache kv(SmallOptions(4));
  ASSERT_TRUE(kv.AddSequence(1).ok());
  ASSERT_TRUE(kv.Reserve(1, 10).has_value());
  ASSERT_TRUE(kv.Commit(1, std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}).ok());
  ASSERT_TRUE(kv.Truncate(1, 5).ok());
  EXPECT_EQ(kv.CommittedLength(1), 5);
  EXPECT_EQ(kv.free_blocks(), 2);
  ASSERT_EQ(kv.Reserve(1, 11), 5);
  EXPECT_EQ(kv.free_blocks(), 0);
  ASSERT_EQ(kv.Reserve(1, 1), 5);  // a smaller reservation gives blocks back
  EXPECT_EQ(kv.free_blocks(), 2);
  EXPECT_FALSE(kv.Truncate(1, 6).ok());
}

TEST(KvCacheTest, DuplicateSequenceIsAnError) {
  KvCache kv(SmallOptions(1));
  ASSERT_TRUE(kv.AddSequence(3).ok());
  EXPECT_EQ(kv.AddSequence(3).code(), absl::StatusCode::kAlreadyExists);
}

// A storage that records the row moves each commit describes.
class RecordingStorage final : public KvStorage {
 public:
  struct Call {
    SeqId seq;
    std::vector<int32_t> blocks;
    int committed;
    std::vector<int32_t> keep;
  };
  explicit RecordingStorage(std::vector<Call>* calls) : calls_(calls) {}
  void Commit(SeqId seq, std::span<const int32_t> blocks, int committed,
              std::span<const int32_t> keep) override {
    calls_->push_back({seq, {blocks.begin(), blocks.end()}, committed, {keep.begin(), keep.end()}});
  }
  void CopyBlock(int32_t /*from*/, int32_t /*to*/) override {}
  size_t ElementBytes() const override { return 2; }

 private:
  std::vector<Call>* calls_;
};

TEST(KvStorageTest, CommitDescribesRowMovesToAnExternalStorage) {
  std::vector<RecordingStorage::Call> calls;
  KvCacheOptions options = SmallOptions(8);
  options.make_storage = [&calls](const KvCacheOptions&) {
    return std::make_unique<RecordingStorage>(&calls);
  };
  KvCache kv(options);
  EXPECT_EQ(kv.host_storage(), nullptr);
  EXPECT_EQ(kv.BytesPerToken(), 2u * 2 * 2 * 2);  // K and V, 2 layers, 2 elements, 2 bytes
  ASSERT_TRUE(kv.AddSequence(3).ok());
  ASSERT_EQ(kv.Reserve(3, 5), 0);
  const std::vector<int32_t> prefix = {0, 1, 2};
  ASSERT_TRUE(kv.Commit(3, prefix).ok());  // a kept prefix moves nothing
  EXPECT_TRUE(calls.empty());
  ASSERT_EQ(kv.Reserve(3, 6), 3);  // slots 3..8: blocks 0, 1, 2
  const std::vector<int32_t> blocks(kv.BlockTable(3).begin(), kv.BlockTable(3).end());
  ASSERT_EQ(blocks.size(), 3u);
  const std::vector<int32_t> keep = {0, 2, 5};
  ASSERT_TRUE(kv.Commit(3, keep).ok());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].seq, 3);
  EXPECT_EQ(calls[0].blocks, blocks);  // the table before the commit freed block 2
  EXPECT_EQ(calls[0].committed, 3);
  EXPECT_EQ(calls[0].keep, keep);
  EXPECT_EQ(kv.BlockTable(3).size(), 2u);  // 6 committed tokens
  // Invalid indices are rejected before the storage hears of them.
  ASSERT_EQ(kv.Reserve(3, 2), 6);
  const std::vector<int32_t> bad = {1, 1};
  EXPECT_FALSE(kv.Commit(3, bad).ok());
  EXPECT_EQ(calls.size(), 1u);
  ASSERT_TRUE(kv.Truncate(3, 2).ok());  // truncation moves no rows
  EXPECT_EQ(calls.size(), 1u);
}

TEST(KvStorageTest, HostStorageIsTheDefault) {
  KvCache kv(SmallOptions(2));
  ASSERT_NE(kv.host_storage(), nullptr);
  EXPECT_EQ(kv.Keys(1), kv.host_storage()->Keys(1));
  EXPECT_EQ(kv.BytesPerToken(), 2u * 2 * 2 * sizeof(float));
}

TEST(KvStorageTest, HostStorageRandomizesEveryRowWithinBoundsAsAFunctionOfTheSeed) {
  KvCache a(SmallOptions(2)), b(SmallOptions(2)), c(SmallOptions(2));
  ASSERT_TRUE(a.storage().Randomize(11, 0.5f).ok());
  ASSERT_TRUE(b.storage().Randomize(11, 0.5f).ok());
  ASSERT_TRUE(c.storage().Randomize(12, 0.5f).ok());
  const size_t pool = 2 * 4 * 2;  // blocks * block_size * row elements
  std::vector<float> seen;
  for (int l = 0; l < 2; ++l) {
    for (size_t i = 0; i < pool; ++i) {
      for (const float v : {a.Keys(l)[i], a.Values(l)[i]}) {
        EXPECT_GE(v, -0.5f);
        EXPECT_LT(v, 0.5f);
        seen.push_back(v);
      }
      EXPECT_EQ(a.Keys(l)[i], b.Keys(l)[i]);
      EXPECT_EQ(a.Values(l)[i], b.Values(l)[i]);
      EXPECT_NE(a.Keys(l)[i], c.Keys(l)[i]);
    }
  }
  // Different values in different rows, pools and layers (no row repeats another).
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());
}

TEST(KvStorageTest, AStorageWithoutRandomizeSaysSo) {
  std::vector<RecordingStorage::Call> calls;
  RecordingStorage storage(&calls);
  EXPECT_EQ(storage.Randomize(1, 1.0f).code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace tandem
