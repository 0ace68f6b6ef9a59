// config.json parsing, validation and serialisation. One field table per section (visit_*) drives
// both the reader and the writer, so the two cannot drift apart.
#include "model/config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include <sstream>
#include "io/text_file.h"

namespace dsv41 {
namespace {

using json = nlohmann::json;
constexpr int64_t kMaxI = std::numeric_limits<int64_t>::max();
enum Need { kRequired, kOptional };

std::string type_of(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Reads fields of one JSON object, collecting one error per bad field.
class Reader {
 public:
  Reader(const json& obj, std::string prefix, std::vector<std::string>* errors)
      : obj_(obj), prefix_(std::move(prefix)), errors_(errors) {}

  void integer(const char* key, int64_t& f, int64_t lo, int64_t hi, Need need = kRequired) {
    const json* v = get(key, need);
    if (!v) return;
    if (!v->is_number_integer()) return bad(key, "expected an integer, got " + type_of(*v));
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(kMaxI))
      return bad(key, "out of range");
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) return bad(key, range_msg(x, lo, hi));
    f = x;
  }
  void optional_integer(const char* key, std::optional<int64_t>& f, int64_t lo, int64_t hi) {
    if (!obj_.contains(key) || obj_[key].is_null()) {
      f.reset();
      return;
    }
    int64_t x = 0;
    const std::size_t before = errors_->size();
    integer(key, x, lo, hi);
    if (errors_->size() == before) f = x;
  }
  void number(const char* key, double& f, double lo, double hi, Need need = kRequired) {
    const json* v = get(key, need);
    if (!v) return;
    if (!v->is_number()) return bad(key, "expected a number, got " + type_of(*v));
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) return bad(key, range_msg(x, lo, hi));
    f = x;
  }
  void positive(const char* key, double& f, Need need = kRequired) {
    number(key, f, 0.0, std::numeric_limits<double>::max(), need);
    if (obj_.contains(key) && obj_[key].is_number() && !(f > 0)) bad(key, "must be > 0");
  }
  void boolean(const char* key, bool& f, Need need = kRequired) {
    const json* v = get(key, need);
    if (!v) return;
    if (!v->is_boolean()) return bad(key, "expected a boolean, got " + type_of(*v));
    f = v->get<bool>();
  }
  void string(const char* key, std::string& f, std::initializer_list<const char*> allowed,
              Need need = kRequired) {
    const json* v = get(key, need);
    if (!v) return;
    if (!v->is_string()) return bad(key, "expected a string, got " + type_of(*v));
    const std::string s = v->get<std::string>();
    if (allowed.size()) {
      bool ok = false;
      std::string list;
      for (const char* a : allowed)
        ok |= s == a, list += std::string(list.empty() ? "" : ", ") + "\"" + a + "\"";
      if (!ok) return bad(key, "\"" + s + "\" is not supported (expected " + list + ")");
    }
    f = s;
  }
  void int_list(const char* key, std::vector<int64_t>& f, int64_t lo, int64_t hi,
                Need need = kRequired) {
    const json* v = get(key, need);
    if (!v) return;
    if (!v->is_array()) return bad(key, "expected an array of integers, got " + type_of(*v));
    std::vector<int64_t> out;
    for (std::size_t i = 0; i < v->size(); ++i) {
      const json& e = (*v)[i];
      if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > uint64_t(kMaxI)))
        return bad(key, "entry " + std::to_string(i) + " is not an integer");
      const int64_t x = e.get<int64_t>();
      if (x < lo || x > hi)
        return bad(key, "entry " + std::to_string(i) + ": " + range_msg(x, lo, hi));
      out.push_back(x);
    }
    f = std::move(out);
  }
  void string_list(const char* key, std::vector<std::string>& f, Need need = kRequired) {
    const json* v = get(key, need);
    if (!v) return;
    if (!v->is_array()) return bad(key, "expected an array of strings, got " + type_of(*v));
    std::vector<std::string> out;
    for (const auto& e : *v) {
      if (!e.is_string()) return bad(key, "entries must be strings");
      out.push_back(e.get<std::string>());
    }
    f = std::move(out);
  }
  void bad(const std::string& key, const std::string& msg) {
    errors_->push_back(prefix_ + key + ": " + msg);
  }
  const json* object(const char* key, Need need) {
    const json* v = get(key, need);
    if (v && !v->is_object()) {
      bad(key, "expected an object, got " + type_of(*v));
      return nullptr;
    }
    return v;
  }

 private:
  const json* get(const char* key, Need need) {
    if (!obj_.contains(key)) {
      if (need == kRequired) errors_->push_back(prefix_ + key + ": missing");
      return nullptr;
    }
    return &obj_[key];
  }
  template <typename T>
  static std::string range_msg(T x, T lo, T hi) {
    std::ostringstream s;
    s << "value " << x << " out of range [" << lo << ", " << hi << "]";
    return s.str();
  }
  const json& obj_;
  std::string prefix_;
  std::vector<std::string>* errors_;
};

