// The engine's mailbox and load board: the only state the engine thread shares with callers.
// Callers (request handlers, draft channels) post typed messages; the engine thread takes them
// all at once between steps, or waits for the next one with a deadline. The load board holds
// the engine's last published load for any thread to read.
//
// Thread-safe: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/engine/draft_channel.h"
#include "worker/engine/engine.h"

namespace tandem {

// Defined in engine_impl.h. Shared ownership only so that this header needs no definition.
struct EngineSequence;

namespace engine_message {

struct Submit {
  std::shared_ptr<EngineSequence> sequence;
};
struct Cancel {
  uint64_t id = 0;
};
struct Chain {
  DraftChain chain;
  std::string drafter;  // the address of the drafter that sent it
};
struct Drain {};

}  // namespace engine_message

using EngineMessage = std::variant<engine_message::Submit, engine_message::Cancel,
                                   engine_message::Chain, engine_message::Drain>;

class EngineMailbox {
 public:
  EngineMailbox() = default;
  EngineMailbox(const EngineMailbox&) = delete;
  EngineMailbox& operator=(const EngineMailbox&) = delete;

  // Queues `message` and wakes a waiting reader. After Close() messages are dropped (a late
  // draft chain for a gone engine) and false is returned.
  bool Post(EngineMessage message);
  // Every queued message, oldest first.
  std::vector<EngineMessage> TakeAll();
  // Blocks until a message is queued, the mailbox is closed or `deadline` passes; true when a
  // message is queued.
  bool WaitUntil(absl::Time deadline);
  // Stops accepting messages; waiters wake. Messages already queued stay for TakeAll.
  void Close();
  bool closed() const;
  // Submits posted but not yet taken (for the queue limit).
  int pending_submits() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<EngineMessage> messages_ ABSL_GUARDED_BY(mu_);
  int pending_submits_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem
