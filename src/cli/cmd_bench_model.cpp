// `dsv41 bench decode` and `dsv41 bench prefill` (design.md §8): the fast engine on a model,
// JSON. Decode: per (streams, context) point, steps of one token per stream after a prefill of
// `context` tokens each: tok/s (aggregate and per stream), weight bytes the kernels read per step
// (counted by the engine), distinct routed experts per step, achieved GB/s, the read probe measured
// beside it and fraction_of_floor = (bytes per step / probe GB/s) / step time. Prefill: per prompt
// length, one step of the whole prompt: tok/s, time to first token, and the step's multiply-adds
// (counted by the engine) per second against ops' FP8 GEMM peak measured in the same run. Both:
// flops_per_step (2 x the multiply-adds the engine counts: linears, experts, mHC; a prefill's
// "step" is the whole prompt), reference_gflop_per_s (oneDNN's bf16 matmul m=2048 k=n=5120 run
// beside the point, ops::reference_gemm) and fraction_of_roofline = max(bytes / probe, flops /
// reference) / step time.
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/bench_image.h"
#include "cli/bench_model.h"
#include "cli/commands.h"
#include "cli/fast_model_dir.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/fast/fast_model.h"
#include "ops/bench/kernel_bench.h"
#include "ops/kernels.h"

namespace dsv41::cli {

Result<std::vector<int64_t>> parse_list(const std::string& s, const std::string& what) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      const long long x = std::stoll(item, &used);
      if (used != item.size() || x < 0) throw std::invalid_argument(item);
      v.push_back(x);
    } catch (const std::exception&) {
      return Status::error(what + ": '" + item + "' is not a non-negative integer");
    }
  }
  if (v.empty()) return Status::error(what + ": empty list");
  return v;
}

ReadProbe::ReadProbe(std::size_t mb, std::size_t threads) : buf_(mb << 18), pool_(threads) {
  for (std::size_t i = 0; i < buf_.size(); ++i) buf_[i] = float(i & 1023);
}

double ReadProbe::gb_per_s() {
  std::vector<float> sink(pool_.size());
  auto job = [&](std::size_t b, std::size_t e, std::size_t p) {
    sink[p] += ops::kernels().read_sum(buf_.data() + b, int64_t(e - b));
  };
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = Clock::now();
    pool_.parallel_for(buf_.size(), std::ref(job));
    best = std::max(best, double(buf_.size() * sizeof(float)) / 1e9 / secs(t0, Clock::now()));
  }
  volatile float keep = sink[0];
  (void)keep;
  return best;
}

Result<BenchModel> load_for_bench(const BenchArgs& a) {
  auto dir = ensure_converted(a.model, a.converted);
  if (!dir) return dir.status();
  FastOptions o;
  o.threads = a.threads;
  o.act_quant = a.act_quant == "on";
  o.kv_cache_bytes = int64_t(a.kv_cache_gb * 1e9);
  o.warm = true;  // measure the kernels, not the first touch of the weights' pages
  o.huge_pages = a.huge_pages == "on";
  o.replay_margin = replay_margin_value(a.replay_margin);
  auto r = parallel::load_split(*dir, o, {a.tp, a.ep, a.rank_timeout_s});
  if (!r) return r.status();
  BenchModel bm;
  bm.runner = std::move(*r);
  bm.lead = parallel::as_lead(bm.runner.get());
  bm.local = bm.lead ? &bm.lead->local() : dynamic_cast<FastModel*>(bm.runner.get());
  return bm;
}

static std::vector<int32_t> bench_random_tokens(Rng& rng, int32_t vocab, int64_t n) {
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (auto& v : t) v = int32_t(rng.below(uint64_t(vocab)));
  return t;
}

// max(bytes / probe, flops / reference) / step time: how close a step is to the machine's bound,
// memory or arithmetic, whichever binds (design.md §4); the bytes alone without a reference.
double roofline_fraction(double bytes, double probe_gbs, double flops,
                         const ops::ReferenceGemm& ref, double step_s) {
  const double mem_s = probe_gbs > 0 ? bytes / 1e9 / probe_gbs : 0;
  const double math_s = ref.gflop_per_s > 0 ? flops / 1e9 / ref.gflop_per_s : 0;
  return std::max(mem_s, math_s) / step_s;
}

