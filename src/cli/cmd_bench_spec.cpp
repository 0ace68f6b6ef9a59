// `dsv41 bench decode --speculative on` (design.md §8; issue 16's A/B): the engine with the DSpark
// drafter loaded decodes greedy requests with drafting on and, as the control, with drafting
// suppressed (Engine::set_drafting: the same engine and model, or with --spec-paired a second
// engine running at the same time), at each --streams count, on a
// repetitive prompt (a short random pattern repeated) and on a random one. Per point and mode:
// per-stream decode tok/s (each stream's tokens after its first over the time from its first to
// its last), aggregate tok/s, drafts verified and accepted, the acceptance rate, rows the model ran
// per step and distinct routed experts per step (from the model's counters; the points' few
// prefill steps included); and the on/off ratio of per-stream tok/s: the modes alternate within
// each of --spec-repeats repetitions (off, on, oracle in even ones, the reverse in odd ones, so a
// steady drift favours neither), rates are medians, ratios the median of each repetition's own
// (drift of the machine's speed cancels), and the ratio of the rates pooled over repetitions;
// after an unmeasured warm-up request with drafting off and on. --spec-modes off,on leaves the
// oracle out; --spec-paired runs off and on at the same time on two engines. Shadow probes
// (--spec-probe shadow, the engine's default) are counted apart from verified drafts. A third mode,
// "oracle", drafts the control run's own tokens (model/oracle_drafter.h): the speed-up verification
// gives when every draft is right, on this model and machine.
#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/bench_model.h"
#include "cli/commands.h"
#include "cli/fast_model_dir.h"
#include "core/cpu_set.h"
#include "core/log.h"
#include "engine/engine.h"
#include "model/oracle_drafter.h"
#include "ops/kernels.h"

