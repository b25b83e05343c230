#include "services/common/logit_adjust_proto.h"

#include <algorithm>

namespace tandem {

LogitAdjust ToLogitAdjust(const v1::GenerateRequest& request) {
  const v1::SamplingParams& sampling = request.sampling();
  LogitAdjust adjust;
  adjust.presence_penalty = sampling.presence_penalty();
  adjust.frequency_penalty = sampling.frequency_penalty();
  adjust.repetition_penalty =
      sampling.repetition_penalty() == 0 ? 1.0f : sampling.repetition_penalty();
  adjust.logit_bias.assign(sampling.logit_bias().begin(), sampling.logit_bias().end());
  // A protobuf map's order is unspecified; the engine's is the ids'.
  std::sort(adjust.logit_bias.begin(), adjust.logit_bias.end());
  adjust.min_tokens = request.min_tokens();
  return adjust;
}

}  // namespace tandem
