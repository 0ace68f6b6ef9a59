// Internals of the fast forward shared by its translation units (fast_model.cpp: loading,
// sequences, the step; fast_attention.cpp: attention, compressor, indexer; fast_moe.cpp: MoE and
// Engram): weight bindings, per-sequence cache state and the step's scratch.
//
// Scratch memory policy: every buffer a step needs lives in Impl and only grows (to the largest
// step seen), so a decode step of a warmed-up engine allocates nothing.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/engram_hash.h"
#include "model/fast/converted_weights.h"
#include "model/fast/fast_model.h"
#include "model/fast/kv_pool.h"
#include "model/layer_plan.h"
#include "model/reference/ref_ops.h"
#include "ops/kernels.h"

namespace dsv41::fast {

// A linear layer's weight as stored in the converted layout: FP8 E4M3 with 32x32 E8M0 scales or
// BF16 (plain or dequantized FP8), [out, in] row-major.
struct Linear {
  DType dtype = DType::kU8;
  const uint8_t* w = nullptr;
  const uint8_t* scale = nullptr;
  int64_t out = 0, in = 0;
  // An FP8 linear of the checkpoint whose input DeepSeek's code rounds (act_quant mode); wo_a is
  // not one (DeepSeek's converter dequantizes it to BF16 for a grouped einsum).
  bool act = false;
  // FP8 scales that the act-quant GEMM can fold into bf16 weights (ops::fp8_aq_scales_ok).
  bool aq_ok = false;
  // The step that last counted this weight's bytes (FastStats::weight_bytes counts each weight
  // once per step, whatever number of tokens read it).
  mutable int64_t stamp = -1;
  bool quantized() const { return dtype == DType::kF8_E4M3; }
};

struct ExpertW {
  const uint8_t *w13 = nullptr, *s13 = nullptr, *w2 = nullptr, *s2 = nullptr;
  // Whether its scales suit the act-quant kernels (ops::mxfp4_aq_scales_ok): -1 not yet checked
  // (checked on first use, so loading does not read every expert's scales), 0 no, 1 yes.
  mutable int8_t aq = -1;
};

struct LayerW {
  std::vector<float> attn_norm, ffn_norm, q_norm, kv_norm, c_norm, i_k_norm;
  const float *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
  const float *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  const float* attn_sink = nullptr;
  Linear wq_a, wq_b, wkv, wo_a, wo_b;
  // Split attention (FastOptions::tp_parts): rows of wq_b for this process's heads and of wo_a for
  // its groups (out 0 when it has none); equal to wq_b / wo_a in one process.
  Linear wq_b_own, wo_a_own;
  std::vector<uint16_t> owned_wo_a;  // wo_a in BF16 when its groups straddle FP8 scale blocks
  Linear c_wkv, c_wgate, i_wk, i_wq_b, i_wproj;
  Linear gate;
  const float* gate_bias = nullptr;
  const float* gate_bias_vl = nullptr;  // the selection bias of image positions (spec §9.1)
  std::vector<ExpertW> experts;
  Linear sh_w1, sh_w2, sh_w3;
  Linear e_wkv;
  std::vector<float> e_qk;                        // q_weight * k_weight [hc, hidden]
  std::vector<const uint8_t*> e_codes, e_scales;  // per hash column: that bucket's rows
};

// The DSpark drafter's own tensors (spec §8) beside its stage blocks (LayerW, bound like backbone
// layers): stage 0's main_proj / main_norm, the last stage's norm, Markov and confidence heads.
struct DsparkW {
  std::vector<LayerW> stages;
  Linear main_proj, markov_head;                   // markov_head: BF16 [vocab, rank]
  std::vector<float> main_norm, norm, confidence;  // confidence: [hidden + rank]
  const uint16_t* markov_embed = nullptr;          // BF16 [vocab, rank]
  std::vector<int64_t> target_slot;  // backbone layer -> slot of main_hidden (-1: not a target)
};

// Binds converted-layout tensors by name (fast_model.cpp: the backbone; fast_dspark.cpp: the
// drafter's own tensors).
struct Binder {
  const ConvertedWeights& w;
  Linear lin(const std::string& name) const {
    const WeightSpan& s = w.get(name + ".weight");
    Linear l;
    l.dtype = s.dtype;
    l.w = s.data;
    l.out = s.rows();
    l.in = s.cols();
    if (s.dtype == DType::kF8_E4M3) {
      const WeightSpan& sc = w.get(name + ".scale");
      l.scale = sc.data;
      l.aq_ok = ops::fp8_aq_scales_ok(sc.data, int64_t(sc.bytes));
    }
    l.act = s.dtype == DType::kF8_E4M3 || s.from_fp8;
    DSV41_CHECK_MSG(s.dtype == DType::kF8_E4M3 || s.dtype == DType::kBF16, name.c_str());
    return l;
  }
  std::vector<float> vec(const std::string& name) const {
    const WeightSpan& s = w.get(name);
    const int64_t n = int64_t(s.bytes / dtype_size(s.dtype));
    std::vector<float> v(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      if (s.dtype == DType::kBF16) {
        uint16_t b;
        std::memcpy(&b, s.data + 2 * i, 2);
        v[std::size_t(i)] = bf16_to_float(b);
      } else {
        DSV41_CHECK_MSG(s.dtype == DType::kF32, name.c_str());
        std::memcpy(&v[std::size_t(i)], s.data + 4 * i, 4);
      }
    }
    return v;
  }
  const float* f32(const std::string& name) const {
    const WeightSpan& s = w.get(name);
    DSV41_CHECK_MSG(s.dtype == DType::kF32, name.c_str());
    return reinterpret_cast<const float*>(s.data);  // tensors start 64-byte aligned
  }
};

// Rows [r0, r1) of a linear as a linear of its own (r0 on a 32-row scale block for FP8; r1 too
// unless it is the end).
inline Linear linear_rows(const Linear& l, int64_t r0, int64_t r1) {
  Linear p = l;
  p.out = r1 - r0;
  p.stamp = -1;
  if (l.quantized()) {
    DSV41_CHECK(r0 % 32 == 0 && (r1 % 32 == 0 || r1 == l.out));
    p.w += r0 * l.in;
    p.scale += (r0 / 32) * ((l.in + 31) / 32);
  } else {
    p.w += r0 * l.in * 2;
  }
  return p;
}

// The mean over the hc copies of a residual stream h [hc * d] (copy-major), in copy order: a tap
// of the seam and DSpark's main_hidden.
inline void mean_copies(const float* h, int64_t hc, int64_t d, float* out) {
  for (int64_t i = 0; i < d; ++i) {
    float s = 0;
    for (int64_t j = 0; j < hc; ++j) s += h[j * d + i];
    out[i] = s / float(hc);
  }
}

// Per KV source of a sequence: the open group of a ratio > 1 compressor, and the projections of
// the last max_rollback positions so truncate() can reopen a group exactly.
struct SourceSeq {
  int part_n = 0;
  std::vector<float> part_kv, part_g;  // [ratio - 1][head_dim]
  std::vector<float> roll_kv, roll_g;  // ring [max_rollback][head_dim], slot = pos % max_rollback
  std::vector<int64_t> roll_pos;       // the position each slot holds (-1: none)
};

struct SeqState {
  SeqId id = 0;
  uint64_t tag = 0;  // the pool's view of this sequence (unique per open)
  int64_t len = 0;
  std::vector<int32_t> history;  // Engram compressed ids per position
  std::vector<BlockRef> win, glob;
  std::vector<SourceSeq> src;  // per KvLayout source
  int vendor_slot = -1;        // vendor index keys: the source that published last
  // Decoder replay: the first position whose window rows of the decoder layers (the split layer
  // on) and DSpark stages were computed; their window reads start here (0: all of them were).
  int64_t dec_floor = 0;
  // Prefix cache (model/fast/prefix_cache.cpp): the token ids, the positions attached from the
  // cache (read-only, never truncated into), and the hash chain of the global blocks registered.
  std::vector<int32_t> tokens;
  int64_t shared_len = 0;
  std::vector<std::string> chain;  // per global block in the cache (or attached): its chain hash
  std::string salt;
  bool cacheable = true;  // false for caches not computed from its tokens (the bench's random fill)
};

// A cached prefix block: global block k of some sequence (positions [k G, (k + 1) G)) with the
// hash of its chain (parent hash, salt, its tokens), the tokens themselves (checked on a hit), and
// the window blocks that hold the window rows before its end, so a sequence attached there has
// everything a sequence that computed the prefix would have.
struct PrefixEntry {
  std::string parent;
  std::vector<int32_t> tokens;
  BlockRef glob;
  int64_t first_win = 0;      // index of win[0] in a window block table
  std::vector<BlockRef> win;  // window blocks covering [end - window, end)
  uint64_t last_use = 0;
  int children = 0;       // cached entries whose parent this is
  int64_t dec_floor = 0;  // the registering sequence's SeqState::dec_floor then
};

// One token row of a step.
struct TokenRow {
  SeqState* seq = nullptr;
  int64_t pos = 0;
  int32_t token = 0;
  int slice = 0;
  int row_in_slice = 0;
  SpanKind kind = SpanKind::kText;  // an image span's position: bias_vl routing, no Engram
};

}  // namespace dsv41::fast