// Writes fields into a JSON object; same method names as Reader, so visit_* serves both.
class Writer {
 public:
  explicit Writer(json* obj) : obj_(obj) {}
  // An optional field the source did not give keeps a default outside its range (0 for a
  // [1, ...] field): it is left out, as it came, so that the written form parses again (found by
  // fuzz_config's round trip).
  void integer(const char* key, int64_t& f, int64_t lo, int64_t hi, Need need = kRequired) {
    if (need == kOptional && (f < lo || f > hi)) return;
    (*obj_)[key] = f;
  }
  void optional_integer(const char* key, std::optional<int64_t>& f, int64_t, int64_t) {
    if (f)
      (*obj_)[key] = *f;
    else
      (*obj_)[key] = nullptr;
  }
  void number(const char* key, double& f, double, double, Need = kRequired) { (*obj_)[key] = f; }
  void positive(const char* key, double& f, Need need = kRequired) {
    if (need == kOptional && !(f > 0)) return;  // not given (as integer() above)
    (*obj_)[key] = f;
  }
  void boolean(const char* key, bool& f, Need = kRequired) { (*obj_)[key] = f; }
  void string(const char* key, std::string& f, std::initializer_list<const char*>,
              Need = kRequired) {
    (*obj_)[key] = f;
  }
  void int_list(const char* key, std::vector<int64_t>& f, int64_t, int64_t, Need = kRequired) {
    (*obj_)[key] = f;
  }
  void string_list(const char* key, std::vector<std::string>& f, Need = kRequired) {
    (*obj_)[key] = f;
  }

 private:
  json* obj_;
};

constexpr int64_t kMaxDim = int64_t(1) << 20;  // any single width
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxVocab = int64_t(1) << 26;

