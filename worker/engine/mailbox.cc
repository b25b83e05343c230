#include "worker/engine/mailbox.h"

namespace tandem {

bool EngineMailbox::Post(EngineMessage message) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  if (std::holds_alternative<engine_message::Submit>(message)) ++pending_submits_;
  messages_.push_back(std::move(message));
  return true;
}

std::vector<EngineMessage> EngineMailbox::TakeAll() {
  absl::MutexLock lock(&mu_);
  std::vector<EngineMessage> out;
  out.swap(messages_);
  pending_submits_ = 0;
  return out;
}

bool EngineMailbox::WaitUntil(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !messages_.empty() || closed_; };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  return !messages_.empty();
}

void EngineMailbox::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

bool EngineMailbox::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

int EngineMailbox::pending_submits() const {
  absl::MutexLock lock(&mu_);
  return pending_submits_;
}

}  // namespace tandem
