// KV pool blocks, their geometry and their tags (see kv_pool.h).
#include "model/fast/kv_pool.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/check.h"

namespace dsv41 {

const char* isolation_mode_name(IsolationMode m) {
  switch (m) {
    case IsolationMode::kOff:
      return "off";
    case IsolationMode::kCount:
      return "count";
    case IsolationMode::kMask:
      return "mask";
  }
  return "?";
}

double KvLayout::global_bytes_per_token() const {
  double b = 0;
  for (const auto& s : sources) b += double(s.comp_bytes + s.key_bytes) / double(s.ratio);
  return b;
}

int64_t KvLayout::window_bytes_per_sequence() const {
  return window * int64_t(num_layers) * window_row_bytes;
}

KvLayout make_kv_layout(int64_t window, int num_layers, int64_t head_dim, int64_t index_dim,
                        const std::vector<std::pair<int, int>>& sources, int64_t window_tokens) {
  DSV41_CHECK(window_tokens > 0 && num_layers > 0);
  KvLayout L;
  L.window = window;
  L.window_tokens = window_tokens;
  L.num_layers = num_layers;
  L.window_row_bytes = head_dim + head_dim / 32;  // ops/cache_pack.h window_row_bytes
  L.window_tag_off = (window_tokens * num_layers * L.window_row_bytes + 7) / 8 * 8;
  const int64_t window_block =
      L.window_tag_off + window_tokens * num_layers * int64_t(sizeof(RowTag));
  int64_t lcm = 1;
  double per_token = 0;
  for (const auto& [layer, ratio] : sources) {
    KvLayout::Source s;
    s.layer = layer;
    s.ratio = ratio;
    s.comp_bytes = head_dim / 2 + head_dim / 16;   // compressed_row_bytes
    s.key_bytes = index_dim / 2 + index_dim / 32;  // index_key_bytes
    per_token += double(s.comp_bytes + s.key_bytes + 2 * int64_t(sizeof(RowTag))) / ratio;
    lcm = std::lcm(lcm, int64_t(ratio));
    L.sources.push_back(s);
  }
  // Global blocks as large as window blocks: as many positions as fit, a multiple of every ratio
  // and of the window block's positions (so a global block boundary is a window block boundary
  // and no compressor group is open there: where the prefix cache can cut a sequence).
  lcm = std::lcm(lcm, window_tokens);
  int64_t gt = lcm;
  if (per_token > 0) gt = std::max(lcm, int64_t(double(window_block) / per_token) / lcm * lcm);
  L.global_tokens = gt;
  int64_t off = 0;
  for (auto& s : L.sources) {
    s.entries = gt / s.ratio;
    s.comp_off = off;
    off += s.entries * s.comp_bytes;
    s.key_off = off;
    off += s.entries * s.key_bytes;
  }
  off = (off + 7) / 8 * 8;
  for (auto& s : L.sources) {
    s.comp_tag_off = off;
    off += s.entries * int64_t(sizeof(RowTag));
    s.key_tag_off = off;
    off += s.entries * int64_t(sizeof(RowTag));
  }
  L.block_bytes = (std::max(window_block, off) + 63) / 64 * 64;
  return L;
}

KvPool::KvPool(KvLayout layout, int64_t budget_bytes, IsolationMode mode)
    : layout_(std::move(layout)), mode_(mode) {
  const int64_t n = std::max<int64_t>(0, budget_bytes / layout_.block_bytes);
  DSV41_CHECK(n < (int64_t(1) << 31));
  arena_.reset(new uint8_t[std::size_t(n * layout_.block_bytes)]);
  epochs_.assign(std::size_t(n), 0);
  refs_.assign(std::size_t(n), 0);
  cache_refs_.assign(std::size_t(n), 0);
  free_.reserve(std::size_t(n));
  for (int64_t b = n - 1; b >= 0; --b) free_.push_back(int32_t(b));
}

BlockRef KvPool::allocate(uint64_t owner) {
  if (free_.empty()) return {};
  const int32_t b = free_.back();
  free_.pop_back();
  BlockRef r{b, ++epochs_[std::size_t(b)], owner};
  refs_[std::size_t(b)] = 1;
  // Tags cleared, so a row never written since this allocation reads as foreign.
  uint8_t* d = data(r);
  std::memset(d + layout_.window_tag_off, 0,
              std::size_t(layout_.block_bytes - layout_.window_tag_off));
  for (const auto& s : layout_.sources)
    std::memset(d + s.comp_tag_off, 0, std::size_t(2 * s.entries) * sizeof(RowTag));
  return r;
}

void KvPool::add_refs(BlockRef b, int32_t refs, int32_t cache_refs) {
  DSV41_CHECK(b.valid() && epochs_[std::size_t(b.block)] == b.epoch &&
              refs_[std::size_t(b.block)] > 0);
  const bool before = only_cached(b.block);
  refs_[std::size_t(b.block)] += refs;
  cache_refs_[std::size_t(b.block)] += cache_refs;
  DSV41_CHECK(cache_refs_[std::size_t(b.block)] >= 0 &&
              refs_[std::size_t(b.block)] >= cache_refs_[std::size_t(b.block)]);
  evictable_ += int64_t(only_cached(b.block)) - int64_t(before);
  if (refs_[std::size_t(b.block)] > 0) return;
  ++epochs_[std::size_t(b.block)];  // stale references now fail the epoch check
  free_.push_back(b.block);
}

void KvPool::share(BlockRef b) {
  add_refs(b, 1, 0);
}
void KvPool::release(BlockRef b) {
  add_refs(b, -1, 0);
}
void KvPool::share_cached(BlockRef b) {
  add_refs(b, 1, 1);
}
void KvPool::release_cached(BlockRef b) {
  add_refs(b, -1, -1);
}

}  // namespace dsv41
