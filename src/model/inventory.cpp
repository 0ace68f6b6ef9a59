// Expected-tensor derivation (spec §3.6 shapes) and the inventory check.
#include "model/inventory.h"

#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "io/safetensors.h"
#include "model/tensor_names.h"

namespace dsv41 {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

class Builder {
 public:
  Builder(const ModelConfig& c, std::vector<ExpectedTensor>* out) : c_(c), out_(out) {}

  void add(std::string name, DType dt, std::vector<int64_t> shape, TensorRole role) {
    out_->push_back(ExpectedTensor{std::move(name), dt, std::move(shape), role, layer_});
  }
  // FP8 E4M3 linear [out, in] + its E8M0 block scale [ceil(out/b0), ceil(in/b1)].
  void fp8_linear(const std::string& base, int64_t out, int64_t in, TensorRole role) {
    const auto& b = c_.quantization.weight_block_size;
    add(base + ".weight", DType::kF8_E4M3, {out, in}, role);
    add(base + ".scale", DType::kF8_E8M0, {ceil_div(out, b[0]), ceil_div(in, b[1])}, role);
  }
  // MXFP4 expert linear: I8 [out, in/2] (two E2M1 per byte) + E8M0 [out, in/32].
  void fp4_linear(const std::string& base, int64_t out, int64_t in) {
    add(base + ".weight", DType::kI8, {out, in / 2}, TensorRole::kExpert);
    add(base + ".scale", DType::kF8_E8M0, {out, in / 32}, TensorRole::kExpert);
  }
  void set_layer(int l) { layer_ = l; }

