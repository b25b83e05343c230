// SwiGLU's activation against its formula in double precision, and the split over threads: a row
// computed alone equals the same row in a many-row call bit for bit.
#include "kernels/cpu/activation.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kernels::cpu {
namespace {

TEST(SiluMulFusedTest, MatchesTheFormulaAndEachRowAlone) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const int inter : {1, 7, 512, 1000, 2048}) {
    for (const int rows : {1, 2, 5, 16}) {
      std::vector<float> gate_up(static_cast<size_t>(rows) * 2 * inter);
      for (float& x : gate_up) x = normal(rng);
      std::vector<float> out(static_cast<size_t>(rows) * inter, NAN);
      SiluMulFused(gate_up.data(), out.data(), rows, inter);
      for (int r = 0; r < rows; ++r) {
        const float* g = gate_up.data() + static_cast<size_t>(r) * 2 * inter;
        std::vector<float> alone(inter, NAN);
        SiluMulFused(g, alone.data(), 1, inter);
        EXPECT_EQ(std::memcmp(alone.data(), out.data() + static_cast<size_t>(r) * inter,
                              sizeof(float) * inter),
                  0)
            << "row " << r << " of " << rows << ", inter " << inter;
        for (int i = 0; i < inter; ++i) {
          const double x = g[i], u = g[inter + i];
          const double want = x / (1.0 + std::exp(-x)) * u;
          EXPECT_NEAR(out[static_cast<size_t>(r) * inter + i], want, 1e-5 * (1.0 + std::abs(want)))
              << r << ", " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cpu
