// Prometheus text-format metrics of the server: request counts by endpoint and status, token
// counters, queue and KV gauges, latency histograms (request duration, time to first token,
// inter-token latency) and the engine's step histograms (step time, batch tokens and sequences).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/histogram.h"

namespace dsv41 {

struct EngineStats;

class Metrics {
 public:
  // A request answered with `status` (counted per endpoint and status).
  void request_done(const std::string& endpoint, int status);
  // A generation request the engine ran: counted, and its end-to-end time in the duration
  // histogram.
  void generation_done(const std::string& endpoint, int status, double seconds);
  void first_token(double seconds);
  // `n` tokens arrived `seconds` after the previous ones (each counted at seconds / n).
  void inter_token(double seconds, int64_t n);
  void tokens(int64_t prompt, int64_t generated);
  // Gauges and the engine's counters are read at render time from the caller.
  std::string render(const EngineStats& engine, int64_t in_flight) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram duration_{Histogram::seconds()}, ttft_{Histogram::seconds()};
  Histogram itl_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
};

}  // namespace dsv41
