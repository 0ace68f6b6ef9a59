// Metrics storage and Prometheus exposition (text format 0.0.4).
#include "server/metrics.h"

#include <fmt/format.h>

#include "engine/engine.h"

namespace dsv41 {

void Metrics::request_done(const std::string& endpoint, int status, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
  if (endpoint == "/v1/completions" || endpoint == "/v1/chat/completions")
    duration_.observe(seconds);
}

void Metrics::first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::inter_token(double seconds, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) itl_.observe(seconds / double(n));
}

void Metrics::tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

std::string Metrics::render(const EngineStats& engine, int64_t in_flight) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out += "# HELP dsv41_requests_total HTTP requests by endpoint and status code.\n";
  out += "# TYPE dsv41_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += fmt::format("dsv41_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, n);
  out += "# HELP dsv41_prompt_tokens_total Prompt tokens of finished generation requests.\n";
  out += "# TYPE dsv41_prompt_tokens_total counter\n";
  out += fmt::format("dsv41_prompt_tokens_total {}\n", prompt_tokens_);
  out += "# HELP dsv41_generation_tokens_total Generated tokens of finished generation requests.\n";
  out += "# TYPE dsv41_generation_tokens_total counter\n";
  out += fmt::format("dsv41_generation_tokens_total {}\n", generated_tokens_);
  out +=
      "# HELP dsv41_queue_length Requests waiting for the engine.\n# TYPE dsv41_queue_length "
      "gauge\n";
  out += fmt::format("dsv41_queue_length {}\n", engine.queued);
  out +=
      "# HELP dsv41_running_requests Requests the engine is running.\n# TYPE "
      "dsv41_running_requests gauge\n";
  out += fmt::format("dsv41_running_requests {}\n", engine.running);
  out += "# HELP dsv41_in_flight_requests Generation requests accepted and not yet answered.\n";
  out += "# TYPE dsv41_in_flight_requests gauge\n";
  out += fmt::format("dsv41_in_flight_requests {}\n", in_flight);
  out +=
      "# HELP dsv41_kv_foreign_reads_total KV cache rows read whose tag (sequence, block epoch, "
      "position) was not the reader's; the isolation gate, it must stay 0.\n";
  out += "# TYPE dsv41_kv_foreign_reads_total counter\n";
  out += fmt::format("dsv41_kv_foreign_reads_total {}\n", engine.kv_foreign_reads);
  out += "# HELP dsv41_kv_blocks_total Blocks of the KV cache pool (0: no bounded pool).\n";
  out += "# TYPE dsv41_kv_blocks_total gauge\n";
  out += fmt::format("dsv41_kv_blocks_total {}\n", engine.kv_blocks_total);
  out += "# HELP dsv41_kv_blocks_used KV cache blocks held by sequences.\n";
  out += "# TYPE dsv41_kv_blocks_used gauge\n";
  out += fmt::format("dsv41_kv_blocks_used {}\n", engine.kv_blocks_used);
  out +=
      "# HELP dsv41_num_preemptions_total Sequences preempted (blocks given back, recomputed "
      "later) because the KV cache was full.\n";
  out += "# TYPE dsv41_num_preemptions_total counter\n";
  out += fmt::format("dsv41_num_preemptions_total {}\n", engine.preemptions_total);
  out += "# HELP dsv41_prefix_cache_queries_total Prompt lookups in the prefix cache.\n";
  out += "# TYPE dsv41_prefix_cache_queries_total counter\n";
  out += fmt::format("dsv41_prefix_cache_queries_total {}\n", engine.prefix_queries);
  out += "# HELP dsv41_prefix_cache_query_tokens_total Prompt tokens looked up.\n";
  out += "# TYPE dsv41_prefix_cache_query_tokens_total counter\n";
  out += fmt::format("dsv41_prefix_cache_query_tokens_total {}\n", engine.prefix_query_tokens);
  out += "# HELP dsv41_prefix_cache_hit_tokens_total Prompt tokens found cached (not computed).\n";
  out += "# TYPE dsv41_prefix_cache_hit_tokens_total counter\n";
  out += fmt::format("dsv41_prefix_cache_hit_tokens_total {}\n", engine.prefix_hit_tokens);
  out += "# HELP dsv41_engine_steps_total Model steps (batches) the engine ran.\n";
  out += "# TYPE dsv41_engine_steps_total counter\n";
  out += fmt::format("dsv41_engine_steps_total {}\n", engine.steps_total);
  out += "# HELP dsv41_request_duration_seconds Generation request latency, end to end.\n";
  out += "# TYPE dsv41_request_duration_seconds histogram\n";
  duration_.render("dsv41_request_duration_seconds", out);
  out +=
      "# HELP dsv41_time_to_first_token_seconds Time from arrival to the first generated token.\n";
  out += "# TYPE dsv41_time_to_first_token_seconds histogram\n";
  ttft_.render("dsv41_time_to_first_token_seconds", out);
  out += "# HELP dsv41_inter_token_latency_seconds Time between a request's generated tokens.\n";
  out += "# TYPE dsv41_inter_token_latency_seconds histogram\n";
  itl_.render("dsv41_inter_token_latency_seconds", out);
  out += "# HELP dsv41_engine_step_seconds Duration of one engine step (one model batch).\n";
  out += "# TYPE dsv41_engine_step_seconds histogram\n";
  engine.step_seconds.render("dsv41_engine_step_seconds", out);
  out += "# HELP dsv41_engine_batch_tokens Tokens in one engine step, all sequences together.\n";
  out += "# TYPE dsv41_engine_batch_tokens histogram\n";
  engine.batch_tokens.render("dsv41_engine_batch_tokens", out);
  out += "# HELP dsv41_engine_batch_sequences Sequences in one engine step.\n";
  out += "# TYPE dsv41_engine_batch_sequences histogram\n";
  engine.batch_sequences.render("dsv41_engine_batch_sequences", out);
  return out;
}

}  // namespace dsv41