Result<nlohmann::ordered_json> decode_point(BenchModel& bm, ReadProbe& probe, int64_t streams,
                                            int64_t context, int steps, bool prefill_context,
                                            Rng& rng) {
  ModelRunner& m = *bm.runner;
  const FastModel& local = *bm.local;
  const int32_t V = m.vocab_size();
  for (int64_t s = 0; s < streams; ++s) {
    DSV41_RETURN_IF_ERROR(m.open(SeqId(s + 1)));
    if (context > 0 && !prefill_context) {  // caches of `context` tokens, random rows
      DSV41_RETURN_IF_ERROR(bm.fill_random_context(SeqId(s + 1), context, rng.next_u64()));
    } else if (context > 0) {  // each stream's context, one prefill step per stream
      StepBatch b;
      b.slices.push_back({SeqId(s + 1), 0, bench_random_tokens(rng, V, context), {}, {}});
      StepOutput out;
      DSV41_RETURN_IF_ERROR(m.step(b, &out));
    }
  }
  StepBatch b;
  for (int64_t s = 0; s < streams; ++s) b.slices.push_back({SeqId(s + 1), context, {1}, {0}, {}});
  StepOutput out;
  auto run_step = [&]() -> Status {
    for (auto& sl : b.slices) {
      sl.first_pos = m.length(sl.seq);
      sl.tokens[0] = int32_t(rng.below(uint64_t(V)));
    }
    return m.step(b, &out);
  };
  DSV41_RETURN_IF_ERROR(run_step());  // warm-up: scratch, first touch of pages
  // The arithmetic reference beside the point (before the probe, so oneDNN's threads are idle
  // again when the steps run).
  const ops::ReferenceGemm ref = ops::reference_gemm();
  const double probe_before = probe.gb_per_s();
  const FastStats s0 = local.stats();
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) DSV41_RETURN_IF_ERROR(run_step());
  const double t = secs(t0, Clock::now());
  const FastStats s1 = local.stats();
  const double probe_gbs = std::max(probe_before, probe.gb_per_s());
  for (int64_t s = 0; s < streams; ++s) m.free(SeqId(s + 1));
  const double step_s = t / steps;
  const double bytes = double(s1.weight_bytes - s0.weight_bytes) / steps;
  const double tok_s = double(streams) / step_s;
  const double flops = 2.0 * double(s1.macs - s0.macs) / steps;
  nlohmann::ordered_json j{
      {"streams", streams},
      {"context", context},
      {"steps", steps},
      {"tok_s", tok_s},
      {"tok_s_per_stream", tok_s / double(streams)},
      {"step_ms", step_s * 1e3},
      {"bytes_per_step", bytes},
      {"distinct_experts_per_step", double(s1.distinct_experts - s0.distinct_experts) / steps},
      {"achieved_gb_per_s", bytes / 1e9 / step_s},
      {"read_probe_gb_per_s", probe_gbs},
      {"fraction_of_floor", bytes / 1e9 / probe_gbs / step_s},
      {"flops_per_step", flops},
      {"reference_gflop_per_s", ref.gflop_per_s},
      {"reference_op", ref.op},
      {"fraction_of_roofline", roofline_fraction(bytes, probe_gbs, flops, ref, step_s)},
      {"foreign_reads", s1.foreign_reads}};
  if (bm.lead) {  // split: rank 0's time in collectives (waiting for the others included)
    const double comm_s = (s1.collective_seconds - s0.collective_seconds) / steps;
    j["collective_ms_per_step"] = comm_s * 1e3;
    j["collective_share"] = comm_s / step_s;
    j["collectives_per_step"] = double(s1.collectives - s0.collectives) / steps;
    j["exchanged_bytes_per_token"] =
        double(s1.collective_bytes - s0.collective_bytes) / steps / double(streams);
  }
  return j;
}

