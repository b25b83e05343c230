// kernels/cuda embedding gather against the CPU path's row copy (bit-exact) on random tables and
// ids. Parameter checks run everywhere; the comparisons skip without a CUDA device.
#include "kernels/cuda/embedding.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "tests/kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using testing::Bf16;
using testing::ExpectInvalid;

EmbeddingParams ValidParams(const std::vector<int32_t>& ids, const std::vector<Bf16>& table,
                            std::vector<Bf16>& out) {
  EmbeddingParams p;
  p.ids = ids.data();
  p.table = table.data();
  p.out = out.data();
  p.tokens = 2;
  p.vocab = 4;
  p.hidden = 8;
  p.out_stride = 8;
  return p;
}

TEST(EmbeddingCheckTest, AcceptsValidAndEmpty) {
  std::vector<int32_t> ids(2);
  std::vector<Bf16> table(32), out(16);
  EmbeddingParams p = ValidParams(ids, table, out);
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  EXPECT_EQ(WorkspaceBytes(p), 0u);
  EmbeddingParams empty;
  empty.vocab = 4;
  empty.hidden = 8;
  empty.out_stride = 8;
  EXPECT_TRUE(empty.Check().ok()) << empty.Check();
}

TEST(EmbeddingCheckTest, RejectsBadFields) {
  std::vector<int32_t> ids(2);
  std::vector<Bf16> table(32), out(16);
  EmbeddingParams p = ValidParams(ids, table, out);
  p.tokens = -1;
  ExpectInvalid(p, "tokens");
  p = ValidParams(ids, table, out);
  p.vocab = 0;
  ExpectInvalid(p, "vocab");
  p = ValidParams(ids, table, out);
  p.hidden = 0;
  ExpectInvalid(p, "hidden");
  p = ValidParams(ids, table, out);
  p.out_stride = 7;
  ExpectInvalid(p, "out_stride");
  p = ValidParams(ids, table, out);
  p.ids = nullptr;
  ExpectInvalid(p, "ids");
  p = ValidParams(ids, table, out);
  p.table = nullptr;
  ExpectInvalid(p, "table");
  p = ValidParams(ids, table, out);
  p.out = table.data() + 4;
  ExpectInvalid(p, "overlaps");
}

TEST(EmbeddingCheckTest, TokenIdsAreValidatedOnTheHost) {
  const std::vector<int32_t> good = {0, 3, 1};
  EXPECT_TRUE(CheckTokenIds(good, 4).ok());
  const std::vector<int32_t> high = {0, 4};
  const absl::Status status = CheckTokenIds(high, 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("token id 4 at index 1"), std::string::npos) << status;
  const std::vector<int32_t> negative = {-1};
  EXPECT_FALSE(CheckTokenIds(negative, 4).ok());
}

class EmbeddingCudaTest : public testing::CudaTest {
 protected:
  // Gathers random ids from a random table into rows of `out_stride`; every element of every
  // output row must equal the table row bit for bit (padding columns stay NaN).
  void Run(int tokens, int vocab, int hidden, int out_stride, bool with_bad_ids) {
    SCOPED_TRACE(absl::StrCat("tokens ", tokens, " vocab ", vocab, " hidden ", hidden,
                              " out_stride ", out_stride));
    std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
    std::vector<int32_t> ids(tokens);
    for (int32_t& id : ids) id = pick(rng_);
    if (with_bad_ids && tokens >= 2) {
      ids[0] = -5;
      ids[1] = vocab + 7;
    }
    const std::vector<Bf16> table = testing::RandomBf16(rng_, size_t{1} * vocab * hidden, 0, 1);
    const size_t out_count = static_cast<size_t>(tokens) * out_stride;
    auto d_ids = testing::Upload(ids);
    auto d_table = testing::Upload(table);
    auto d_out = testing::Upload(testing::NanBf16(out_count));
    ASSERT_TRUE(d_ids.ok() && d_table.ok() && d_out.ok());
    EmbeddingParams p;
    p.ids = d_ids->get();
    p.table = d_table->get();
    p.out = d_out->get();
    p.tokens = tokens;
    p.vocab = vocab;
    p.hidden = hidden;
    p.out_stride = out_stride;
    ASSERT_TRUE(Invoke(p, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto got = testing::Download(p.out, out_count);
    ASSERT_TRUE(got.ok());
    int mismatches = 0;
    for (int t = 0; t < tokens; ++t) {
      // Device code clamps out-of-range ids (the documented contract).
      const int id = std::min(std::max(ids[t], 0), vocab - 1);
      for (int c = 0; c < out_stride; ++c) {
        const Bf16 g = (*got)[static_cast<size_t>(t) * out_stride + c];
        if (c < hidden) {
          const Bf16 w = table[static_cast<size_t>(id) * hidden + c];
          if (std::memcmp(&g, &w, sizeof(Bf16)) != 0 && ++mismatches <= 10) {
            ADD_FAILURE() << "[" << t << ", " << c << "] got " << __bfloat162float(g) << " want "
                          << __bfloat162float(w);
          }
        } else if (!std::isnan(__bfloat162float(g)) && ++mismatches <= 10) {
          ADD_FAILURE() << "padding [" << t << ", " << c << "] was written";
        }
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
};

TEST_F(EmbeddingCudaTest, GathersRowsExactly) {
  Run(1, 10, 8, 8, false);
  Run(37, 1000, 4096, 4096, false);  // vectorised path
  Run(5, 300, 1001, 1001, false);    // scalar path
  Run(6, 50, 64, 72, false);         // strided output rows
}

TEST_F(EmbeddingCudaTest, ClampsOutOfRangeIds) { Run(4, 20, 16, 16, true); }

}  // namespace
}  // namespace tandem::kernels::cuda