template <typename V>
void visit_text(V& v, TextConfig& t) {
  v.integer("vocab_size", t.vocab_size, 4, kMaxVocab);
  v.integer("hidden_size", t.hidden_size, 32, kMaxDim);
  v.integer("num_hidden_layers", t.num_hidden_layers, 1, kMaxLayers);
  v.integer("num_attention_heads", t.num_attention_heads, 1, 4096);
  v.integer("num_key_value_heads", t.num_key_value_heads, 1, 1);
  v.integer("head_dim", t.head_dim, 32, kMaxDim);
  v.integer("qk_rope_head_dim", t.qk_rope_head_dim, 2, kMaxDim);
  v.integer("q_lora_rank", t.q_lora_rank, 1, kMaxDim);
  v.integer("o_lora_rank", t.o_lora_rank, 1, kMaxDim);
  v.integer("o_groups", t.o_groups, 1, 4096);
  v.integer("moe_intermediate_size", t.moe_intermediate_size, 32, kMaxDim);
  v.integer("n_routed_experts", t.n_routed_experts, 1, 65536);
  v.integer("n_shared_experts", t.n_shared_experts, 1, 1);
  v.integer("num_experts_per_tok", t.num_experts_per_tok, 1, 65536);
  v.string("scoring_func", t.scoring_func, {"sqrtsoftplus"});
  v.string("topk_method", t.topk_method, {"noaux_tc"});
  v.boolean("norm_topk_prob", t.norm_topk_prob);
  v.positive("routed_scaling_factor", t.routed_scaling_factor);
  v.string("hidden_act", t.hidden_act, {"silu"});
  v.positive("swiglu_limit", t.swiglu_limit);
  v.positive("rms_norm_eps", t.rms_norm_eps);
  v.positive("gate_temp", t.gate_temp, kOptional);
  v.boolean("attention_bias", t.attention_bias, kOptional);
  v.number("attention_dropout", t.attention_dropout, 0.0, 0.0, kOptional);
  v.number("initializer_range", t.initializer_range, 0.0, 1e9, kOptional);
  v.boolean("use_cache", t.use_cache, kOptional);
  v.boolean("tie_word_embeddings", t.tie_word_embeddings, kOptional);
  v.integer("max_position_embeddings", t.max_position_embeddings, 1, int64_t(1) << 40);
  v.positive("rope_theta", t.rope_theta);
  v.positive("compress_rope_theta", t.compress_rope_theta);
  v.integer("sliding_window", t.sliding_window, 1, kMaxDim);
  v.int_list("compress_ratios", t.compress_ratios, 0, 128);
  v.int_list("kv_source_layer_ids", t.kv_source_layer_ids, 0, kMaxLayers);
  v.int_list("index_source_layer_ids", t.index_source_layer_ids, 0, kMaxLayers);
  v.integer("index_n_heads", t.index_n_heads, 1, 4096);
  v.integer("index_head_dim", t.index_head_dim, 32, kMaxDim);
  v.integer("index_topk", t.index_topk, 1, kMaxI);
  v.optional_integer("candidate_source_layer_id", t.candidate_source_layer_id, 0, kMaxLayers);
  v.integer("candidate_topk_blocks", t.candidate_topk_blocks, 1, kMaxI);
  v.integer("candidate_block_size", t.candidate_block_size, 1, kMaxI);
  v.integer("hc_mult", t.hc_mult, 1, 64);
  v.integer("hc_sinkhorn_iters", t.hc_sinkhorn_iters, 1, 10000);
  v.positive("hc_eps", t.hc_eps);
  v.int_list("engram_layer_ids", t.engram_layer_ids, 0, kMaxLayers);
  v.int_list("engram_num_embeddings", t.engram_num_embeddings, 1, kMaxI);
  v.integer("engram_max_ngram_size", t.engram_max_ngram_size, 2, 16);
  v.integer("engram_vocab_size", t.engram_vocab_size, 2, int64_t(1) << 40);
  v.integer("engram_n_heads", t.engram_n_heads, 1, 1024);
  v.integer("engram_head_dim", t.engram_head_dim, 32, kMaxDim);
  v.integer("engram_pad_token_id", t.engram_pad_token_id, 0, kMaxVocab);
  v.integer("engram_compressed_vocab_size", t.engram_compressed_vocab_size, 1, kMaxVocab);
  v.integer("num_nextn_predict_layers", t.num_nextn_predict_layers, 0, 64);
  v.integer("dspark_block_size", t.dspark_block_size, 1, 1024);
  v.integer("dspark_noise_token_id", t.dspark_noise_token_id, 0, kMaxVocab);
  v.int_list("dspark_target_layer_ids", t.dspark_target_layer_ids, 0, kMaxLayers);
  v.integer("dspark_markov_rank", t.dspark_markov_rank, 1, kMaxDim);
  v.integer("dspark_n_routed_experts", t.dspark_n_routed_experts, 1, 65536);
  v.integer("dspark_num_experts_per_tok", t.dspark_num_experts_per_tok, 1, 65536);
}

template <typename V>
void visit_rope_scaling(V& v, RopeScaling& r) {
  v.string("rope_type", r.rope_type, {"yarn"});
  v.number("factor", r.factor, 1.0, 1e9);
  v.positive("beta_fast", r.beta_fast);
  v.positive("beta_slow", r.beta_slow);
  v.integer("original_max_position_embeddings", r.original_max_position_embeddings, 1,
            int64_t(1) << 40);
}

