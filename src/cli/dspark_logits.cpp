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
#include "cli/float_file.h"
#include "core/log.h"
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

template <typename T>
int run(const DsparkLogitsArgs& a, const std::vector<int32_t>& ids) {
  const int64_t T_len = int64_t(ids.size()), P = a.prefill;
  if (P < 1 || P > T_len - 2) {
    log::error("logits: --dspark-prefill {} needs 1 <= P <= T-2 with T = {} tokens", P, T_len);
    return kExitUsage;
  }
  ReferenceOptions opt;
  opt.index_keys =
      a.index_keys == "vendor" ? IndexKeySemantics::kVendor : IndexKeySemantics::kOwner;
  opt.act_quant = a.act_quant == "on";
  opt.dspark = true;
  const auto t0 = std::chrono::steady_clock::now();
  auto model = ReferenceModel<T>::load(a.model, opt);
  if (!model) {
    log::error("logits: {}", model.status().message());
    return kExitInvalid;
  }
  ReferenceModel<T>& m = **model;
  const int64_t V = m.config().text.vocab_size, B = m.config().text.dspark_block_size;
  std::vector<T> target, drafts, confidence;
  std::vector<int32_t> chain;
  DraftStep<T> step;
  Status st = m.forward(std::vector<int32_t>(ids.begin(), ids.begin() + P), &target);
  for (int64_t i = P; st.is_ok() && i <= T_len - 2; ++i) {
    st = m.forward({ids[std::size_t(i)]}, &target);
    if (st.is_ok()) st = m.draft(ids[std::size_t(i + 1)], &step);
    if (!st.is_ok()) break;
    drafts.insert(drafts.end(), step.logits.begin(), step.logits.end());
    chain.insert(chain.end(), step.ids.begin(), step.ids.end());
    confidence.insert(confidence.end(), step.confidence.begin(), step.confidence.end());
  }
  if (!st.is_ok()) {
    log::error("logits: --tokens: {}", st.message());
    return kExitInvalid;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool f64 = ends_with_f64(a.out);
  const std::string stem = stem_of(a.out), ext = f64 ? ".f64" : ".f32";
  const std::string ids_file = stem + ".ids.i32", conf_file = stem + ".confidence" + ext,
                    target_file = stem + ".target" + ext;
  for (Status w :
       {write_floats(a.out, drafts, f64), write_ids(ids_file, chain),
        write_floats(conf_file, confidence, f64), write_floats(target_file, target, f64)})
    if (!w.is_ok()) {
      log::error("logits: --out: {}", w.message());
      return kExitInvalid;
    }
  nlohmann::ordered_json j = {{"out", a.out},
                              {"ids", ids_file},
                              {"confidence", conf_file},
                              {"target", target_file},
                              {"tokens", T_len},
                              {"dspark_prefill", P},
                              {"steps", T_len - 1 - P},
                              {"block", B},
                              {"vocab", V},
                              {"dtype", f64 ? "float64" : "float32"},
                              {"path", "reference"},
                              {"precision", sizeof(T) == 8 ? "fp64" : "fp32"},
                              {"index_keys", a.index_keys},
                              {"act_quant", a.act_quant},
                              {"seconds", seconds}};
  std::printf("%s\n", j.dump().c_str());
  return kExitOk;
}

}  // namespace

int run_dspark_logits(const DsparkLogitsArgs& a, const std::vector<int32_t>& ids) {
  return a.precision == "fp64" ? run<double>(a, ids) : run<float>(a, ids);
}

}  // namespace dsv41::cli
