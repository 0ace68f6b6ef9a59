// The fast engine's KV pool ("one KV group", design.md §6): one arena of fixed-size blocks from a
// byte budget, holding the packed cache rows each layer actually owns (spec §3.4, §7):
//   window blocks   window_tokens positions x every backbone layer's FP8 window row (528 B at the
//                   released shapes); a sequence keeps only the blocks its window (plus the
//                   rollback margin) still needs;
//   global blocks   global_tokens positions x every KV source's compressed rows (288 B per entry,
//                   one entry per `ratio` positions) and index keys (68 B per entry); kept for the
//                   whole context. Reuse layers own nothing.
// Every row carries a tag (sequence, the block's allocation epoch, position), written with the row
// and checked on every read against what the reader expects: `count` counts foreign reads,
// `mask` also refuses them (the reader gets no row), `off` skips the check. The counter is what
// the isolation gate reads (it must stay 0).
//
// Blocks are plain memory owned by the pool, reference-counted; sequences hold (block, epoch,
// owner) references in block tables sized by their real context (model/fast/fast_model.cpp), the
// prefix cache holds references to the blocks of cached prefixes. Not thread-safe for allocation;
// row reads and writes from worker threads are (distinct rows, atomic counter).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsv41 {

enum class IsolationMode { kOff, kCount, kMask };
const char* isolation_mode_name(IsolationMode m);

struct RowTag {
  uint64_t seq = 0;  // 0: never written (sequence ids start at 1 in the pool's view)
  uint32_t epoch = 0;
  int32_t pos = -1;
};

// Geometry of the blocks, from the config and the layer plan.
struct KvLayout {
  struct Source {
    int layer = 0;  // the KV source layer
    int ratio = 1;
    int64_t comp_bytes = 0, key_bytes = 0;
    // Offsets inside a global block: compressed rows, index keys (contiguous, for the indexer),
    // then their tags.
    int64_t comp_off = 0, key_off = 0, comp_tag_off = 0, key_tag_off = 0;
    int64_t entries = 0;  // per global block = global_tokens / ratio
  };
  int64_t window = 0;         // sliding window (positions attended)
  int64_t window_tokens = 0;  // positions per window block
  int64_t global_tokens = 0;  // positions per global block
  int num_layers = 0;         // layers with window rows
  int64_t window_row_bytes = 0;
  int64_t window_tag_off = 0;  // tags after the rows in a window block: [layer][slot]
  std::vector<Source> sources;
  int64_t block_bytes = 0;  // every block, either kind

  // Bytes of packed rows (tags excluded) one position adds to the global part, and the fixed
  // window part per sequence (window positions x layers).
  double global_bytes_per_token() const;
  int64_t window_bytes_per_sequence() const;
};

// window_tokens positions per window block; global blocks are as large (in bytes) and hold as many
// positions as fit, a multiple of every ratio.
KvLayout make_kv_layout(int64_t window, int num_layers, int64_t head_dim, int64_t index_dim,
                        const std::vector<std::pair<int, int>>& sources, int64_t window_tokens);

// A reference to a block as a sequence's table (or the prefix cache) holds it: the block, its
// allocation epoch, and the tag of the sequence that writes its rows (a reader checks each row's
// tag against this owner, so a block shared through the prefix cache reads as the writer's).
struct BlockRef {
  int32_t block = -1;
  uint32_t epoch = 0;
  uint64_t owner = 0;
  bool valid() const { return block >= 0; }
};

class KvPool {
 public:
  KvPool(KvLayout layout, int64_t budget_bytes, IsolationMode mode);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  IsolationMode mode() const { return mode_; }
  int64_t blocks_total() const { return int64_t(epochs_.size()); }
  int64_t blocks_free() const { return int64_t(free_.size()); }

  // A fresh block (its epoch advanced, its tags cleared, one reference), or an invalid ref when
  // none is left. share() adds a reference (the prefix cache, a sequence attached to a cached
  // prefix); release() drops one and frees the block with the last.
  BlockRef allocate(uint64_t owner);
  void share(BlockRef b);
  void release(BlockRef b);
  // The prefix cache's own references (counted apart, so the blocks only the cache holds, the
  // evictable ones, are known in O(1)).
  void share_cached(BlockRef b);
  void release_cached(BlockRef b);
  int32_t refs(int32_t block) const { return refs_[std::size_t(block)]; }
  int32_t cache_refs(int32_t block) const { return cache_refs_[std::size_t(block)]; }
  int64_t evictable() const { return evictable_; }

  uint8_t* data(BlockRef b) { return arena_.get() + int64_t(b.block) * layout_.block_bytes; }
  const uint8_t* data(BlockRef b) const {
    return arena_.get() + int64_t(b.block) * layout_.block_bytes;
  }
  RowTag* tag_at(BlockRef b, int64_t offset) { return reinterpret_cast<RowTag*>(data(b) + offset); }

  // Checks a row's tag against what its reader expects. Returns false when the row must not be
  // used (mask mode, foreign row); counts every foreign read in count and mask modes.
  bool check(const RowTag& t, uint64_t seq, uint32_t epoch, int64_t pos) const {
    if (mode_ == IsolationMode::kOff) return true;
    if (t.seq == seq && t.epoch == epoch && t.pos == pos) return true;
    foreign_reads_.fetch_add(1, std::memory_order_relaxed);
    return mode_ != IsolationMode::kMask;
  }
  int64_t foreign_reads() const { return foreign_reads_.load(std::memory_order_relaxed); }
  uint32_t current_epoch(int32_t block) const { return epochs_[std::size_t(block)]; }

 private:
  KvLayout layout_;
  IsolationMode mode_;
  std::unique_ptr<uint8_t[]> arena_;  // not zeroed: pages are touched only when used
  std::vector<uint32_t> epochs_;
  std::vector<int32_t> refs_, cache_refs_;
  int64_t evictable_ = 0;  // blocks whose every reference is the cache's
  bool only_cached(int32_t b) const {
    return cache_refs_[std::size_t(b)] > 0 && refs_[std::size_t(b)] == cache_refs_[std::size_t(b)];
  }
  void add_refs(BlockRef b, int32_t refs, int32_t cache_refs);
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  mutable std::atomic<int64_t> foreign_reads_{0};
};

}  // namespace dsv41
