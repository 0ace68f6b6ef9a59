// The model seam (design.md §2, §6): what every forward path (the fast engine, the reference, the
// scripted test backends, later an MPI rank) is driven through, as plain data so a step can be
// logged, replayed or broadcast. A step is a batch of sequence slices; sequences are opened, freed
// and truncated explicitly, so the scheduler (continuous batching, preemption), speculative
// decoding (roll back rejected drafts) and prefix caching can rely on exact cache state.
//
// Contract of a step (every implementation):
//   - each slice appends its tokens to its sequence at positions first_pos .. first_pos + n - 1,
//     where first_pos must equal the sequence's current length (the step refuses otherwise);
//   - a sequence appears in at most one slice per step;
//   - logits_rows lists, ascending, the slice-relative rows whose next-token logits are returned
//     (row t = the logits after tokens[0..t]); several rows per slice are allowed;
//   - taps lists backbone layers whose *input* residual stream (after that layer's Engram, the
//     mean over the hc copies, hidden_size values per token) is returned for every token of the
//     slice (DSpark's main_hidden, spec §8);
//   - batch invariance: a slice's outputs are bit-identical whatever else shares the step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsv41 {

using SeqId = uint64_t;

// What a position of an image span is (spec §9.1's token types); kText outside every span. A span
// of an llm_w x llm_h image is llm_h * (llm_w + 1) + 2 positions: IMAGE_START, per row llm_w
// IMAGE positions and an IMAGE_NEWLINE, then IMAGE_END.
enum class SpanKind : uint8_t { kText, kImageStart, kImage, kImageNewline, kImageEnd };
inline int64_t image_span(int64_t llm_w, int64_t llm_h) {
  return llm_h * (llm_w + 1) + 2;
}
// The kind of position i (0-based) of such a span.
inline SpanKind span_position_kind(int64_t i, int64_t llm_w, int64_t span) {
  if (i == 0) return SpanKind::kImageStart;
  if (i == span - 1) return SpanKind::kImageEnd;
  return (i - 1) % (llm_w + 1) == llm_w ? SpanKind::kImageNewline : SpanKind::kImage;
}

// An image written into a slice (spec §9.1): slice rows start .. start + span() - 1 carry the
// model's image_token_id; `rows` are the vision aligner's rows for the IMAGE positions ([llm_h *
// llm_w, hidden], fp32, reading order). Spans in order and wholly inside the slice (a span is
// never cut between steps). `key` identifies the image's pixels (0: none): the prefix cache keys
// the span by it, so a sequence with an unkeyed image is never cached.
struct SliceImage {
  int32_t start = 0;
  int32_t llm_w = 0, llm_h = 0;
  std::shared_ptr<const std::vector<float>> rows;
  uint64_t key = 0;
  // The span's positions already in the sequence (a prefix-cache hit that ended inside the span):
  // the slice holds positions first .. span() - 1 of it, from its row `start`. 0: the whole span.
  int32_t first = 0;
  int64_t span() const { return image_span(llm_w, llm_h); }
  int64_t in_slice() const { return span() - first; }
};

// The index among the aligner's rows (reading order) of IMAGE position i of a span, -1 for a
// delimiter.
inline int64_t image_row_of(int64_t i, int64_t llm_w, int64_t span) {
  if (i <= 0 || i >= span - 1) return -1;
  const int64_t q = i - 1, row = q / (llm_w + 1), col = q % (llm_w + 1);
  return col < llm_w ? row * llm_w + col : -1;
}

// The id a span's position i stands for in prefix-cache keys (ModelRunner::attach_cached_prefix's
// tokens, the cached blocks' chains): negative, so never a real token, and a function of the
// image's key, so two images never share a cached span.
inline int32_t image_key_token(uint64_t key, int64_t i) {
  uint64_t h = key ^ (0x9E3779B97F4A7C15ull * uint64_t(i + 1));
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return -1 - int32_t(h & 0x3FFFFFFF);
}

struct SeqSlice {
  SeqId seq = 0;
  int64_t first_pos = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> logits_rows;  // ascending slice-relative rows
  std::vector<int32_t> taps;         // ascending backbone layer indices
  // Every layer on every token even when the path's decoder replay is on (a request that wants
  // the logits of every prompt token: prompt_logprobs).
  bool full_stack = false;
  std::vector<SliceImage> images = {};  // image spans of the slice (a first slice only)
};

