#include "services/router/registry_watcher.h"

#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<RegistryWatcher>> RegistryWatcher::Create(const std::string& redis,
                                                                         router::RegistryView* view,
                                                                         absl::Duration period,
                                                                         const RedisAuth& auth) {
  absl::StatusOr<RedisAddress> address = ParseRedisAddress(redis);
  if (!address.ok()) return address.status();
  absl::StatusOr<RedisClient::Options> client = RedisClient::WithAuth(*address, auth);
  if (!client.ok()) return client.status();
  client->max_backoff = std::min(absl::Seconds(5), period * 4);
  return std::unique_ptr<RegistryWatcher>(new RegistryWatcher(*std::move(client), view, period));
}

RegistryWatcher::RegistryWatcher(RedisClient::Options client, router::RegistryView* view,
                                 absl::Duration period)
    : client_(std::move(client)), view_(view), period_(period) {}

RegistryWatcher::~RegistryWatcher() { Stop(); }

void RegistryWatcher::Start() {
  WatchOnce();
  thread_.Start(period_, [this] { WatchOnce(); });
}

void RegistryWatcher::Stop() { thread_.Stop(); }

absl::StatusOr<std::vector<router::WorkerRecord>> RegistryWatcher::List() {
  const std::string pattern = absl::StrCat(std::string(router::kWorkerKeyPrefix), "*");
  std::vector<std::string> keys;
  std::string cursor = "0";
  do {
    absl::StatusOr<RedisReply> reply =
        client_.Command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    if (!reply.ok()) return reply.status();
    if (reply->type != RedisReply::Type::kArray || reply->elements.size() != 2) {
      return absl::UnavailableError("Redis answered SCAN with something other than a cursor");
    }
    cursor = reply->elements[0].str;
    for (const RedisReply& key : reply->elements[1].elements) keys.push_back(key.str);
  } while (cursor != "0");
  std::vector<router::WorkerRecord> records;
  if (keys.empty()) return records;
  std::vector<std::string> mget = {"MGET"};
  mget.insert(mget.end(), keys.begin(), keys.end());
  absl::StatusOr<RedisReply> values = client_.Command(mget);
  if (!values.ok()) return values.status();
  for (size_t i = 0; i < values->elements.size(); ++i) {
    const RedisReply& value = values->elements[i];
    if (value.type != RedisReply::Type::kString) continue;  // expired since the SCAN
    absl::StatusOr<router::WorkerRecord> record = router::DecodeWorkerRecord(value.str);
    if (!record.ok()) {
      std::fprintf(stderr, "tandem-router: registry key %s skipped: %s\n", keys[i].c_str(),
                   record.status().ToString().c_str());
      continue;
    }
    records.push_back(*std::move(record));
  }
  return records;
}

void RegistryWatcher::WatchOnce() {
  absl::StatusOr<std::vector<router::WorkerRecord>> records = List();
  if (!records.ok()) {
    if (reachable_) {
      std::fprintf(stderr,
                   "tandem-router: cannot read the registry (serving from the last view; "
                   "retrying): %s\n",
                   records.status().ToString().c_str());
    }
    reachable_ = false;
    return;
  }
  if (!reachable_) std::fprintf(stderr, "tandem-router: the registry is readable again\n");
  reachable_ = true;
  const router::RegistryView::Changes changes = view_->Apply(*records);
  for (const std::string& added : changes.added) {
    std::fprintf(stderr, "tandem-router: registered %s\n", added.c_str());
  }
  for (const std::string& removed : changes.removed) {
    std::fprintf(stderr, "tandem-router: registration gone: %s\n", removed.c_str());
  }
}

}  // namespace tandem
