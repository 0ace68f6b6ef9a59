// `dsv41 bench serve` (design.md §8): the whole server under load, JSON. In one run: first the
// engine's own decode at each concurrency (bench decode's point at the prompt length), then the
// server in this process on loopback, driven by its own HTTP client: `concurrency` workers each
// sending streamed /v1/completions requests (token-id prompts of --prompt-len, the first
// --shared-prefix tokens common to all, --max-tokens greedy tokens, EOS ignored) until --requests
// are done. Per point: aggregate output tok/s, TTFT and inter-token latency p50/p99 (from the SSE
// chunks' arrival; the first request's TTFT apart, for --shared-prefix), the prefix-cache hit rate,
// and the ratio to the decode point (what scheduling, prefill and HTTP cost); the same ratio for
// the steps that held only decodes (what scheduling and HTTP cost apart from the prompts' prefill).
// --constrained ab runs each point again with every request under a JSON schema (issue 32): the
// ratio of the two output rates is what structured outputs cost.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/bench_model.h"
#include "cli/commands.h"
#include "cli/fast_model_dir.h"
#include "core/log.h"
#include "engine/engine.h"
#include "ops/kernels.h"
#include "server/http_server.h"

namespace dsv41::cli {
namespace {

struct ServeBenchArgs {
  BenchArgs common;
  std::string concurrency = "1,4,16";
  int64_t requests = 0;  // per point; 0: 2 x concurrency (at least 4)
  int64_t prompt_len = 32, max_tokens = 32, shared_prefix = 0;
  int64_t max_num_batched_tokens = EngineOptions{}.max_num_batched_tokens;
  std::string prefix_cache = "on";
  std::string constrained = "off";  // off | on | ab (issue 32: structured outputs' cost)
};

// --constrained: every request's answer follows this schema (structured_outputs.json): 200
// records, so longer than any --max-tokens here: each request still generates --max-tokens tokens
// (finish "length") and the tok/s compare with the unconstrained requests'.
const char* kBenchSchema =
    R"({"type":"array","minItems":200,"maxItems":200,"items":{"type":"object","properties":)"
    R"({"name":{"type":"string","maxLength":16},"n":{"type":"integer","minimum":0,"maximum":999}},)"
    R"("required":["name","n"],"additionalProperties":false}})";

struct RequestTiming {
  double ttft = -1;          // seconds from sending to the first token chunk
  std::vector<double> gaps;  // between token chunks
  int64_t tokens = 0;        // completion tokens (usage)
  int status = 0;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(q * double(v.size() - 1) + 0.5))];
}

// One streamed completion; SSE frames parsed as they arrive.
RequestTiming one_request(int port, const nlohmann::json& body) {
  RequestTiming r;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(600, 0);
  std::string buf;
  const auto t0 = Clock::now();
  auto last = t0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* d, std::size_t n, uint64_t, uint64_t) {
    buf.append(d, n);
    for (std::size_t e; (e = buf.find("\n\n")) != std::string::npos; buf.erase(0, e + 2)) {
      const std::string frame = buf.substr(0, e);
      if (frame.rfind("data: ", 0) != 0 || frame == "data: [DONE]") continue;
      const auto j = nlohmann::json::parse(frame.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object())
        r.tokens = j["usage"].value("completion_tokens", int64_t(0));
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const auto now = Clock::now();
      if (r.ttft < 0)
        r.ttft = secs(t0, now);
      else
        r.gaps.push_back(secs(last, now));
      last = now;
    }
    return true;
  };
  auto res = c.send(req);
  r.status = res ? res->status : 0;
  return r;
}

