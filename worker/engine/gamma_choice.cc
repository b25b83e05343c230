#include "worker/engine/gamma_choice.h"

#include <algorithm>
#include <cmath>

namespace tandem {

namespace {

// Fixed-point rounds; the choice settles in two or three on every batch tried.
constexpr int kRounds = 6;

// The largest γ <= max_gamma whose last draft still gains more than λ: α^k > λ for k = 1..γ.
int GammaAt(const GammaCandidate& c, double lambda) {
  int gamma = 0;
  double gain = 1;
  while (gamma < c.max_gamma) {
    gain *= std::clamp(c.acceptance, 0.0, 1.0);
    if (gain <= lambda) break;
    ++gamma;
  }
  return gamma;
}

}  // namespace

double ExpectedTokens(double acceptance, int gamma) {
  const double a = std::clamp(acceptance, 0.0, 1.0);
  double total = 1;
  double term = 1;
  for (int k = 1; k <= gamma; ++k) {
    term *= a;
    total += term;
  }
  return total;
}

std::vector<int> ChooseGammas(std::span<const GammaCandidate> candidates, const GammaBatch& batch,
                              const CostModel& cost) {
  std::vector<int> gammas(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) gammas[i] = std::max(0, candidates[i].max_gamma);
  if (cost.step_times.size() < 2) return gammas;
  // Dinkelbach-style rounds from the maximum: each round's goodput prices a batch token for the
  // next; the best vector seen by the model wins (the curve is only piecewise linear).
  std::vector<int> best = gammas;
  double best_goodput = -1;
  for (int round = 0; round < kRounds; ++round) {
    double tokens = batch.other_tokens + batch.candidate_tokens;
    double gain = batch.other_gain;
    for (size_t i = 0; i < candidates.size(); ++i) {
      tokens += gammas[i];
      gain += ExpectedTokens(candidates[i].acceptance, gammas[i]);
    }
    const double seconds = cost.StepSeconds(tokens).value_or(0);
    if (seconds <= 0) return best;
    const double goodput = gain / seconds;
    if (goodput > best_goodput) {
      best_goodput = goodput;
      best = gammas;
    }
    const double lambda = goodput * cost.MarginalSeconds(tokens).value_or(0);
    bool changed = false;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const int gamma = GammaAt(candidates[i], lambda);
      changed |= gamma != gammas[i];
      gammas[i] = gamma;
    }
    if (!changed) break;
  }
  return best;
}

void AcceptanceEstimate::Observe(int drafted, int accepted) {
  if (drafted <= 0) return;
  accepted = std::clamp(accepted, 0, drafted);
  hits_ = kDecay * hits_ + accepted;
  trials_ = kDecay * trials_ + accepted + (accepted < drafted ? 1 : 0);
}

}  // namespace tandem