 private:
  const ModelConfig& c_;
  std::vector<ExpectedTensor>* out_;
  int layer_ = -1;
};

void add_block(Builder& b, const TextConfig& t, const LayerPlan& p) {
  const BlockTensorNames n = block_tensor_names(p);
  const int64_t D = t.hidden_size, H = t.num_attention_heads, Dh = t.head_dim,
                I = t.moe_intermediate_size;
  b.add(n.attn_norm, DType::kBF16, {D}, TensorRole::kNorm);
  b.add(n.ffn_norm, DType::kBF16, {D}, TensorRole::kNorm);
  for (const auto& [fn, base, scale] : {std::tie(n.hc_attn_fn, n.hc_attn_base, n.hc_attn_scale),
                                        std::tie(n.hc_ffn_fn, n.hc_ffn_base, n.hc_ffn_scale)}) {
    b.add(fn, DType::kF32, {t.hc_mix(), t.hc_mult * D}, TensorRole::kMhc);
    b.add(base, DType::kF32, {t.hc_mix()}, TensorRole::kMhc);
    b.add(scale, DType::kF32, {3}, TensorRole::kMhc);
  }
  b.add(n.attn_sink, DType::kF32, {H}, TensorRole::kAttn);
  b.add(n.q_norm, DType::kBF16, {t.q_lora_rank}, TensorRole::kAttn);
  b.add(n.kv_norm, DType::kBF16, {Dh}, TensorRole::kAttn);
  b.fp8_linear(n.wq_a, t.q_lora_rank, D, TensorRole::kAttn);
  b.fp8_linear(n.wq_b, H * Dh, t.q_lora_rank, TensorRole::kAttn);
  b.fp8_linear(n.wkv, t.num_key_value_heads * Dh, D, TensorRole::kAttn);
  b.fp8_linear(n.wo_a, t.o_groups * t.o_lora_rank, H * Dh / t.o_groups, TensorRole::kAttn);
  b.fp8_linear(n.wo_b, D, t.o_groups * t.o_lora_rank, TensorRole::kAttn);
  if (p.is_kv_source()) {
    b.add(n.c_norm, DType::kBF16, {Dh}, TensorRole::kCompressor);
    b.add(n.c_wkv + ".weight", DType::kBF16, {Dh, D}, TensorRole::kCompressor);
    if (p.compressor_gate)
      b.add(n.c_wgate + ".weight", DType::kBF16, {Dh, D}, TensorRole::kCompressor);
    b.add(n.i_wk + ".weight", DType::kBF16, {t.index_head_dim, Dh}, TensorRole::kIndexer);
    b.add(n.i_k_norm, DType::kBF16, {t.index_head_dim}, TensorRole::kIndexer);
  }
  if (p.has_indexer()) {
    b.fp8_linear(n.i_wq_b, t.index_n_heads * t.index_head_dim, t.q_lora_rank, TensorRole::kIndexer);
    b.add(n.i_wproj + ".weight", DType::kBF16, {t.index_n_heads, D}, TensorRole::kIndexer);
  }
  b.add(n.gate + ".weight", DType::kBF16, {p.n_routed_experts, D}, TensorRole::kRouter);
  b.add(n.gate_bias, DType::kF32, {p.n_routed_experts}, TensorRole::kRouter);
  b.add(n.gate_bias_vl, DType::kF32, {p.n_routed_experts}, TensorRole::kRouter);
  for (int e = 0; e < p.n_routed_experts; ++e) {
    b.fp4_linear(n.expert(e, "w1"), I, D);
    b.fp4_linear(n.expert(e, "w2"), D, I);
    b.fp4_linear(n.expert(e, "w3"), I, D);
  }
  const int64_t Is = I * t.n_shared_experts;
  b.fp8_linear(n.sh_w1, Is, D, TensorRole::kSharedExpert);
  b.fp8_linear(n.sh_w2, D, Is, TensorRole::kSharedExpert);
  b.fp8_linear(n.sh_w3, Is, D, TensorRole::kSharedExpert);
}

void add_engram(Builder& b, const TextConfig& t, const LayerPlan& p) {
  const BlockTensorNames n = block_tensor_names(p);
  const int64_t rows = t.engram_num_embeddings[std::size_t(p.engram)];
  const int64_t in = (t.engram_max_ngram_size - 1) * t.engram_n_heads * t.engram_head_dim;
  b.add(n.e_embed + ".weight", DType::kF8_E4M3, {rows, t.engram_head_dim}, TensorRole::kEngram);
  b.add(n.e_embed + ".scale", DType::kF8_E8M0, {rows, t.engram_head_dim / 32}, TensorRole::kEngram);
  b.fp8_linear(n.e_wkv, (t.hc_mult + 1) * t.hidden_size, in, TensorRole::kEngram);
  b.add(n.e_q, DType::kBF16, {t.hc_mult, t.hidden_size}, TensorRole::kEngram);
  b.add(n.e_k, DType::kBF16, {t.hc_mult, t.hidden_size}, TensorRole::kEngram);
}

}  // namespace

uint64_t ExpectedTensor::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

std::vector<ExpectedTensor> expected_text_tensors(const ModelConfig& c, const ModelPlan& plan) {
  const TextConfig& t = c.text;
  std::vector<ExpectedTensor> out;
  Builder b(c, &out);
  const int64_t V = t.vocab_size, D = t.hidden_size;
  b.add(kEmbedName, DType::kBF16, {V, D}, TensorRole::kGlobal);
  b.add(std::string(kHeadName) + ".weight", DType::kBF16, {V, D}, TensorRole::kGlobal);
  b.add(kFinalNormName, DType::kBF16, {D}, TensorRole::kGlobal);
  for (const char* g : {"image_start", "image_end", "image_newline"})
    b.add(g, DType::kBF16, {D}, TensorRole::kGlobal);
  for (const LayerPlan& p : plan.layers) {
    b.set_layer(p.index);
    add_block(b, t, p);
    if (p.engram >= 0) add_engram(b, t, p);
    if (p.dspark_stage < 0) continue;
    const std::string S = p.tensor_prefix();
    const DsparkTensorNames n = dspark_tensor_names(S, S);
    if (p.dspark_stage == 0) {
      b.fp8_linear(n.main_proj, D, int64_t(t.dspark_target_layer_ids.size()) * D,
                   TensorRole::kDspark);
      b.add(n.main_norm, DType::kBF16, {D}, TensorRole::kDspark);
    }
    if (p.dspark_stage == int(t.num_nextn_predict_layers) - 1) {
      b.add(n.norm, DType::kBF16, {D}, TensorRole::kDspark);
      b.add(n.markov_embed, DType::kBF16, {V, t.dspark_markov_rank}, TensorRole::kDspark);
      b.add(n.markov_head + ".weight", DType::kBF16, {V, t.dspark_markov_rank},
            TensorRole::kDspark);
      b.add(n.confidence, DType::kBF16, {1, D + t.dspark_markov_rank}, TensorRole::kDspark);
    }
  }
  return out;
}

