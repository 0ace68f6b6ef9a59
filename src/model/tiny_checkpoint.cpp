// make-tiny: value generation per tensor kind, sharding and the atomic-enough write order (shards,
// then tokenizer files, then config.json and the index last, so a partial directory never opens).
#include "model/tiny_checkpoint.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/dtypes.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/text_file.h"
#include "model/engram_layout.h"
#include "model/inventory.h"
#include "model/layer_plan.h"
#include "model/tensor_names.h"

namespace dsv41 {
namespace fs = std::filesystem;
namespace {

enum class FillKind { kE4M3Codes, kE8M0, kE2M1Packed, kBF16Uniform, kF32Uniform };

struct Fill {
  FillKind kind;
  double lo = 0, hi = 0;  // uniform range (BF16/F32)
  int center = 0;         // E8M0: centre exponent; bytes are 127 + center + {-1, 0, +1}
};

// RMS of a uniformly random non-NaN E4M3 code and of a random E2M1 nibble.
double e4m3_code_rms() {
  double s = 0;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const float v = e4m3_to_float(uint8_t(b));
    if (std::isnan(v)) continue;
    s += double(v) * v, ++n;
  }
  return std::sqrt(s / n);
}
double e2m1_code_rms() {
  double s = 0;
  for (int n = 0; n < 16; ++n) s += double(e2m1_to_float(uint8_t(n))) * e2m1_to_float(uint8_t(n));
  return std::sqrt(s / 16);
}

Fill uniform_std(DType dt, double stddev) {
  const double a = stddev * std::sqrt(3.0);
  return Fill{dt == DType::kF32 ? FillKind::kF32Uniform : FillKind::kBF16Uniform, -a, a, 0};
}

// How to fill tensor `t` so the dequantized model keeps O(1) activations (see tiny_checkpoint.h).
Fill choose_fill(const ExpectedTensor& t,
                 const std::unordered_map<std::string, const ExpectedTensor*>& by_name) {
  const std::string& n = t.name;
  if (t.dtype == DType::kF8_E4M3) return Fill{FillKind::kE4M3Codes};
  if (t.dtype == DType::kI8) return Fill{FillKind::kE2M1Packed};
  if (t.dtype == DType::kF8_E8M0) {
    const std::string base = n.substr(0, n.size() - std::string("scale").size());
    auto it = by_name.find(base + "weight");
    DSV41_CHECK_MSG(it != by_name.end(), n.c_str());
    const ExpectedTensor& w = *it->second;
    double target, code_rms;
    if (n.ends_with("engram.embed.scale")) {
      target = 1.0, code_rms = e4m3_code_rms();  // table rows: unit-scale values
    } else if (w.dtype == DType::kI8) {
      target = 1.0 / std::sqrt(double(w.shape[1] * 2)), code_rms = e2m1_code_rms();
    } else {
      target = 1.0 / std::sqrt(double(w.shape[1])), code_rms = e4m3_code_rms();
    }
    return Fill{FillKind::kE8M0, 0, 0, int(std::lround(std::log2(target / code_rms)))};
  }
  if (n.ends_with("norm.weight")) return Fill{FillKind::kBF16Uniform, 0.9, 1.1};
  if (n.ends_with("_fn")) return uniform_std(t.dtype, 1.0 / std::sqrt(double(t.shape[1])));
  if (n.ends_with("_base")) return Fill{FillKind::kF32Uniform, -0.5, 0.5};
  if (n.ends_with("_scale")) return Fill{FillKind::kF32Uniform, 0.5, 1.5};
  if (n.ends_with("attn_sink")) return Fill{FillKind::kF32Uniform, -1.0, 1.0};
  if (n.ends_with("gate.bias") || n.ends_with("gate.bias_vl"))
    return Fill{FillKind::kF32Uniform, -0.1, 0.1};
  if (n.ends_with("q_weight") || n.ends_with("k_weight"))
    return Fill{FillKind::kBF16Uniform, 0.5, 1.5};
  if (n == "embed.weight" || n.rfind("image_", 0) == 0 || n.ends_with("markov_head.embed.weight"))
    return uniform_std(t.dtype, 1.0);
  if (t.shape.size() == 2) return uniform_std(t.dtype, 1.0 / std::sqrt(double(t.shape[1])));
  return uniform_std(t.dtype, 1.0);
}

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9E3779B97F4A7C15ull);
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Fills bytes [0, out.size()) in chunks of kFillChunk bytes, chunk k drawn from Rng(seed + k): the
// result does not depend on how chunks are spread over threads.
constexpr std::size_t kFillChunk = 1 << 20;

