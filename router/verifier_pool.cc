#include "router/verifier_pool.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::router {

namespace {

bool ServesMode(const VerifierInfo& info, std::string_view mode) {
  if (mode.empty() || mode == "auto") return true;
  return std::find(info.modes.begin(), info.modes.end(), mode) != info.modes.end();
}

}  // namespace

VerifierPool::VerifierPool(std::vector<std::string> addresses, std::function<absl::Time()> clock)
    : clock_(std::move(clock)), addresses_(std::move(addresses)), entries_(addresses_.size()) {}

double VerifierPool::AverageAt(const Entry& entry, absl::Time now) {
  if (entry.averaged_at == absl::InfinitePast()) return entry.in_flight;
  // A clock that did not move (or went back) adds nothing.
  if (now <= entry.averaged_at) return entry.average_in_flight;
  const double keep = std::exp(-absl::FDivDuration(now - entry.averaged_at, kStreamsWindow));
  return entry.average_in_flight * keep + entry.in_flight * (1 - keep);
}

void VerifierPool::Average(Entry& entry, absl::Time now) {
  entry.average_in_flight = AverageAt(entry, now);
  entry.averaged_at = std::max(entry.averaged_at, now);
}

double VerifierPool::StreamsOf(const Entry& entry, absl::Time now) {
  return std::max<double>(entry.in_flight, AverageAt(entry, now));
}

double VerifierPool::Streams(size_t index) const {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  return StreamsOf(entries_[index], now);
}

size_t VerifierPool::size() const {
  absl::MutexLock lock(&mu_);
  return addresses_.size();
}

std::string VerifierPool::address(size_t index) const {
  absl::MutexLock lock(&mu_);
  return addresses_[index];
}

size_t VerifierPool::Add(std::string address) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < addresses_.size(); ++i) {
    if (addresses_[i] == address) return i;
  }
  addresses_.push_back(std::move(address));
  entries_.emplace_back();
  return addresses_.size() - 1;
}

void VerifierPool::SetRetired(size_t index, bool retired) {
  absl::MutexLock lock(&mu_);
  entries_[index].retired = retired;
}

bool VerifierPool::Retired(size_t index) const {
  absl::MutexLock lock(&mu_);
  return entries_[index].retired;
}

void VerifierPool::SetInfo(size_t index, VerifierInfo info) {
  absl::MutexLock lock(&mu_);
  entries_[index].info = std::move(info);
}

bool VerifierPool::HasInfo(size_t index) const {
  absl::MutexLock lock(&mu_);
  return entries_[index].info.has_value();
}

std::string VerifierPool::WorkerId(size_t index) const {
  absl::MutexLock lock(&mu_);
  const auto& info = entries_[index].info;
  return info ? info->worker_id : std::string();
}

void VerifierPool::SetHealthy(size_t index, bool healthy) {
  absl::MutexLock lock(&mu_);
  entries_[index].healthy = healthy;
}

bool VerifierPool::Healthy(size_t index) const {
  absl::MutexLock lock(&mu_);
  return entries_[index].healthy;
}

double EstimatedSequences(const VerifierLoad* load, double in_flight) {
  const double own = std::max(0.0, in_flight);
  if (load == nullptr) return own;
  const int others = std::max(0, load->running + load->queued - load->own_streams);
  return others + own;
}

int VerifierPool::InFlight(size_t index) const {
  absl::MutexLock lock(&mu_);
  return entries_[index].in_flight;
}

std::optional<VerifierInfo> VerifierPool::Info(size_t index) const {
  absl::MutexLock lock(&mu_);
  return entries_[index].info;
}

void VerifierPool::SetLoad(size_t index, VerifierLoad load) {
  absl::MutexLock lock(&mu_);
  load.own_streams = entries_[index].in_flight;
  entries_[index].load = std::make_shared<const VerifierLoad>(std::move(load));
}

std::shared_ptr<const VerifierLoad> VerifierPool::Load(size_t index) const {
  absl::MutexLock lock(&mu_);
  return entries_[index].load;
}

