// Start-up calibration of a verifier's cost model: a few short synthetic requests per mode at a
// few batch sizes, run through the engine like real traffic before the verifier serves, so
// that the router's mode policy has measured step times and tokens per step from the first
// request on. The engine measures these steps as it measures every step (CostModelBuilder);
// calibration only makes traffic.
//
// Thread-safety: call from one thread while nothing else submits to the engine.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/engine/engine.h"

namespace tandem {

struct CalibrationOptions {
  // Modes to measure; a mode the engine refuses (e.g. `spec` without a default drafter, the
  // self-speculative modes on a checkpoint without a <|mask|> token) is skipped and named in
  // the result. Empty = the modes the router's policy may choose (AutoModes() in
  // common/cost_model.h).
  std::vector<std::string> modes;
  std::vector<int> batch_sizes = {1, 2, 4, 8};  // concurrent requests per round
  int tokens = 16;                              // completion tokens per request
  // Wall-time bound of the whole calibration: requests still running then are cancelled and no
  // round starts after it.
  absl::Duration budget = absl::Seconds(2);
};

struct CalibrationResult {
  std::vector<std::string> measured;  // modes that ran at least one round
  std::vector<std::string> skipped;   // "mode: why"
  int requests = 0;
  absl::Duration took;
  bool out_of_time = false;  // the budget ended it before every round ran
};

// InvalidArgument for options that cannot work (no batch size, tokens <= 0); modes the engine
// refuses are skipped, not errors.
absl::StatusOr<CalibrationResult> Calibrate(Engine& engine, const CalibrationOptions& options);

}  // namespace tandem