nlohmann::ordered_json serve_point(int port, int64_t conc, const ServeBenchArgs& a, int32_t vocab,
                                   Rng& rng, bool constrained) {
  const int64_t n = a.requests > 0 ? a.requests : std::max<int64_t>(4, 2 * conc);
  std::vector<int32_t> prefix(std::size_t(std::min(a.shared_prefix, a.prompt_len)));
  for (auto& t : prefix) t = int32_t(rng.below(uint64_t(vocab)));
  std::vector<nlohmann::json> bodies;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> p = prefix;
    while (int64_t(p.size()) < a.prompt_len) p.push_back(int32_t(rng.below(uint64_t(vocab))));
    bodies.push_back({{"model", "bench"},
                      {"prompt", p},
                      {"max_tokens", a.max_tokens},
                      {"temperature", 0},
                      {"ignore_eos", true},
                      {"stream", true},
                      {"stream_options", {{"include_usage", true}}}});
    if (constrained)
      bodies.back()["structured_outputs"] = {{"json", nlohmann::json::parse(kBenchSchema)}};
  }
  std::vector<RequestTiming> got(static_cast<std::size_t>(n));
  std::atomic<int64_t> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> workers;
  for (int64_t w = 0; w < conc; ++w)
    workers.emplace_back([&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;)
        got[std::size_t(i)] = one_request(port, bodies[std::size_t(i)]);
    });
  for (auto& t : workers) t.join();
  const double wall = secs(t0, Clock::now());
  int64_t tokens = 0, failed = 0;
  std::vector<double> ttft, ttft_rest, gaps;
  for (std::size_t i = 1; i < got.size(); ++i)
    if (got[i].ttft >= 0) ttft_rest.push_back(got[i].ttft);
  for (const auto& r : got) {
    tokens += r.tokens;
    failed += r.status != 200;
    if (r.ttft >= 0) ttft.push_back(r.ttft);
    gaps.insert(gaps.end(), r.gaps.begin(), r.gaps.end());
  }
  return {{"concurrency", conc},
          {"requests", n},
          {"failed", failed},
          {"output_tokens", tokens},
          {"wall_s", wall},
          {"output_tok_s", double(tokens) / wall},
          {"ttft_first_ms", got.empty() ? 0.0 : got[0].ttft * 1e3},
          {"ttft_after_first_p50_ms", percentile(ttft_rest, 0.5) * 1e3},
          {"ttft_p50_ms", percentile(ttft, 0.5) * 1e3},
          {"ttft_p99_ms", percentile(ttft, 0.99) * 1e3},
          {"itl_p50_ms", percentile(gaps, 0.5) * 1e3},
          {"itl_p99_ms", percentile(gaps, 0.99) * 1e3}};
}

