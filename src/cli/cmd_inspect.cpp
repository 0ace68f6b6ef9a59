// `dsv41 inspect`: parses a checkpoint's config, prints the layer plan and checks the tensor
// inventory against the shard headers (tensor data is never read). Exit 0 when valid, 2 with named
// errors.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/convert/converted_checkpoint.h"
#include "model/inventory.h"
#include "model/layer_plan.h"

namespace dsv41::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

std::string src(int l) {
  return l < 0 ? "-" : std::to_string(l);
}

json plan_json(const ModelPlan& plan) {
  json rows = json::array();
  for (const LayerPlan& p : plan.layers) {
    json r;
    r["layer"] = p.index;
    if (p.dspark_stage >= 0) r["dspark_stage"] = p.dspark_stage;
    r["compress_ratio"] = p.compress_ratio;
    r["mode"] = std::string(attn_mode_name(p.mode));
    r["kv_source"] = p.kv_source;
    r["index_source"] = p.index_source;
    r["candidate_source"] = p.candidate_source;
    r["candidate_filter"] = p.candidate_filter;
    r["compressor_gate"] = p.compressor_gate;
    r["engram"] = p.engram >= 0;
    r["dspark_target"] = p.dspark_target >= 0;
    r["rope_theta"] = p.rope_theta;
    r["yarn"] = p.yarn;
    if (p.yarn) r["yarn_low"] = p.yarn_low, r["yarn_high"] = p.yarn_high;
    r["routed_experts"] = p.n_routed_experts;
    r["experts_per_tok"] = p.experts_per_tok;
    rows.push_back(r);
  }
  return rows;
}

void print_text(const ModelConfig& c, const ModelPlan& plan) {
  const TextConfig& t = c.text;
  std::printf(
      "config: vocab %lld, hidden %lld, layers %lld + %lld DSpark stages, heads %lld x %lld (rope "
      "%lld), "
      "q_lora %lld, o %lld x %lld, experts %lld top-%lld (inter %lld), window %lld, index %lld x "
      "%lld top-%lld\n",
      (long long)t.vocab_size, (long long)t.hidden_size, (long long)t.num_hidden_layers,
      (long long)t.num_nextn_predict_layers, (long long)t.num_attention_heads,
      (long long)t.head_dim, (long long)t.qk_rope_head_dim, (long long)t.q_lora_rank,
      (long long)t.o_groups, (long long)t.o_lora_rank, (long long)t.n_routed_experts,
      (long long)t.num_experts_per_tok, (long long)t.moe_intermediate_size,
      (long long)t.sliding_window, (long long)t.index_n_heads, (long long)t.index_head_dim,
      (long long)t.index_topk);
  std::printf("\n%-7s %-5s %-8s %-6s %-6s %-10s %-7s %-7s %-12s %s\n", "layer", "ratio", "mode",
              "kv", "topk", "candidates", "engram", "dspark", "rope", "experts");
  for (const LayerPlan& p : plan.layers) {
    std::string name =
        p.dspark_stage >= 0 ? "mtp." + std::to_string(p.dspark_stage) : std::to_string(p.index);
    std::string cand = p.candidate_source        ? "publish"
                       : p.candidate_filter >= 0 ? "from " + src(p.candidate_filter)
                                                 : "-";
    std::string rope = std::to_string(int64_t(p.rope_theta)) + (p.yarn ? "+yarn" : "");
    std::printf("%-7s %-5d %-8s %-6s %-6s %-10s %-7s %-7s %-12s %d top-%d\n", name.c_str(),
                p.compress_ratio, std::string(attn_mode_name(p.mode)).c_str(),
                src(p.kv_source).c_str(), src(p.index_source).c_str(), cand.c_str(),
                p.engram >= 0 ? "yes" : "-", p.dspark_target >= 0 ? "target" : "-", rope.c_str(),
                p.n_routed_experts, p.experts_per_tok);
  }
}