struct StepBatch {
  std::vector<SeqSlice> slices;
  int64_t tokens() const {
    int64_t n = 0;
    for (const auto& s : slices) n += int64_t(s.tokens.size());
    return n;
  }
};

struct SliceOutput {
  std::vector<float> logits;             // logits_rows.size() * vocab_size
  std::vector<std::vector<float>> taps;  // per tap: tokens.size() * hidden_size
};

struct StepOutput {
  std::vector<SliceOutput> slices;  // one per input slice, same order
};

// DSpark drafting (spec §8, design.md §9): for each open sequence, the block [next, noise, ...] at
// positions length .. length + B - 1 through the drafter, which reads the target only through the
// rows its steps left (main_hidden of the consumed positions). Changes no sequence state.
struct DraftQuery {
  SeqId seq = 0;
  int32_t next = 0;  // the token for position length(seq) (sampled from the last logits row)
};

struct DraftResult {
  std::vector<float> logits;      // B * vocab_size: row j predicts position length + 1 + j
  std::vector<int32_t> ids;       // B + 1: ids[0] = next, ids[j + 1] = argmax of row j
  std::vector<float> confidence;  // B: the confidence head's raw value per row
};

// The interface a forward path implements. Not thread-safe: one driver thread calls it.
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int32_t vocab_size() const = 0;
  virtual int64_t hidden_size() const = 0;
  virtual int64_t max_context() const = 0;  // longest sequence (prompt + generated)

  // A new empty sequence; refuses an id that is open, or when no cache is left for another one.
  virtual Status open(SeqId seq) = 0;
  // Gives every cache row of the sequence back (unknown ids: no-op).
  virtual void free(SeqId seq) = 0;
  // Rolls the sequence back to its first `length` tokens: every cache (window rows, compressed
  // rows, compressor partial groups, index keys, Engram history) then holds exactly what it would
  // had only those tokens been consumed. Refuses (and changes nothing) when it cannot do that
  // exactly; the caller then frees and recomputes.
  virtual Status truncate(SeqId seq, int64_t length) = 0;
  virtual int64_t length(SeqId seq) const = 0;  // -1 for an unknown id

  virtual Status step(const StepBatch& batch, StepOutput* out) = 0;

  // DSpark drafting: the block size B (0: this path has no drafter, or it was not loaded), and one
  // draft per query (same order; a sequence at most once; every sequence must have length >= 1).
  // Batch-invariant like a step: a query's result does not depend on the others.
  virtual int64_t draft_block_size() const { return 0; }
  virtual Status draft(const std::vector<DraftQuery>& /*queries*/,
                       std::vector<DraftResult>* /*out*/) {
    return Status::error("this model path has no DSpark drafter");
  }

  // Cache rows read whose tag was not the reader's (the isolation gate: must stay 0); 0 for a path
  // without a tagged pool. Safe to call from any thread.
  virtual int64_t foreign_reads() const { return 0; }

  // Whether the path can still run steps: a split forward (parallel/) whose ranks stopped
  // answering reports why (ErrorKind::kUnavailable) and fails every later call. Safe from any
  // thread.
  virtual Status health() const { return Status::ok(); }

  // KV capacity, in the pool's blocks, for a scheduler that admits and preempts before a step
  // rather than after a failed one. A path without a bounded pool reports 0 blocks in all and
  // needs none. kv_blocks_to_grow: the blocks a step taking `seq` to `new_len` tokens allocates
  // (a sequence not open counts as a new, empty one). Safe to call between steps.
  virtual int64_t kv_blocks_total() const { return 0; }
  virtual int64_t kv_blocks_free() const { return 0; }
  virtual int64_t kv_blocks_to_grow(SeqId /*seq*/, int64_t /*new_len*/) const { return 0; }
  // The most blocks one sequence of `length` tokens, fed at most `step_tokens` per step, holds at
  // once (for refusing at submission what no pool state could run). Pure: safe from any thread.
  virtual int64_t kv_blocks_peak(int64_t /*length*/, int64_t /*step_tokens*/) const { return 0; }

  // Prefix caching. An open, empty sequence takes the longest cached prefix of `tokens` that it can
  // take exactly (its logits afterwards are bit for bit those of computing it), never all of them
  // (at least the last token is left to compute, so a step gives its logits); `salt` separates
  // requests that must not share (different salts never hit each other). Returns the number of
  // tokens attached: the sequence's length is then that (0: none; a path without a cache: 0).
  virtual int64_t attach_cached_prefix(SeqId /*seq*/, const std::vector<int32_t>& /*tokens*/,
                                       const std::string& /*salt*/) {
    return 0;
  }
  // Whether attach_cached_prefix can find anything at all (a cache exists and is on).
  virtual bool prefix_caching() const { return false; }
  struct PrefixCacheCounts {
    int64_t queries = 0, query_tokens = 0, hit_tokens = 0;
    int64_t evictions = 0;  // cached blocks given back to the pool to make room
  };
  virtual PrefixCacheCounts prefix_cache_counts() const { return {}; }
};