std::vector<ExpectedTensor> expected_vision_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  if (!c.vision) return out;
  const VisionConfig& v = *c.vision;
  const int64_t W = v.hidden_size, P = v.patch_size, r = v.downsample_ratio, D = c.text.hidden_size;
  auto add = [&](std::string n, std::vector<int64_t> s) {
    out.push_back(
        ExpectedTensor{std::move(n), DType::kBF16, std::move(s), TensorRole::kVision, -1});
  };
  add("vision.patch_embed.proj.weight", {W, 3 * P * P});
  add("vision.patch_embed.proj.bias", {W});
  for (int64_t k = 0; k < v.num_hidden_layers; ++k) {
    const std::string B = "vision.blocks." + std::to_string(k) + ".";
    add(B + "attn.wqkv.weight", {3 * W, W});
    add(B + "attn.wqkv.bias", {3 * W});
    add(B + "attn.wo.weight", {W, W});
    add(B + "attn.wo.bias", {W});
    add(B + "mlp.w1.weight", {2 * v.intermediate_size, W});
    add(B + "mlp.w2.weight", {W, v.intermediate_size});
    add(B + "norm1.weight", {W});
    add(B + "norm2.weight", {W});
  }
  add("vision.norm.weight", {W});
  add("aligner.w1.weight", {D, W * r * r});
  add("aligner.w1.bias", {D});
  add("aligner.w2.weight", {D, D});
  add("aligner.w2.bias", {D});
  return out;
}

bool is_vision_tensor_name(const std::string& name) {
  return name.rfind("vision.", 0) == 0 || name.rfind("aligner.", 0) == 0;
}

InventoryReport check_inventory(const std::vector<ExpectedTensor>& expected,
                                const Checkpoint& ckpt) {
  InventoryReport r;
  std::unordered_map<std::string, const ExpectedTensor*> want;
  want.reserve(expected.size());
  for (const auto& e : expected) want[e.name] = &e;
  for (const auto& e : expected) {
    const Checkpoint::Entry* found = ckpt.find(e.name);
    if (!found) {
      r.missing.push_back(e.name);
      continue;
    }
    bool good = true;
    if (found->info->dtype != e.dtype) {
      r.wrong_dtype.push_back(e.name + ": expected " + std::string(dtype_name(e.dtype)) +
                              ", found " + std::string(dtype_name(found->info->dtype)));
      good = false;
    }
    if (found->info->shape != e.shape) {
      r.wrong_shape.push_back(e.name + ": expected " + shape_to_string(e.shape) + ", found " +
                              shape_to_string(found->info->shape));
      good = false;
    }
    r.matched += good;
  }
  for (const auto& name : ckpt.tensor_names()) {
    if (want.count(name)) continue;
    if (is_vision_tensor_name(name))
      ++r.ignored_vision;
    else
      r.extra.push_back(name);
  }
  return r;
}

