// Prometheus text-format metrics of the server: request counts by endpoint and status, token
// counters, queue gauges and latency histograms (request duration, time to first token).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace dsv41 {

struct EngineStats;

class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                     1,     2.5,  5,     10,   30,  60,   120};
  void observe(double seconds);
  // Appends the _bucket/_sum/_count lines for `name` (caller holds the metrics lock).
  void render(const std::string& name, std::string& out) const;

 private:
  std::array<uint64_t, kBounds.size()> buckets_{};
  uint64_t count_ = 0;
  double sum_ = 0;
};

class Metrics {
 public:
  void request_done(const std::string& endpoint, int status, double seconds);
  void first_token(double seconds);
  void tokens(int64_t prompt, int64_t generated);
  // Gauges and the engine's counters are read at render time from the caller.
  std::string render(const EngineStats& engine, int64_t in_flight) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram duration_, ttft_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
};

}  // namespace dsv41