namespace dsv41::cli {
namespace {

struct StreamRun {
  int64_t tokens = 0;
  double first = -1, last = -1;  // seconds from the point's start
  std::vector<int32_t> ids;      // the tokens generated
};

// The requests of one point, all at once; each stream's token arrival times.
std::vector<StreamRun> run_streams(Engine& e, const std::vector<std::vector<int32_t>>& prompts,
                                   int64_t max_tokens, Clock::time_point t0, Status* err) {
  std::vector<StreamRun> runs(prompts.size());
  std::vector<std::thread> th;
  std::vector<Status> errs(prompts.size(), Status::ok());
  for (std::size_t i = 0; i < prompts.size(); ++i)
    th.emplace_back([&, i] {
      GenerationRequest r;
      r.prompt = prompts[i];
      r.sampling.temperature = 0;
      r.sampling.max_tokens = int(max_tokens);
      r.sampling.ignore_eos = true;
      auto h = e.submit(r);
      if (!h) {
        errs[i] = h.status();
        return;
      }
      for (RequestOutput o; h->next(o, std::chrono::seconds(3600));) {
        // The engine's emission times, not this thread's wake-ups: on a busy machine one
        // wake-up can collect every token of a short request (session 15's CI: a span of 0).
        for (const auto& t : o.tokens) {
          const double at = secs(t0, t.emitted);
          if (runs[i].first < 0) runs[i].first = at;
          runs[i].last = at;
          ++runs[i].tokens;
          runs[i].ids.push_back(t.token);
        }
        if (o.finished) {
          if (o.reason == FinishReason::kError) errs[i] = Status::error(o.error);
          break;
        }
      }
    });
  for (auto& t : th) t.join();
  for (const Status& s : errs)
    if (!s.is_ok()) *err = s;
  return runs;
}

nlohmann::ordered_json measure(Engine& e, const FastModel& m,
                               const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens,
                               Status* err, std::vector<std::vector<int32_t>>* streams = nullptr) {
  const EngineStats es0 = e.stats();
  const FastStats fs0 = m.stats();
  const auto t0 = Clock::now();
  const auto runs = run_streams(e, prompts, max_tokens, t0, err);
  const double wall = secs(t0, Clock::now());
  // The engine thread has published every token, but a verify step counts its drafts after it
  // emits them: wait for the loop's store after the step (no sequence running or queued), or a
  // starved engine thread carries an "on" run's counts into the next run.
  EngineStats es1 = e.stats();
  for (int i = 0; i < 3000 && (es1.running > 0 || es1.queued > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    es1 = e.stats();
  }
  if (es1.running > 0 || es1.queued > 0)
    log::warn(
        "bench: the engine still runs {} sequences 30 s after its streams ended; this "
        "run's counts may include the next one's",
        es1.running + es1.queued);
  const FastStats fs1 = m.stats();
  double per_stream = 0, span = 0;
  int64_t tokens = 0, gaps = 0, measured = 0;
  for (const StreamRun& r : runs) {
    tokens += r.tokens;
    if (r.tokens > 1 && r.last > r.first) {  // else no rate: fewer than two tokens
      per_stream += double(r.tokens - 1) / (r.last - r.first);
      gaps += r.tokens - 1;
      span += r.last - r.first;
      ++measured;
    }
  }
  per_stream /= double(std::max<int64_t>(1, measured));
  if (streams)  // each prompt with what it generated: the oracle's drafts
    for (std::size_t i = 0; i < runs.size(); ++i) {
      streams->push_back(prompts[i]);
      streams->back().insert(streams->back().end(), runs[i].ids.begin(), runs[i].ids.end());
    }
  const int64_t drafts = es1.spec_draft_tokens - es0.spec_draft_tokens;
  const int64_t accepted = es1.spec_accepted_tokens - es0.spec_accepted_tokens;
  const int64_t steps = fs1.steps - fs0.steps;
  return {{"per_stream_tok_s", per_stream},
          // Each stream's tokens after its first and the seconds they took, summed over streams:
          // the pooled rate over many repetitions (summarize) weighs each run by its time.
          {"stream_gaps", gaps},
          {"unmeasured_streams", int64_t(runs.size()) - measured},
          {"stream_span_s", span},
          {"tok_s", double(tokens) / wall},
          {"tokens", tokens},
          {"wall_s", wall},
          {"verify_steps", es1.spec_steps - es0.spec_steps},
          {"drafts", drafts},
          {"accepted", accepted},
          {"acceptance_rate", drafts > 0 ? double(accepted) / double(drafts) : 0.0},
          {"shadow_probes", es1.spec_shadow_probes - es0.spec_shadow_probes},
          {"shadow_drafts", es1.spec_shadow_draft_tokens - es0.spec_shadow_draft_tokens},
          {"shadow_accepted", es1.spec_shadow_accepted_tokens - es0.spec_shadow_accepted_tokens},
          {"steps", steps},
          // Weight bytes the model's steps and drafts were handed per generated token (each
          // matrix once per step or draft call): the traffic a token costs, free of the machine's
          // speed drifts that make the tok/s ratios noisy.
          {"weight_bytes", fs1.weight_bytes - fs0.weight_bytes},
          {"draft_calls", es1.spec_draft_calls - es0.spec_draft_calls},
          {"draft_seconds", es1.spec_draft_seconds - es0.spec_draft_seconds},
          {"decode_step_seconds", es1.decode_steps_seconds - es0.decode_steps_seconds},
          {"decode_tokens", es1.decode_steps_tokens - es0.decode_steps_tokens},
          {"weight_bytes_per_token",
           tokens > 0 ? double(fs1.weight_bytes - fs0.weight_bytes) / double(tokens) : 0.0},
          {"rows_per_step", steps > 0 ? double(fs1.tokens - fs0.tokens) / double(steps) : 0.0},
          {"distinct_experts_per_step",
           steps > 0 ? double(fs1.distinct_experts - fs0.distinct_experts) / double(steps) : 0.0}};
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// One mode's repetitions: median rates, summed counts, the per-run rates.
nlohmann::ordered_json summarize(const std::vector<nlohmann::ordered_json>& runs) {
  static constexpr const char* kCounts[] = {
      "verify_steps",      "drafts",          "accepted",      "shadow_probes",
      "shadow_drafts",     "shadow_accepted", "tokens",        "steps",
      "weight_bytes",      "draft_calls",     "decode_tokens", "stream_gaps",
      "unmeasured_streams"};
  static constexpr const char* kSeconds[] = {"draft_seconds", "decode_step_seconds",
                                             "stream_span_s"};
  nlohmann::ordered_json j = runs.back();
  std::vector<double> per_stream, tok_s;
  std::map<std::string, int64_t> counts;
  std::map<std::string, double> seconds;
  nlohmann::ordered_json drafts_runs = nlohmann::ordered_json::array(),
                         engine_runs = nlohmann::ordered_json::array();
  for (const auto& r : runs) {
    per_stream.push_back(r["per_stream_tok_s"].get<double>());
    tok_s.push_back(r["tok_s"].get<double>());
    drafts_runs.push_back(r["drafts"]);
    if (r.contains("engine")) engine_runs.push_back(r["engine"]);  // --spec-paired
    for (const char* key : kCounts) counts[key] += r[key].get<int64_t>();
    for (const char* key : kSeconds) seconds[key] += r[key].get<double>();
  }
  for (const char* key : kCounts) j[key] = counts[key];
  for (const char* key : kSeconds) j.erase(key);  // reported as rates below
  j.erase("decode_tokens");
  j.erase("stream_gaps");
  j["per_stream_tok_s"] = median(per_stream);
  // Every repetition's stream tokens over every repetition's stream seconds: with the modes
  // alternating over many short repetitions, a slow phase of the machine falls on both modes
  // alike and weighs by its length (the median of per-repetition ratios, below, counts runs).
  j["per_stream_tok_s_pooled"] =
      seconds["stream_span_s"] > 0 ? double(counts["stream_gaps"]) / seconds["stream_span_s"] : 0.0;
  j["tok_s"] = median(tok_s);
  j["per_stream_tok_s_runs"] = per_stream;
  j["drafts_runs"] = drafts_runs;
  j.erase("engine");
  if (!engine_runs.empty()) j["engine_runs"] = engine_runs;  // which engine ran each repetition
  // Time per drafter call, and per plain or verify decode step (the engine's own clocks; decode
  // steps exclude the prefill steps, which `steps` counts).
  const int64_t calls = counts["draft_calls"], decoded = counts["decode_tokens"];
  const int64_t tokens = counts["tokens"], drafts = counts["drafts"];
  j["draft_ms_per_call"] = calls > 0 ? 1e3 * seconds["draft_seconds"] / double(calls) : 0.0;
  // Decode steps' time per token they gave (plain steps: one; verify steps: 1 + accepted).
  j["decode_ms_per_token"] =
      decoded > 0 ? 1e3 * seconds["decode_step_seconds"] / double(decoded) : 0.0;
  j["weight_bytes_per_token"] = tokens > 0 ? double(counts["weight_bytes"]) / double(tokens) : 0.0;
  j["acceptance_rate"] = drafts > 0 ? double(counts["accepted"]) / double(drafts) : 0.0;
  return j;
}

// Warm-up, not measured: one request with drafting off, then on (its acceptance prior learns from
// it as a running server's would). Without it the first measured repetition was an outlier
// (0.54x against 0.91-1.10x for the others, session 12): one-time costs of a process's first
// drafter calls and verify steps, presumably first touches of what only drafting uses.
Status warm_up(Engine& e, const FastModel& m, OracleDrafter* oracle, int64_t tokens) {
  Rng rng(7);
  std::vector<int32_t> prompt(16);
  for (auto& t : prompt) t = int32_t(rng.below(uint64_t(e.vocab_size())));
  for (const bool drafting : {false, true}) {
    Status err = Status::ok();
    e.set_drafting(drafting);
    e.select_acceptance_slot(drafting ? 1 : 0);  // the slots of the modes "off" and "on"
    oracle->set_streams({});
    measure(e, m, {prompt}, tokens, &err);
    if (!err.is_ok()) return err;
  }
  return Status::ok();
}

constexpr const char* kModes[] = {"off", "on", "oracle"};  // index = acceptance slot

// "--spec-modes": a comma-separated subset of kModes with "off" (the control every ratio needs),
// as slots in kModes' order (off first: the oracle replays repetition 0's control tokens).
Result<std::vector<int>> parse_modes(const std::string& list) {
  bool want[3] = {false, false, false};
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const std::size_t comma = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, comma - pos);
    const auto it = std::find_if(std::begin(kModes), std::end(kModes),
                                 [&](const char* m) { return name == m; });
    if (it == std::end(kModes))
      return Status::error("'" + name + "' is not a mode (off, on, oracle)");
    want[it - std::begin(kModes)] = true;
    pos = comma + 1;
  }
  if (!want[0] || !(want[1] || want[2]))
    return Status::error("'" + list + "' needs off (the control) and on and/or oracle");
  std::vector<int> slots;
  for (int i = 0; i < 3; ++i)
    if (want[i]) slots.push_back(i);
  return slots;
}

// One engine of the bench: the fast model with the drafter loaded, behind the oracle drafter (its
// chains replaced in mode "oracle" only), warmed up.
struct SpecEngine {
  std::unique_ptr<Engine> engine;
  const FastModel* fast = nullptr;
  OracleDrafter* oracle = nullptr;
};

Result<SpecEngine> load_spec_engine(const std::string& dir, const BenchArgs& a, int threads,
                                    int max_seqs) {
  FastOptions o;
  o.threads = threads;
  o.act_quant = a.act_quant == "on";
  o.kv_cache_bytes = int64_t(a.kv_cache_gb * 1e9);
  o.warm = true;
  o.huge_pages = a.huge_pages == "on";
  o.prefix_cache = false;  // every mode computes its prompts
  o.dspark = true;
  auto model = FastModel::load(dir, o);
  if (!model) return model.status().with_context("--model: ");
  SpecEngine se;
  se.fast = model->get();
  // The drafter runs for real in both drafting modes; in "oracle" its chains are replaced with
  // the control run's own tokens (every draft right: what verification costs and returns).
  auto oracle =
      std::make_unique<OracleDrafter>(std::move(*model), std::vector<std::vector<int32_t>>{});
  se.oracle = oracle.get();
  auto tok = Tokenizer::load(dir + "/tokenizer.json");
  if (!tok) return tok.status().with_context("--model: ");
  EngineOptions eo;
  eo.model_dir = dir;
  eo.speculative = true;
  eo.speculative_width = a.spec_width;
  eo.speculative_shadow_probes = a.spec_probe == "shadow";
  eo.max_num_seqs = max_seqs;
  auto engine = Engine::create(std::move(oracle), std::move(*tok), eo);
  if (!engine) return engine.status().with_context("--speculative on: ");
  se.engine = std::move(*engine);
  if (Status st = warm_up(*se.engine, *se.fast, se.oracle, a.spec_tokens); !st)
    return st.with_context("warm-up: ");
  return se;
}

// Prepares engine `e` for one run of mode `slot` (kModes).
void set_mode(SpecEngine& e, int slot, const std::vector<std::vector<int32_t>>& streams_seen) {
  e.engine->set_drafting(slot != 0);
  // Each drafter's requests learn, and carry to its later requests as a server does, their own
  // acceptance prior: across repetitions and points, so only each drafter's first request of the
  // run starts cold (later points start from what earlier ones learned).
  e.engine->select_acceptance_slot(slot);
  e.oracle->set_streams(slot == 2 ? streams_seen : std::vector<std::vector<int32_t>>{});
}

// The repetitions of one point, each mode's runs in `runs`. One engine: the modes alternate within
// each repetition (off, on, oracle in even ones, the reverse in odd ones; the oracle's drafts come
// from repetition 0's control, which runs first), so a drift of the machine's speed over the run
// cancels in the per-repetition ratios. Two engines (--spec-paired): off and on run at the same
// time, each on its own engine, and the engines swap modes every repetition: a slow phase of the
// machine falls on both runs of a repetition.
Status run_point(std::vector<SpecEngine>& engines, const std::vector<int>& modes,
                 const std::vector<std::vector<int32_t>>& prompts, const BenchArgs& a,
                 const std::string& label,
                 std::map<std::string, std::vector<nlohmann::ordered_json>>* runs) {
  std::vector<std::vector<int32_t>> streams_seen;
  const int nm = int(modes.size());
  for (int64_t rep = 0; rep < a.spec_repeats; ++rep) {
    if (engines.size() == 2) {
      log::info("bench decode: speculative off and on at once, {}, run {} ...", label, rep + 1);
      SpecEngine &on = engines[std::size_t(rep % 2)], &off = engines[std::size_t(1 - rep % 2)];
      set_mode(off, 0, streams_seen);
      set_mode(on, 1, streams_seen);
      Status err_on = Status::ok(), err_off = Status::ok();
      nlohmann::ordered_json j_on, j_off;
      {
        std::jthread t(
            [&] { j_on = measure(*on.engine, *on.fast, prompts, a.spec_tokens, &err_on); });
        j_off = measure(*off.engine, *off.fast, prompts, a.spec_tokens, &err_off);
      }
      j_on["engine"] = rep % 2;
      j_off["engine"] = 1 - rep % 2;
      (*runs)["off"].push_back(std::move(j_off));
      (*runs)["on"].push_back(std::move(j_on));
      DSV41_RETURN_IF_ERROR(err_off);
      DSV41_RETURN_IF_ERROR(err_on);
      continue;
    }
    for (int m = 0; m < nm; ++m) {
      const int slot = modes[std::size_t(rep % 2 ? nm - 1 - m : m)];
      log::info("bench decode: speculative {} at {}, run {} ...", kModes[slot], label, rep + 1);
      set_mode(engines[0], slot, streams_seen);
      Status err = Status::ok();
      (*runs)[kModes[slot]].push_back(measure(*engines[0].engine, *engines[0].fast, prompts,
                                              a.spec_tokens, &err,
                                              slot == 0 && rep == 0 ? &streams_seen : nullptr));
      DSV41_RETURN_IF_ERROR(err);
    }
  }
  return Status::ok();
}

// A point's summaries per mode and each drafting mode's ratios to the control.
void summarize_point(const std::vector<int>& modes,
                     const std::map<std::string, std::vector<nlohmann::ordered_json>>& runs,
                     nlohmann::ordered_json* pt_out) {
  nlohmann::ordered_json& pt = *pt_out;
  for (const int slot : modes) pt[kModes[slot]] = summarize(runs.at(kModes[slot]));
  for (const int slot : modes) {
    if (slot == 0) continue;
    const std::string mode = kModes[slot], prefix = slot == 1 ? "" : "oracle_";
    std::vector<double> ratios;
    const auto &mine = runs.at(mode), &control = runs.at("off");
    for (std::size_t r = 0; r < mine.size(); ++r) {
      const double off = control[r]["per_stream_tok_s"].get<double>();
      ratios.push_back(off > 0 ? mine[r]["per_stream_tok_s"].get<double>() / off : 0.0);
    }
    pt[prefix + "speedup_per_stream"] = median(ratios);
    pt[prefix + "speedup_per_stream_runs"] = ratios;
    const double off_pooled = pt["off"]["per_stream_tok_s_pooled"].get<double>();
    pt[prefix + "speedup_per_stream_pooled"] =
        off_pooled > 0 ? pt[mode]["per_stream_tok_s_pooled"].get<double>() / off_pooled : 0.0;
    // Off's weight bytes per token over this mode's (above 1: less traffic per token).
    const double bytes = pt[mode]["weight_bytes_per_token"].get<double>();
    pt[prefix + "traffic_ratio"] =
        bytes > 0 ? pt["off"]["weight_bytes_per_token"].get<double>() / bytes : 0.0;
  }
}

}  // namespace

int run_bench_speculative(const BenchArgs& a) {
  if (Status st = one_process_only("bench decode --speculative on"); !st) {
    log::error("bench decode: {}", st.message());
    return kExitUsage;
  }
  auto streams = parse_list(a.streams, "--streams");
  if (!streams) {
    log::error("bench decode: {}", streams.status().message());
    return kExitUsage;
  }
  auto modes = parse_modes(a.spec_modes);
  if (!modes) {
    log::error("bench decode: --spec-modes: {}", modes.status().message());
    return kExitUsage;
  }
  if (a.spec_paired && *modes != std::vector<int>{0, 1}) {
    log::error("bench decode: --spec-paired runs off and on at once: it needs --spec-modes off,on");
    return kExitUsage;
  }
  // The engines differ by a few percent (docs/dspark.md): each must run "on" equally often.
  if (a.spec_paired && a.spec_repeats % 2) {
    log::error(
        "bench decode: --spec-paired swaps the engines' modes every repetition: "
        "--spec-repeats must be even (got {})",
        a.spec_repeats);
    return kExitUsage;
  }
  auto dir = ensure_converted(a.model, a.converted);
  if (!dir) {
    log::error("bench decode: --model: {}", dir.status().message());
    return kExitInvalid;
  }
  // Paired: two engines at once share the cores (each its half unless --threads says).
  const int cores = int(default_thread_count());
  const int threads = a.spec_paired && a.threads == 0 ? std::max(1, cores / 2) : a.threads;
  const int max_seqs =
      int(std::max<int64_t>(1, *std::max_element(streams->begin(), streams->end())));
  std::vector<SpecEngine> engines;
  for (int i = 0; i < (a.spec_paired ? 2 : 1); ++i) {
    auto se = load_spec_engine(*dir, a, threads, max_seqs);
    if (!se) {
      log::error("bench decode: {}", se.status().message());
      return kExitInvalid;
    }
    engines.push_back(std::move(*se));
  }
  const int32_t V = engines[0].engine->vocab_size();
  Rng rng(6);
  nlohmann::ordered_json points = nlohmann::ordered_json::array();
  for (const char* kind : {"repetitive", "random"}) {
    for (int64_t s : *streams) {
      if (s < 1) continue;
      std::vector<std::vector<int32_t>> prompts(static_cast<std::size_t>(s));
      for (auto& p : prompts) {
        std::vector<int32_t> pattern(std::string(kind) == "repetitive" ? 4 : 16);
        for (auto& t : pattern) t = int32_t(rng.below(uint64_t(V)));
        while (p.size() < 16) p.insert(p.end(), pattern.begin(), pattern.end());
      }
      nlohmann::ordered_json pt = {{"prompt", kind}, {"streams", s}};
      std::map<std::string, std::vector<nlohmann::ordered_json>> runs;
      const std::string label = std::to_string(s) + " streams, " + kind + " prompt";
      if (Status st = run_point(engines, *modes, prompts, a, label, &runs); !st) {
        log::error("bench decode: {}", st.message());
        return kExitInvalid;
      }
      summarize_point(*modes, runs, &pt);
      points.push_back(pt);
    }
  }
  nlohmann::ordered_json j = {
      {"bench", "decode"},
      {"speculative", "dspark"},
      {"model", a.model},
      {"isa", ops::isa_name(ops::kernels().isa)},
      {"tokens_per_request", a.spec_tokens},
      {"spec_width", a.spec_width},
      {"spec_probe", a.spec_probe},
      {"repeats", a.spec_repeats},
      {"modes", a.spec_modes},
      {"paired", a.spec_paired},
      {"threads_per_engine", threads > 0 ? threads : cores},
      {"control", a.spec_paired ? "a second engine with drafting suppressed, at "
                                  "the same time (the engines swap modes)"
                                : "the same engine with drafting suppressed"},
      {"warmup", "one unmeasured request drafting off, then on"},
      {"points", points}};
  std::printf("%s\n", j.dump(2).c_str());
  return kExitOk;
}

}  // namespace dsv41::cli
