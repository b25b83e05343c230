#include "common/cost_model.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <utility>

namespace tandem {

namespace {

// Power-of-two bucket of a positive count: 1 -> 0, 2..3 -> 1, 4..7 -> 2, ...
size_t BucketOf(int count) {
  return static_cast<size_t>(std::bit_width(static_cast<unsigned>(std::max(count, 1))) - 1);
}

}  // namespace

const std::vector<std::string>& AutoModes() {
  static const std::vector<std::string> modes = {"ar",  "spec",  "self_spec", "self_spec_quadratic",
                                                 "isd", "jacobi"};
  return modes;
}

std::optional<double> CostModel::StepSeconds(double batch_tokens) const {
  if (step_times.empty()) return std::nullopt;
  const std::vector<StepTimePoint>& p = step_times;
  if (p.size() == 1 || batch_tokens <= p.front().batch_tokens) return p.front().step_seconds;
  for (size_t i = 1; i < p.size(); ++i) {
    if (batch_tokens <= p[i].batch_tokens) {
      const double span = p[i].batch_tokens - p[i - 1].batch_tokens;
      if (span <= 0) return p[i].step_seconds;
      const double f = (batch_tokens - p[i - 1].batch_tokens) / span;
      return p[i - 1].step_seconds + f * (p[i].step_seconds - p[i - 1].step_seconds);
    }
  }
  const StepTimePoint& last = p.back();
  const StepTimePoint& before = p[p.size() - 2];
  const double span = last.batch_tokens - before.batch_tokens;
  const double slope =
      span > 0 ? std::max(0.0, (last.step_seconds - before.step_seconds) / span) : 0.0;
  return last.step_seconds + slope * (batch_tokens - last.batch_tokens);
}

std::optional<double> CostModel::MarginalSeconds(double batch_tokens) const {
  const std::vector<StepTimePoint>& p = step_times;
  if (p.size() < 2) return std::nullopt;
  // The segment around `batch_tokens`; the first or last one outside the measured range.
  size_t i = 1;
  while (i + 1 < p.size() && batch_tokens > p[i].batch_tokens) ++i;
  const double span = p[i].batch_tokens - p[i - 1].batch_tokens;
  if (span <= 0) return 0.0;
  return std::max(0.0, (p[i].step_seconds - p[i - 1].step_seconds) / span);
}

namespace {

// The mode's point at `sequences` from its points p (non-empty, by sequences ascending), start
// cost aside: interpolated between neighbours, held beyond the ends.
ModeLoadPoint Interpolate(const std::vector<ModeLoadPoint>& p, double sequences) {
  if (sequences <= p.front().sequences) return p.front();
  if (sequences >= p.back().sequences) return p.back();
  for (size_t i = 1; i < p.size(); ++i) {
    if (sequences <= p[i].sequences) {
      const double span = p[i].sequences - p[i - 1].sequences;
      if (span <= 0) return p[i];
      const double f = (sequences - p[i - 1].sequences) / span;
      auto mix = [f](double a, double b) { return a + f * (b - a); };
      ModeLoadPoint out;
      out.sequences = sequences;
      out.tokens_per_step = mix(p[i - 1].tokens_per_step, p[i].tokens_per_step);
      out.extend_tokens = mix(p[i - 1].extend_tokens, p[i].extend_tokens);
      out.wait_seconds = mix(p[i - 1].wait_seconds, p[i].wait_seconds);
      out.step_seconds = mix(p[i - 1].step_seconds, p[i].step_seconds);
      const double a = p[i - 1].start_seconds;
      const double b = p[i].start_seconds;
      out.start_seconds = a > 0 && b > 0 ? mix(a, b) : std::max(a, b);
      out.samples = std::min(p[i - 1].samples, p[i].samples);
      return out;
    }
  }
  return p.back();
}

}  // namespace

std::optional<ModeLoadPoint> CostModel::ModeAt(std::string_view mode, double sequences) const {
  auto it = modes.find(mode);
  if (it == modes.end() || it->second.empty()) return std::nullopt;
  const std::vector<ModeLoadPoint>& p = it->second;
  ModeLoadPoint out = Interpolate(p, sequences);
  // A start measured on one side only is held, not blended with the other's 0; where neither
  // side saw a request start (its requests started at other loads), the nearest load's start.
  if (out.start_seconds <= 0) {
    double nearest = -1;
    for (const ModeLoadPoint& point : p) {
      if (point.start_seconds <= 0) continue;
      const double distance = std::abs(point.sequences - sequences);
      if (nearest < 0 || distance < nearest) {
        nearest = distance;
        out.start_seconds = point.start_seconds;
      }
    }
  }
  return out;
}

std::optional<double> CostModel::Goodput(std::string_view mode, double sequences,
                                         double request_tokens) const {
  if (sequences <= 0) return std::nullopt;
  const std::optional<ModeLoadPoint> point = ModeAt(mode, sequences);
  if (!point) return std::nullopt;
  const std::optional<double> curve = StepSeconds(sequences * std::max(1.0, point->extend_tokens));
  double seconds = curve.value_or(0);
  if (point->step_seconds > 0) {
    seconds = point->step_seconds;
    const ModeLoadPoint& last = modes.find(mode)->second.back();
    if (sequences > last.sequences && curve) {
      // Beyond the mode's measured loads: its last step time, grown as the curve grows.
      const std::optional<double> at_last =
          StepSeconds(last.sequences * std::max(1.0, last.extend_tokens));
      if (at_last && *at_last > 0) seconds *= std::max(1.0, *curve / *at_last);
    }
  }
  if (seconds <= 0) return std::nullopt;
  const double step = seconds + std::max(0.0, point->wait_seconds);
  const double length = request_tokens > 0 ? request_tokens : this->request_tokens;
  if (length <= 0 || point->start_seconds <= 0 || point->tokens_per_step <= 0) {
    return sequences * point->tokens_per_step / step;
  }
  return sequences * length / (point->start_seconds + length * step / point->tokens_per_step);
}

bool CostModel::MeasuredNear(std::string_view mode, double sequences, int64_t min_samples) const {
  auto it = modes.find(mode);
  if (it == modes.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(), [&](const ModeLoadPoint& p) {
    return p.samples >= min_samples && p.sequences * 2 >= sequences && p.sequences <= sequences * 2;
  });
}

CostModelBuilder::CostModelBuilder(double tau_seconds, std::function<double()> clock)
    : tau_(tau_seconds), clock_(std::move(clock)) {
  if (!clock_) {
    clock_ = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
}

void CostModelBuilder::Add(Mean& mean, double value, double now) const {
  ++mean.samples;
  double past = mean.weight;
  // Past kKeep observations' worth, the past fades with its age, down to kKeep of them.
  if (past > kKeep && tau_ > 0) {
    past = std::max(kKeep, past * std::exp(-std::max(0.0, now - mean.last) / tau_));
  }
  mean.value += (value - mean.value) / (past + 1);
  mean.weight = past + 1;
  mean.last = now;
}

CostModelBuilder::Bucket& CostModelBuilder::ModeBucket(std::string_view mode, int sequences) {
  auto it = modes_.find(mode);
  if (it == modes_.end()) it = modes_.emplace(std::string(mode), std::vector<Bucket>()).first;
  const size_t k = BucketOf(sequences);
  if (it->second.size() <= k) it->second.resize(k + 1);
  return it->second[k];
}

void CostModelBuilder::ObserveStep(int batch_tokens, double seconds) {
  if (batch_tokens <= 0 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  const size_t k = BucketOf(batch_tokens);
  if (steps_.size() <= k) steps_.resize(k + 1);
  const double now = clock_();
  Add(steps_[k].x, batch_tokens, now);
  Add(steps_[k].y, seconds, now);
}

void CostModelBuilder::ObserveSequenceStep(std::string_view mode, int sequences, int gained,
                                           int extend_tokens, double wait_seconds,
                                           double step_seconds) {
  if (sequences <= 0 || gained < 0 || extend_tokens <= 0) return;
  if (!(wait_seconds >= 0) || !std::isfinite(wait_seconds)) wait_seconds = 0;
  if (!(step_seconds >= 0) || !std::isfinite(step_seconds)) step_seconds = 0;
  Bucket& bucket = ModeBucket(mode, sequences);
  const double now = clock_();
  Add(bucket.x, sequences, now);
  Add(bucket.y, gained, now);
  Add(bucket.z, extend_tokens, now);
  Add(bucket.wait, wait_seconds, now);
  // Step times come only from some sequence-steps (see above): their own mean.
  if (step_seconds > 0) Add(bucket.step, step_seconds, now);
}

void CostModelBuilder::ObserveStart(std::string_view mode, int sequences, double seconds) {
  if (sequences <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  Add(ModeBucket(mode, sequences).start, seconds, clock_());
}

void CostModelBuilder::ObserveFinished(int completion_tokens) {
  if (completion_tokens <= 0) return;
  Add(request_tokens_, completion_tokens, clock_());
}

CostModel CostModelBuilder::Snapshot() const {
  CostModel model;
  model.request_tokens = request_tokens_.value;
  for (const Bucket& b : steps_) {
    if (b.y.samples == 0) continue;
    model.step_times.push_back(StepTimePoint{
        .batch_tokens = b.x.value, .step_seconds = b.y.value, .samples = b.y.samples});
  }
  for (const auto& [mode, buckets] : modes_) {
    std::vector<ModeLoadPoint>& points = model.modes[mode];
    for (const Bucket& b : buckets) {
      if (b.y.samples == 0) continue;
      points.push_back(ModeLoadPoint{.sequences = b.x.value,
                                     .tokens_per_step = b.y.value,
                                     .extend_tokens = b.z.value,
                                     .wait_seconds = b.wait.value,
                                     .step_seconds = b.step.value,
                                     .start_seconds = b.start.value,
                                     .samples = b.y.samples});
    }
  }
  return model;
}

}  // namespace tandem
