// ChainOutbox: one write in flight, merging of extensions, a finish exactly once and never
// during a write.
#include "services/drafter/chain_outbox.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

DraftChain Chain(uint64_t session, int from, std::vector<int32_t> tokens) {
  return DraftChain{.session = session, .from = from, .tokens = std::move(tokens)};
}

TEST(ChainOutbox, OneWriteInFlightAndExtensionsMerge) {
  ChainOutbox outbox(16);
  ChainOutbox::Action a = outbox.Push(Chain(1, 10, {1, 2}));
  ASSERT_TRUE(a.write.has_value());
  EXPECT_EQ(a.write->tokens, (std::vector<int32_t>{1, 2}));
  // Behind the write in flight: the extension of session 1 cannot merge into what is already
  // being written, so it queues; the next extension merges into it.
  EXPECT_FALSE(outbox.Push(Chain(1, 12, {3})).write.has_value());
  EXPECT_FALSE(outbox.Push(Chain(2, 5, {9})).write.has_value());
  EXPECT_FALSE(outbox.Push(Chain(1, 13, {4, 5})).write.has_value());
  EXPECT_EQ(outbox.queued(), 2u);
  a = outbox.WriteDone(true);
  ASSERT_TRUE(a.write.has_value());
  EXPECT_EQ(a.write->session, 1u);
  EXPECT_EQ(a.write->from, 12);
  EXPECT_EQ(a.write->tokens, (std::vector<int32_t>{3, 4, 5}));
  a = outbox.WriteDone(true);
  ASSERT_TRUE(a.write.has_value());
  EXPECT_EQ(a.write->session, 2u);
  a = outbox.WriteDone(true);
  EXPECT_FALSE(a.write.has_value());
  EXPECT_FALSE(a.finish.has_value());
}

TEST(ChainOutbox, ReplacementsStaySeparateAndErrorsReplace) {
  ChainOutbox outbox(16);
  ASSERT_TRUE(outbox.Push(Chain(7, 0, {1})).write.has_value());
  outbox.Push(Chain(1, 10, {1, 2}));
  outbox.Push(Chain(1, 11, {6, 6}));  // a replacement: from is not the queued chain's end
  EXPECT_EQ(outbox.queued(), 2u);
  outbox.Push(DraftChain{.session = 1, .error = absl::InvalidArgumentError("bad")});
  EXPECT_EQ(outbox.queued(), 2u);
  ChainOutbox::Action a = outbox.WriteDone(true);
  ASSERT_TRUE(a.write.has_value());
  EXPECT_EQ(a.write->from, 10);
  a = outbox.WriteDone(true);
  ASSERT_TRUE(a.write.has_value());
  EXPECT_FALSE(a.write->error.ok());
  EXPECT_TRUE(a.write->tokens.empty());
}

TEST(ChainOutbox, FinishesOnceAndNeverDuringAWrite) {
  ChainOutbox outbox(16);
  ASSERT_TRUE(outbox.Push(Chain(1, 0, {1})).write.has_value());
  ChainOutbox::Action a = outbox.Close(absl::OkStatus());
  EXPECT_FALSE(a.finish.has_value());  // a write is in flight
  EXPECT_FALSE(outbox.Push(Chain(1, 1, {2})).write.has_value());
  a = outbox.WriteDone(true);
  ASSERT_TRUE(a.finish.has_value());
  EXPECT_TRUE(a.finish->ok());
  EXPECT_FALSE(outbox.Close(absl::CancelledError("again")).finish.has_value());
  EXPECT_TRUE(outbox.closed());
}

TEST(ChainOutbox, AReaderTooFarBehindEndsTheStream) {
  ChainOutbox outbox(3);
  ASSERT_TRUE(outbox.Push(Chain(100, 0, {1})).write.has_value());
  for (uint64_t s = 0; s < 3; ++s) EXPECT_FALSE(outbox.Push(Chain(s, 0, {1})).finish);
  EXPECT_FALSE(outbox.Push(Chain(3, 0, {1})).finish.has_value());  // write still in flight
  ChainOutbox::Action a = outbox.WriteDone(true);
  EXPECT_FALSE(a.write.has_value());
  ASSERT_TRUE(a.finish.has_value());
  EXPECT_EQ(a.finish->code(), absl::StatusCode::kResourceExhausted);
}

TEST(ChainOutbox, AFailedWriteFinishes) {
  ChainOutbox outbox(16);
  ASSERT_TRUE(outbox.Push(Chain(1, 0, {1})).write.has_value());
  outbox.Push(Chain(2, 0, {1}));
  ChainOutbox::Action a = outbox.WriteDone(false);
  EXPECT_FALSE(a.write.has_value());
  EXPECT_TRUE(a.finish.has_value());
}

}  // namespace
}  // namespace tandem
