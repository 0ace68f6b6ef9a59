// The reference forward ("oracle", spec §4-§7): the complete V4.1 text model for one sequence, read
// from the official layout with weights dequantized exactly to T, every step computed in T (float
// or double), the three trained KV fake-quantizations applied (spec §3.5 mode 1: no activation
// quantization, no bf16 roundings).
//
// Positions are processed one at a time inside each layer, so the result of a position never
// depends on how the sequence was split into calls: full prefill, token-by-token decode and chunked
// prefill give identical logits (except under the `vendor` index-key switch, which reproduces
// DeepSeek's decode quirk of spec §5.6.7 on purpose).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/layer_plan.h"
#include "model/seam.h"

namespace dsv41 {

enum class IndexKeySemantics { kOwner, kVendor };

struct ReferenceOptions {
  IndexKeySemantics index_keys = IndexKeySemantics::kOwner;
  // Weights are always read through the mmap and dequantized row by row, never copied; with
  // streaming, each layer's pages are also dropped once the layer is done, so at most one layer's
  // weights (plus the rows of embedding/head in use) stay resident.
  bool streaming = false;
  // DeepSeek's inference numerics: every FP8/FP4 linear's input rounded to E4M3 with a power-of-two
  // scale per 32 first (spec §3.3). Off (default): model-faithful.
  bool act_quant = false;
  // Load the DSpark drafter (the mtp.* stages) and keep its context as the target runs, so that
  // draft() can be called after any forward(); costs every stage's window row per position.
  bool dspark = false;
};

// One DSpark drafting step (design.md §9, spec §8), in T.
template <typename T>
struct DraftStep {
  std::vector<T> logits;      // [B, vocab], after the Markov bias; row j predicts pos + 1 + j
  std::vector<int32_t> ids;   // B + 1: ids[0] = the given next token, ids[j+1] = argmax row j
  std::vector<T> confidence;  // [B]: the confidence head's raw scalar per row (no sigmoid)
};

// Counters over the life of a model object, so tests can show which paths a sequence exercised.
struct ReferenceStats {
  int64_t indexer_queries = 0;      // (layer, position) pairs scored by an indexer
  int64_t topk_strict_subsets = 0;  // ... whose top-k kept fewer entries than were visible
  int64_t candidate_filtered = 0;   // ... whose candidate pool excluded at least one visible entry
};

// One decision of a run, recorded when tracing (flip reports, reference/flip_report.h).
enum class TraceSite {
  kWindowKv,
  kCompressedKv,
  kIndexKey,
  kIndexQuery,
  kTopk,
  kCandidates,
  kExperts,
  kActQuant  // act_quant mode: an FP8/FP4 linear's input rounded to E4M3 (sub: the call's index
             // within its layer and position; `tensor` names the weight)
};
std::string_view trace_site_name(TraceSite s);

struct TraceEvent {
  int layer = 0;
  int64_t pos = 0;  // the query's (or producing token's) absolute position
  TraceSite site = TraceSite::kWindowKv;
  int64_t sub = -1;  // head for index queries, entry for compressed rows / index keys, else -1
  std::vector<int64_t> decision;  // element codes (fake-quants) or chosen indices (selections)
  std::vector<double> detail;     // x / s before rounding, or the scores selection chose from
  std::vector<double> scales;     // per-block scales (fake-quants)
  std::string tensor;             // kActQuant: the weight whose input was rounded
};

// An image of the prompt (spec §9, §9.1), already through the vision tower: its span starts at
// the call's token `start` (the IMAGE_START delimiter) and covers llm_h * (llm_w + 1) + 2
// positions, each carrying the config's image_token_id in the token list; `rows` are the
// aligner's rows that fill its IMAGE positions ([llm_h * llm_w, hidden], reading order).
template <typename T>
struct PromptImage {
  int64_t start = 0;
  int64_t llm_w = 0, llm_h = 0;
  std::vector<T> rows;
  int64_t span() const { return image_span(llm_w, llm_h); }
};

// The kind of each of n positions starting at the call's token `first`, for the given spans.
template <typename T>
std::vector<SpanKind> span_kinds(const std::vector<PromptImage<T>>& images, int64_t first,
                                 int64_t n);

template <typename T>
class ReferenceModel {
 public:
  // Loads config, plan, tokenizer-derived Engram map and all text-model weights from DIR.
  static Result<std::unique_ptr<ReferenceModel>> load(const std::string& dir,
                                                      const ReferenceOptions& opt);
  ~ReferenceModel();

  const ModelConfig& config() const;
  const ModelPlan& plan() const;
  int64_t position() const;  // number of tokens consumed so far
  void reset();              // start a new sequence
  const ReferenceStats& stats() const;
  // Records every fake-quant rounding, top-k set, candidate pool and expert choice (nullptr: off).
  void set_trace(std::vector<TraceEvent>* trace);

  // One call of the model on tokens at absolute positions [position(), position() + n): appends n
  // rows of vocab_size logits (row t = next-token logits after token t). `dump`, when given,
  // receives each backbone layer's output residual stream: dump[l] gets n * hc * hidden values
  // appended.
  Status forward(const std::vector<int32_t>& tokens, std::vector<T>* logits,
                 std::vector<std::vector<T>>* dump = nullptr);
  // The same with images merged into the prompt (spec §9.1): every span wholly inside the call,
  // in order, not overlapping, its positions all image_token_id. DeepSeek's code merges images in
  // its first forward (position 0) only; here a call may start anywhere, with the same result
  // (each position depends on the positions before it only, whatever the calls). Span positions
  // embed the delimiter vectors and the aligner rows, route with `gate.bias_vl` (selection only;
  // the weights still come from the unbiased scores), are dead in the Engram history and pass
  // Engram unchanged.
  Status forward(const std::vector<int32_t>& tokens, const std::vector<PromptImage<T>>& images,
                 std::vector<T>* logits, std::vector<std::vector<T>>* dump = nullptr);

  // The DSpark drafter after the target has consumed positions [0, position()): `next` is the
  // token for position() (sampled from the target's last logits row); the block [next, noise, ...]
  // at positions position() .. position()+B-1 runs through every stage, attending each stage's
  // window rows of the last sliding_window consumed positions. Changes no target state, and no
  // drafter state either (block rows are never kept). Needs ReferenceOptions::dspark.
  Status draft(int32_t next, DraftStep<T>* out);

 private:
  ReferenceModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

extern template class ReferenceModel<float>;
extern template std::vector<SpanKind> span_kinds(const std::vector<PromptImage<float>>&, int64_t,
                                                 int64_t);
extern template std::vector<SpanKind> span_kinds(const std::vector<PromptImage<double>>&, int64_t,
                                                 int64_t);
extern template class ReferenceModel<double>;

}  // namespace dsv41
