#include "router/registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem::router {

std::string WorkerKey(const WorkerRecord& record) {
  return absl::StrCat(std::string(kWorkerKeyPrefix), record.role, ":", record.worker_id);
}

std::string EncodeWorkerRecord(const WorkerRecord& record) {
  nlohmann::json json = {
      {"role", record.role},
      {"worker_id", record.worker_id},
      {"address", record.address},
      {"model", record.model},
      {"modes", record.modes},
      {"max_context", record.max_context},
      {"target", record.target},
      {"load",
       {{"running", record.running},
        {"queued", record.queued},
        {"kv_usage_ratio", record.kv_usage_ratio},
        {"draining", record.draining}}},
  };
  return json.dump();
}

absl::StatusOr<WorkerRecord> DecodeWorkerRecord(std::string_view text) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError("the worker record is not a JSON object");
  }
  WorkerRecord record;
  try {
    for (const char* field : {"role", "worker_id", "address"}) {
      if (!json.contains(field) || !json[field].is_string() ||
          json[field].get<std::string>().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the worker record has no '", field, "' string"));
      }
    }
    record.role = json["role"].get<std::string>();
    record.worker_id = json["worker_id"].get<std::string>();
    record.address = json["address"].get<std::string>();
    record.model = json.value("model", std::string());
    record.modes = json.value("modes", std::vector<std::string>());
    record.max_context = json.value("max_context", 0);
    record.target = json.value("target", std::string());
    if (json.contains("load") && json["load"].is_object()) {
      const nlohmann::json& load = json["load"];
      record.running = load.value("running", 0);
      record.queued = load.value("queued", 0);
      record.kv_usage_ratio = load.value("kv_usage_ratio", 0.0);
      record.draining = load.value("draining", false);
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the worker record is malformed: ", e.what()));
  }
  return record;
}

RegistryView::RegistryView(VerifierPool* pool) : pool_(pool) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < pool_->size(); ++i) static_.insert(i);
}

RegistryView::Changes RegistryView::Apply(const std::vector<WorkerRecord>& records) {
  Changes changes;
  absl::MutexLock lock(&mu_);
  std::map<std::string, size_t> registered;
  std::vector<WorkerRecord> drafters;
  for (const WorkerRecord& record : records) {
    if (record.role == "drafter") {
      drafters.push_back(record);
      continue;
    }
    if (record.role != "verifier" || registered.count(record.address) > 0) continue;
    const size_t index = pool_->Add(record.address);
    registered[record.address] = index;
    if (static_.count(index) > 0) continue;
    if (registered_.count(record.address) == 0) {
      changes.added.push_back("verifier " + record.address);
      pool_->SetRetired(index, false);
    }
  }
  for (const auto& [address, index] : registered_) {
    if (registered.count(address) > 0 || static_.count(index) > 0) continue;
    // Gone from the registry but still answering the router's polls: the registry lost its data
    // (Redis restarted empty) and the worker's next heartbeat registers it again. It stays in
    // service until it stops answering, then the next listing without it retires it.
    if (pool_->Healthy(index)) {
      registered[address] = index;
      continue;
    }
    pool_->SetRetired(index, true);
    changes.removed.push_back("verifier " + address);
  }
  auto listed = [&](const std::string& address) {
    return std::any_of(drafters.begin(), drafters.end(),
                       [&](const auto& d) { return d.address == address; });
  };
  for (const WorkerRecord& drafter : drafters) {
    const bool known = std::any_of(drafters_.begin(), drafters_.end(),
                                   [&](const auto& d) { return d.address == drafter.address; });
    if (!known) changes.added.push_back("drafter " + drafter.address);
    drafter_absences_.erase(drafter.address);
  }
  // The router does not poll drafters: one missing from a few listings in a row is kept (a
  // registry that lost its data has it back within a heartbeat), then dropped.
  for (const WorkerRecord& drafter : drafters_) {
    if (listed(drafter.address)) continue;
    if (++drafter_absences_[drafter.address] < kDrafterAbsentListings) {
      drafters.push_back(drafter);
      continue;
    }
    drafter_absences_.erase(drafter.address);
    changes.removed.push_back("drafter " + drafter.address);
  }
  registered_ = std::move(registered);
  drafters_ = std::move(drafters);
  return changes;
}

std::string RegistryView::PickDrafter(const std::string& model) {
  absl::MutexLock lock(&mu_);
  const size_t n = drafters_.size();
  const WorkerRecord* best = nullptr;
  size_t best_index = 0;
  bool best_built_for_it = false;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (next_drafter_ + k) % n;
    const WorkerRecord& drafter = drafters_[i];
    if (drafter.draining) continue;
    if (!drafter.target.empty() && drafter.target != model) continue;  // another model's
    const bool built_for_it = !drafter.target.empty();
    if (best == nullptr || built_for_it > best_built_for_it ||
        (built_for_it == best_built_for_it && drafter.running < best->running)) {
      best = &drafter;
      best_index = i;
      best_built_for_it = built_for_it;
    }
  }
  if (best == nullptr) return std::string();
  next_drafter_ = best_index + 1;
  return best->address;
}

std::vector<std::string> RegistryView::Drafters() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const WorkerRecord& drafter : drafters_) out.push_back(drafter.address);
  return out;
}

}  // namespace tandem::router