template <typename V>
void visit_quant(V& v, QuantizationConfig& q) {
  v.string("quant_method", q.quant_method, {"fp8"});
  v.string("activation_scheme", q.activation_scheme, {"dynamic"});
  v.int_list("weight_block_size", q.weight_block_size, 1, 4096);
  v.string("scale_fmt", q.scale_fmt, {"ue8m0"});
  v.string("expert_dtype", q.expert_dtype, {"fp4"});
}

template <typename V>
void visit_vision(V& v, VisionConfig& c) {
  v.integer("num_hidden_layers", c.num_hidden_layers, 0, kMaxLayers);
  v.integer("hidden_size", c.hidden_size, 1, kMaxDim);
  v.integer("num_attention_heads", c.num_attention_heads, 1, 4096);
  v.integer("intermediate_size", c.intermediate_size, 1, kMaxDim);
  v.integer("patch_size", c.patch_size, 1, 4096);
  v.integer("downsample_ratio", c.downsample_ratio, 1, 64);
  v.integer("max_image_tokens", c.max_image_tokens, 1, kMaxI, kOptional);
  v.integer("min_pixels", c.min_pixels, 0, kMaxI, kOptional);
  v.positive("rope_theta", c.rope_theta, kOptional);
}

template <typename V>
void visit_root(V& v, ModelConfig& c) {
  v.string_list("architectures", c.architectures);
  v.string("model_type", c.model_type, {"deepseek_v41"});
  v.string("dtype", c.dtype, {}, kOptional);
  v.integer("bos_token_id", c.bos_token_id, 0, kMaxVocab);
  v.integer("eos_token_id", c.eos_token_id, 0, kMaxVocab);
  v.integer("pad_token_id", c.pad_token_id, 0, kMaxVocab);
  v.integer("image_token_id", c.image_token_id, 0, kMaxVocab);
}

// Field-level relations inside text_config that do not need the layer plan.
void check_text_relations(const ModelConfig& c, std::vector<std::string>* errors) {
  const TextConfig& t = c.text;
  auto err = [&](const std::string& m) { errors->push_back("text_config." + m); };
  if (t.hidden_size % 32)
    err("hidden_size: must be a multiple of 32 (MXFP4 experts use 32-element blocks)");
  if (t.moe_intermediate_size % 32)
    err("moe_intermediate_size: must be a multiple of 32 (MXFP4 blocks)");
  if (t.head_dim % 32)
    err("head_dim: must be a multiple of 32 (FP8 window rows use 32-wide blocks)");
  if (t.qk_rope_head_dim % 2 || t.qk_rope_head_dim > t.head_dim)
    err("qk_rope_head_dim: must be even and <= head_dim");
  if (t.index_head_dim % 32 || t.qk_rope_head_dim > t.index_head_dim)
    err("index_head_dim: must be a multiple of 32 and >= qk_rope_head_dim");
  if (t.num_attention_heads % t.o_groups) err("o_groups: must divide num_attention_heads");
  if (t.num_experts_per_tok > t.n_routed_experts)
    err("num_experts_per_tok: exceeds n_routed_experts");
  if (t.dspark_num_experts_per_tok > t.dspark_n_routed_experts)
    err("dspark_num_experts_per_tok: exceeds dspark_n_routed_experts");
  if (t.engram_head_dim % 32)
    err("engram_head_dim: must be a multiple of 32 (one E8M0 scale per 32)");
  if (t.engram_num_embeddings.size() != t.engram_layer_ids.size())
    err("engram_num_embeddings: needs one entry per engram_layer_ids entry");
  if (t.engram_pad_token_id >= t.vocab_size) err("engram_pad_token_id: not below vocab_size");
  if (t.engram_compressed_vocab_size > t.vocab_size)
    err("engram_compressed_vocab_size: exceeds vocab_size");
  if (t.dspark_noise_token_id >= t.vocab_size) err("dspark_noise_token_id: not below vocab_size");
  if (t.tie_word_embeddings)
    err("tie_word_embeddings: true is not supported (V4.1 has a separate head)");
  if (int64_t(t.compress_ratios.size()) != t.total_layers())
    err("compress_ratios: has " + std::to_string(t.compress_ratios.size()) +
        " entries, expected num_hidden_layers + num_nextn_predict_layers = " +
        std::to_string(t.total_layers()));
  for (int64_t id : {c.bos_token_id, c.eos_token_id, c.pad_token_id, c.image_token_id})
    if (id >= t.vocab_size)
      errors->push_back("token id " + std::to_string(id) +
                        " (bos/eos/pad/image_token_id) is not below text_config.vocab_size");
  if (c.quantization.weight_block_size.size() != 2)
    errors->push_back("quantization_config.weight_block_size: expected two entries");
  bool arch = false;
  for (const auto& a : c.architectures) arch |= a == "DeepseekV41ForCausalLM";
  if (!arch) errors->push_back("architectures: does not contain \"DeepseekV41ForCausalLM\"");
}

}  // namespace

