// Metrics storage and Prometheus exposition (text format 0.0.4).
#include "server/metrics.h"

#include <fmt/format.h>

#include "engine/engine.h"

namespace dsv41 {
namespace {

// vLLM's histogram buckets (vllm/v1/metrics/loggers.py): time to first token, inter-token latency
// (and its older name, time per output token), end-to-end request latency.
const std::vector<double> kVllmTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                              0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                              20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kVllmItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                             0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                             7.5,  10.0,  20.0, 40.0,  80.0};
const std::vector<double> kVllmE2eBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                             5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
// vLLM's finished_reason label values, indexed as Metrics::vllm_finished_.
constexpr const char* kVllmFinishReasons[4] = {"stop", "length", "abort", "error"};

// A Prometheus label value: backslash, double quote and newline escaped (text format 0.0.4).
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

Metrics::Metrics(std::string model_name)
    : vllm_labels_(fmt::format("model_name=\"{}\",engine=\"0\"", label_value(model_name))),
      vllm_ttft_(kVllmTtftBuckets),
      vllm_itl_(kVllmItlBuckets),
      vllm_e2e_(kVllmE2eBuckets) {}

void Metrics::request_done(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::generation_done(const std::string& endpoint, int status, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
  duration_.observe(seconds);
  vllm_e2e_.observe(seconds);
}

void Metrics::first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
  vllm_ttft_.observe(seconds);
}

void Metrics::inter_token(double seconds, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) {
    itl_.observe(seconds / double(n));
    vllm_itl_.observe(seconds / double(n));
  }
}

void Metrics::sequence_finished(FinishReason reason) {
  // vLLM counts a request whose client went away as "abort", a failed one as "error".
  const int i = reason == FinishReason::kLength      ? 1
                : reason == FinishReason::kCancelled ? 2
                : reason == FinishReason::kError     ? 3
                                                     : 0;
  std::lock_guard<std::mutex> lock(mu_);
  ++vllm_finished_[i];
}

void Metrics::tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

namespace {

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}
void value(std::string& out, const char* name, const char* type, const char* help, int64_t v) {
  header(out, name, type, help);
  out += fmt::format("{} {}\n", name, v);
}
void histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  header(out, name, "histogram", help);
  h.render(name, out);
}

}  // namespace

