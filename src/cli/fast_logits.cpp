// run_fast_logits (see fast_logits.h).
#include "cli/fast_logits.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/fast_model_dir.h"
#include "cli/float_file.h"
#include "core/log.h"
#include "core/rng.h"
#include "model/fast/fast_model.h"
#include "parallel/distributed_runner.h"

namespace dsv41::cli {
namespace {

struct Companion {
  SeqId id = 0;
  std::vector<int32_t> tokens;
};

std::vector<int32_t> random_tokens(Rng& rng, int32_t vocab, int64_t n) {
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (auto& v : t) v = int32_t(rng.next_u64() % uint64_t(vocab));
  return t;
}

// One step: the target's chunk among the companions' random chunks, the target at a random place.
Status step_with_companions(ModelRunner& m, std::vector<Companion>& comp, Rng& rng,
                            const SeqSlice& target, std::vector<float>* logits) {
  StepBatch b;
  std::vector<SeqSlice> others;
  for (auto& c : comp) {
    const int64_t len = m.length(c.id);
    if (rng.next_u64() % 4 == 0) continue;  // sits this step out
    SeqSlice s;
    s.seq = c.id;
    s.first_pos = len;
    const int64_t n =
        std::min<int64_t>(1 + int64_t(rng.next_u64() % 8), int64_t(c.tokens.size()) - len);
    s.tokens.assign(c.tokens.begin() + len, c.tokens.begin() + len + n);
    if (rng.next_u64() % 2) s.logits_rows.push_back(int32_t(n - 1));
    others.push_back(std::move(s));
  }
  const std::size_t at = rng.next_u64() % (others.size() + 1);
  for (std::size_t i = 0; i < at; ++i) b.slices.push_back(others[i]);
  b.slices.push_back(target);
  for (std::size_t i = at; i < others.size(); ++i) b.slices.push_back(others[i]);
  StepOutput out;
  DSV41_RETURN_IF_ERROR(m.step(b, &out));
  logits->insert(logits->end(), out.slices[at].logits.begin(), out.slices[at].logits.end());
  // Finished companions leave and new ones take their place (the pool's blocks are reused).
  for (auto& c : comp)
    if (m.length(c.id) >= int64_t(c.tokens.size())) {
      m.free(c.id);
      DSV41_RETURN_IF_ERROR(m.open(c.id));
      c.tokens = random_tokens(rng, m.vocab_size(), 1 + int64_t(rng.next_u64() % 64));
    }
  return Status::ok();
}

}  // namespace

int run_fast_logits(const FastLogitsArgs& a, const std::vector<int32_t>& ids, int64_t chunk,
                    const std::vector<SliceImage>& images) {
  auto dir = ensure_converted(a.model, a.converted_dir);
  if (!dir) {
    log::error("logits: --model: {}", dir.status().message());
    return kExitInvalid;
  }
  FastOptions o;
  o.index_keys = a.index_keys == "vendor" ? IndexKeySemantics::kVendor : IndexKeySemantics::kOwner;
  o.act_quant = a.act_quant == "on";
  o.decoder_replay = a.decoder_replay == "on";
  o.prefill_attention = a.prefill_attention == "on";
  o.replay_margin = replay_margin_value(a.replay_margin);
  o.threads = a.threads;
  o.kv_cache_bytes = int64_t(a.kv_cache_gb * 1e9);
  const auto t0 = std::chrono::steady_clock::now();
  // Under mpirun, ranks other than 0 follow rank 0 inside load_split and end there.
  auto m = parallel::load_split(*dir, o, {a.tp, a.ep, a.rank_timeout_s});
  if (!m) {
    log::error("logits: --model: {}", m.status().message());
    return kExitInvalid;
  }
  ModelRunner& fm = **m;
  parallel::LeadRunner* lead = parallel::as_lead(m->get());
  const FastModel& local = lead ? lead->local() : dynamic_cast<const FastModel&>(fm);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Rng rng(a.companion_seed);
  std::vector<Companion> comp;
  for (int c = 0; c < a.companions; ++c) {
    comp.push_back(
        {SeqId(2 + c), random_tokens(rng, fm.vocab_size(), 1 + int64_t(rng.next_u64() % 64))});
    if (Status st = fm.open(comp.back().id); !st.is_ok()) {
      log::error("logits: --companions: {}", st.message());
      return kExitInvalid;
    }
  }
  if (Status st = fm.open(1); !st.is_ok()) {
    log::error("logits: {}", st.message());
    return kExitInvalid;
  }
  std::vector<float> logits;
  const auto t1 = std::chrono::steady_clock::now();
  int64_t first_min = 0;  // images are merged in the first call only: it holds every span
  for (const SliceImage& im : images) first_min = im.start + im.span();
  for (int64_t b = 0; b < int64_t(ids.size());) {
    SeqSlice s;
    s.seq = 1;
    s.first_pos = b;
    const int64_t len = b == 0 ? std::max(chunk, first_min) : chunk;
    s.tokens.assign(ids.begin() + b, ids.begin() + std::min<int64_t>(int64_t(ids.size()), b + len));
    b += int64_t(s.tokens.size());
    if (s.first_pos == 0) s.images = images;
    for (int32_t r = 0; r < int32_t(s.tokens.size()); ++r) s.logits_rows.push_back(r);
    if (Status st = step_with_companions(fm, comp, rng, s, &logits); !st.is_ok()) {
      log::error("logits: {}", st.message());
      return kExitInvalid;
    }
  }
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const bool f64 = ends_with_f64(a.out);
  if (Status st = write_floats(a.out, logits, f64); !st.is_ok()) {
    log::error("logits: --out: {}", st.message());
    return kExitInvalid;
  }
  const int64_t V = fm.vocab_size();
  int64_t argmax = 0;
  const float* last = logits.data() + logits.size() - std::size_t(V);
  for (int64_t v = 1; v < V; ++v)
    if (last[v] > last[argmax]) argmax = v;
  const KvLayout& L = local.pool().layout();
  nlohmann::ordered_json j = {{"out", a.out},
                              {"tokens", ids.size()},
                              {"vocab", V},
                              {"dtype", f64 ? "float64" : "float32"},
                              {"path", "fast"},
                              {"converted", *dir},
                              {"mode", a.mode},
                              {"index_keys", a.index_keys},
                              {"act_quant", a.act_quant},
                              {"decoder_replay", a.decoder_replay},
                              {"companions", a.companions},
                              {"isa", local.isa()},
                              {"load_seconds", load_s},
                              {"run_seconds", run_s},
                              {"tok_s", double(ids.size()) / std::max(run_s, 1e-9)},
                              {"kv_global_bytes_per_token", L.global_bytes_per_token()},
                              {"kv_window_bytes_per_sequence", L.window_bytes_per_sequence()},
                              {"foreign_reads", local.stats().foreign_reads},
                              {"last_argmax", argmax}};
  if (a.decoder_replay == "on") {  // rows the decoder skipped have no logits (NaN in the file)
    int64_t nan_rows = 0;
    for (std::size_t r = 0; r < ids.size(); ++r) nan_rows += std::isnan(logits[r * std::size_t(V)]);
    j["replay_margin"] = local.replay_margin();
    j["rows_without_logits"] = nan_rows;
  }
  if (lead) {  // a split forward: this rank's share and what the collectives cost
    const FastStats st = local.stats();
    j["ranks"] = parallel::World::get().size();
    j["weight_bytes_rank0"] = st.share_weight_bytes;
    j["collectives"] = st.collectives;
    j["collective_bytes"] = st.collective_bytes;
    j["collective_seconds"] = st.collective_seconds;
  }
  std::printf("%s\n", j.dump().c_str());
  return kExitOk;
}

}  // namespace dsv41::cli