void fill_chunk(const Fill& f, uint64_t seed, std::span<uint8_t> out) {
  Rng rng(seed);
  switch (f.kind) {
    case FillKind::kE4M3Codes:
      for (std::size_t i = 0; i < out.size(); ++i) {
        uint8_t b = uint8_t(rng.next_u64());
        if ((b & 0x7F) == 0x7F) b ^= 0x01;  // NaN codes -> ±448
        out[i] = b;
      }
      break;
    case FillKind::kE2M1Packed:  // every byte is two valid nibbles (-0 included, as real
                                 // checkpoints may hold)
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(rng.next_u64());
      break;
    case FillKind::kE8M0:
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = uint8_t(127 + f.center + int(rng.below(3)) - 1);
      break;
    case FillKind::kBF16Uniform:
      for (std::size_t i = 0; i + 1 < out.size(); i += 2) {
        const uint16_t b = float_to_bf16(float(rng.uniform(f.lo, f.hi)));
        std::memcpy(out.data() + i, &b, 2);
      }
      break;
    case FillKind::kF32Uniform:
      for (std::size_t i = 0; i + 3 < out.size(); i += 4) {
        const float v = float(rng.uniform(f.lo, f.hi));
        std::memcpy(out.data() + i, &v, 4);
      }
      break;
  }
}

void fill_tensor(ThreadPool& pool, const Fill& f, uint64_t seed, std::span<uint8_t> out) {
  const std::size_t chunks = (out.size() + kFillChunk - 1) / kFillChunk;
  pool.parallel_for(chunks, [&](std::size_t b, std::size_t e, std::size_t) {
    for (std::size_t k = b; k < e; ++k) {
      const std::size_t off = k * kFillChunk;
      fill_chunk(f, seed + k, out.subspan(off, std::min(kFillChunk, out.size() - off)));
    }
  });
}

// Shard budget: several shards even for tiny checkpoints, so multi-shard loading is always
// exercised.
uint64_t shard_budget(uint64_t total) {
  return std::min<uint64_t>(total / 4 + 1, 2ull << 30);
}

// --bigram (tiny_checkpoint.h): the successor of every id, drawn among the tokenizer's ordinary
// tokens (no special token, so greedy chains never stop or enter a chat marker).
std::vector<int64_t> bigram_successors(uint64_t seed, const TokenizerTable& tok, int64_t vocab) {
  std::vector<bool> special(std::size_t(vocab), false);
  for (const auto& [text, id] : tok.added)
    if (id >= 0 && id < vocab) special[std::size_t(id)] = true;
  std::vector<int64_t> ordinary;
  for (int64_t v = 0; v < vocab; ++v)
    if (!special[std::size_t(v)]) ordinary.push_back(v);
  DSV41_CHECK_MSG(!ordinary.empty(), "bigram: no ordinary token");
  Rng rng(name_seed(seed, "bigram successors"));
  std::vector<int64_t> succ(static_cast<std::size_t>(vocab));
  for (auto& s : succ) s = ordinary[std::size_t(rng.below(ordinary.size()))];
  return succ;
}

// Writes rows of `src` (BF16 [rows, cols]) into `out` as out[v] = scale * src[succ[v]] (scale a
// power of two: exact in BF16). With `unit_rows`, each source row is first scaled to norm 1.
void permute_rows(std::span<const uint8_t> src, const std::vector<int64_t>& succ, int64_t cols,
                  double scale, bool unit_rows, std::span<uint8_t> out) {
  const std::size_t row_bytes = std::size_t(cols) * 2;
  DSV41_CHECK(out.size() == succ.size() * row_bytes && src.size() == out.size());
  std::vector<float> row(static_cast<std::size_t>(cols));
  for (std::size_t v = 0; v < succ.size(); ++v) {
    const uint8_t* s = src.data() + std::size_t(succ[v]) * row_bytes;
    double norm2 = 0;
    for (int64_t c = 0; c < cols; ++c) {
      uint16_t b;
      std::memcpy(&b, s + 2 * c, 2);
      row[std::size_t(c)] = bf16_to_float(b);
      norm2 += double(row[std::size_t(c)]) * row[std::size_t(c)];
    }
    const double k = scale * (unit_rows && norm2 > 0 ? 1.0 / std::sqrt(norm2) : 1.0);
    for (int64_t c = 0; c < cols; ++c) {
      const uint16_t b = float_to_bf16(float(row[std::size_t(c)] * k));
      std::memcpy(out.data() + v * row_bytes + 2 * c, &b, 2);
    }
  }
}

