// The engine's small parts without a model: draft chain merging and serving, and the mailbox.
#include <thread>

#include "gtest/gtest.h"
#include "worker/engine/actor_mailbox.h"
#include "worker/engine/chain_drafter.h"
#include "worker/engine/mailbox.h"

namespace tandem {
namespace {

TEST(DraftChainBufferTest, ExtendsReplacesAndServesAgreeingDrafts) {
  DraftChainBuffer buffer;
  ChainDrafter drafter(&buffer);
  std::vector<int32_t> seq = {1, 2, 3};
  EXPECT_FALSE(drafter.Draft(seq, 4).ok());  // no chain yet

  buffer.Merge({.session = 1, .from = 3, .tokens = {7, 8}}, seq);
  EXPECT_EQ(*drafter.Draft(seq, 4), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(*drafter.Draft(seq, 1), (std::vector<int32_t>{7}));
  buffer.Merge({.session = 1, .from = 5, .tokens = {9}}, seq);  // extends
  EXPECT_EQ(*drafter.Draft(seq, 4), (std::vector<int32_t>{7, 8, 9}));

  seq.push_back(7);  // the first draft was accepted: the rest is still usable
  EXPECT_EQ(*drafter.Draft(seq, 4), (std::vector<int32_t>{8, 9}));
  seq.push_back(5);  // the second was rejected: nothing is usable
  EXPECT_FALSE(drafter.Draft(seq, 4).ok());

  // A chain starting at the old end, after a rejection inside the old chain, replaces it.
  seq = {1, 2, 3, 7, 8, 4};
  buffer.Merge({.session = 1, .from = 6, .tokens = {11, 12}}, seq);
  EXPECT_EQ(buffer.from, 6);
  EXPECT_EQ(*drafter.Draft(seq, 4), (std::vector<int32_t>{11, 12}));

  buffer.Merge({.session = 1, .from = 2, .tokens = {3, 7}}, seq);  // replaces
  EXPECT_EQ(buffer.from, 2);
  EXPECT_FALSE(drafter.Draft(seq, 4).ok());  // ends before the sequence does

  buffer.Merge({.session = 1, .error = absl::UnavailableError("gone")}, seq);
  EXPECT_FALSE(buffer.enabled);
  buffer.Merge({.session = 1, .from = 6, .tokens = {1}}, seq);
  EXPECT_FALSE(drafter.Draft(seq, 4).ok());  // drafting stays off
}

TEST(EngineMailboxTest, TakesMessagesInOrderAndWakesWaiters) {
  EngineMailbox box;
  EXPECT_FALSE(box.WaitUntil(absl::Now() + absl::Milliseconds(5)));
  EXPECT_TRUE(box.Post(engine_message::Cancel{1}));
  EXPECT_TRUE(box.Post(engine_message::Submit{}));
  EXPECT_EQ(box.pending_submits(), 1);
  EXPECT_TRUE(box.WaitUntil(absl::InfiniteFuture()));
  std::vector<EngineMessage> got = box.TakeAll();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(std::get<engine_message::Cancel>(got[0]).id, 1u);
  EXPECT_EQ(box.pending_submits(), 0);

  std::thread poster([&] {
    absl::SleepFor(absl::Milliseconds(20));
    box.Post(engine_message::Drain{});
  });
  EXPECT_TRUE(box.WaitUntil(absl::Now() + absl::Seconds(30)));
  poster.join();
  box.Close();
  EXPECT_FALSE(box.Post(engine_message::Cancel{2}));
  EXPECT_EQ(box.TakeAll().size(), 1u);
  EXPECT_FALSE(box.WaitUntil(absl::InfiniteFuture()));  // closed: returns at once
}

TEST(PublishedTest, ReturnsTheLastPublishedLoad) {
  Published<EngineLoad> board;
  board.Publish({.running = 3, .steps = 9});
  EXPECT_EQ(board.Get().running, 3);
  EXPECT_EQ(board.Get().steps, 9);
}

}  // namespace
}  // namespace tandem