namespace {

// A rank's memory in `bench decode`'s per_rank list (its collectives added when split).
nlohmann::ordered_json rank_json(const parallel::RankReport& r) {
  return {{"rank", r.rank},
          {"weight_bytes", r.share_weight_bytes},
          {"rss_bytes", r.rss_bytes},
          {"rss_file_bytes", r.rss_file_bytes},
          {"huge_page_weight_bytes", r.huge_page_weight_bytes},
          {"anon_huge_bytes", r.anon_huge_bytes},
          {"kv_pool_bytes", r.kv_pool_bytes}};
}

int run_bench_decode(const BenchArgs& a) {
  if (a.speculative == "on") return run_bench_speculative(a);
  auto streams = parse_list(a.streams, "--streams");
  auto context = parse_list(a.context, "--context");
  if (!streams || !context) {
    log::error("bench decode: {}", (!streams ? streams.status() : context.status()).message());
    return kExitUsage;
  }
  auto m = load_for_bench(a);
  if (!m) {
    log::error("bench decode: --model: {}", m.status().message());
    return kExitInvalid;
  }
  ReadProbe probe(a.probe_mb, std::size_t(a.threads));
  Rng rng(1);
  nlohmann::ordered_json points = nlohmann::ordered_json::array();
  for (int64_t c : *context)
    for (int64_t s : *streams) {
      if (s < 1) continue;
      log::info("bench decode: {} streams at context {} ...", s, c);
      auto p = decode_point(*m, probe, s, c, a.steps, a.context_fill == "prefill", rng);
      if (!p) {
        log::error("bench decode: {} streams, context {}: {}", s, c, p.status().message());
        return kExitInvalid;
      }
      points.push_back(*p);
    }
  nlohmann::ordered_json j = {{"bench", "decode"},      {"model", a.model},
                              {"isa", m->local->isa()}, {"act_quant", a.act_quant},
                              {"threads", a.threads},   {"context_fill", a.context_fill},
                              {"points", points}};
  if (m->lead) {  // split: every rank's memory and collectives
    auto reps = m->lead->reports();
    if (!reps) {
      log::error("bench decode: {}", reps.status().message());
      return kExitRankFailed;
    }
    j["ranks"] = reps->size();
    j["tp"] = m->lead->split().tp;
    j["ep"] = m->lead->split().ep;
    nlohmann::ordered_json rj = nlohmann::ordered_json::array();
    for (const auto& r : *reps) {
      nlohmann::ordered_json x = rank_json(r);
      x["collectives"] = r.collectives;
      x["collective_bytes"] = r.collective_bytes;
      x["collective_seconds"] = r.collective_seconds;
      rj.push_back(std::move(x));
    }
    j["per_rank"] = rj;
  } else {
    j["ranks"] = 1;
    j["tp"] = 1;
    j["ep"] = 1;
    j["per_rank"] = nlohmann::ordered_json::array({rank_json(parallel::own_report(*m->local, 0))});
  }
  std::printf("%s\n", j.dump(2).c_str());
  return kExitOk;
}

// The peak the prefill is measured against, in the same run: ops' FP8 prefill GEMM on a
// [5120 x 5120] matrix at 256 tokens over every thread (rows split at multiples of 96, as
// `bench kernels` does), best of 3; GFLOP/s = 2 x multiply-adds / s.
double fp8_gemm_peak_gflops(int threads) {
  constexpr int64_t kN = 5120, kK = 5120, kM = 256;
  Rng rng(4);
  std::vector<uint8_t> w(std::size_t(kN * kK)), sc(std::size_t(kN / 32 * (kK / 32)), 120);
  for (auto& b : w) b = uint8_t(rng.below(0x7E));  // finite E4M3
  std::vector<float> x(std::size_t(kM * kK)), y(std::size_t(kM * kN));
  for (auto& v : x) v = float(rng.uniform(-0.5, 0.5));
  ThreadPool pool(std::size_t(std::max(0, threads)));
  const ops::Kernels& k = ops::kernels();
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(std::size_t((kN + 95) / 96), [&](std::size_t b, std::size_t e, std::size_t) {
      const int64_t r0 = int64_t(b) * 96, rows = std::min(kN, int64_t(e) * 96) - r0;
      k.fp8_gemm(w.data() + r0 * kK, sc.data() + (r0 / 32) * (kK / 32), rows, kK, x.data(), kM,
                 y.data() + r0, kN);
    });
    if (rep > 0) best = std::min(best, secs(t0, Clock::now()));  // rep 0 warms up
  }
  return 2.0 * double(kN * kK * kM) / best / 1e9;
}

