// libFuzzer target: config.json text parsed and validated (parse_config), as the loader and the
// converter read it. A config that parses must write back to a form that parses to the same config
// (config_to_json, what make-tiny writes), and a layer plan built from it must be self-consistent:
// every layer it points to exists, and a layer reusing or re-indexing compressed KV points to a
// layer that owns it.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "model/config.h"
#include "model/layer_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace dsv41;
  const auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  auto cfg = parse_config(j, "config.json");
  if (!cfg) return 0;
  const nlohmann::json written = config_to_json(*cfg);
  auto again = parse_config(written, "config.json");
  if (!again) {
    std::fprintf(stderr, "%s\n", again.status().message().c_str());
    fuzz::invariant_failed("a parsed config's own JSON does not parse");
  }
  if (config_to_json(*again) != written) fuzz::invariant_failed("a config does not round-trip");
  auto plan = build_layer_plan(*cfg);
  if (!plan) return 0;
  const auto n = static_cast<int>(plan->layers.size());
  if (plan->num_backbone != cfg->text.num_hidden_layers || n < plan->num_backbone)
    fuzz::invariant_failed("the plan's layer count differs from the config's");
  auto in_range = [&](int k) { return k >= -1 && k < n; };
  for (const LayerPlan& l : plan->layers) {
    if (!in_range(l.kv_source) || !in_range(l.index_source) || !in_range(l.candidate_filter))
      fuzz::invariant_failed("a layer plan points past the layers");
    if ((l.mode == AttnMode::kReuse || l.mode == AttnMode::kReindex) &&
        (l.kv_source < 0 || !plan->layers[std::size_t(l.kv_source)].is_kv_source()))
      fuzz::invariant_failed("a layer reads compressed KV from a layer that owns none");
  }
  return 0;
}
