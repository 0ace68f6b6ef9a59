// The tensor names of the text model (spec §3.6): the one table the inventory, the reference
// forward, the converter's layout rules and the fast forward all read, so a name is spelled once.
// Linear layers are given by their base name (`X`: the tensors are `X.weight` and, for FP8 and
// MXFP4, `X.scale`); other tensors by their full name.
#pragma once

#include <string>

#include "model/layer_plan.h"

namespace dsv41 {

inline constexpr const char* kEmbedName = "embed.weight";
inline constexpr const char* kHeadName = "head";  // linear: head.weight
inline constexpr const char* kFinalNormName = "norm.weight";

struct BlockTensorNames {
  std::string prefix;  // "layers.L." or "mtp.S."
  // every block
  std::string attn_norm, ffn_norm;
  std::string hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  std::string attn_sink, q_norm, kv_norm;
  std::string wq_a, wq_b, wkv, wo_a, wo_b;  // linears
  // KV sources (compressor, index keys) and index sources (indexer query side)
  std::string c_norm, c_wkv, c_wgate, i_wk, i_k_norm;  // c_wkv, c_wgate, i_wk: BF16 linears
  std::string i_wq_b, i_wproj;                         // linears
  // MoE
  std::string gate, gate_bias, gate_bias_vl;  // gate: BF16 linear
  std::string sh_w1, sh_w2, sh_w3;            // linears
  // Engram (layers with one)
  std::string e_embed;  // table base: e_embed.weight / e_embed.scale (official layout)
  std::string e_wkv;    // linear
  std::string e_q, e_k;

  // Routed expert e's linear `w` ("w1", "w2", "w3"; the converted layout's "w13").
  std::string expert(int e, const char* w) const;
  // The converted layout's bucket of Engram hash column c (base name, .weight / .scale).
  std::string engram_bucket(std::size_t c) const;
};

BlockTensorNames block_tensor_names(const LayerPlan& p);

// The DSpark drafter's own tensors beside its stage blocks (spec §8): stage 0 owns main_proj
// (linear) and main_norm, the last stage the final norm, the Markov head and the confidence head.
struct DsparkTensorNames {
  std::string main_proj, main_norm;                         // under mtp.0.
  std::string norm, markov_embed, markov_head, confidence;  // under mtp.{S-1}.
};

// Names for stage prefixes `first` (stage 0) and `last` (the last stage), e.g. "mtp.0.".
DsparkTensorNames dspark_tensor_names(const std::string& first, const std::string& last);
// The same for a plan with DSpark stages.
DsparkTensorNames dspark_tensor_names(const ModelPlan& plan);

}  // namespace dsv41