namespace {

// A config field and the tensor dimension it sets on its own (the first expected tensor named
// `tensor` or ending in "." + `tensor`).
struct Anchor {
  const char* field;
  int64_t TextConfig::*value;
  const char* tensor;
  std::size_t dim;
  const char* unit;
};
constexpr Anchor kAnchors[] = {
    {"vocab_size", &TextConfig::vocab_size, "embed.weight", 0, "rows"},
    {"hidden_size", &TextConfig::hidden_size, "embed.weight", 1, "columns"},
    {"num_attention_heads", &TextConfig::num_attention_heads, "attn.attn_sink", 0, "entries"},
    {"head_dim", &TextConfig::head_dim, "attn.kv_norm.weight", 0, "entries"},
    {"q_lora_rank", &TextConfig::q_lora_rank, "attn.q_norm.weight", 0, "entries"},
    {"moe_intermediate_size", &TextConfig::moe_intermediate_size, "ffn.experts.0.w1.weight", 0,
     "rows"},
    {"n_routed_experts", &TextConfig::n_routed_experts, "layers.0.ffn.gate.bias", 0, "entries"},
    {"dspark_n_routed_experts", &TextConfig::dspark_n_routed_experts, "mtp.0.ffn.gate.bias", 0,
     "entries"},
    {"index_n_heads", &TextConfig::index_n_heads, "attn.indexer.weights_proj.weight", 0, "rows"},
    {"index_head_dim", &TextConfig::index_head_dim, "attn.indexer.k_norm.weight", 0, "entries"},
    {"hc_mult", &TextConfig::hc_mult, "engram.q_weight", 0, "rows"},
    {"engram_head_dim", &TextConfig::engram_head_dim, "engram.embed.weight", 1, "columns"},
    {"dspark_markov_rank", &TextConfig::dspark_markov_rank, "markov_head.embed.weight", 1,
     "columns"},
};

const ExpectedTensor* find_anchor(const std::vector<ExpectedTensor>& expected, const char* tensor) {
  const std::string name = tensor, suffix = "." + name;
  for (const auto& e : expected)
    if (e.name == name || e.name.ends_with(suffix)) return &e;
  return nullptr;
}

}  // namespace

std::vector<std::string> config_contradictions(const ModelConfig& c,
                                               const std::vector<ExpectedTensor>& expected,
                                               const Checkpoint& ckpt, const InventoryReport& rep) {
  std::vector<std::string> out;
  for (const Anchor& a : kAnchors) {
    const ExpectedTensor* e = find_anchor(expected, a.tensor);
    const Checkpoint::Entry* found = e ? ckpt.find(e->name) : nullptr;
    if (!found || found->info->shape.size() != e->shape.size() || a.dim >= e->shape.size())
      continue;
    const int64_t have = found->info->shape[a.dim];
    if (have == e->shape[a.dim] || have <= 0) continue;
    ModelConfig fixed = c;
    fixed.text.*a.value = have;
    auto plan = build_layer_plan(fixed);
    if (!plan) continue;
    const InventoryReport again = check_inventory(expected_text_tensors(fixed, *plan), ckpt);
    if (again.problems() * 2 >= rep.problems()) continue;  // explains too little
    out.push_back(
        fmt::format("text_config.{} = {} in config.json, but {} has {} {} ({})", a.field,
                    c.text.*a.value, e->name, have, a.unit,
                    again.ok() ? fmt::format("with {} = {} every tensor matches", a.field, have)
                               : fmt::format("with {} = {}, {} of the {} inventory problems remain",
                                             a.field, have, again.problems(), rep.problems())));
  }
  return out;
}

std::string InventoryReport::summary(std::size_t max_per_kind) const {
  std::string s;
  auto list = [&](const char* kind, const std::vector<std::string>& v) {
    if (v.empty()) return;
    s += std::to_string(v.size()) + " " + kind + " tensor(s):\n";
    for (std::size_t i = 0; i < v.size() && i < max_per_kind; ++i) s += "  " + v[i] + "\n";
    if (v.size() > max_per_kind)
      s += "  ... and " + std::to_string(v.size() - max_per_kind) + " more\n";
  };
  list("missing", missing);
  list("unexpected", extra);
  list("mis-shaped", wrong_shape);
  list("mis-typed", wrong_dtype);
  return s;
}

InventoryTotals inventory_totals(const std::vector<ExpectedTensor>& tensors) {
  InventoryTotals t;
  for (const auto& e : tensors) {
    ++t.tensors;
    t.bytes += e.nbytes();
    ++t.per_dtype[std::string(dtype_name(e.dtype))];
  }
  return t;
}

}  // namespace dsv41
