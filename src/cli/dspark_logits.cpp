// `dsv41 logits --dspark`: the DSpark drafter's logits, chain ids and confidences for a
// teacher-forced sequence (design.md §9): the target prefills tokens[0:P], then decodes tokens[i]
// at i = P .. T-2, and after each decode the drafter runs with tokens[i+1] as its first id.
// Files (little-endian, step-major, float64 when --out ends in .f64): OUT = drafter logits
// [N, B, vocab]; STEM.ids.i32 = int32 [N, B+1]; STEM.confidence.EXT = [N, B]; STEM.target.EXT =
// the target's logits [T-1, vocab].
#include "cli/dspark_logits.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/fast_model_dir.h"
#include "cli/float_file.h"
#include "core/log.h"
#include "model/fast/fast_model.h"
#include "model/reference/reference_model.h"

namespace dsv41::cli {
namespace {

Status write_ids(const std::string& path, const std::vector<int32_t>& v) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return Status::error(path + ": cannot create");
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(int32_t)));
  f.close();
  if (!f) return Status::error(path + ": write failed");
  return Status::ok();
}

// OUT without its extension (".f32" / ".f64" / anything after the last dot of the file name).
std::string stem_of(const std::string& out) {
  const std::size_t slash = out.find_last_of('/');
  const std::size_t dot = out.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return out;
  return out.substr(0, dot);
}

// What a run collects: the target's rows, each step's drafter rows, chain ids and confidences.
template <typename T>
struct Collected {
  std::vector<T> target, drafts, confidence;
  std::vector<int32_t> chain;
  int64_t vocab = 0, block = 0;
};

int write_outputs(const DsparkLogitsArgs& a, int64_t T_len, const Collected<double>& c,
                  bool f64_compute, double seconds) {
  const bool f64 = ends_with_f64(a.out);
  const std::string stem = stem_of(a.out), ext = f64 ? ".f64" : ".f32";
  const std::string ids_file = stem + ".ids.i32", conf_file = stem + ".confidence" + ext,
                    target_file = stem + ".target" + ext;
  for (Status w :
       {write_floats(a.out, c.drafts, f64), write_ids(ids_file, c.chain),
        write_floats(conf_file, c.confidence, f64), write_floats(target_file, c.target, f64)})
    if (!w.is_ok()) {
      log::error("logits: --out: {}", w.message());
      return kExitInvalid;
    }
  nlohmann::ordered_json j = {{"out", a.out},
                              {"ids", ids_file},
                              {"confidence", conf_file},
                              {"target", target_file},
                              {"tokens", T_len},
                              {"dspark_prefill", a.prefill},
                              {"steps", T_len - 1 - a.prefill},
                              {"block", c.block},
                              {"vocab", c.vocab},
                              {"dtype", f64 ? "float64" : "float32"},
                              {"path", a.path},
                              {"precision", f64_compute ? "fp64" : "fp32"},
                              {"index_keys", a.index_keys},
                              {"act_quant", a.act_quant},
                              {"seconds", seconds}};
  std::printf("%s\n", j.dump().c_str());
  return kExitOk;
}

template <typename T>
Collected<double> widen(Collected<T>&& c) {
  Collected<double> d;
  d.target.assign(c.target.begin(), c.target.end());
  d.drafts.assign(c.drafts.begin(), c.drafts.end());
  d.confidence.assign(c.confidence.begin(), c.confidence.end());
  d.chain = std::move(c.chain);
  d.vocab = c.vocab;
  d.block = c.block;
  return d;
}

