// SwiGLU's activation against its formula in double precision, every instruction set's version
// against the process's own bit for bit, and the split over threads: a row computed alone equals
// the same row in a many-row call bit for bit.
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

TEST(SiluMulFusedTest, EveryVersionGivesTheSameBits) {
  // Wide and extreme values: e^-|g| underflowing, the flush below -87, zeros of both signs.
  std::vector<float> gate = {0.0f,  -0.0f,  1e-30f, -1e-30f, 0.5f,   -0.5f,   20.0f, -20.0f,
                             86.9f, -86.9f, 87.5f,  -87.5f,  100.0f, -100.0f, 1e30f, -1e30f};
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 8.0f);
  while (gate.size() < 1003) gate.push_back(normal(rng));
  const int inter = static_cast<int>(gate.size());
  std::vector<float> gate_up(gate);
  for (int i = 0; i < inter; ++i) gate_up.push_back(normal(rng));
  std::vector<float> want(inter, NAN);
  SiluMulFused(gate_up.data(), want.data(), 1, inter);
  for (int i = 0; i < inter; ++i) {
    const double x = gate[i], u = gate_up[inter + i];
    const double exact = x / (1.0 + std::exp(-x)) * u;
    EXPECT_NEAR(want[i], exact, 1e-5 * (1.0 + std::abs(exact))) << "g " << x;
  }
  for (const char* version : ActivationKernelVersions()) {
    std::vector<float> got(inter, NAN);
    SiluMulFusedWith(version, gate_up.data(), got.data(), 1, inter);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * inter), 0) << version;
  }
}

}  // namespace
}  // namespace tandem::kernels::cpu
