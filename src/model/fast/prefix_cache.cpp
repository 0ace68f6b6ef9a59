// The fast engine's prefix cache (issue 14, docs/decisions.md "Prefix cache"): full global blocks
// of sequences, hashed as a chain (SHA-256 over the parent's hash, the salt and the block's token
// ids), each with the window blocks that hold the window rows before its end.
//
// What is shared, and why a hit is exact: a sequence cut at a global block boundary P (a multiple
// of every compress ratio and of the window block's positions, kv_pool.cpp) has no open compressor
// group, its compressed rows and index keys for positions < P are all in the global blocks before
// P, the window rows it will still read are those of [P - window, P), its Engram history is a
// function of its tokens, and the candidate pool and top-k selections are recomputed per query.
// The fast path's rows do not depend on how a sequence was chunked or batched, so the cached rows
// are bit for bit what this sequence would compute. Not shared: the truncate rollback ring (a
// sequence cannot truncate below what it attached), and nothing in the vendor index-key mode
// (its last-publisher state depends on the chunking).
//
// Blocks are shared read-only: a sequence writes only positions >= P, which start new blocks. Row
// tags keep the writer's identity; a reader checks each row against the owner its table expects.
#include <algorithm>
#include <cstring>

#include "io/sha256.h"
#include "model/fast/fast_internal.h"

