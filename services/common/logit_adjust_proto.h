// A GenerateRequest's logit bias, penalties and min_tokens in the engine's terms, shared by the
// router (which checks them before it spends a verifier) and the verifier (which runs them).
//
// Thread-safety: pure functions.
#pragma once

#include "tandem/v1/generate.pb.h"
#include "worker/sampling/logit_adjust.h"

namespace tandem {

// The wire's conventions become the engine's: repetition_penalty 0 is off (1). The ban list of
// min_tokens is left to the engine. Unchecked: see CheckLogitAdjust.
LogitAdjust ToLogitAdjust(const v1::GenerateRequest& request);

}  // namespace tandem
