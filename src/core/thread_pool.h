// A persistent thread pool: workers are created once and sleep between jobs, so the hot path never
// spawns threads. parallel_for splits [0, n) into contiguous ranges, one per participant (the
// caller thread takes part), and returns when all ranges are done. Jobs must not throw.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv41 {

class ThreadPool {
 public:
  // threads = total participants including the caller; 0 means std::thread::hardware_concurrency.
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
  const std::function<void(std::size_t, std::size_t, std::size_t)>* job_ = nullptr;
  std::size_t job_n_ = 0;
  std::size_t generation_ = 0;
  std::size_t pending_ = 0;
  bool stop_ = false;
};

}  // namespace dsv41
