// The runners the engine loads (engine/model_loading.h).
#include "engine/model_loading.h"
#include "model/fast/fast_model.h"
#include "model/reference/reference_runner.h"
#include "parallel/distributed_runner.h"

namespace dsv41 {

Result<std::unique_ptr<ModelRunner>> load_reference_runner(const std::string& model_dir,
                                                           bool dspark) {
  ReferenceOptions opt;
  opt.dspark = dspark;
  auto r = ReferenceRunner<float>::load(model_dir, opt);
  if (!r) return r.status();
  return std::unique_ptr<ModelRunner>(std::move(*r));
}

Result<std::unique_ptr<ModelRunner>> load_fast_runner(const std::string& converted_dir,
                                                      const FastRunnerOptions& o) {
  FastOptions fo;
  fo.threads = o.threads;
  fo.cpus = o.cpus;
  fo.act_quant = o.act_quant;
  fo.kv_cache_bytes = int64_t(o.kv_cache_gb * 1e9);
  fo.warm = o.warm;
  fo.huge_pages = o.huge_pages;
  fo.prefix_cache = o.prefix_cache;
  fo.dspark = o.dspark;
  fo.decoder_replay = o.decoder_replay;
  fo.replay_margin = o.replay_margin;
  fo.isolation = o.isolation == "mask"  ? IsolationMode::kMask
                 : o.isolation == "off" ? IsolationMode::kOff
                                        : IsolationMode::kCount;
  return parallel::load_split(converted_dir, fo, {o.tp, o.ep, o.rank_timeout_s});
}

}  // namespace dsv41