int run_bench_prefill(const BenchArgs& a) {
  if (!a.images.empty()) {  // the vision tower's points instead of the text prefill's
    auto pts = bench_image_points(a.model, a.converted, a.images, a.threads);
    if (!pts) {
      log::error("bench prefill: {}", pts.status().message());
      return kExitInvalid;
    }
    nlohmann::ordered_json j = {{"bench", "prefill"},
                                {"model", a.model},
                                {"isa", ops::isa_name(ops::active_isa())},
                                {"threads", a.threads},
                                {"images", *pts}};
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  auto lengths = parse_list(a.lengths, "--lengths");
  if (!lengths) {
    log::error("bench prefill: {}", lengths.status().message());
    return kExitUsage;
  }
  auto m = load_for_bench(a);
  if (!m) {
    log::error("bench prefill: --model: {}", m.status().message());
    return kExitInvalid;
  }
  Rng rng(2);
  ReadProbe probe(a.probe_mb, std::size_t(a.threads));
  log::info("bench prefill: measuring the FP8 GEMM peak ...");
  const double peak = fp8_gemm_peak_gflops(a.threads);
  if (a.extremes && (a.decoder_replay != "ab" || a.prefill_attention != "ab")) {
    log::error("bench prefill: --extremes needs --decoder-replay ab and --prefill-attention ab");
    return kExitUsage;
  }
  // The switches' combinations, each measured on the same prompt (first: everything off).
  std::vector<std::pair<bool, bool>> modes;  // (decoder replay, prefill attention)
  for (bool rep : {false, true})
    for (bool pa : {false, true})
      if ((a.decoder_replay == "ab" || (a.decoder_replay == "on") == rep) &&
          (a.prefill_attention == "ab" || (a.prefill_attention == "on") == pa))
        if (!a.extremes || rep == pa) modes.emplace_back(rep, pa);
  auto label = [](std::pair<bool, bool> md) {
    return std::string(md.first ? "replay_on" : "replay_off") +
           (md.second ? "+prefill_attention_on" : "+prefill_attention_off");
  };
  nlohmann::ordered_json points = nlohmann::ordered_json::array();
  for (int64_t len : *lengths) {
    if (len < 1) continue;
    const std::vector<int32_t> prompt = bench_random_tokens(rng, m->runner->vocab_size(), len);
    const int64_t chunk = a.chunk > 0 ? std::min(a.chunk, len) : len;
    const ops::ReferenceGemm ref = ops::reference_gemm();  // beside the point
    const double probe_gbs = probe.gb_per_s();
    nlohmann::ordered_json by_mode = nlohmann::ordered_json::object();
    for (const auto& mode : modes) {
      const bool replay = mode.first;
      log::info("bench prefill: {} tokens in chunks of {}, {} ...", len, chunk, label(mode));
      m->set_prefill_attention(mode.second);
      if (Status st = m->set_decoder_replay(replay); !st.is_ok()) {
        log::error("bench prefill: {}", st.message());
        return kExitInvalid;
      }
      ModelRunner& fm = *m->runner;
      const FastModel& local = *m->local;
      if (Status st = fm.open(1); !st.is_ok()) {
        log::error("bench prefill: {}", st.message());
        return kExitInvalid;
      }
      const FastStats s0 = local.stats();
      const auto t0 = Clock::now();
      Status st = Status::ok();
      double last_chunk_ms = 0;
      for (int64_t c0 = 0; c0 < len && st.is_ok(); c0 += chunk) {
        const int64_t cn = std::min(chunk, len - c0);
        StepBatch b;
        b.slices.push_back(
            {1, c0, std::vector<int32_t>(prompt.begin() + c0, prompt.begin() + c0 + cn), {}, {}});
        if (c0 + cn == len) b.slices[0].logits_rows.push_back(int32_t(cn - 1));
        StepOutput out;
        const auto tc = Clock::now();
        st = fm.step(b, &out);
        last_chunk_ms = secs(tc, Clock::now()) * 1e3;
      }
      const double t = secs(t0, Clock::now());
      fm.free(1);
      if (!st.is_ok()) {
        log::error("bench prefill: {} tokens: {}", len, st.message());
        return kExitInvalid;
      }
      const double flops = 2.0 * double(local.stats().macs - s0.macs);
      const double gflops = flops / t / 1e9;
      const double bytes = double(local.stats().weight_bytes - s0.weight_bytes);
      const int64_t chunks = (len + chunk - 1) / chunk;
      by_mode[label(mode)] = {
          {"tok_s", double(len) / t},
          {"ttft_ms", t * 1e3},
          {"ms_per_chunk", t * 1e3 / double(chunks)},
          {"last_chunk_ms", last_chunk_ms},
          {"bytes_read", bytes},
          {"linear_gflop_s", gflops},
          {"fraction_of_gemm_peak", gflops / peak},
          {"bytes_per_step", bytes},
          {"flops_per_step", flops},
          {"reference_gflop_per_s", ref.gflop_per_s},
          {"reference_op", ref.op},
          {"read_probe_gb_per_s", probe_gbs},
          {"fraction_of_roofline", roofline_fraction(bytes, probe_gbs, flops, ref, t)},
          {"replay_skipped_rows", local.stats().replay_skipped_rows - s0.replay_skipped_rows}};
    }
    nlohmann::ordered_json pt = {{"tokens", len}, {"chunk", chunk}};
    // The first mode's figures at the top level (the keys checks read), each mode under its name.
    for (const auto& [k, v] : by_mode.begin().value().items()) pt[k] = v;
    pt["modes"] = by_mode;
    // Each switch's ratio with the other switch as in the first mode, and everything on against
    // everything off.
    auto ratio = [&](std::pair<bool, bool> off, std::pair<bool, bool> on) -> double {
      if (!by_mode.contains(label(off)) || !by_mode.contains(label(on))) return 0;
      return by_mode[label(off)]["ms_per_chunk"].get<double>() /
             by_mode[label(on)]["ms_per_chunk"].get<double>();
    };
    const bool pa0 = modes.front().second, rep0 = modes.front().first;
    if (double r = ratio({false, pa0}, {true, pa0}); r > 0) pt["replay_speedup_per_chunk"] = r;
    if (double r = ratio({rep0, false}, {rep0, true}); r > 0)
      pt["prefill_attention_speedup_per_chunk"] = r;
    if (double r = ratio({false, false}, {true, true}); r > 0) pt["all_on_speedup"] = r;
    points.push_back(pt);
  }
  nlohmann::ordered_json j = {{"bench", "prefill"},
                              {"model", a.model},
                              {"isa", m->local->isa()},
                              {"act_quant", a.act_quant},
                              {"threads", a.threads},
                              {"fp8_gemm_peak_gflop_s", peak},
                              {"replay_margin", m->local->replay_margin()},
                              {"points", points}};
  std::printf("%s\n", j.dump(2).c_str());
  return kExitOk;
}

}  // namespace