// Checks the batch against the seam's contract given the sequences' current lengths (-1: not
// open); the error names the slice and the field.
template <typename LengthOf>
Status check_step_batch(const StepBatch& b, int32_t vocab, int64_t max_context,
                        LengthOf length_of) {
  for (std::size_t i = 0; i < b.slices.size(); ++i) {
    const SeqSlice& s = b.slices[i];
    // Built only for an error: a decode step's checks must not allocate.
    auto where = [&] {
      return "slice " + std::to_string(i) + " (sequence " + std::to_string(s.seq) + "): ";
    };
    const int64_t len = length_of(s.seq);
    if (len < 0) return Status::error(where() + "sequence is not open");
    if (s.first_pos != len)
      return Status::error(where() + "first_pos " + std::to_string(s.first_pos) +
                           " is not the sequence length " + std::to_string(len));
    if (s.tokens.empty()) return Status::error(where() + "no tokens");
    if (len + int64_t(s.tokens.size()) > max_context)
      return Status::error(where() + "would exceed the context of " + std::to_string(max_context));
    for (int32_t t : s.tokens)
      if (t < 0 || t >= vocab)
        return Status::error(where() + "token " + std::to_string(t) +
                             " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    for (std::size_t r = 0; r < s.logits_rows.size(); ++r)
      if (s.logits_rows[r] < 0 || s.logits_rows[r] >= int32_t(s.tokens.size()) ||
          (r > 0 && s.logits_rows[r] <= s.logits_rows[r - 1]))
        return Status::error(where() + "logits_rows must be ascending rows of the slice");
    for (std::size_t j = 0; j < i; ++j)
      if (b.slices[j].seq == s.seq) return Status::error(where() + "sequence appears twice");
  }
  return Status::ok();
}

// A slice's images against its tokens (see SliceImage); the error names the slice and the image.
inline Status check_slice_images(const SeqSlice& s, std::size_t index, int32_t image_token_id,
                                 int64_t hidden) {
  if (s.images.empty()) return Status::ok();
  auto where = [&](std::size_t k) {
    return "slice " + std::to_string(index) + " image " + std::to_string(k) + ": ";
  };
  int64_t end_prev = 0;
  for (std::size_t k = 0; k < s.images.size(); ++k) {
    const SliceImage& im = s.images[k];
    if (im.llm_w < 1 || im.llm_h < 1 || !im.rows ||
        int64_t(im.rows->size()) != int64_t(im.llm_w) * im.llm_h * hidden)
      return Status::error(where(k) + "rows must be llm_h x llm_w x " + std::to_string(hidden) +
                           " values");
    if (im.first < 0 || im.first >= im.span() || (im.first > 0 && (k > 0 || im.start != 0)))
      return Status::error(where(k) +
                           "first must be 0, or the first image's skipped positions "
                           "when the slice begins inside its span");
    if (im.start < end_prev || im.start + im.in_slice() > int64_t(s.tokens.size()))
      return Status::error(where(k) + "its span overlaps the previous one or leaves the slice");
    for (int64_t p = im.start; p < im.start + im.in_slice(); ++p)
      if (s.tokens[std::size_t(p)] != image_token_id)
        return Status::error(where(k) + "row " + std::to_string(p) +
                             " of its span is not image_token_id");
    end_prev = im.start + im.in_slice();
  }
  return Status::ok();
}

}  // namespace dsv41