Result<ModelConfig> parse_config(const json& root, const std::string& file) {
  if (!root.is_object()) return Status::error(file + ": not a JSON object");
  ModelConfig c;
  std::vector<std::string> errors;
  Reader r(root, "", &errors);
  visit_root(r, c);
  if (const json* q = r.object("quantization_config", kRequired)) {
    Reader qr(*q, "quantization_config.", &errors);
    visit_quant(qr, c.quantization);
  }
  if (const json* t = r.object("text_config", kRequired)) {
    Reader tr(*t, "text_config.", &errors);
    visit_text(tr, c.text);
    if (t->contains("rope_scaling") && !(*t)["rope_scaling"].is_null()) {
      if (const json* rs = tr.object("rope_scaling", kRequired)) {
        Reader rr(*rs, "text_config.rope_scaling.", &errors);
        c.text.rope_scaling.emplace();
        visit_rope_scaling(rr, *c.text.rope_scaling);
      }
    }
  }
  if (root.contains("vision_config") && !root["vision_config"].is_null()) {
    if (const json* v = r.object("vision_config", kRequired)) {
      Reader vr(*v, "vision_config.", &errors);
      c.vision.emplace();
      visit_vision(vr, *c.vision);
    }
  }
  if (errors.empty()) check_text_relations(c, &errors);
  if (!errors.empty()) {
    std::string msg = file + ": invalid config:";
    for (const auto& e : errors) msg += "\n  " + e;
    return Status::error(msg);
  }
  return c;
}

Result<ModelConfig> load_config(const std::string& path) {
  auto text = read_text_file(path, 16u << 20);
  if (!text) return text.status();
  json j = json::parse(text.value(), nullptr, false);
  if (j.is_discarded()) return Status::error(path + ": not valid JSON");
  return parse_config(j, path);
}

json config_to_json(const ModelConfig& cfg) {
  ModelConfig c = cfg;  // visitors take non-const references
  json root = json::object();
  Writer w(&root);
  visit_root(w, c);
  json q = json::object();
  Writer qw(&q);
  visit_quant(qw, c.quantization);
  root["quantization_config"] = q;
  json t = json::object();
  t["model_type"] = "deepseek_v41_text";
  Writer tw(&t);
  visit_text(tw, c.text);
  if (c.text.rope_scaling) {
    json rs = json::object();
    Writer rw(&rs);
    visit_rope_scaling(rw, *c.text.rope_scaling);
    t["rope_scaling"] = rs;
  } else {
    t["rope_scaling"] = nullptr;
  }
  root["text_config"] = t;
  if (c.vision) {
    json v = json::object();
    v["model_type"] = "deepseek_v41_vision";
    Writer vw(&v);
    visit_vision(vw, *c.vision);
    root["vision_config"] = v;
  }
  return root;
}

}  // namespace dsv41