void add_common(CLI::App* sub, BenchArgs* a) {
  sub->add_option("--model", a->model, "Checkpoint (converted, or official: converted once)")
      ->required();
  sub->add_option("--converted", a->converted, "Where an official-layout model is converted to");
  sub->add_option("--threads", a->threads, "Threads (0: every core)")->check(CLI::Range(0, 4096));
  sub->add_option("--kv-cache-gb", a->kv_cache_gb, "KV pool size in GB (0: default)")
      ->check(CLI::Range(0.0, 1e6));
  sub->add_option("--act-quant", a->act_quant, "on | off")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->add_option("--huge-pages", a->huge_pages,
                  "on = the weights copied onto transparent huge pages at load (as serve) | off = "
                  "read through the file mapping (per_rank.huge_page_weight_bytes says what was "
                  "copied)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

void add_bench_model(CLI::App* bench, Runner* run) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* dec = bench->add_subcommand(
      "decode",
      "Fast-engine decode, JSON per (streams, context): tok/s, bytes_per_step (weight bytes the "
      "kernels read, counted), distinct_experts_per_step, achieved GB/s, read_probe_gb_per_s "
      "measured beside it, fraction_of_floor = (bytes/probe)/step time, isa.");
  add_common(dec, a.get());
  add_split_options(dec, &a->tp, &a->ep, &a->rank_timeout_s);
  dec->add_option("--streams", a->streams, "Comma-separated stream counts")->capture_default_str();
  dec->add_option("--context", a->context, "Comma-separated context depths (tokens prefilled)")
      ->capture_default_str();
  dec->add_option("--context-fill", a->context_fill,
                  "random: each stream's caches filled with random rows in the cache formats "
                  "(decode at depth timed without the prefill; same arithmetic) | prefill: run "
                  "the prefill of random tokens")
      ->check(CLI::IsMember({"random", "prefill"}))
      ->capture_default_str();
  dec->add_option("--steps", a->steps, "Timed decode steps per point")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  dec->add_option("--probe-mb", a->probe_mb, "Read-probe buffer (MiB)")
      ->check(CLI::Range(16, 65536))
      ->capture_default_str();
  dec->add_option("--speculative", a->speculative,
                  "on: instead, the DSpark A/B through the engine: greedy requests at each "
                  "--streams count on a repetitive and a random prompt, drafting on vs "
                  "suppressed (per-stream tok/s, acceptance, rows and distinct experts per step)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  dec->add_option("--spec-width", a->spec_width,
                  "--speculative on: drafts verified at every step (0: what the engine's cost "
                  "model picks per request)")
      ->check(CLI::Range(int64_t(0), int64_t(16)))
      ->capture_default_str();
  dec->add_option("--spec-repeats", a->spec_repeats,
                  "--speculative on: repetitions of the modes, alternating (medians reported)")
      ->check(CLI::Range(int64_t(1), int64_t(400)))
      ->capture_default_str();
  dec->add_option("--spec-modes", a->spec_modes,
                  "--speculative on: the modes each repetition runs, comma-separated: off (the "
                  "control, always) with on and/or oracle; off,on halves a long A/B's time")
      ->capture_default_str();
  dec->add_flag("--spec-paired", a->spec_paired,
                "--speculative on with --spec-modes off,on: two engines run off and on at the "
                "same time (each with half the cores unless --threads says; they swap modes every "
                "repetition), so a slow phase of the machine falls on both runs of a repetition");
  dec->add_option("--spec-tokens", a->spec_tokens,
                  "--speculative on: tokens each request generates")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 20))
      ->capture_default_str();
  add_spec_probe_option(dec, &a->spec_probe);
  dec->callback([=] { *run = [=] { return run_bench_decode(*a); }; });
  auto p = std::make_shared<BenchArgs>();
  CLI::App* pre = bench->add_subcommand(
      "prefill",
      "Fast-engine prefill, JSON per prompt length: tok/s, ttft_ms, the multiply-adds' GFLOP/s "
      "and their fraction of the FP8 prefill GEMM's peak measured in the same run, "
      "flops_per_step, reference_gflop_per_s (oneDNN bf16 matmul m=2048 k=n=5120 beside the "
      "point) and fraction_of_roofline, isa.");
  add_common(pre, p.get());
  add_split_options(pre, &p->tp, &p->ep, &p->rank_timeout_s);
  pre->add_option("--decoder-replay", p->decoder_replay,
                  "off | on | ab: each length with decoder replay off and on in the same run "
                  "(ratio replay_speedup_per_chunk)")
      ->check(CLI::IsMember({"off", "on", "ab"}))
      ->capture_default_str();
  add_replay_margin_option(pre, &p->replay_margin);
  pre->add_option(
         "--prefill-attention", p->prefill_attention,
         "off | on | ab: ops' banded prefill attention (same bits as the one-query "
         "kernel) against the one-query path, in the same run "
         "(prefill_attention_speedup_per_chunk; with --decoder-replay ab also all_on_speedup)")
      ->check(CLI::IsMember({"off", "on", "ab"}))
      ->capture_default_str();
  pre->add_flag("--extremes", p->extremes,
                "With --decoder-replay ab --prefill-attention ab: measure only everything off and "
                "everything on (all_on_speedup), for lengths where four modes take too long");
  pre->add_option("--chunk", p->chunk,
                  "Prompt tokens per step (0: the whole prompt in one step), as the engine's "
                  "--max-num-batched-tokens chunks a prompt")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24))
      ->capture_default_str();
  pre->add_option("--lengths", p->lengths, "Comma-separated prompt lengths")->capture_default_str();
  pre->add_option("--images", p->images,
                  "Instead of the text points: the vision tower on images of these sizes "
                  "(WIDTHxHEIGHT, comma-separated; planned as requests' images are): tower_ms, "
                  "flops, gflop_per_s, reference_gflop_per_s, fraction_of_roofline");
  pre->add_option("--probe-mb", p->probe_mb, "Read-probe buffer (MiB)")
      ->check(CLI::Range(16, 65536))
      ->capture_default_str();
  pre->callback([=] { *run = [=] { return run_bench_prefill(*p); }; });
}

}  // namespace dsv41::cli