std::string Metrics::render(const EngineStats& engine, int64_t in_flight,
                            const ConnectionFigures& connections,
                            const ImageFigures& images) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  header(out, "dsv41_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (const auto& [key, n] : requests_)
    out += fmt::format("dsv41_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, n);
  value(out, "dsv41_prompt_tokens_total", "counter",
        "Prompt tokens of finished generation requests.", prompt_tokens_);
  value(out, "dsv41_generation_tokens_total", "counter",
        "Generated tokens of finished generation requests.", generated_tokens_);
  value(out, "dsv41_queue_length", "gauge", "Requests waiting for the engine.", engine.queued);
  value(out, "dsv41_running_requests", "gauge", "Requests the engine is running.", engine.running);
  value(out, "dsv41_in_flight_requests", "gauge",
        "Generation requests accepted and not yet answered.", in_flight);
  value(out, "dsv41_open_connections", "gauge", "HTTP connections open now.", connections.open);
  value(out, "dsv41_connections_refused_total", "counter",
        "Connections refused over --max-connections or --max-connections-per-client.",
        connections.refused);
  value(out, "dsv41_connections_timed_out_total", "counter",
        "Connections closed at a deadline: headers, body, idle keep-alive or a write.",
        connections.timed_out);
  value(out, "dsv41_streams_cut_total", "counter",
        "Streamed answers cut for a reader slower than --stream-buffer-kb allows.",
        connections.streams_cut);
  value(out, "dsv41_image_encodes_total", "counter",
        "Images of requests run through the vision tower.", images.encodes);
  value(out, "dsv41_image_cache_hits_total", "counter",
        "Images of requests found encoded already (--image-cache-mb).", images.cache_hits);
  value(out, "dsv41_kv_foreign_reads_total", "counter",
        "KV cache rows read whose tag (sequence, block epoch, position) was not the reader's; "
        "the isolation gate, it must stay 0.",
        engine.kv_foreign_reads);
  value(out, "dsv41_kv_blocks_total", "gauge", "Blocks of the KV cache pool (0: no bounded pool).",
        engine.kv_blocks_total);
  value(out, "dsv41_kv_blocks_used", "gauge", "KV cache blocks held by sequences.",
        engine.kv_blocks_used);
  value(out, "dsv41_num_preemptions_total", "counter",
        "Sequences preempted (blocks given back, recomputed later) because the KV cache was full.",
        engine.preemptions_total);
  value(out, "dsv41_prefix_cache_queries_total", "counter", "Prompt lookups in the prefix cache.",
        engine.prefix_queries);
  value(out, "dsv41_prefix_cache_query_tokens_total", "counter", "Prompt tokens looked up.",
        engine.prefix_query_tokens);
  value(out, "dsv41_prefix_cache_hit_tokens_total", "counter",
        "Prompt tokens found cached (not computed).", engine.prefix_hit_tokens);
  value(out, "dsv41_prefix_cache_evictions_total", "counter",
        "Cached blocks given back to the KV pool to make room (the pool had been filled).",
        engine.prefix_evictions);
  value(out, "dsv41_engine_steps_total", "counter", "Model steps (batches) the engine ran.",
        engine.steps_total);
  value(
      out, "dsv41_engine_prompt_tokens_total", "counter",
      "Prompt tokens of the requests whose prompt the engine has computed (cached ones included).",
      engine.prompt_tokens_total);
  value(out, "dsv41_engine_generated_tokens_total", "counter",
        "Tokens the engine generated, counted as they are sampled (unfinished requests too).",
        engine.generated_tokens_total);
  value(out, "dsv41_spec_draft_tokens_total", "counter",
        "DSpark drafts verified (speculative decoding, --speculative dspark).",
        engine.spec_draft_tokens);
  value(out, "dsv41_spec_accepted_total", "counter",
        "DSpark drafts the verifier accepted (each one a token emitted without its own step).",
        engine.spec_accepted_tokens);
  value(out, "dsv41_spec_verify_steps_total", "counter",
        "Decode steps of a sequence that verified drafts.", engine.spec_steps);
  value(out, "dsv41_spec_shadow_probes_total", "counter",
        "DSpark shadow probes: chains drafted while drafting did not pay and compared with the "
        "tokens plain steps emitted (--spec-probe shadow).",
        engine.spec_shadow_probes);
  value(out, "dsv41_spec_shadow_draft_tokens_total", "counter",
        "Drafts of shadow probes compared with the emitted tokens (up to the first mismatch, "
        "which counts).",
        engine.spec_shadow_draft_tokens);
  value(out, "dsv41_spec_shadow_accepted_total", "counter",
        "Drafts of shadow probes that matched the emitted tokens (a verify would have accepted "
        "them).",
        engine.spec_shadow_accepted_tokens);
  histogram(out, "dsv41_request_duration_seconds", "Generation request latency, end to end.",
            duration_);
  histogram(out, "dsv41_time_to_first_token_seconds",
            "Time from arrival to the first generated token.", ttft_);
  histogram(out, "dsv41_inter_token_latency_seconds", "Time between a request's generated tokens.",
            itl_);
  histogram(out, "dsv41_engine_step_seconds", "Duration of one engine step (one model batch).",
            engine.step_seconds);
  histogram(out, "dsv41_engine_batch_tokens", "Tokens in one engine step, all sequences together.",
            engine.batch_tokens);
  histogram(out, "dsv41_engine_batch_sequences", "Sequences in one engine step.",
            engine.batch_sequences);
  value(out, "dsv41_max_queue", "gauge",
        "Requests that may wait beyond the free running seats (--max-queue); more get 429.",
        engine.max_queue);
  value(out, "dsv41_max_num_seqs", "gauge", "Requests running in the same steps at most.",
        engine.max_num_seqs);
  render_vllm(out, engine);
  return out;
}

// vLLM's families for what both servers measure, from the same counters as the dsv41_ ones.
void Metrics::render_vllm(std::string& out, const EngineStats& engine) const {
  auto one = [&](const char* name, const char* type, const char* help, auto v) {
    header(out, name, type, help);
    out += fmt::format("{}{{{}}} {}\n", name, vllm_labels_, v);
  };
  one("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
      engine.running);
  one("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
      engine.queued);
  const double kv = engine.kv_blocks_total > 0
                        ? double(engine.kv_blocks_used) / double(engine.kv_blocks_total)
                        : 0.0;
  one("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", kv);
  one("vllm:gpu_cache_usage_perc", "gauge",
      "KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc "
      "instead.",
      kv);
  one("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
      engine.prompt_tokens_total);
  one("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
      engine.generated_tokens_total);
  one("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
      engine.preemptions_total);
  one("vllm:prefix_cache_queries_total", "counter",
      "Prefix cache queries, in terms of number of queried tokens.", engine.prefix_query_tokens);
  one("vllm:prefix_cache_hits_total", "counter",
      "Prefix cache hits, in terms of number of cached tokens.", engine.prefix_hit_tokens);
  header(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (int i = 0; i < 4; ++i)
    out += fmt::format("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", vllm_labels_,
                       kVllmFinishReasons[i], vllm_finished_[i]);
  auto hist = [&](const char* name, const char* help, const Histogram& h) {
    header(out, name, "histogram", help);
    h.render(name, out, vllm_labels_);
  };
  hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
       vllm_ttft_);
  hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
       vllm_itl_);
  // vLLM still exports the older name beside it, with the same observations.
  hist("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
       vllm_itl_);
  hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
       vllm_e2e_);
}

}  // namespace dsv41
