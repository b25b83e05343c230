// A verifier's cost model: what one batched step costs as a function of the tokens in it, and
// what each decoding mode gains per sequence-step as a function of the load. The verifier's
// engine measures it (CostModelBuilder, fed by calibration at start-up and then by every real
// step), the verifier reports it in WorkerLoad, and the router's mode policy reads it to
// estimate each mode's goodput; the engine's per-step γ choice reads the same curve.
//
// Why step time over batch tokens rather than per mode: every mode's steps go through the same
// batched forward, so one curve fed by every step (mixed batches and prefill included) stays
// fresh for all modes; a mode's step time at load n is then the curve at the batch tokens n
// sequences of that mode put in a step (n × its measured extend tokens per sequence-step).
//
// Thread-safety: plain values (CostModel) and a builder owned by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// The modes an "auto" request may be given: lossless under their default options (greedy
// output equal to ar's, sampling in ar's distribution), in the order the router's policy
// breaks ties (cheapest first). Verifiers calibrate exactly these at start-up.
const std::vector<std::string>& AutoModes();

// One bucket of the step-time curve: steps whose batch tokens fell in [2^k, 2^(k+1)).
struct StepTimePoint {
  double batch_tokens = 0;  // mean batch tokens of the bucket's steps
  double step_seconds = 0;  // mean wall time of one step (plan, forward, consume, commit)
  int64_t samples = 0;      // steps observed
};

// One bucket of a mode's load curve: sequence-steps of the mode taken while the verifier held
// [2^k, 2^(k+1)) sequences decoding in that mode (its own load; other modes' sequences in the
// same steps do not count).
struct ModeLoadPoint {
  double sequences = 0;        // mean resident sequences of the mode (the load)
  double tokens_per_step = 0;  // completion tokens a sequence gained per step (its TPF)
  double extend_tokens = 0;    // tokens a sequence put into the batch per step
  // Seconds a sequence waited between the end of its previous step and the start of this one:
  // steps it sat out (a spec sequence waiting for its draft chain, or a batch it did not fit
  // in) and the host work between steps. It is what the step-time curve does not see: a mode
  // whose sequences often wait decodes slower than its TPF and extend tokens alone suggest.
  double wait_seconds = 0;
  // Mean wall time of the steps taken while every resident sequence ran this mode (those that
  // sat the step out included): the mode's own step time at this load, with whatever its steps
  // cost beyond the forward (on a shared host, a drafter's work competing with the verifier's)
  // — what the shared curve, fed by every step, blurs. 0 when no such step was seen.
  double step_seconds = 0;
  // Mean seconds from a request's submission to the end of the step that took the last of its
  // prompt (its first token), for requests that started at this load: queueing, prefill, and
  // whatever a mode does before its first token (a `spec` request opening its drafter session
  // while the drafter takes the same prompt). What a request pays once, not per token: at a
  // few short requests it decides between modes whose per-token rates tie. 0 when no request
  // started at this load.
  double start_seconds = 0;
  int64_t samples = 0;  // sequence-steps observed
};

struct CostModel {
  std::vector<StepTimePoint> step_times;  // by batch_tokens, ascending
  // Per mode name, by sequences ascending. Only modes measured at least once appear.
  std::map<std::string, std::vector<ModeLoadPoint>, std::less<>> modes;
  // Mean completion tokens of the verifier's finished requests (any mode; 0 = none yet): the
  // length over which a mode's start cost is spread.
  double request_tokens = 0;

  bool empty() const { return step_times.empty() && modes.empty(); }
  // Seconds of a step of `batch_tokens`: piecewise linear between points; below the first point
  // its value (a step's fixed cost dominates there); above the last the slope of the last two
  // points continues (never decreasing). nullopt without points.
  std::optional<double> StepSeconds(double batch_tokens) const;
  // Seconds one more token adds to a step of `batch_tokens` (the curve's slope there, >= 0).
  // nullopt with fewer than two points.
  std::optional<double> MarginalSeconds(double batch_tokens) const;
  // The mode's TPF and extend tokens at `sequences`, interpolated linearly between its points
  // and held constant beyond them; its start cost likewise, from the points that measured one
  // (the nearest of them where neither neighbour did). nullopt when the mode has no point.
  std::optional<ModeLoadPoint> ModeAt(std::string_view mode, double sequences) const;
  // Completion tokens per second of `sequences` sequences all decoding in `mode`, each serving
  // requests of L completion tokens one after another: sequences × L / (start + L × per token),
  // with per token = (step seconds + wait seconds) / TPF and start the mode's start_seconds
  // (Little's law for a closed loop of `sequences` clients). Step seconds is the mode's own
  // measured step time at that load (interpolated between its points; beyond its last point,
  // scaled along the curve by StepSeconds(sequences × extend) / StepSeconds(at that point)), or
  // the curve alone where the mode has no step time. L is `request_tokens` when positive, else
  // the model's request_tokens; without an L or a start cost the estimate is the steady rate
  // sequences / per token. nullopt without data for the mode or the curve.
  std::optional<double> Goodput(std::string_view mode, double sequences,
                                double request_tokens = 0) const;
  // Whether `mode` has a point measured near `sequences` (within a factor of two) from at least
  // `min_samples` sequence-steps: an estimate there is a measurement, not an extrapolation.
  bool MeasuredNear(std::string_view mode, double sequences, int64_t min_samples) const;
};

