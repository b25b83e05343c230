#include "common/periodic_thread.h"

#include <atomic>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(PeriodicThreadTest, RunsTheTaskEveryPeriodUntilStopped) {
  std::atomic<int> runs{0};
  PeriodicThread thread;
  EXPECT_FALSE(thread.running());
  thread.Start(absl::Milliseconds(2), [&] { ++runs; });
  EXPECT_TRUE(thread.running());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (runs.load() < 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  thread.Stop();
  EXPECT_FALSE(thread.running());
  const int after_stop = runs.load();
  EXPECT_GE(after_stop, 3);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(runs.load(), after_stop);  // no run after Stop returned
  thread.Stop();                       // again: a no-op
}

TEST(PeriodicThreadTest, StopDoesNotWaitOutThePeriod) {
  std::atomic<int> runs{0};
  PeriodicThread thread;
  thread.Start(absl::Hours(1), [&] { ++runs; });
  const absl::Time start = absl::Now();
  thread.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(runs.load(), 0);  // the first run comes one period after Start
}

TEST(PeriodicThreadTest, RestartsAfterStopAndStopsOnDestruction) {
  std::atomic<int> runs{0};
  {
    PeriodicThread thread;
    thread.Start(absl::Hours(1), [] {});
    thread.Stop();
    thread.Start(absl::Milliseconds(1), [&] { ++runs; });
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (runs.load() < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  }  // the destructor stops and joins
  EXPECT_GE(runs.load(), 1);
}

}  // namespace
}  // namespace tandem
