// Prometheus text-format metrics of the server: request counts by endpoint and status, token
// counters, queue and KV gauges, latency histograms (request duration, time to first token,
// inter-token latency) and the engine's step histograms (step time, batch tokens and sequences).
// Beside the dsv41_* families, vLLM's names (vllm:*, labelled model_name and engine as vLLM
// labels them, its histogram buckets) for what the two have in common, so that dashboards and
// alerts written for vLLM read this server (docs/server.md has the mapping).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/histogram.h"

namespace dsv41 {

struct EngineStats;
enum class FinishReason;

// The network layer's figures /metrics exports (http::TransportCounters).
struct ConnectionFigures {
  int64_t open = 0, refused = 0, timed_out = 0, streams_cut = 0;
};

// The image encoder's counts (server/image_inputs.h ImageSupport).
struct ImageFigures {
  int64_t encodes = 0, cache_hits = 0;
};

class Metrics {
 public:
  // `model_name`: the served model's name, vLLM's model_name label.
  explicit Metrics(std::string model_name = {});
  // A request answered with `status` (counted per endpoint and status).
  void request_done(const std::string& endpoint, int status);
  // A generation request the engine ran: counted, and its end-to-end time in the duration
  // histogram.
  void generation_done(const std::string& endpoint, int status, double seconds);
  void first_token(double seconds);
  // `n` tokens arrived `seconds` after the previous ones (each counted at seconds / n).
  void inter_token(double seconds, int64_t n);
  void tokens(int64_t prompt, int64_t generated);
  // One sequence (a choice) ended: vllm:request_success_total by vLLM's finished_reason.
  void sequence_finished(FinishReason reason);
  // Gauges and the engine's counters are read at render time from the caller.
  // `connections`: the network layer's gauges and counters (open, refused, timed out, cut).
  std::string render(const EngineStats& engine, int64_t in_flight,
                     const ConnectionFigures& connections = ConnectionFigures(),
                     const ImageFigures& images = ImageFigures()) const;

 private:
  void render_vllm(std::string& out, const EngineStats& engine) const;  // under mu_
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram duration_{Histogram::seconds()}, ttft_{Histogram::seconds()};
  Histogram itl_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  // vLLM's: the same observations in its buckets (vllm/v1/metrics/loggers.py), and its
  // finished_reason counts (stop, length, abort, error).
  std::string vllm_labels_;  // model_name="...",engine="0"
  Histogram vllm_ttft_, vllm_itl_, vllm_e2e_;
  uint64_t vllm_finished_[4] = {};
};

}  // namespace dsv41
