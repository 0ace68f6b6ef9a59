// block_tensor_names (see tensor_names.h).
#include "model/tensor_names.h"

#include "core/check.h"

namespace dsv41 {

std::string BlockTensorNames::expert(int e, const char* w) const {
  return prefix + "ffn.experts." + std::to_string(e) + "." + w;
}

std::string BlockTensorNames::engram_bucket(std::size_t c) const {
  return e_embed + ".bucket." + std::to_string(c);
}

BlockTensorNames block_tensor_names(const LayerPlan& p) {
  const std::string L = p.tensor_prefix();
  BlockTensorNames n;
  n.prefix = L;
  n.attn_norm = L + "attn_norm.weight";
  n.ffn_norm = L + "ffn_norm.weight";
  n.hc_attn_fn = L + "hc_attn_fn";
  n.hc_attn_base = L + "hc_attn_base";
  n.hc_attn_scale = L + "hc_attn_scale";
  n.hc_ffn_fn = L + "hc_ffn_fn";
  n.hc_ffn_base = L + "hc_ffn_base";
  n.hc_ffn_scale = L + "hc_ffn_scale";
  n.attn_sink = L + "attn.attn_sink";
  n.q_norm = L + "attn.q_norm.weight";
  n.kv_norm = L + "attn.kv_norm.weight";
  n.wq_a = L + "attn.wq_a";
  n.wq_b = L + "attn.wq_b";
  n.wkv = L + "attn.wkv";
  n.wo_a = L + "attn.wo_a";
  n.wo_b = L + "attn.wo_b";
  n.c_norm = L + "attn.compressor.norm.weight";
  n.c_wkv = L + "attn.compressor.wkv";
  n.c_wgate = L + "attn.compressor.wgate";
  n.i_wk = L + "attn.indexer.wk";
  n.i_k_norm = L + "attn.indexer.k_norm.weight";
  n.i_wq_b = L + "attn.indexer.wq_b";
  n.i_wproj = L + "attn.indexer.weights_proj";
  n.gate = L + "ffn.gate";
  n.gate_bias = L + "ffn.gate.bias";
  n.gate_bias_vl = L + "ffn.gate.bias_vl";
  n.sh_w1 = L + "ffn.shared_experts.w1";
  n.sh_w2 = L + "ffn.shared_experts.w2";
  n.sh_w3 = L + "ffn.shared_experts.w3";
  n.e_embed = L + "engram.embed";
  n.e_wkv = L + "engram.wkv";
  n.e_q = L + "engram.q_weight";
  n.e_k = L + "engram.k_weight";
  return n;
}

DsparkTensorNames dspark_tensor_names(const std::string& first, const std::string& last) {
  DsparkTensorNames n;
  n.main_proj = first + "main_proj";
  n.main_norm = first + "main_norm.weight";
  n.norm = last + "norm.weight";
  n.markov_embed = last + "markov_head.embed.weight";
  n.markov_head = last + "markov_head.head";
  n.confidence = last + "confidence_head.proj.weight";
  return n;
}

DsparkTensorNames dspark_tensor_names(const ModelPlan& plan) {
  const int S = int(plan.layers.size()) - plan.num_backbone;
  DSV41_CHECK(S > 0);
  return dspark_tensor_names(plan.stage(0).tensor_prefix(), plan.stage(S - 1).tensor_prefix());
}

}  // namespace dsv41