// The reference: prefill tokens[0:P], then per step a one-token forward and a draft.
template <typename T>
Result<Collected<T>> run_reference(const DsparkLogitsArgs& a, const std::vector<int32_t>& ids) {
  ReferenceOptions opt;
  opt.index_keys =
      a.index_keys == "vendor" ? IndexKeySemantics::kVendor : IndexKeySemantics::kOwner;
  opt.act_quant = a.act_quant == "on";
  opt.dspark = true;
  auto model = ReferenceModel<T>::load(a.model, opt);
  if (!model) return model.status();
  ReferenceModel<T>& m = **model;
  Collected<T> c;
  c.vocab = m.config().text.vocab_size;
  c.block = m.config().text.dspark_block_size;
  DraftStep<T> step;
  const int64_t P = a.prefill;
  DSV41_RETURN_IF_ERROR(m.forward(std::vector<int32_t>(ids.begin(), ids.begin() + P), &c.target));
  for (int64_t i = P; i <= int64_t(ids.size()) - 2; ++i) {
    DSV41_RETURN_IF_ERROR(m.forward({ids[std::size_t(i)]}, &c.target));
    DSV41_RETURN_IF_ERROR(m.draft(ids[std::size_t(i + 1)], &step));
    c.drafts.insert(c.drafts.end(), step.logits.begin(), step.logits.end());
    c.chain.insert(c.chain.end(), step.ids.begin(), step.ids.end());
    c.confidence.insert(c.confidence.end(), step.confidence.begin(), step.confidence.end());
  }
  return c;
}

// The fast engine on the same schedule (one sequence, its drafter through ModelRunner::draft).
Result<Collected<float>> run_fast(const DsparkLogitsArgs& a, const std::vector<int32_t>& ids) {
  auto dir = ensure_converted(a.model, a.converted);
  if (!dir) return dir.status();
  FastOptions o;
  o.index_keys = a.index_keys == "vendor" ? IndexKeySemantics::kVendor : IndexKeySemantics::kOwner;
  o.act_quant = a.act_quant == "on";
  o.threads = a.threads;
  o.kv_cache_bytes = int64_t(a.kv_cache_gb * 1e9);
  o.dspark = true;
  auto model = FastModel::load(*dir, o);
  if (!model) return model.status();
  FastModel& m = **model;
  Collected<float> c;
  c.vocab = m.vocab_size();
  c.block = m.draft_block_size();
  DSV41_RETURN_IF_ERROR(m.open(1));
  const int64_t P = a.prefill;
  auto feed = [&](int64_t from, int64_t n) -> Status {
    StepBatch b;
    b.slices.push_back({1, from, {ids.begin() + from, ids.begin() + from + n}, {}, {}});
    for (int32_t r = 0; r < int32_t(n); ++r) b.slices[0].logits_rows.push_back(r);
    StepOutput out;
    DSV41_RETURN_IF_ERROR(m.step(b, &out));
    c.target.insert(c.target.end(), out.slices[0].logits.begin(), out.slices[0].logits.end());
    return Status::ok();
  };
  DSV41_RETURN_IF_ERROR(feed(0, P));
  std::vector<DraftResult> r;
  for (int64_t i = P; i <= int64_t(ids.size()) - 2; ++i) {
    DSV41_RETURN_IF_ERROR(feed(i, 1));
    DSV41_RETURN_IF_ERROR(m.draft({{1, ids[std::size_t(i + 1)]}}, &r));
    c.drafts.insert(c.drafts.end(), r[0].logits.begin(), r[0].logits.end());
    c.chain.insert(c.chain.end(), r[0].ids.begin(), r[0].ids.end());
    c.confidence.insert(c.confidence.end(), r[0].confidence.begin(), r[0].confidence.end());
  }
  return c;
}

}  // namespace

int run_dspark_logits(const DsparkLogitsArgs& a, const std::vector<int32_t>& ids) {
  const int64_t T_len = int64_t(ids.size());
  if (a.prefill < 1 || a.prefill > T_len - 2) {
    log::error("logits: --dspark-prefill {} needs 1 <= P <= T-2 with T = {} tokens", a.prefill,
               T_len);
    return kExitUsage;
  }
  const auto t0 = std::chrono::steady_clock::now();
  Result<Collected<double>> c = Status::error("");
  if (a.path == "fast") {
    auto f = run_fast(a, ids);
    c = f ? Result<Collected<double>>(widen(std::move(*f))) : f.status();
  } else if (a.precision == "fp64") {
    c = run_reference<double>(a, ids);
  } else {
    auto f = run_reference<float>(a, ids);
    c = f ? Result<Collected<double>>(widen(std::move(*f))) : f.status();
  }
  if (!c) {
    log::error("logits: {}", c.status().message());
    return kExitInvalid;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return write_outputs(a, T_len, *c, a.path != "fast" && a.precision == "fp64", seconds);
}

}  // namespace dsv41::cli
