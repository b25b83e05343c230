// `ar`: one token per forward — the reference every lossless mode must reproduce.
#pragma once

#include "worker/decoding/decoding_mode.h"

namespace tandem {

class ArMode : public DecodingMode {
 public:
  explicit ArMode(int vocab_size) : vocab_size_(vocab_size) {}

  std::string_view name() const override { return "ar"; }
  bool lossless() const override { return true; }
  StepPlan Plan(const DecodeState& state) override;
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override;

 private:
  int vocab_size_;
};

}  // namespace tandem
