// ThreadPool: every index visited exactly once, ranges contiguous, reusable across many jobs.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
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

}  // namespace
}  // namespace dsv41