std::string shard_name(std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

Status prepare_out_dir(const MakeTinyOptions& opt) {
  std::error_code ec;
  if (fs::exists(opt.out_dir, ec)) {
    if (!fs::is_directory(opt.out_dir, ec))
      return Status::error("--out: " + opt.out_dir + " exists and is not a directory");
    if (!fs::is_empty(opt.out_dir, ec) && !opt.force)
      return Status::error("--out: " + opt.out_dir + " is not empty (use --force to overwrite)");
    for (const auto& e : fs::directory_iterator(opt.out_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name == "config.json" || name == kIndexFileName || name.ends_with(".safetensors") ||
          name.ends_with(".safetensors.tmp") || name == "tokenizer.json" ||
          name == "tokenizer_config.json")
        fs::remove(e.path(), ec);
    }
  }
  fs::create_directories(opt.out_dir, ec);
  if (ec) return Status::error("--out: cannot create " + opt.out_dir + ": " + ec.message());
  return Status::ok();
}

// The preset's config with `patch` merged into its JSON form, parsed and checked again.
Result<ModelConfig> apply_config_patch(const ModelConfig& base, const std::string& patch) {
  const nlohmann::json p = nlohmann::json::parse(patch, nullptr, /*allow_exceptions=*/false);
  if (p.is_discarded() || !p.is_object()) return Status::error("--config-patch: not a JSON object");
  nlohmann::json j = config_to_json(base);
  j.merge_patch(p);
  const bool sizes_given = p.contains("text_config") && p["text_config"].is_object() &&
                           p["text_config"].contains("engram_num_embeddings");
  nlohmann::json& t = j["text_config"];
  if (!sizes_given && t.contains("engram_layer_ids") && t["engram_layer_ids"].is_array())
    t["engram_num_embeddings"] = std::vector<int64_t>(t["engram_layer_ids"].size(), 1);
  auto c = parse_config(j, "--config-patch");
  if (!c) return c.status();
  if (!sizes_given) {  // placeholders above; the real sizes follow from the patched config
    c->text.engram_num_embeddings.clear();
    for (const auto& l : engram_layouts(c->text)) c->text.engram_num_embeddings.push_back(l.rows());
  }
  return c;
}

}  // namespace

