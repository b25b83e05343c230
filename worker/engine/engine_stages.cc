#include "worker/engine/engine_stages.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/engine/engine_impl.h"

namespace tandem {

namespace {

StepPlan Chunk(std::span<const int32_t> tokens, int kv_len, int n) {
  StepPlan plan;
  plan.tokens.assign(tokens.begin() + kv_len, tokens.begin() + kv_len + n);
  plan.positions.resize(n);
  for (int i = 0; i < n; ++i) plan.positions[i] = kv_len + i;
  return plan;
}

}  // namespace

std::optional<StepPlan> PrefillSlice(std::span<const int32_t> tokens, int kv_len, int chunk_limit) {
  const int pending = static_cast<int>(tokens.size()) - kv_len;
  if (pending <= 1 || pending <= chunk_limit) return std::nullopt;
  return Chunk(tokens, kv_len, std::min(chunk_limit, pending - 1));
}

std::optional<StepPlan> EchoSlice(std::span<const int32_t> tokens, int kv_len, int chunk_limit,
                                  int prompt_len) {
  const int left = prompt_len - 1 - kv_len;
  if (left <= 0) return std::nullopt;
  StepPlan plan = Chunk(tokens, kv_len, std::min({chunk_limit, kMaxEchoRows, left}));
  plan.outputs.resize(plan.tokens.size());
  for (size_t i = 0; i < plan.outputs.size(); ++i) plan.outputs[i] = static_cast<int32_t>(i);
  return plan;
}

std::optional<StepPlan> ReplaySlice(std::span<const int32_t> tokens, int kv_len, int chunk_limit,
                                    int prompt_len, int exact_tokens) {
  if (exact_tokens <= 0 || prompt_len >= static_cast<int>(tokens.size())) {
    return PrefillSlice(tokens, kv_len, chunk_limit);
  }
  if (kv_len < prompt_len) {
    if (std::optional<StepPlan> slice =
            PrefillSlice(tokens.first(prompt_len), kv_len, chunk_limit)) {
      return slice;
    }
    return Chunk(tokens, kv_len, prompt_len - kv_len);
  }
  return PrefillSlice(tokens, kv_len, std::min(chunk_limit, exact_tokens));
}

std::shared_ptr<EngineSequence> PickVictim(
    std::span<const std::shared_ptr<EngineSequence>> running, const EngineSequence* seq,
    const std::function<bool(const EngineSequence*)>& in_batch) {
  for (auto it = running.rbegin(); it != running.rend(); ++it) {
    if (it->get() != seq && !in_batch(it->get())) return *it;
  }
  return nullptr;
}

ExtendOutput ModeView(ExtendOutput& out, size_t mode_layers, size_t tokens, int hidden_size) {
  const size_t mode_values = mode_layers * tokens * static_cast<size_t>(hidden_size);
  ExtendOutput view;
  view.logits = std::move(out.logits);
  view.tokens = out.tokens;
  view.accepted = out.accepted;
  view.hidden.assign(out.hidden.begin(), out.hidden.begin() + static_cast<ptrdiff_t>(std::min(
                                                                  mode_values, out.hidden.size())));
  return view;
}

Emitted AppendTokens(EngineSequence& s, std::span<const int32_t> append) {
  Emitted emitted;
  emitted.offset = static_cast<int>(s.tokens.size());
  for (int32_t token : append) {
    s.tokens.push_back(token);
    emitted.tokens.push_back(token);
    ++s.generated;
    absl::StatusOr<std::string> delta = s.detok->Push({&token, 1});
    if (!delta.ok()) {
      emitted.error = delta.status();
      break;
    }
    StopChecker::Step stop = s.checker->Push(token, *delta);
    emitted.text += stop.text;
    emitted.finish = stop.finish;
    if (emitted.finish != FinishReason::kNone) break;
    if (s.generated >= s.max_new) {  // the checker counts this too; kept for clarity
      emitted.finish = FinishReason::kLength;
      break;
    }
  }
  // Every mode draws its tokens from rows masked by the grammar; a token it refuses would be
  // a mode's bug, and ends the sequence rather than break the response format.
  if (s.constraint != nullptr && emitted.error.ok() && !emitted.tokens.empty() &&
      !s.constraint->Accepts({})) {
    emitted.error = absl::InternalError(
        absl::StrCat("mode ", s.mode_name, " gave a token the response format's grammar refuses"));
  }
  return emitted;
}

void ObserveSequenceSteps(CostModelBuilder& cost,
                          const std::map<std::string, int, std::less<>>& residents,
                          std::span<const SequenceObservation> observed, double step_seconds) {
  const bool one_mode = residents.size() == 1;
  for (const SequenceObservation& o : observed) {
    auto it = residents.find(o.mode);
    const int load = it != residents.end() ? it->second : 1;
    if (o.start > 0) {
      cost.ObserveStart(o.mode, load, o.start + step_seconds);
      continue;
    }
    cost.ObserveSequenceStep(o.mode, load, o.gained, o.extend, o.wait,
                             one_mode ? step_seconds : 0.0);
  }
}

}  // namespace tandem
