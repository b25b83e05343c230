#include "worker/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/sampling/philox.h"

namespace tandem {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// Top-k below this fraction of the vocabulary selects with a heap in one pass; above it, with
// nth_element over a copy.
constexpr size_t kHeapSelectRatio = 16;

// Top-p first narrows the vocabulary to the tokens whose weight (relative to the maximum, which
// is 1) reaches a floor, lowering the floor until those tokens hold the nucleus mass; a nucleus
// is usually a few dozen tokens of a ~150k vocabulary. Those candidates are then sorted lazily:
// the largest `chunk` are partitioned off and sorted, and the chunk grows geometrically until
// the cumulative mass reaches top_p.
constexpr float kNucleusFloors[] = {0x1.0p-10f, 0x1.0p-30f, 0.0f};
constexpr size_t kFirstTopPChunk = 64;
constexpr size_t kTopPChunkGrowth = 8;

void PointMass(size_t size, int32_t index, std::vector<float>* probs) {
  probs->assign(size, 0.0f);
  if (index >= 0) (*probs)[static_cast<size_t>(index)] = 1.0f;
}

// Writes the temperature-scaled logits shifted so the maximum is 0: z = (l - max) / T, in
// [-inf, 0]. NaN logits become -inf. Shifting before dividing keeps a tiny temperature from
// overflowing: the worst case is -inf, whose weight is 0 anyway. A +inf logit dominates every
// finite one, so the +inf tokens share the mass equally (the limit of softmax).
void ScaledLogits(std::span<const float> logits, float max_logit, double inv_temperature,
                  float* z) {
  const size_t n = logits.size();
  if (max_logit == kPosInf) {
    for (size_t i = 0; i < n; ++i) z[i] = logits[i] == kPosInf ? 0.0f : kNegInf;
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const float l = logits[i];
    // `!(l > -inf)` also catches NaN.
    z[i] = !(l > kNegInf)
               ? kNegInf
               : static_cast<float>((static_cast<double>(l) - max_logit) * inv_temperature);
  }
}

// The tokens whose z is at least the k-th largest z, in index order. Ties with the k-th value
// are all kept (so more than k may survive), matching transformers' TopKLogitsWarper; -inf
// tokens are left out since they get no mass anyway. Requires 0 < k < n.
void TopKSupport(const float* z, size_t n, size_t k, std::vector<int32_t>* support) {
  thread_local std::vector<float> largest;
  const auto greater = std::greater<float>();
  float threshold;
  if (k * kHeapSelectRatio <= n) {
    // Min-heap of the k largest values so far: past the first few thousand tokens nearly every
    // value loses the comparison with the heap's minimum, so this is one cheap pass.
    largest.assign(z, z + k);
    std::make_heap(largest.begin(), largest.end(), greater);
    for (size_t i = k; i < n; ++i) {
      if (z[i] > largest.front()) {
        std::pop_heap(largest.begin(), largest.end(), greater);
        largest.back() = z[i];
        std::push_heap(largest.begin(), largest.end(), greater);
      }
    }
    threshold = largest.front();
  } else {
    largest.assign(z, z + n);
    const auto kth = largest.begin() + static_cast<std::ptrdiff_t>(k - 1);
    std::nth_element(largest.begin(), kth, largest.end(), greater);
    threshold = *kth;
  }
  support->clear();
  for (size_t i = 0; i < n; ++i) {
    if (z[i] >= threshold && z[i] > kNegInf) support->push_back(static_cast<int32_t>(i));
  }
}

// Narrows a dense weight vector to the candidates for a nucleus of mass `needed`: every token
// of weight >= some floor, the floor chosen so that their mass exceeds `needed`. Weights below
// the floor are zeroed. The candidates are a prefix of the tokens by decreasing weight, so the
// nucleus lies within them.
void NucleusCandidates(float* w, size_t n, double needed, std::vector<int32_t>* support) {
  float floor = 0.0f;
  for (const float candidate_floor : kNucleusFloors) {
    floor = candidate_floor;
    support->clear();
    double mass = 0.0;
    for (size_t i = 0; i < n; ++i) {
      if (w[i] >= floor && w[i] > 0.0f) {
        support->push_back(static_cast<int32_t>(i));
        mass += w[i];
      }
    }
    // The margin covers summation-order rounding between this sum and the sorted one in
    // ApplyTopP: a candidate set that only just reaches `needed` is widened instead.
    if (mass > needed * (1.0 + 1e-9)) break;
  }
  for (size_t i = 0; i < n; ++i) {
    if (w[i] < floor) w[i] = 0.0f;
  }
}

// Keeps the smallest prefix of `support`, by decreasing weight (lowest index first among equal
// weights), whose mass reaches top_p of `total`; always at least one token. This is
// transformers' TopPLogitsWarper rule (drop a token when the mass strictly above it already
// reaches top_p). Zeroes the dropped weights, shrinks `support` to the kept tokens (in weight
// order) and returns their mass.
double ApplyTopP(float top_p, double total, float* w, std::vector<int32_t>* support) {
  std::vector<int32_t>& order = *support;
  const auto heavier = [w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
  const auto at = [&order](size_t rank) {
    return order.begin() + static_cast<std::ptrdiff_t>(rank);
  };
  const double needed = static_cast<double>(top_p) * total;
  const size_t count = order.size();
  size_t sorted = 0;
  size_t chunk_end = std::min(count, kFirstTopPChunk);
  double kept_mass = 0.0;
  while (sorted < count) {
    if (chunk_end < count) std::nth_element(at(sorted), at(chunk_end), order.end(), heavier);
    std::sort(at(sorted), at(chunk_end), heavier);
    for (size_t rank = sorted; rank < chunk_end; ++rank) {
      if (rank > 0 && kept_mass >= needed) {
        for (size_t dropped = rank; dropped < count; ++dropped) w[order[dropped]] = 0.0f;
        order.resize(rank);
        return kept_mass;
      }
      kept_mass += w[order[rank]];
    }
    sorted = chunk_end;
    chunk_end = std::min(count, chunk_end * kTopPChunkGrowth);
  }
  return kept_mass;
}

// Drops tokens whose weight is below min_p times the largest weight (the largest survives), over
// `support` when given, else over all n. Returns the kept mass.
double ApplyMinP(float min_p, float* w, size_t n, std::vector<int32_t>* support) {
  float max_weight = 0.0f;
  double kept_mass = 0.0;
  if (support != nullptr) {
    for (const int32_t i : *support) max_weight = std::max(max_weight, w[i]);
    const float threshold = std::min(min_p, 1.0f) * max_weight;
    std::erase_if(*support, [&](int32_t i) {
      if (w[i] >= threshold) {
        kept_mass += w[i];
        return false;
      }
      w[i] = 0.0f;
      return true;
    });
    return kept_mass;
  }
  max_weight = *std::max_element(w, w + n);
  const float threshold = std::min(min_p, 1.0f) * max_weight;
  for (size_t i = 0; i < n; ++i) {
    if (w[i] < threshold) {
      w[i] = 0.0f;
    } else {
      kept_mass += w[i];
    }
  }
  return kept_mass;
}

bool Usable(float p) { return p > 0.0f && p < kPosInf; }

// Inverse CDF over the entries `index(0..count)` of `probs`, visited in increasing index order.
// Entries that are not finite and positive are never drawn; -1 when there is none.
template <typename IndexAt>
int32_t InverseCdf(const float* probs, size_t count, IndexAt index, double u) {
  double total = 0.0;
  for (size_t j = 0; j < count; ++j) {
    const float p = probs[index(j)];
    if (Usable(p)) total += p;
  }
  if (total <= 0.0) return -1;
  if (!(u > 0.0)) u = 0.0;
  if (u >= 1.0) u = std::nextafter(1.0, 0.0);
  const double target = u * total;
  // Summing in the same order as `total` makes the final cumulative equal `total`; only when
  // u * total rounds up to `total` does the scan run off the end, and then the last usable
  // entry is the right answer.
  double cumulative = 0.0;
  int32_t last_usable = -1;
  for (size_t j = 0; j < count; ++j) {
    const auto i = static_cast<int32_t>(index(j));
    if (!Usable(probs[i])) continue;
    cumulative += probs[i];
    last_usable = i;
    if (cumulative > target) return last_usable;
  }
  return last_usable;
}

// SamplingDistribution's body. When the filters have narrowed the distribution, `support` holds
// the tokens with nonzero probability (in no particular order) and the result is true; false
// means any token may have mass.
bool Distribution(std::span<const float> logits, const SamplingParams& params,
                  std::vector<float>* probs, std::vector<int32_t>* support) {
  const size_t n = logits.size();
  if (n == 0) {
    probs->clear();
    return false;
  }
  const int32_t best = Argmax(logits);
  const float max_logit = logits[static_cast<size_t>(best)];
  // With no finite maximum there is nothing to normalise: fall back to the greedy token.
  if (params.greedy() || !(max_logit > kNegInf)) {
    PointMass(n, best, probs);
    support->assign(1, best);
    return true;
  }
  probs->resize(n);
  float* values = probs->data();
  // Order as in transformers' sampling warpers: temperature, top-k, top-p, min-p.
  ScaledLogits(logits, max_logit, 1.0 / static_cast<double>(params.temperature), values);
  bool sparse = false;
  double total = 0.0;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < n) {
    TopKSupport(values, n, static_cast<size_t>(params.top_k), support);
    thread_local std::vector<float> weights;
    weights.resize(support->size());
    for (size_t j = 0; j < support->size(); ++j) weights[j] = std::exp(values[(*support)[j]]);
    std::fill(values, values + n, 0.0f);
    for (size_t j = 0; j < support->size(); ++j) {
      values[(*support)[j]] = weights[j];
      total += weights[j];
    }
    sparse = true;
  } else {
    for (size_t i = 0; i < n; ++i) {
      values[i] = std::exp(values[i]);  // exp(-inf) = 0: -inf tokens get no mass
      total += values[i];
    }
  }
  if (params.top_p < 1.0f) {
    if (!sparse) {
      NucleusCandidates(values, n, static_cast<double>(params.top_p) * total, support);
      sparse = true;
    }
    total = ApplyTopP(params.top_p, total, values, support);
  }
  if (params.min_p > 0.0f) total = ApplyMinP(params.min_p, values, n, sparse ? support : nullptr);
  // The maximum has weight exp(0) = 1 and survives every filter, so total >= 1.
  const double inv_total = 1.0 / total;
  if (sparse) {
    for (const int32_t i : *support) values[i] = static_cast<float>(values[i] * inv_total);
  } else {
    for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(values[i] * inv_total);
  }
  return sparse;
}

}  // namespace

