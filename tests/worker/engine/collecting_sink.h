// A SequenceSink for engine tests: it collects one request's events, and the test thread waits
// for the last one.
#pragma once

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/engine/engine.h"

namespace tandem::testing {

class CollectingSink : public SequenceSink {
 public:
  void OnEvent(SequenceEvent event) override {
    absl::MutexLock lock(&mu_);
    ++events_;
    if (!event.error.ok()) ++errors_;
    tokens_.insert(tokens_.end(), event.tokens.begin(), event.tokens.end());
    logprobs_.insert(logprobs_.end(), event.logprobs.begin(), event.logprobs.end());
    prompt_logprobs_.insert(prompt_logprobs_.end(), event.prompt_logprobs.begin(),
                            event.prompt_logprobs.end());
    text_ += event.text;
    if (done_) ++after_done_;
    if (event.finish != FinishReason::kNone || !event.error.ok()) {
      done_ = true;
      finish_ = event.finish;
      error_ = event.error;
      usage_ = event.usage;
      mode_ = event.mode;
    }
  }
  bool Backlogged() const override {
    absl::MutexLock lock(&mu_);
    return backlogged_;
  }

  void SetBacklogged(bool b) {
    absl::MutexLock lock(&mu_);
    backlogged_ = b;
  }
  // Waits for the last event (at most 60 s); false on timeout.
  bool Wait() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(60));
  }
  bool WaitForTokens(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return tokens_.size() >= n || done_; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(60));
  }

  std::vector<int32_t> tokens() const {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  std::vector<TokenLogprob> logprobs() const {
    absl::MutexLock lock(&mu_);
    return logprobs_;
  }
  std::vector<TokenLogprob> prompt_logprobs() const {
    absl::MutexLock lock(&mu_);
    return prompt_logprobs_;
  }
  std::string text() const {
    absl::MutexLock lock(&mu_);
    return text_;
  }
  FinishReason finish() const {
    absl::MutexLock lock(&mu_);
    return finish_;
  }
  absl::Status error() const {
    absl::MutexLock lock(&mu_);
    return error_;
  }
  SequenceUsage usage() const {
    absl::MutexLock lock(&mu_);
    return usage_;
  }
  int events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  int errors() const {
    absl::MutexLock lock(&mu_);
    return errors_;
  }
  int after_done() const {
    absl::MutexLock lock(&mu_);
    return after_done_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);
  std::vector<TokenLogprob> logprobs_ ABSL_GUARDED_BY(mu_);
  std::vector<TokenLogprob> prompt_logprobs_ ABSL_GUARDED_BY(mu_);
  std::string text_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool backlogged_ ABSL_GUARDED_BY(mu_) = false;
  FinishReason finish_ ABSL_GUARDED_BY(mu_) = FinishReason::kNone;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  SequenceUsage usage_ ABSL_GUARDED_BY(mu_);
  std::string mode_ ABSL_GUARDED_BY(mu_);
  int events_ ABSL_GUARDED_BY(mu_) = 0;
  int errors_ ABSL_GUARDED_BY(mu_) = 0;
  int after_done_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::testing
