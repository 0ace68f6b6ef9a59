// ThreadPool implementation: an atomic generation counter starts a job, an atomic pending count
// ends it; each side polls its atomic for kSpin, then sleeps on a condition variable. No wake-up
// is lost: a sleeper checks its condition under mu_, and every change of a condition is followed
// by taking mu_ before the notify.
#include "core/thread_pool.h"

#include "core/cpu_set.h"

#include <algorithm>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DSV41_CPU_RELAX() _mm_pause()
#else
#define DSV41_CPU_RELAX() std::this_thread::yield()
#endif

namespace dsv41 {

namespace {
// Participant p of `parts` owns [begin, end) of [0, n): sizes differ by at most one.
std::pair<std::size_t, std::size_t> split(std::size_t n, std::size_t parts, std::size_t p) {
  const std::size_t base = n / parts, extra = n % parts;
  const std::size_t begin = p * base + std::min(p, extra);
  return {begin, begin + base + (p < extra ? 1 : 0)};
}

// Polls done() for up to `budget`; true when it held. The first kPauseSpin with the CPU's pause,
// then yielding the core between polls: a busy machine (other processes, the server's threads,
// tests run side by side) gets the core back while the pool waits (a pause-only spin doubled the
// sanitized engine tests' time under ctest -j).
constexpr std::chrono::microseconds kPauseSpin{10};

template <class Done>
bool spin_until(const Done& done, std::chrono::microseconds budget) {
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + budget, pause_until = start + kPauseSpin;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return done();
    const bool pause = now < pause_until;
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      if (pause)
        DSV41_CPU_RELAX();
      else
        std::this_thread::yield();
    }
  }
}
}  // namespace

std::chrono::microseconds ThreadPool::spin_budget() {
  static const std::chrono::microseconds budget = [] {
    const char* env = std::getenv("DSV41_POOL_SPIN_US");
    if (env == nullptr || *env == '\0') return kSpin;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 0 || v > 1000000) return kSpin;  // malformed: the default
    return std::chrono::microseconds(v);
  }();
  return budget;
}

ThreadPool::ThreadPool(std::size_t threads) {
  if (threads == 0) threads = default_thread_count();
  for (std::size_t i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  { std::lock_guard<std::mutex> lock(mu_); }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(
    std::size_t n, const std::function<void(std::size_t, std::size_t, std::size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n, 0);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  pending_.store(workers_.size(), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);  // a worker between its check and its sleep
  }
  start_cv_.notify_all();
  auto [b, e] = split(n, size(), 0);
  if (b < e) fn(b, e, 0);
  auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done, spin_)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, done);
  }
  job_ = nullptr;
}

void ThreadPool::worker_loop(std::size_t id) {
  std::size_t seen = 0;
  for (;;) {
    auto started = [&] {
      return stop_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(started, spin_)) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, started);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    auto [b, e] = split(job_n_, size(), id);
    if (b < e) (*job_)(b, e, id);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      {
        std::lock_guard<std::mutex> lock(mu_);  // the caller between its check and its sleep
      }
      done_cv_.notify_one();
    }
  }
}

}  // namespace dsv41