int run_bench_serve(const ServeBenchArgs& a) {
  if (Status st = one_process_only("bench serve"); !st) {
    log::error("bench serve: {}", st.message());
    return kExitUsage;
  }
  auto conc = parse_list(a.concurrency, "--concurrency");
  if (!conc) {
    log::error("bench serve: {}", conc.status().message());
    return kExitUsage;
  }
  auto dir = ensure_converted(a.common.model, a.common.converted);
  if (!dir) {
    log::error("bench serve: --model: {}", dir.status().message());
    return kExitInvalid;
  }
  BenchArgs ca = a.common;
  ca.model = *dir;
  ca.converted.clear();
  // The engine's own decode at each concurrency, in the same run (then the model is released).
  std::vector<double> decode_tok_s;
  {
    auto m = load_for_bench(ca);
    if (!m) {
      log::error("bench serve: --model: {}", m.status().message());
      return kExitInvalid;
    }
    ReadProbe probe(64, std::size_t(a.common.threads));
    Rng rng(3);
    for (int64_t c : *conc) {
      log::info("bench serve: engine decode at {} streams ...", c);
      auto p = decode_point(*m, probe, std::max<int64_t>(1, c), a.prompt_len, 5, false, rng);
      if (!p) {
        log::error("bench serve: decode at {} streams: {}", c, p.status().message());
        return kExitInvalid;
      }
      decode_tok_s.push_back((*p)["tok_s"].get<double>());
    }
  }
  EngineOptions eo;
  eo.model_dir = *dir;
  eo.fast.threads = a.common.threads;
  eo.fast.act_quant = a.common.act_quant == "on";
  eo.fast.huge_pages = a.common.huge_pages == "on";
  eo.fast.kv_cache_gb = a.common.kv_cache_gb;
  eo.max_num_batched_tokens = a.max_num_batched_tokens;
  eo.fast.prefix_cache = a.prefix_cache == "on";
  auto engine = Engine::load(eo);
  if (!engine) {
    log::error("bench serve: --model: {}", engine.status().message());
    return kExitInvalid;
  }
  ServerOptions so;
  so.port = 0;
  so.model_name = "bench";
  so.threads = 0;  // one per request the engine can hold
  HttpServer server(**engine, so);
  if (Status st = server.bind(); !st) {
    log::error("bench serve: {}", st.message());
    return kExitInvalid;
  }
  std::thread serving([&] { server.serve(); });
  Rng rng(4);
  nlohmann::ordered_json points = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < conc->size(); ++i) {
    const int64_t c = std::max<int64_t>(1, (*conc)[i]);
    log::info("bench serve: {} concurrent clients ...", c);
    const EngineStats before = (*engine)->stats();
    auto p = serve_point(server.port(), c, a, (*engine)->vocab_size(), rng, a.constrained == "on");
    if (a.constrained == "ab") {
      // The same load with every request constrained, right after: the ratio of their tok/s.
      log::info("bench serve: {} concurrent clients, every request constrained ...", c);
      Rng again(5 + uint64_t(i));
      auto q = serve_point(server.port(), c, a, (*engine)->vocab_size(), again, true);
      p["constrained"] = q;
      p["constrained_tok_s_ratio"] =
          q["output_tok_s"].get<double>() / std::max(1e-9, p["output_tok_s"].get<double>());
    }
    const EngineStats after = (*engine)->stats();
    const int64_t looked = after.prefix_query_tokens - before.prefix_query_tokens;
    p["prefix_hit_rate"] =
        looked > 0 ? double(after.prefix_hit_tokens - before.prefix_hit_tokens) / double(looked)
                   : 0.0;
    p["engine_decode_tok_s"] = decode_tok_s[i];
    p["ratio_to_decode"] = p["output_tok_s"].get<double>() / decode_tok_s[i];
    // The served decode rate apart from prefill: steps that held only decodes, their tokens over
    // their wall time (sampling and publishing included; the HTTP threads share the cores).
    const double dsec = after.decode_steps_seconds - before.decode_steps_seconds;
    const int64_t dtok = after.decode_steps_tokens - before.decode_steps_tokens;
    p["decode_steps"] = {{"tokens", dtok}, {"seconds", dsec}};
    p["decode_steps_tok_s"] = dsec > 0 ? double(dtok) / dsec : 0.0;
    p["decode_steps_ratio_to_decode"] = dsec > 0 ? double(dtok) / dsec / decode_tok_s[i] : 0.0;
    points.push_back(p);
  }
  const EngineStats st = (*engine)->stats();
  server.shutdown();
  serving.join();
  nlohmann::ordered_json j = {{"bench", "serve"},
                              {"model", a.common.model},
                              {"isa", ops::isa_name(ops::kernels().isa)},
                              {"prompt_len", a.prompt_len},
                              {"max_tokens", a.max_tokens},
                              {"shared_prefix", a.shared_prefix},
                              {"prefix_cache", a.prefix_cache == "on"},
                              {"max_num_batched_tokens", a.max_num_batched_tokens},
                              {"constrained", a.constrained},
                              {"preemptions", st.preemptions_total},
                              {"kv_foreign_reads", st.kv_foreign_reads},
                              {"points", points}};
  std::printf("%s\n", j.dump(2).c_str());
  return kExitOk;
}

}  // namespace

void add_bench_serve(CLI::App* bench, Runner* run) {
  auto a = std::make_shared<ServeBenchArgs>();
  CLI::App* sub = bench->add_subcommand(
      "serve",
      "The server under load (in this process, over loopback), JSON per concurrency: output "
      "tok/s, TTFT and inter-token latency p50/p99, and the ratio to the engine's own decode at "
      "the same number of streams measured first in the same run.");
  add_common(sub, &a->common);
  sub->add_option("--concurrency", a->concurrency, "Comma-separated client counts")
      ->capture_default_str();
  sub->add_option("--requests", a->requests, "Requests per point (0: 2 x concurrency, >= 4)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20))
      ->capture_default_str();
  sub->add_option("--prompt-len", a->prompt_len, "Prompt tokens per request")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str();
  sub->add_option("--max-tokens", a->max_tokens, "Generated tokens per request")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str();
  sub->add_option(
         "--shared-prefix", a->shared_prefix,
         "Leading prompt tokens common to every request (prefix-cache hits after the first)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20))
      ->capture_default_str();
  sub->add_option("--max-num-batched-tokens", a->max_num_batched_tokens,
                  "The engine's token budget per step (serve's option)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str();
  sub->add_option("--constrained", a->constrained,
                  "Structured outputs: off | on (every request's answer follows a JSON schema) | "
                  "ab (each point also run with every request constrained, right after: "
                  "constrained_tok_s_ratio)")
      ->check(CLI::IsMember({"off", "on", "ab"}))
      ->capture_default_str();
  sub->add_option("--prefix-cache", a->prefix_cache, "on | off")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->callback([=] { *run = [=] { return run_bench_serve(*a); }; });
}

}  // namespace dsv41::cli