int run_inspect(const std::string& dir, bool as_json, bool verify) {
  json out;
  out["model"] = dir;
  std::vector<std::string> errors;
  auto finish = [&](int code) {
    out["ok"] = code == kExitOk;
    out["errors"] = errors;
    if (as_json) std::printf("%s\n", out.dump(2).c_str());
    for (const auto& e : errors) std::fprintf(stderr, "error: %s\n", e.c_str());
    if (!as_json && code == kExitOk) std::printf("\nok: checkpoint is valid\n");
    return code;
  };
  if (is_converted_checkpoint(dir)) {
    out["layout"] = "converted";
    if (!as_json) std::printf("model: %s (converted layout)\n", dir.c_str());
    auto ck = open_converted_checkpoint(dir, verify);
    if (!ck) {
      errors.push_back(ck.status().message());
      return finish(kExitInvalid);
    }
    const double gb = static_cast<double>(ck->payload_bytes) / 1e9;
    out["converted"] = {{"tensors", ck->manifest.tensors.size()},
                        {"files", ck->manifest.files.size()},
                        {"bytes", ck->payload_bytes},
                        {"fp8", ck->manifest.fp8},
                        {"converter_version", ck->manifest.converter_version},
                        {"verified", verify}};
    if (verify) {
      out["converted"]["verify_seconds"] = ck->verify_seconds;
      out["converted"]["verify_gb_per_s"] = gb / std::max(ck->verify_seconds, 1e-9);
    }
    if (!as_json) {
      std::printf("converted: %zu tensors in %zu files, %.3f GB, fp8 %s, %s\n",
                  ck->manifest.tensors.size(), ck->manifest.files.size(), gb,
                  ck->manifest.fp8.c_str(), ck->manifest.converter_version.c_str());
      if (verify)
        std::printf("verify: every sha256 matches (%.3f GB in %.2f s, %.2f GB/s)\n", gb,
                    ck->verify_seconds, gb / std::max(ck->verify_seconds, 1e-9));
    }
    return finish(kExitOk);
  }
  if (verify) {
    errors.push_back("--verify: applies to a converted checkpoint (manifest.json); " + dir +
                     " is in the official layout");
    return finish(kExitUsage);
  }
  out["layout"] = "official";
  if (!as_json) std::printf("model: %s (official layout)\n", dir.c_str());
  auto cfg = load_config((fs::path(dir) / "config.json").string());
  if (!cfg) {
    errors.push_back(cfg.status().message());
    return finish(kExitInvalid);
  }
  auto plan = build_layer_plan(cfg.value());
  if (!plan) {
    errors.push_back((fs::path(dir) / "config.json").string() + ": " + plan.status().message());
    return finish(kExitInvalid);
  }
  out["config"] = json::parse(config_to_json(cfg.value()).dump());
  out["plan"] = plan_json(plan.value());
  if (!as_json) print_text(cfg.value(), plan.value());
  auto ckpt = Checkpoint::open(dir);
  if (!ckpt) {
    errors.push_back(ckpt.status().message());
    return finish(kExitInvalid);
  }
  auto expected = expected_text_tensors(cfg.value(), plan.value());
  // With a vision_config, the tower's tensors are checked like the text model's.
  for (auto& v : expected_vision_tensors(cfg.value())) expected.push_back(std::move(v));
  const InventoryReport rep = check_inventory(expected, ckpt.value());
  const InventoryTotals totals = inventory_totals(expected);
  out["inventory"] = {{"expected_tensors", totals.tensors},
                      {"expected_bytes", totals.bytes},
                      {"checkpoint_tensors", ckpt->tensor_names().size()},
                      {"checkpoint_bytes", ckpt->total_bytes()},
                      {"shards", ckpt->shards().size()},
                      {"matched", rep.matched},
                      {"missing", rep.missing},
                      {"unexpected", rep.extra},
                      {"wrong_shape", rep.wrong_shape},
                      {"wrong_dtype", rep.wrong_dtype},
                      {"ignored_vision", rep.ignored_vision}};
  if (!as_json)
    std::printf(
        "\ninventory: %zu expected tensors (%.3f GB), checkpoint has %zu in %zu shards; %zu match",
        totals.tensors, double(totals.bytes) / 1e9, ckpt->tensor_names().size(),
        ckpt->shards().size(), rep.matched);
  if (!as_json)
    std::printf(
        "%s\n",
        rep.ignored_vision
            ? (", " + std::to_string(rep.ignored_vision) + " vision tensors ignored").c_str()
            : "");
  if (!rep.ok()) {
    // A config value the shapes contradict comes first; then each kind of problem, one line per
    // tensor when there are few, else the first and a count (--json lists them all).
    for (const auto& c : config_contradictions(cfg.value(), expected, ckpt.value(), rep))
      errors.push_back((fs::path(dir) / "config.json").string() + ": " + c);
    const std::string where = dir + ": inventory check failed: ";
    auto list = [&](const std::vector<std::string>& v, const std::string& what,
                    const std::string& open, const std::string& close, const char* plural) {
      constexpr std::size_t kListed = 10;
      for (std::size_t i = 0; i < v.size() && (v.size() <= kListed || i == 0); ++i)
        errors.push_back(where + what + open + v[i] + close);
      if (v.size() > kListed)
        errors.back() += fmt::format("; {} more tensors {} (inspect --json lists them all)",
                                     v.size() - 1, plural);
    };
    list(rep.missing, "missing tensor", " '", "'", "are missing");
    list(rep.extra, "unexpected tensor", " '", "'", "are unexpected");
    list(rep.wrong_shape, "wrong shape", ": ", "", "have the wrong shape");
    list(rep.wrong_dtype, "wrong dtype", ": ", "", "have the wrong dtype");
    return finish(kExitInvalid);
  }
  return finish(kExitOk);
}

}  // namespace

void add_inspect(CLI::App& app, Runner* run) {
  auto dir = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  auto verify = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("inspect",
                                     "Parse a checkpoint (config.json, index and shard headers; "
                                     "tensor data is not read), print the config, "
                                     "the per-layer plan and the inventory check. Exit 0 if valid, "
                                     "2 with named errors otherwise.");
  sub->add_option("--model", *dir, "Checkpoint directory")->required();
  sub->add_flag("--json", *as_json, "Print one JSON document instead of tables");
  sub->add_flag(
      "--verify", *verify,
      "Converted layout: recompute every tensor's sha256 against the manifest (reads all data)");
  sub->callback([=] { *run = [=] { return run_inspect(*dir, *as_json, *verify); }; });
}

}  // namespace dsv41::cli