namespace dsv41 {
namespace {

std::string chain_hash(const std::string& parent, const std::string& salt, const int32_t* tokens,
                       int64_t n) {
  Sha256 h;
  const uint64_t lens[2] = {parent.size(), salt.size()};
  h.update(lens, sizeof lens);
  h.update(parent.data(), parent.size());
  h.update(salt.data(), salt.size());
  h.update(tokens, std::size_t(n) * sizeof(int32_t));
  return h.hex();
}

}  // namespace

bool FastModel::Impl::prefix_enabled() const {
  return opt.prefix_cache && opt.index_keys == IndexKeySemantics::kOwner;
}

void FastModel::Impl::register_prefix(fast::SeqState& s) {
  if (!prefix_enabled() || !s.cacheable) return;
  const KvLayout& L = kv->layout();
  const int64_t G = L.global_tokens;
  if (L.sources.empty()) return;  // no global blocks to hang a prefix on
  while (int64_t(s.chain.size() + 1) * G <= s.len) {
    const int64_t k = int64_t(s.chain.size()), end = (k + 1) * G;
    const std::string parent = s.chain.empty() ? std::string() : s.chain.back();
    const std::string h = chain_hash(parent, s.salt, s.tokens.data() + k * G, G);
    auto it = prefix.find(h);
    if (it == prefix.end()) {
      fast::PrefixEntry e;
      e.parent = parent;
      e.tokens.assign(s.tokens.begin() + k * G, s.tokens.begin() + end);
      e.glob = s.glob[std::size_t(k)];
      e.dec_floor = s.dec_floor;
      e.first_win = std::max<int64_t>(0, end - L.window) / L.window_tokens;
      for (int64_t i = e.first_win; i < end / L.window_tokens; ++i) {
        if (!s.win[std::size_t(i)].valid()) {  // a step releases old window blocks only after this
          s.cacheable = false;
          return;
        }
        e.win.push_back(s.win[std::size_t(i)]);
      }
      it = prefix.emplace(h, std::move(e)).first;
      // References last: nothing above can leave one behind.
      kv->share_cached(it->second.glob);
      for (const BlockRef& b : it->second.win) kv->share_cached(b);
      if (auto p = prefix.find(parent); p != prefix.end()) ++p->second.children;
    }
    it->second.last_use = ++prefix_clock;
    s.chain.push_back(h);
  }
  stats.prefix_entries = int64_t(prefix.size());
}

int64_t FastModel::Impl::prefix_evictable() const {
  return kv->evictable();  // blocks whose every reference is the cache's
}

// The least recently used entry among those that free something (no live sequence holds their
// global block) and that no other entry extends (evicting a chain's root would strand the rest);
// failing that, the least recently used one that frees something, then any.
bool FastModel::Impl::evict_one_prefix() {
  if (prefix.empty()) return false;
  auto best = prefix.end();
  int best_rank = 3;
  for (auto it = prefix.begin(); it != prefix.end(); ++it) {
    const fast::PrefixEntry& e = it->second;
    const bool frees = kv->refs(e.glob.block) == kv->cache_refs(e.glob.block);
    const int rank = frees ? (e.children == 0 ? 0 : 1) : 2;
    if (rank < best_rank || (rank == best_rank && e.last_use < best->second.last_use))
      best = it, best_rank = rank;
  }
  if (auto p = prefix.find(best->second.parent); p != prefix.end()) --p->second.children;
  kv->release_cached(best->second.glob);
  for (const BlockRef& b : best->second.win) kv->release_cached(b);
  prefix.erase(best);
  stats.prefix_entries = int64_t(prefix.size());
  ++stats.prefix_evictions;
  return true;
}

BlockRef FastModel::Impl::alloc_block(uint64_t owner) {
  for (;;) {
    const BlockRef b = kv->allocate(owner);
    if (b.valid() || !evict_one_prefix()) return b;
  }
}

int64_t FastModel::attach_cached_prefix(SeqId seq, const std::vector<int32_t>& tokens,
                                        const std::string& salt) {
  Impl& im = *impl_;
  auto it = im.seqs.find(seq);
  if (it == im.seqs.end() || it->second->len != 0) return 0;
  fast::SeqState& s = *it->second;
  s.salt = salt;
  if (!im.prefix_enabled() || im.kv->layout().sources.empty()) return 0;
  ++im.stats.prefix_queries;
  im.stats.prefix_query_tokens += int64_t(tokens.size());
  const KvLayout& L = im.kv->layout();
  const int64_t G = L.global_tokens;
  // The chain of cached blocks matching tokens, stopping before the last token.
  std::vector<const fast::PrefixEntry*> hit;
  std::vector<std::string> chain;
  while ((int64_t(hit.size()) + 1) * G < int64_t(tokens.size())) {
    const int64_t k = int64_t(hit.size());
    const std::string parent = chain.empty() ? std::string() : chain.back();
    const std::string h = chain_hash(parent, salt, tokens.data() + k * G, G);
    auto e = im.prefix.find(h);
    if (e == im.prefix.end() || e->second.parent != parent ||
        !std::equal(e->second.tokens.begin(), e->second.tokens.end(), tokens.begin() + k * G))
      break;
    hit.push_back(&e->second);
    chain.push_back(h);
  }
  // Decoder replay: a hit stops at the last block whose end a sequence could go on from with only
  // the rows its writer computed, i.e. whose decoder window rows [end - window + 1, end) lie at or
  // above the writer's floor then; blocks ending inside a chunk's skipped rows are computed again.
  // The attached state is then the writer's at that point, bit for bit (a sequence that ran the
  // same chunks itself gets the same logits); the floor carries over.
  while (!hit.empty() && hit.back()->dec_floor > int64_t(hit.size()) * G - L.window + 1 &&
         hit.back()->dec_floor > 0) {
    im.stats.prefix_replay_capped_tokens += G;
    hit.pop_back();
    chain.pop_back();
  }
  if (hit.empty()) return 0;
  const int64_t P = int64_t(hit.size()) * G;
  // Tables first, references last: an allocation failing above leaves no reference behind.
  const fast::PrefixEntry& last = *hit.back();
  s.glob.clear();
  for (const fast::PrefixEntry* e : hit) s.glob.push_back(e->glob);
  s.win.assign(std::size_t(P / L.window_tokens), BlockRef{});
  for (std::size_t i = 0; i < last.win.size(); ++i)
    s.win[std::size_t(last.first_win) + i] = last.win[i];
  s.tokens.assign(tokens.begin(), tokens.begin() + P);
  s.history.resize(std::size_t(P));
  for (int64_t p = 0; p < P; ++p)
    s.history[std::size_t(p)] =  // an image span's key ids (seam.h image_key_token): dead
        tokens[std::size_t(p)] < 0 ? kEngramDead : im.cmap[std::size_t(tokens[std::size_t(p)])];
  s.len = s.shared_len = P;
  s.dec_floor = last.dec_floor;  // below P - window + 1 (above)
  s.chain = std::move(chain);
  for (const fast::PrefixEntry* e : hit) {
    im.kv->share(e->glob);
    const_cast<fast::PrefixEntry*>(e)->last_use = ++im.prefix_clock;
  }
  for (const BlockRef& b : last.win) im.kv->share(b);
  im.stats.prefix_hit_tokens += P;
  return P;
}

bool FastModel::prefix_caching() const {
  return impl_->prefix_enabled() && !impl_->kv->layout().sources.empty();
}

ModelRunner::PrefixCacheCounts FastModel::prefix_cache_counts() const {
  const FastStats& st = impl_->stats;
  return {st.prefix_queries, st.prefix_query_tokens, st.prefix_hit_tokens, st.prefix_evictions};
}

}  // namespace dsv41