double UniformRandom(uint64_t seed, uint64_t position, RngPurpose purpose, uint32_t stream) {
  const PhiloxCounter counter = {static_cast<uint32_t>(position),
                                 static_cast<uint32_t>(position >> 32),
                                 static_cast<uint32_t>(purpose), stream};
  const PhiloxKey key = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const PhiloxCounter bits = Philox4x32_10(counter, key);
  const uint64_t mantissa = ((static_cast<uint64_t>(bits[0]) << 32) | bits[1]) >> 11;
  return static_cast<double>(mantissa) * 0x1.0p-53;
}

absl::Status CheckSamplingParams(const SamplingParams& params) {
  // The negated comparisons also catch NaN.
  if (!(params.temperature >= 0) || std::isinf(params.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature must be a finite number >= 0 (0 = greedy), got ", params.temperature));
  }
  if (params.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k must be >= 0 (0 = off), got ", params.top_k));
  }
  if (!(params.top_p >= 0 && params.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p must be within [0, 1] (1 = off), got ", params.top_p));
  }
  if (!(params.min_p >= 0 && params.min_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_p must be within [0, 1] (0 = off), got ", params.min_p));
  }
  return absl::OkStatus();
}

int32_t Argmax(std::span<const float> logits) {
  if (logits.empty()) return -1;
  // The first index of the maximum, where `>` skips NaN (every comparison with it is false);
  // an all -inf/NaN input answers 0. Two vector passes (a vocabulary row is in cache after the
  // first): the maximum, then the first value equal to it; four registers of four floats, which
  // every target has (a 32000-entry row: 25 us -> 2.5 us against the one-pass scalar scan).
  using Vec = float __attribute__((vector_size(16)));
  using Mask = int32_t __attribute__((vector_size(16)));
  constexpr size_t kStep = 16;
  const float* p = logits.data();
  const size_t n = logits.size();
  Vec a = {kNegInf, kNegInf, kNegInf, kNegInf}, b = a, c = a, d = a, w, x, y, z;
  auto load = [&](size_t i) {
    std::memcpy(&w, p + i, sizeof(w));
    std::memcpy(&x, p + i + 4, sizeof(x));
    std::memcpy(&y, p + i + 8, sizeof(y));
    std::memcpy(&z, p + i + 12, sizeof(z));
  };
  size_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    load(i);
    a = w > a ? w : a;
    b = x > b ? x : b;
    c = y > c ? y : c;
    d = z > d ? z : d;
  }
  float best = kNegInf;
  for (int l = 0; l < 4; ++l) best = std::max({best, a[l], b[l], c[l], d[l]});
  for (; i < n; ++i) best = p[i] > best ? p[i] : best;
  if (!(best > kNegInf)) return 0;
  const Vec target = {best, best, best, best};
  for (i = 0; i + kStep <= n; i += kStep) {
    load(i);
    const Mask equal = (w == target) | (x == target) | (y == target) | (z == target);
    uint64_t halves[2];
    std::memcpy(halves, &equal, sizeof(halves));
    if ((halves[0] | halves[1]) != 0) break;
  }
  while (p[i] != best) ++i;
  return static_cast<int32_t>(i);
}

void SamplingDistribution(std::span<const float> logits, const SamplingParams& params,
                          std::vector<float>* probs) {
  thread_local std::vector<int32_t> support;
  Distribution(logits, params, probs, &support);
}

int32_t SampleFromDistribution(std::span<const float> probs, double u) {
  return InverseCdf(
      probs.data(), probs.size(), [](size_t j) { return j; }, u);
}

int32_t SampleToken(std::span<const float> logits, const SamplingParams& params, uint64_t position,
                    RngPurpose purpose) {
  if (params.greedy()) return Argmax(logits);
  // Reused across calls on this thread: a 150k-entry allocation per token is measurable.
  thread_local std::vector<float> probs;
  thread_local std::vector<int32_t> support;
  const double u = UniformRandom(params.seed, position, purpose);
  if (!Distribution(logits, params, &probs, &support)) return SampleFromDistribution(probs, u);
  // Visiting the support in index order adds the same numbers in the same order as a scan of
  // the whole vector, so the token is exactly SampleFromDistribution's.
  std::sort(support.begin(), support.end());
  return InverseCdf(
      probs.data(), support.size(), [](size_t j) { return support[j]; }, u);
}

int32_t VerifyDraft(std::span<const float> logits, int32_t draft, const SamplingParams& sampling,
                    uint64_t index, bool* accepted, std::vector<float>* scratch) {
  if (sampling.greedy()) {
    const int32_t best = Argmax(logits);
    *accepted = best == draft;
    return best;
  }
  std::vector<float>& probs = *scratch;
  SamplingDistribution(logits, sampling, &probs);
  double total = 0;
  for (const float p : probs) total += p;
  const double p_draft = total > 0 ? probs[draft] / total : 0.0;
  *accepted = UniformRandom(sampling.seed, index, RngPurpose::kAccept) < p_draft;
  if (*accepted) return draft;
  probs[draft] = 0.0f;
  const int32_t token =
      SampleFromDistribution(probs, UniformRandom(sampling.seed, index, RngPurpose::kResample));
  // Only a degenerate p (all its mass on the draft, which would have been accepted) leaves
  // nothing to resample; the draft is then the token.
  return token >= 0 ? token : draft;
}

}  // namespace tandem
