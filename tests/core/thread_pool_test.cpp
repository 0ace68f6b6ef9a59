// ThreadPool: every index visited exactly once, ranges contiguous, reusable across many jobs.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

namespace dsv41 {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (std::size_t threads : {1u, 2u, 3u, 8u}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (std::size_t n : {0u, 1u, 2u, 7u, 1000u}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](std::size_t b, std::size_t e, std::size_t) {
        for (std::size_t i = b; i < e; ++i) hits[i]++;
      });
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
  }
}

TEST(ThreadPool, ReusedManyTimesAndUsesParticipants) {
  ThreadPool pool(4);
  std::atomic<long> sum{0};
  std::mutex mu;
  std::set<std::size_t> participants;
  for (int rep = 0; rep < 2000; ++rep) {
    pool.parallel_for(64, [&](std::size_t b, std::size_t e, std::size_t p) {
      long s = 0;
      for (std::size_t i = b; i < e; ++i) s += long(i);
      sum += s;
      std::lock_guard<std::mutex> lock(mu);
      participants.insert(p);
    });
  }
  EXPECT_EQ(sum.load(), 2000L * (63 * 64 / 2));
  EXPECT_EQ(participants.size(), 4u);
}

// Jobs further apart than the spin (the workers asleep on the condition variable) and parts that
// outlast it (the caller asleep waiting for a worker): each job still sees every index once and
// parallel_for returns only after the last part.
TEST(ThreadPool, WakesAfterSleepingOnBothSides) {
  ThreadPool pool(3);
  const auto pause = ThreadPool::kSpin * 5;
  for (int rep = 0; rep < 6; ++rep) {
    std::this_thread::sleep_for(pause);
    std::vector<std::atomic<int>> hits(9);
    std::atomic<int> finished{0};
    pool.parallel_for(9, [&](std::size_t b, std::size_t e, std::size_t p) {
      if (p != 0 && rep % 2 == 1) std::this_thread::sleep_for(pause);  // slower than the caller
      for (std::size_t i = b; i < e; ++i) hits[i]++;
      finished++;
    });
    EXPECT_EQ(finished.load(), 3) << rep;
    for (auto& h : hits) ASSERT_EQ(h.load(), 1) << rep;
  }
}

}  // namespace
}  // namespace dsv41
