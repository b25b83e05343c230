#include "worker/engine/calibration.h"

#include <algorithm>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

namespace {

// Prose, so that drafts and Jacobi guesses meet text like real traffic's rather than noise.
constexpr const char* kPrompts[] = {
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The quick brown fox jumps over the lazy dog. The dog did not move, because",
    "Here is a short story about a robot that learned to paint. One morning",
    "In the beginning of the school year, the teacher asked every student to",
};

struct RoundState {
  absl::Mutex mu;
  int finished ABSL_GUARDED_BY(mu) = 0;
  absl::Status error ABSL_GUARDED_BY(mu);
};

// Counts the finished requests of one round.
class RoundSink : public SequenceSink {
 public:
  explicit RoundSink(std::shared_ptr<RoundState> state) : state_(std::move(state)) {}
  void OnEvent(SequenceEvent event) override;

 private:
  std::shared_ptr<RoundState> state_;
};

void RoundSink::OnEvent(SequenceEvent event) {
  if (event.finish == FinishReason::kNone && event.error.ok()) return;
  absl::MutexLock lock(&state_->mu);
  ++state_->finished;
  if (!event.error.ok() && state_->error.ok()) state_->error = event.error;
}

}  // namespace

absl::StatusOr<CalibrationResult> Calibrate(Engine& engine, const CalibrationOptions& options) {
  if (options.batch_sizes.empty() || options.tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration needs at least one batch size and tokens > 0, got ",
                     options.batch_sizes.size(), " sizes and ", options.tokens, " tokens"));
  }
  for (int size : options.batch_sizes) {
    if (size <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration batch sizes must be positive, got ", size));
    }
  }
  std::vector<std::string> modes = options.modes;
  if (modes.empty()) modes = AutoModes();

  CalibrationResult result;
  const absl::Time start = absl::Now();
  const absl::Time end = start + options.budget;
  std::vector<std::string> refused;  // modes the engine refused: not tried again
  // Small batches of every mode first, so that a short budget still measures every mode.
  for (int size : options.batch_sizes) {
    for (const std::string& mode : modes) {
      if (std::find(refused.begin(), refused.end(), mode) != refused.end()) continue;
      if (absl::Now() >= end) {
        result.out_of_time = true;
        break;
      }
      auto state = std::make_shared<RoundState>();
      std::vector<uint64_t> ids;
      for (int i = 0; i < size; ++i) {
        SequenceRequest request;
        request.request_id = absl::StrCat("calibration-", mode, "-", size, "-", i);
        request.prompt = kPrompts[i % std::size(kPrompts)];
        request.mode = mode;
        request.max_tokens = options.tokens;
        request.sampling.temperature = 0;
        request.sampling.seed = static_cast<uint64_t>(i);
        request.deadline = end;
        request.synthetic = true;
        absl::StatusOr<uint64_t> id =
            engine.Submit(std::move(request), std::make_shared<RoundSink>(state));
        if (!id.ok()) {
          if (id.status().code() == absl::StatusCode::kInvalidArgument && ids.empty()) {
            refused.push_back(mode);
            result.skipped.push_back(absl::StrCat(mode, ": ", id.status().message()));
            break;
          }
          // Submitted ones still finish; the rest of the round is lost.
          break;
        }
        ids.push_back(*id);
      }
      if (ids.empty()) continue;
      result.requests += static_cast<int>(ids.size());
      const int expected = static_cast<int>(ids.size());
      {
        absl::MutexLock lock(&state->mu);
        auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
          return state->finished >= expected;
        };
        // The deadline ends the requests themselves; the extra second covers that message.
        if (!state->mu.AwaitWithDeadline(absl::Condition(&done), end + absl::Seconds(1))) {
          for (uint64_t id : ids) engine.Cancel(id);
          state->mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(5));
        }
      }
      if (std::find(result.measured.begin(), result.measured.end(), mode) ==
          result.measured.end()) {
        result.measured.push_back(mode);
      }
    }
    if (result.out_of_time) break;
  }
  result.took = absl::Now() - start;
  return result;
}

}  // namespace tandem