Result<MakeTinyResult> make_tiny_checkpoint(const MakeTinyOptions& opt) {
  GeneratedTokenizer gen;
  std::string tok_json;
  if (opt.tokenizer_path.empty()) {
    gen = make_tiny_tokenizer();
    tok_json = gen.tokenizer_json;
  } else {
    auto text = read_text_file(opt.tokenizer_path);
    if (!text) return text.status().with_context("--tokenizer: ");
    tok_json = std::move(text.value());
    const fs::path cfg = fs::path(opt.tokenizer_path).parent_path() / "tokenizer_config.json";
    if (fs::exists(cfg)) {
      auto ctext = read_text_file(cfg.string());
      if (!ctext) return ctext.status().with_context("--tokenizer: ");
      gen.tokenizer_config_json = std::move(ctext.value());
    } else {
      gen.tokenizer_config_json = make_tiny_tokenizer().tokenizer_config_json;
    }
  }
  auto table = parse_tokenizer_json(
      tok_json, opt.tokenizer_path.empty() ? "generated tokenizer.json" : opt.tokenizer_path);
  if (!table) return table.status();
  auto cfg = preset_config(opt.preset, table.value());
  if (!cfg) return cfg.status();
  if (!opt.config_patch.empty()) {
    auto patched = apply_config_patch(cfg.value(), opt.config_patch);
    if (!patched) return patched.status();
    cfg = std::move(patched);
  }
  auto plan = build_layer_plan(cfg.value());
  if (!plan) return plan.status().with_context("preset '" + opt.preset + "': ");
  DSV41_RETURN_IF_ERROR(prepare_out_dir(opt));

  auto tensors = expected_text_tensors(cfg.value(), plan.value());
  for (auto& v : expected_vision_tensors(cfg.value())) tensors.push_back(std::move(v));
  std::unordered_map<std::string, const ExpectedTensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t;
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.nbytes();
  // Consecutive tensors (inventory order: globals, then layer by layer) packed into shards.
  std::vector<std::vector<std::size_t>> shards(1);
  uint64_t in_shard = 0;
  const uint64_t budget = shard_budget(total);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (in_shard > 0 && in_shard + tensors[i].nbytes() > budget)
      shards.emplace_back(), in_shard = 0;
    shards.back().push_back(i);
    in_shard += tensors[i].nbytes();
  }
  log::info("make-tiny: preset '{}', seed {}{}, {} tensors, {:.1f} MB in {} shards -> {}",
            opt.preset, opt.seed, opt.bigram ? ", bigram" : "", tensors.size(), double(total) / 1e6,
            shards.size(), opt.out_dir);
  ThreadPool pool(opt.threads);
  // --bigram: the embedding and the Markov head are derived from the head tensors' own random
  // values (regenerated here from their seeds, so write order does not matter).
  const TextConfig& tc = cfg.value().text;
  std::vector<int64_t> succ;
  if (opt.bigram) succ = bigram_successors(opt.seed, table.value(), tc.vocab_size);
  auto regenerate = [&](const std::string& name) {
    const ExpectedTensor& t = *by_name.at(name);
    std::vector<uint8_t> bytes(t.nbytes());
    fill_tensor(pool, choose_fill(t, by_name), name_seed(opt.seed, t.name), bytes);
    return bytes;
  };
  auto fill_bigram = [&](const ExpectedTensor& t, std::span<uint8_t> out) {
    const double d = double(tc.hidden_size);
    if (t.name == kEmbedName) {
      // Head rows have norm ~1; x 16 sqrt(hidden) gives entries of ~16, so the embedding
      // dominates the residual stream (layer outputs are O(1) whatever its scale).
      const double scale = std::exp2(std::round(std::log2(16 * std::sqrt(d))));
      permute_rows(regenerate(std::string(kHeadName) + ".weight"), succ, t.shape[1], scale, false,
                   out);
    } else if (t.name.ends_with("markov_head.head.weight")) {
      std::vector<int64_t> identity(succ.size());
      for (std::size_t v = 0; v < identity.size(); ++v) identity[v] = int64_t(v);
      permute_rows(regenerate(t.name), identity, t.shape[1], 1.0, true, out);
    } else if (t.name.ends_with("markov_head.embed.weight")) {
      // Equal-norm head rows make w_g . w_g the largest of all w_j . w_g; s scales that margin
      // above the drafter's own logits (at most about 1.1 sqrt(hidden) for unit head rows).
      const double scale = std::exp2(std::ceil(std::log2(64 * std::sqrt(d))));
      const std::string head =
          t.name.substr(0, t.name.size() - std::string("embed.weight").size()) + "head.weight";
      permute_rows(regenerate(head), succ, t.shape[1], scale, true, out);
    } else {
      fill_tensor(pool, choose_fill(t, by_name), name_seed(opt.seed, t.name), out);
    }
  };
  std::vector<std::pair<std::string, std::string>> weight_map;
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t done = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shard_name(s, shards.size());
    std::vector<TensorSpec> specs;
    for (std::size_t i : shards[s]) {
      specs.push_back({tensors[i].name, tensors[i].dtype, tensors[i].shape});
      weight_map.emplace_back(tensors[i].name, name);
    }
    auto fill = [&](std::size_t k, std::span<uint8_t> out) {
      const ExpectedTensor& t = tensors[shards[s][k]];
      if (opt.bigram)
        fill_bigram(t, out);
      else
        fill_tensor(pool, choose_fill(t, by_name), name_seed(opt.seed, t.name), out);
      done += out.size();
    };
    DSV41_RETURN_IF_ERROR(write_safetensors((fs::path(opt.out_dir) / name).string(), specs, fill,
                                            {{"format", "pt"}}));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double rate = double(done) / std::max(secs, 1e-9);
    log::info("make-tiny: shard {}/{} written ({:.1f}/{:.1f} MB, {:.0f} MB/s, ETA {:.0f} s)", s + 1,
              shards.size(), double(done) / 1e6, double(total) / 1e6, rate / 1e6,
              double(total - done) / std::max(rate, 1.0));
  }
  DSV41_RETURN_IF_ERROR(
      write_text_file((fs::path(opt.out_dir) / "tokenizer.json").string(), tok_json));
  DSV41_RETURN_IF_ERROR(write_text_file((fs::path(opt.out_dir) / "tokenizer_config.json").string(),
                                        gen.tokenizer_config_json));
  DSV41_RETURN_IF_ERROR(write_text_file((fs::path(opt.out_dir) / "config.json").string(),
                                        config_to_json(cfg.value()).dump(2) + "\n"));
  DSV41_RETURN_IF_ERROR(write_index_json(opt.out_dir, weight_map, total));
  return MakeTinyResult{tensors.size(), total, shards.size()};
}

}  // namespace dsv41