// Accumulates a CostModel from observations: per power-of-two bucket, a running mean over the
// first kKeep observations, then a mean that forgets with time (a weight decaying as
// exp(-age / tau) per observation) but always keeps at least kKeep observations' worth of
// its past, so the model follows the machine as it warms up or gets busier, a bucket in use
// averages over its last tau seconds whatever the step rate, and a bucket seldom visited is
// not replaced by its next observation.
//
// Why time and not a count: one sequence-step's tokens vary from 1 to γ + 1 with the text, and
// a step's time with what else shared it (a prefill, the drafter's work, the host), so an
// estimate needs many of them. A fixed count of about 100 (a weight of 0.02 on the newest) was
// about a second of traffic when a step took 10 ms, but 40 ms of it on the bundled models'
// 0.4 ms steps: there `ar`'s estimated goodput at C = 2 swung by ±15 % from one load report to
// the next while its throughput held steady, and auto left `ar` for `spec`, 20 % slower, on
// such a swing. tau = 2 s matches the policy's confirm time: an estimate is the average over
// about the span a switch must last.
//
// Thread-safety: one thread (the engine's).
class CostModelBuilder {
 public:
  static constexpr double kKeep = 50;  // observations a mean never forgets
  // `clock`: seconds on a steady clock (tests pass their own); default: the process's.
  explicit CostModelBuilder(double tau_seconds = 2.0, std::function<double()> clock = nullptr);

  // One batched step of `batch_tokens` > 0 tokens that took `seconds`.
  void ObserveStep(int batch_tokens, double seconds);
  // One sequence's decode step in `mode`: the verifier held `sequences` resident sequences in
  // that mode (this one included); this one put `extend_tokens` tokens into the step and gained
  // `gained` completion tokens, after waiting `wait_seconds` since its previous step ended; the
  // step took `step_seconds` (0: not this mode's step time — the engine passes it only for
  // steps taken while every resident sequence ran this mode, since a mixed step's time belongs
  // to the mix, not to any one of its modes).
  void ObserveSequenceStep(std::string_view mode, int sequences, int gained, int extend_tokens,
                           double wait_seconds = 0, double step_seconds = 0);
  // A request in `mode` got its first token `seconds` after its submission, with `sequences`
  // resident sequences in that mode (this one included).
  void ObserveStart(std::string_view mode, int sequences, double seconds);
  // A request finished normally (a stop or its length) with `completion_tokens` tokens.
  void ObserveFinished(int completion_tokens);

  CostModel Snapshot() const;

 private:
  // A mean over observations weighted by their age (see the class comment).
  struct Mean {
    double value = 0;
    double weight = 0;  // observations' worth of past it holds
    double last = 0;    // clock of the newest observation
    int64_t samples = 0;
  };
  struct Bucket {
    Mean x;      // batch tokens or sequences
    Mean y;      // step seconds or tokens per step
    Mean z;      // extend tokens (modes only)
    Mean wait;   // wait seconds (modes only)
    Mean step;   // the mode's own step seconds (modes only; some sequence-steps)
    Mean start;  // start seconds (modes only; a request's first token)
  };
  void Add(Mean& mean, double value, double now) const;
  Bucket& ModeBucket(std::string_view mode, int sequences);

  double tau_;
  std::function<double()> clock_;
  std::vector<Bucket> steps_;                                      // index = bucket
  std::map<std::string, std::vector<Bucket>, std::less<>> modes_;  // index = bucket
  Mean request_tokens_;
};

}  // namespace tandem
