// A persistent thread pool: workers are created once and wait between jobs, so the hot path never
// spawns threads. parallel_for splits [0, n) into contiguous ranges, one per participant (the
// caller thread takes part), and returns when all ranges are done. Jobs must not throw.
//
// Waiting spins first, then sleeps: a decode step issues a few hundred short jobs (one per
// linear, two per routed expert) with single-threaded work between them, and a condition
// variable's wake-up costs tens of microseconds on a VM (the idle vCPU halts; the futex wake is an
// inter-processor interrupt). Workers and the caller poll an atomic for up to kSpin before
// sleeping on the condition variable (pausing for the first microseconds, then yielding the core
// between polls), so an idle pool costs no CPU after that.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv41 {

class ThreadPool {
 public:
  // How long a waiting thread polls before it sleeps, unless the environment variable
  // DSV41_POOL_SPIN_US says otherwise (0: sleep at once; for hosts shared with other work, and
  // the sanitized tests, which run side by side on the cores).
  static constexpr std::chrono::microseconds kSpin{200};
  static std::chrono::microseconds spin_budget();

  // threads = total participants including the caller; 0: one per physical core of the affinity
  // mask (core/cpu_set.h default_thread_count).
  explicit ThreadPool(std::size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t size() const { return workers_.size() + 1; }

  // fn(begin, end, participant) over a static split of [0, n). Not reentrant: one job at a time.
  void parallel_for(std::size_t n,
                    const std::function<void(std::size_t, std::size_t, std::size_t)>& fn);

 private:
  void worker_loop(std::size_t id);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  // Published before generation_ is raised (release) and read after it is seen (acquire).
  const std::function<void(std::size_t, std::size_t, std::size_t)>* job_ = nullptr;
  std::size_t job_n_ = 0;
  std::atomic<std::size_t> generation_{0};
  std::atomic<std::size_t> pending_{0};
  std::atomic<bool> stop_{false};
  const std::chrono::microseconds spin_ = spin_budget();
};

}  // namespace dsv41