namespace dsv41 {

struct FastModel::Impl {
  using Linear = fast::Linear;
  // Tokens per batch-kernel call: the act-quant GEMMs reuse each decoded weight across all of
  // them (a chunk's activations stay in L2); every token's bits are the same at any size.
  static constexpr int64_t kChunk = 64;
  // Tokens per call in the MoE (router, routed and shared experts), where no attention buffer
  // bounds them: a prefill step's expert sees ~64 tokens at 512 and several hundred at 4,096, and
  // each call decodes the expert's weights once per token block of the kernel (ops
  // aq_token_block), so calls of kChunk left ragged tails (70 tokens: 64 + 6) that paid a whole
  // decode for a few tokens. Chunks are split evenly (ceil(n / kMoeChunk) of one size).
  static constexpr int64_t kMoeChunk = 256;
  static int64_t even_chunk(int64_t n, int64_t most) {
    const int64_t parts = (n + most - 1) / most;
    return parts == 0 ? most : (n + parts - 1) / parts;
  }
  FastOptions opt;
  std::unique_ptr<ConvertedWeights> wts;
  ModelConfig cfg;
  ModelPlan plan;
  const ops::Kernels* kern = nullptr;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<KvPool> kv;
  std::vector<int> source_of_layer;  // backbone layer -> KvLayout source index (-1)
  std::vector<int32_t> cmap;         // token -> Engram compressed id
  std::unique_ptr<EngramHasher> hasher;
  std::vector<fast::LayerW> layers;
  fast::DsparkW dspark;  // loaded when opt.dspark; its stages' window rows are pool layers
                         // num_backbone .. num_backbone + stages - 1
  const uint16_t* embed = nullptr;
  Linear head;
  std::vector<float> norm;
  std::vector<float> image_start, image_newline, image_end;  // the span's delimiter vectors
  ref::Rope<float> rope_swa, rope_comp;
  std::unordered_map<SeqId, std::unique_ptr<fast::SeqState>> seqs;
  std::unordered_map<std::string, fast::PrefixEntry> prefix;  // by chain hash
  uint64_t prefix_clock = 0;
  uint64_t next_tag = 1;
  FastStats stats;
  // linear_count's stamp: one value per step and per draft call, so a matrix both use (the head,
  // a stage's wkv) counts once in each (stats.steps, the stamp before, counted it once for both).
  int64_t count_epoch = 0;
  // This process's share of a split forward (all of it in one process): heads [h0, h1) = groups
  // [g0, g1) of attention; routed experts [expert_lo(E), expert_hi(E)) of a layer with E experts.
  int64_t h0 = 0, h1 = 0, g0 = 0, g1 = 0;
  int64_t expert_lo(int64_t E) const {
    return opt.ep_part < 0 ? 0 : E * opt.ep_part / std::max(1, opt.ep_parts);
  }
  int64_t expert_hi(int64_t E) const {
    return opt.ep_part < 0 ? 0 : E * (opt.ep_part + 1) / std::max(1, opt.ep_parts);
  }
  // Decoder replay (FastOptions::decoder_replay): the split layer (-1: none in this config), and
  // whether the next steps replay.
  int replay_split = -1;
  bool replay_on = false;
  bool prefill_attention_on = true;   // FastOptions::prefill_attention, switchable (bench A/B)
  std::vector<int64_t> replay_index;  // per row of the step: its row after compaction (-1: gone)
  std::vector<uint8_t> replay_keep;   // per row of the step: whether the decoder runs on it
  // The first position a window read of pool layer `layer` may use for sequence s.
  int64_t window_floor(const fast::SeqState& s, int layer) const {
    return replay_split >= 0 && layer >= replay_split ? s.dec_floor : 0;
  }
  // Keeps rows [i] with keep[i] (in order) in every per-token array a layer reads: rows, hs, pre,
  // pre_a, mix_post, mix_comb, xs, main_hidden. Returns the rows kept.
  int64_t compact_rows(const std::vector<uint8_t>& keep);
  // Element-wise sum over the processes (no-op in one): timed and counted in stats.
  void reduce(float* data, int64_t n);
  Status set_share(const std::string& dir);  // h0..g1 from the options, checked against the config
  std::vector<ConvertedWeights::Range> share_ranges() const;  // the weights this process reads

