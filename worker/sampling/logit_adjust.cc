#include "worker/sampling/logit_adjust.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Count changes for the few tokens on a row's path: a short list beats a map.
struct Delta {
  int32_t token;
  int change;
};

void AddDelta(std::vector<Delta>* deltas, int32_t token, int change) {
  for (Delta& d : *deltas) {
    if (d.token == token) {
      d.change += change;
      return;
    }
  }
  deltas->push_back({token, change});
}

const Delta* FindDelta(const std::vector<Delta>& deltas, int32_t token) {
  for (const Delta& d : deltas) {
    if (d.token == token) return &d;
  }
  return nullptr;
}

absl::Status CheckPenalty(float value, const char* name) {
  if (!(std::abs(value) <= kMaxPenalty)) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be within [-", kMaxPenalty, ", ",
                                                   kMaxPenalty, "] (0 = off), got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

bool LogitAdjust::active() const {
  return presence_penalty != 0 || frequency_penalty != 0 || repetition_penalty != 1 ||
         !logit_bias.empty() || (min_tokens > 0 && !min_tokens_ban.empty()) || grammar != nullptr;
}

absl::Status CheckLogitAdjust(const LogitAdjust& adjust, int vocab_size) {
  if (absl::Status s = CheckPenalty(adjust.presence_penalty, "presence_penalty"); !s.ok()) return s;
  if (absl::Status s = CheckPenalty(adjust.frequency_penalty, "frequency_penalty"); !s.ok()) {
    return s;
  }
  if (!(adjust.repetition_penalty > 0 && adjust.repetition_penalty <= kMaxRepetitionPenalty)) {
    return absl::InvalidArgumentError(absl::StrCat("repetition_penalty must be within (0, ",
                                                   kMaxRepetitionPenalty, "] (1 = off), got ",
                                                   adjust.repetition_penalty));
  }
  if (adjust.logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::InvalidArgumentError(absl::StrCat("logit_bias has ", adjust.logit_bias.size(),
                                                   " entries; at most ", kMaxLogitBias));
  }
  absl::flat_hash_set<int32_t> ids;
  for (const auto& [id, bias] : adjust.logit_bias) {
    if (id < 0 || (vocab_size > 0 && id >= vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias names token ", id,
          vocab_size > 0 ? absl::StrCat(", outside the vocabulary [0, ", vocab_size, ")")
                         : std::string(", not a token id (>= 0)")));
    }
    if (!ids.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias names token ", id, " twice"));
    }
    if (!(std::abs(bias) <= kMaxLogitBiasValue)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias for token ", id,
                                                     " must be within [-", kMaxLogitBiasValue, ", ",
                                                     kMaxLogitBiasValue, "], got ", bias));
    }
  }
  if (adjust.min_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens must be >= 0, got ", adjust.min_tokens));
  }
  return absl::OkStatus();
}

void TokenHistory::Sync(std::span<const int32_t> tokens, int prompt_len) {
  const bool grew = prompt_len == prompt_len_ && tokens.size() >= seen_ &&
                    (seen_ == 0 || tokens[seen_ - 1] == last_);
  if (!grew) {
    generated_.clear();
    prompt_.clear();
    prompt_len_ = prompt_len;
    seen_ = 0;
  }
  for (; seen_ < tokens.size(); ++seen_) {
    if (static_cast<int>(seen_) < prompt_len) {
      prompt_.insert(tokens[seen_]);
    } else {
      ++generated_[tokens[seen_]];
    }
  }
  if (!tokens.empty()) last_ = tokens.back();
}

void AdjustLogits(const LogitAdjust& adjust, const TokenHistory& history,
                  std::span<const int32_t> added, std::span<const int32_t> removed,
                  int generated_before, std::span<float> row) {
  const auto in_row = [&](int32_t token) {
    return token >= 0 && static_cast<size_t>(token) < row.size();
  };
  for (const auto& [id, bias] : adjust.logit_bias) {
    if (in_row(id)) row[static_cast<size_t>(id)] += bias;
  }
  if (generated_before < adjust.min_tokens) {
    for (int32_t id : adjust.min_tokens_ban) {
      if (in_row(id)) row[static_cast<size_t>(id)] = kNegInf;
    }
  }
  const bool repetition = adjust.repetition_penalty != 1;
  if (!repetition && adjust.presence_penalty == 0 && adjust.frequency_penalty == 0) return;

  std::vector<Delta> deltas;
  for (int32_t token : added) AddDelta(&deltas, token, 1);
  for (int32_t token : removed) AddDelta(&deltas, token, -1);
  const auto penalise = [&](int32_t token, int count, bool in_prompt) {
    if (!in_row(token) || (count <= 0 && !in_prompt)) return;
    float& logit = row[static_cast<size_t>(token)];
    if (repetition) {
      logit = logit > 0 ? logit / adjust.repetition_penalty : logit * adjust.repetition_penalty;
    }
    if (count > 0) {
      logit -= adjust.frequency_penalty * static_cast<float>(count) + adjust.presence_penalty;
    }
  };
  for (const auto& [token, count] : history.generated()) {
    const Delta* d = FindDelta(deltas, token);
    penalise(token, count + (d != nullptr ? d->change : 0), history.prompt().contains(token));
  }
  for (const Delta& d : deltas) {
    if (!history.generated().contains(d.token)) {
      penalise(d.token, d.change, history.prompt().contains(d.token));
    }
  }
  if (!repetition) return;
  for (int32_t token : history.prompt()) {
    if (!history.generated().contains(token) && FindDelta(deltas, token) == nullptr) {
      penalise(token, 0, true);
    }
  }
}

}  // namespace tandem