std::vector<ModelDescription> VerifierPool::Models() const {
  std::map<std::string, ModelDescription> models;
  {
    absl::MutexLock lock(&mu_);
    for (const Entry& entry : entries_) {
      if (!entry.info || entry.retired) continue;
      const VerifierInfo& info = *entry.info;
      auto [it, inserted] = models.try_emplace(info.model);
      ModelDescription& model = it->second;
      if (inserted) {
        model.id = info.model;
        model.max_context = info.max_context;
        model.tool_call_syntax = info.tool_call_syntax;
      } else {
        model.max_context = std::min(model.max_context, info.max_context);
      }
      for (const std::string& mode : info.modes) {
        if (std::find(model.modes.begin(), model.modes.end(), mode) == model.modes.end()) {
          model.modes.push_back(mode);
        }
      }
    }
  }
  std::vector<ModelDescription> out;
  out.reserve(models.size());
  for (auto& [id, model] : models) out.push_back(std::move(model));
  return out;
}

absl::StatusOr<ModelDescription> VerifierPool::ResolveModel(std::string_view id) const {
  std::vector<ModelDescription> models = Models();
  if (models.empty()) {
    return absl::UnavailableError(
        "no verifier has answered yet, so the router knows no model; retry shortly");
  }
  if (id.empty()) {
    if (models.size() == 1) return models.front();
    std::vector<std::string> ids;
    for (const auto& model : models) ids.push_back(model.id);
    return absl::InvalidArgumentError(absl::StrCat(
        "model is empty and this router serves several; name one of: ", absl::StrJoin(ids, ", ")));
  }
  for (auto& model : models) {
    if (model.id == id) return std::move(model);
  }
  std::vector<std::string> ids;
  for (const auto& model : models) ids.push_back(model.id);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model '", std::string(id), "'; this router serves: ", absl::StrJoin(ids, ", ")));
}

absl::StatusOr<size_t> VerifierPool::Acquire(std::string_view model, std::string_view mode,
                                             const Choice& choice) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  const size_t n = entries_.size();
  std::optional<size_t> best;  // the least loaded
  std::vector<size_t> eligible;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (next_ + k) % n;
    const Entry& entry = entries_[i];
    if (!entry.healthy || !entry.info || entry.retired || i == choice.avoid) continue;
    if (!model.empty() && entry.info->model != model) continue;
    if (!ServesMode(*entry.info, mode)) continue;
    eligible.push_back(i);
    if (!best || entry.in_flight < entries_[*best].in_flight) best = i;
  }
  const bool prefer = best && choice.prefer &&
                      std::find(eligible.begin(), eligible.end(), *choice.prefer) != eligible.end();
  if (prefer && entries_[*choice.prefer].in_flight <=
                    entries_[*best].in_flight + std::max(0, choice.prefer_slack)) {
    best = choice.prefer;
  } else if (best && choice.gain && eligible.size() > 1) {
    auto gain_of = [&](size_t i) {
      const Entry& entry = entries_[i];
      return choice.gain(*entry.info, entry.load.get(), StreamsOf(entry, now));
    };
    // Only a verifier the estimate can judge is compared; without an estimate for the least
    // loaded one, balancing decides.
    if (const std::optional<double> base = gain_of(*best)) {
      size_t pick = *best;
      double pick_gain = *base;
      for (size_t i : eligible) {
        const std::optional<double> g = gain_of(i);
        if (g && *g > pick_gain) {
          pick = i;
          pick_gain = *g;
        }
      }
      if (pick_gain > *base * (1 + choice.gain_margin)) best = pick;
    }
  }
  if (!best) {
    return absl::UnavailableError(absl::StrCat(
        "no healthy verifier serves model '", std::string(model), "'",
        mode.empty() || mode == "auto" ? std::string()
                                       : absl::StrCat(" in mode '", std::string(mode), "'"),
        "; retry later"));
  }
  Average(entries_[*best], now);
  ++entries_[*best].in_flight;
  next_ = (*best + 1) % n;
  return *best;
}

void VerifierPool::Release(size_t index) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  Average(entries_[index], now);
  --entries_[index].in_flight;
}

}  // namespace tandem::router