  // ---- step scratch (grows only) ----
  std::vector<fast::TokenRow> rows;
  std::vector<float> hs, h1s, pre, mix_post, mix_comb, pre_a, xs, ys;  // per token
  std::vector<float> main_hidden, main_x, draft_x;                     // DSpark: per token
  std::vector<uint8_t> block_rows;         // DSpark: a block's packed window rows
  std::vector<std::vector<int64_t>> sel;   // per token: the current index source's selection
  std::vector<std::vector<uint8_t>> cand;  // per token: the candidate pool mask
  // per-call scratch of one token (the step runs tokens one after another)
  std::vector<uint16_t> xpk;  // act-quant activations packed for ops aq_* kernels (xpk_words)
  // xpk holding `words` from a 64-byte line on (the kernels' vector loads then never split a line)
  uint16_t* xpk_words(int64_t words) {
    if (int64_t(xpk.size()) < words + 32) xpk.resize(std::size_t(words + 32));
    return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(xpk.data()) + 63) &
                                       ~uintptr_t(63));
  }
  // fp32 activations packed for ops f32_* GEMMs: xpk's memory, as floats (one packed input per
  // call, like xpk_words)
  float* xpk_floats(int64_t floats) { return reinterpret_cast<float*>(xpk_words(2 * floats)); }
  std::vector<float> qr, iq, kvrow, att_o, ubuf, tmp, tmp2, xq, scores, cosb, sinb, emb, ekv, lat,
      gbuf;
  std::vector<uint8_t> qpack, run_qpack;
  std::vector<float> run_scores;
  std::vector<int64_t> run_nvis;
  // prefill attention (prefill_run): the band's window rows contiguous, the queries' compressed
  // rows and their offsets, the outputs; which chunk tokens it attended
  std::vector<uint8_t> pre_win, prefill_done;
  std::vector<const uint8_t*> pre_comp;
  std::vector<int64_t> pre_cofs;
  std::vector<float> pre_out;
  std::vector<const uint8_t*> att_rows;
  std::vector<uint8_t> att_kinds;
  std::vector<int64_t> topk_out;
  // MoE scratch
  std::vector<float> route_w, ybuf, hbuf, logits_e, bscore, gx, gr, gy;
  std::vector<std::vector<int32_t>> by_expert;  // expert -> token*topk+slot

  // ---- helpers (fast_model.cpp) ----
  // Y[t] = W X[t] for n tokens (x [n, in], y [n, out]), rows split over the thread pool at
  // fixed, shape-only boundaries; token t's bits are those of a one-token call on X[t] alone (the
  // batch kernels read the weights once for the n tokens).
  void linear_batch(const Linear& l, const float* x, int64_t n, float* y);
  void linear(const Linear& l, const float* x, float* y) { linear_batch(l, x, 1, y); }
  // Rows of n values each, act_quant-rounded per row (the input itself when the mode is off).
  const float* maybe_act_quant_rows(const float* x, int64_t rows, int64_t n);
  void linear_count(const Linear& l);  // adds l's bytes to the step's count, once per step
  // Runs fn(r0, r1) over [0, n) in chunks aligned to `align`, a split that depends only on n.
  void par_rows(int64_t n, int64_t align, const std::function<void(int64_t, int64_t)>& fn);
  void rope_table(const ref::Rope<float>& r, int64_t pos);  // fills cosb/sinb
  BlockRef window_block(fast::SeqState& s, int64_t pos);    // allocates when missing
  BlockRef global_block(fast::SeqState& s, int64_t pos);
  // Blocks the sequence lacks to hold new_len positions, and their allocation (the caller has
  // checked they are free: a step gets all its blocks or changes nothing).
  int64_t blocks_needed(const fast::SeqState& s, int64_t new_len) const;
  void reserve_blocks(fast::SeqState& s, int64_t new_len);
  void release_old_window(fast::SeqState& s);
  // A block for `owner`; when the pool is empty, least recently used cached prefixes are evicted
  // until one is free (invalid only when nothing is left to evict).
  BlockRef alloc_block(uint64_t owner);
  // Copy-on-write: a private copy of shared block b (a window block or a global block).
  BlockRef private_copy(BlockRef b, bool window);

  // ---- prefix cache (prefix_cache.cpp) ----
  bool prefix_enabled() const;
  // Registers the global blocks sequence s completed (every full one not yet in the cache).
  void register_prefix(fast::SeqState& s);
  // Blocks only the cache holds (evictable, so free for a scheduler).
  int64_t prefix_evictable() const;
  bool evict_one_prefix();

  // ---- a block's per-token pieces (fast_model.cpp), shared by the step and the drafter ----
  void embed_rows();  // scratch for rows, their embeddings in every copy, one-hot pre
  // The batch's image spans written over their rows' embeddings (before the copies are made).
  void merge_images(const StepBatch& batch);
  // Token t: the attention mix (pre_a, mix_post, mix_comb) and attn_norm(collapse(h, pre)) -> xs.
  void mhc_attention_input(const fast::LayerW& w, int64_t t);
  // Token t: h1 = expand(ys, h); the ffn mix (pre, mix_post, mix_comb); ffn_norm(collapse(h1,
  // pre_a)) -> xs.
  void mhc_ffn_input(const fast::LayerW& w, int64_t t);
  void mhc_ffn_output(int64_t t);  // h = expand(ys, h1) with the ffn mix

  // ---- DSpark (fast_dspark.cpp) ----
  void bind_dspark();
  // After a step's layers: each token's main_x (from main_hidden) made into every stage's window
  // row at its position.
  void dspark_rows(int64_t n);
  // A stage's attention for one block (tokens [t0, t0 + n) of one sequence): the stage's window
  // rows of the last `window` consumed positions plus the whole block (not causal); xs -> ys.
  void dspark_attention(const LayerPlan& p, const fast::LayerW& w, int64_t t0, int64_t n);

  // ---- layers ----
  // Attention of tokens [t0, t0 + n) (n <= kChunk): xs rows in, ys rows out. part: all of it, only
  // a KV source's compressor and index keys (decoder replay's pass over every token), or all but
  // those (the replayed tokens of the split layer).
  enum class AttnPart { kAll, kCompressorOnly, kNoCompressor };
  void attention_chunk(const LayerPlan& p, const fast::LayerW& w, int64_t t0, int64_t n,
                       AttnPart part = AttnPart::kAll);
  // Pieces of it shared with the DSpark stages: the chunk's queries (RoPE'd at each row's
  // position) into tmp [n, heads * head_dim], qr kept; and the grouped low-rank output of the
  // heads' outputs in tmp (inverse RoPE already applied) into ys.
  void attention_queries(const fast::LayerW& w, const ref::Rope<float>& rope, int64_t t0,
                         int64_t n);
  void attention_output(const fast::LayerW& w, int64_t t0, int64_t n);
  // A window row's values from its projection kvt, in place: kv_norm, then RoPE at pos.
  void window_row_values(const fast::LayerW& w, const ref::Rope<float>& rope, int64_t pos,
                         float* kvt);
  // Packs kvt as sequence s's window row of pool layer `layer` at pos, with its tag.
  void store_window_row(fast::SeqState& s, int layer, int64_t pos, const float* kvt);
  // One query [heads, head_dim] (in place) over att_rows / att_kinds with the sink, the heads
  // split over the pool, then the inverse RoPE at pos.
  void attend_query(const fast::LayerW& w, const ref::Rope<float>& rope, int64_t pos, float* q);
  // One token's compressor step from its projections kvp (and gate g for ratio > 1).
  void compressor_step(const LayerPlan& p, const fast::LayerW& w, fast::SeqState& s, int64_t pos,
                       const float* kvp, const float* g);
  // Prefill attention of chunk tokens [t0 + a, t0 + b) (one sequence, consecutive positions)
  // through ops::prefill_attention; false: not possible here (the caller attends them one by one).
  bool prefill_run(const LayerPlan& p, const fast::LayerW& w, const ref::Rope<float>& rope,
                   int64_t t0, int64_t a, int64_t b);
  // Token t's indexer from its queries qi [heads, dim] (rotated in place) and weights wts [heads].
  void indexer(const LayerPlan& p, int64_t t, float* qi, float* wts);
  // The KV source whose index keys the layer's indexer scores for sequence s.
  int index_source(const LayerPlan& p, const fast::SeqState& s) const;
  // Its three parts. Query side (RoPE at the token's position, each head packed as an index-key
  // row into qp [heads rows], the weights scaled in place); returns the visible keys' count.
  int64_t indexer_prep(const LayerPlan& p, int64_t t, float* qi, float* wts, uint8_t* qp);
  // Scores of visible keys [j0, j1) into sc[j0 .. j1) (masked keys score -inf); const and
  // thread-safe: the kernel per contiguous span of one global block, whatever the split.
  void indexer_span_scores(const LayerPlan& p, int64_t t, const uint8_t* qp, const float* wts,
                           int64_t j0, int64_t j1, float* sc) const;
  // The candidate pool and the top-k selection from token t's nvis scores (sc, overwritten).
  void indexer_select(const LayerPlan& p, int64_t t, int64_t nvis, float* sc);
  // The indexer of a run of one sequence's consecutive tokens [t0 + a, t0 + b): the queries
  // prepared one by one, then the scores as a GEMM over the run's queries (each key span read once
  // for a group of queries, the group's queries split over the pool), then each selection. The
  // same kernel calls per (query, key) as `indexer`, so the same bits.
  void indexer_run(const LayerPlan& p, int64_t t0, int64_t a, int64_t b);
  void moe(const LayerPlan& p, const fast::LayerW& w, int64_t n);  // xs -> ys for tokens [0, n)
  void engram_chunk(const LayerPlan& p, const fast::LayerW& w, int64_t t0, int64_t n);
  // Routed expert e on m gathered tokens (x [m, hidden], route [m]) -> out [m, hidden].
  void expert_batch(const fast::ExpertW& e, const float* x, const float* route, int64_t m,
                    float* out);
  // ... through one GEMM family (aq: the act-quant GEMMs, else the FMA GEMMs for fp32 inputs).
  void expert_gemm(const fast::ExpertW& e, const float* x, const float* route, int64_t m,
                   float* out, bool aq);

  // ---- pool row access with tag checks ----
  uint8_t* window_row(fast::SeqState& s, int layer, int64_t pos, RowTag** tag);
  const uint8_t* read_window_row(const fast::SeqState& s, int layer, int64_t pos) const;
  uint8_t* comp_row(fast::SeqState& s, int src, int64_t entry, bool key, RowTag** tag);
  const uint8_t* read_comp_row(const fast::SeqState& s, int src, int64_t entry, bool key) const;
};

}  // namespace dsv41
