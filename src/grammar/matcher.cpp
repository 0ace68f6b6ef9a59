// The vocabulary's byte trie, the per-node token-set memo (XGrammar's split: tokens decided by the
// node alone are precomputed once; the few that pop below it are checked against the real stack at
// each step), the Grammar object and the Matcher that walks the automaton by bytes.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "grammar/grammar_ir.h"
#include "text/byte_level.h"
#include "text/tokenizer.h"
#include "text/tokenizer_file.h"

namespace dsv41 {

using grammar_detail::Automaton;
using grammar_detail::Equivalence;
using grammar_detail::NodeMasks;
using Stack = Matcher::Stack;

namespace {

// More stacks than this in one position means a pathologically ambiguous grammar: the position is
// treated as dead (nothing allowed) rather than slowing every step.
constexpr std::size_t kMaxStacks = 4096;
// An accepted set with more ids than this is stored as a bitset.
constexpr std::size_t kListMax = 2048;

// Adds every position reachable without reading: calls push the callee over the return node; a
// final top pops when something is below it. Sorted, without duplicates.
void close(const Automaton& a, std::vector<Stack>& set) {
  for (std::size_t i = 0; i < set.size() && set.size() <= kMaxStacks; ++i) {
    uint32_t n = set[i].back();
    for (uint32_t c = a.call_begin[n]; c < a.call_begin[n + 1]; ++c) {
      Stack t = set[i];
      t.back() = a.calls[c].ret;
      t.push_back(a.calls[c].callee_start);
      if (std::find(set.begin(), set.end(), t) == set.end()) set.push_back(std::move(t));
    }
    if (a.final[n] && set[i].size() > 1) {
      Stack t(set[i].begin(), set[i].end() - 1);
      if (std::find(set.begin(), set.end(), t) == set.end()) set.push_back(std::move(t));
    }
  }
  if (set.size() > kMaxStacks) set.clear();
  std::sort(set.begin(), set.end());
}

std::vector<Stack> advance(const Automaton& a, const std::vector<Stack>& set, uint8_t b) {
  std::vector<Stack> out;
  for (const Stack& s : set) {
    int32_t t = a.next(s.back(), b);
    if (t < 0) continue;
    out.push_back(s);
    out.back().back() = static_cast<uint32_t>(t);
  }
  if (!out.empty()) close(a, out);
  return out;
}

bool has_final_bottom(const Automaton& a, const std::vector<Stack>& set) {
  for (const Stack& s : set)
    if (s.size() == 1 && a.final[s.back()]) return true;
  return false;
}

// Accumulates a node's sets during its trie walk: accepted ids straight into a bitset (most wide
// nodes accept most of the vocabulary), listed at the end when few.
struct MaskBuilder {
  const TokenVocab& vocab;
  std::vector<uint64_t> bits;
  std::vector<int32_t> uncertain;
  explicit MaskBuilder(const TokenVocab& v) : vocab(v), bits(v.mask_words(), 0) {}
  void accept_at(uint32_t node) {
    const auto& t = vocab.trie();
    for (uint32_t k = t.tok_begin[node], e = t.tok_begin[node + 1]; k < e; ++k) {
      int32_t id = t.ids[k];
      bits[id >> 6] |= uint64_t{1} << (id & 63);
    }
  }
  // Starts from another node's accepted set (a walk from a base then corrects it).
  void accept_all_of(const NodeMasks& m) {
    if (!m.accept_bits.empty()) bits = m.accept_bits;
    for (int32_t id : m.accept_list) bits[id >> 6] |= uint64_t{1} << (id & 63);
  }
  void clear_subtree(uint32_t node) {
    const auto& t = vocab.trie();
    for (uint32_t k = t.tok_begin[node], e = t.tok_begin[t.end[node]]; k < e; ++k) {
      int32_t id = t.ids[k];
      bits[id >> 6] &= ~(uint64_t{1} << (id & 63));
    }
  }
  void uncertain_subtree(uint32_t node) {
    const auto& t = vocab.trie();
    for (uint32_t k = t.tok_begin[node]; k < t.tok_begin[t.end[node]]; ++k)
      uncertain.push_back(t.ids[k]);
  }
  NodeMasks finish() {
    NodeMasks m;
    std::size_t count = 0;
    for (uint64_t w : bits) count += static_cast<std::size_t>(__builtin_popcountll(w));
    if (count > kListMax) {
      m.accept_bits = std::move(bits);
    } else {
      for (std::size_t w = 0; w < bits.size(); ++w)
        for (uint64_t b = bits[w]; b; b &= b - 1)
          m.accept_list.push_back(static_cast<int32_t>(w * 64 + __builtin_ctzll(b)));
    }
    for (std::size_t i = 0; i < uncertain.size(); ++i) {
      const std::string& cur = vocab.bytes(uncertain[i]);
      std::size_t l = 0;
      if (i > 0) {
        const std::string& prev = vocab.bytes(uncertain[i - 1]);
        while (l < cur.size() && l < prev.size() && cur[l] == prev[l]) ++l;
      }
      m.uncertain_lcp.push_back(static_cast<uint16_t>(l));
    }
    m.uncertain = std::move(uncertain);
    return m;
  }
};

// A rule without calls: positions are single nodes, so the walk carries one node per depth (with
// its transition row, so a step is one lookup).
void walk_leaf(const Automaton& a, const TokenVocab& vocab, uint32_t start, MaskBuilder& mb) {
  const auto& t = vocab.trie();
  const uint32_t rule = a.rule_of[start];
  const grammar_detail::ByteSet& follow = a.follow[rule];
  const uint8_t* cls = &a.byte_class[rule * 256];
  std::vector<const int32_t*> row(vocab.max_depth() + 2, nullptr);
  std::vector<uint8_t> fin(vocab.max_depth() + 2, 0), up(vocab.max_depth() + 2, 0);
  row[0] = &a.trans[a.trans_base[start]];
  const uint32_t size = static_cast<uint32_t>(t.byte.size());
  const uint8_t* bytes = t.byte.data();
  const uint16_t* depth = t.depth.data();
  for (uint32_t i = 1; i < size;) {
    int d = depth[i];
    uint8_t b = bytes[i];
    int32_t q2 = row[d - 1][cls[b]];
    bool u = up[d - 1] || (d >= 2 && fin[d - 1] && follow.test(b));
    if (q2 < 0) {
      if (u) mb.uncertain_subtree(i);
      i = t.end[i];
      continue;
    }
    row[d] = &a.trans[a.trans_base[q2]];
    fin[d] = a.final[q2];
    up[d] = u;
    if (t.tok_begin[i] != t.tok_begin[i + 1]) mb.accept_at(i);
    ++i;
  }
}

// The same sets as walk_leaf from `start`, given those of `base`, a node of the same rule whose
// sets are computed (bm): both walk the trie side by side, and wherever the two states (and whether
// the walk already passed a possible return) are equivalent for every string as long as the
// subtree's deepest token, the subtree is classified alike from both: base's bits are already in
// place and its uncertain ids there are copied, without walking it. Elsewhere start's walk corrects
// the bits.
void walk_leaf_from_base(const Automaton& a, const TokenVocab& vocab, const Equivalence& eq,
                         uint32_t start, uint32_t base, const NodeMasks& bm, MaskBuilder& mb) {
  const auto& t = vocab.trie();
  const uint32_t rule = a.rule_of[start];
  const Equivalence::Rule& er = eq.rules[rule];
  const grammar_detail::ByteSet& follow = a.follow[rule];
  const uint8_t* cls = &a.byte_class[rule * 256];
  const std::size_t levels = static_cast<std::size_t>(vocab.max_depth()) + 2;
  std::vector<int32_t> ps(levels, -1), qs(levels, -1);  // start's and base's states (-1: dead)
  std::vector<uint8_t> pu(levels, 0), qu(levels, 0);    // "up" of walk_leaf, per side
  ps[0] = static_cast<int32_t>(start);
  qs[0] = static_cast<int32_t>(base);
  mb.accept_all_of(bm);
  std::size_t cur = 0;  // bm.uncertain is in trie order: a cursor finds each subtree's share
  const uint32_t size = static_cast<uint32_t>(t.byte.size());
  for (uint32_t i = 1; i < size;) {
    const int d = t.depth[i];
    const uint8_t b = t.byte[i];
    const int32_t p = ps[d - 1], q = qs[d - 1];
    if (q >= 0 && pu[d - 1] == qu[d - 1] &&
        eq.same(er, t.height[i], static_cast<uint32_t>(p), static_cast<uint32_t>(q))) {
      const uint32_t lo = t.tok_begin[i], hi = t.tok_begin[t.end[i]];
      while (cur < bm.uncertain.size() && t.pos[bm.uncertain[cur]] < lo) ++cur;
      while (cur < bm.uncertain.size() && t.pos[bm.uncertain[cur]] < hi)
        mb.uncertain.push_back(bm.uncertain[cur++]);
      i = t.end[i];
      continue;
    }
    const int32_t p2 = a.trans[a.trans_base[p] + cls[b]];
    const int32_t q2 = q >= 0 ? a.trans[a.trans_base[q] + cls[b]] : -1;
    const bool u = pu[d - 1] || (d >= 2 && a.final[p] && follow.test(b));
    if (p2 < 0) {
      if (u) mb.uncertain_subtree(i);
      if (q2 >= 0) mb.clear_subtree(i);  // base accepted some of it; a dead base accepted none
      i = t.end[i];
      continue;
    }
    ps[d] = p2;
    pu[d] = u;
    qs[d] = q2;
    qu[d] = q2 >= 0 && (qu[d - 1] || (d >= 2 && a.final[q] && follow.test(b)));
    if (t.tok_begin[i] != t.tok_begin[i + 1]) mb.accept_at(i);
    ++i;
  }
}

// Any rule: positions are sets of stacks over the node (bottom = the node's own frame).
void walk_generic(const Automaton& a, const TokenVocab& vocab, uint32_t start, MaskBuilder& mb) {
  const auto& t = vocab.trie();
  const grammar_detail::ByteSet& follow = a.follow[a.rule_of[start]];
  std::vector<std::vector<Stack>> level(vocab.max_depth() + 2);
  std::vector<uint8_t> up(vocab.max_depth() + 2, 0);
  level[0] = {Stack{start}};
  const uint32_t size = static_cast<uint32_t>(t.byte.size());
  for (uint32_t i = 1; i < size;) {
    int d = t.depth[i];
    uint8_t b = t.byte[i];
    bool u = up[d - 1] || (d >= 2 && has_final_bottom(a, level[d - 1]) && follow.test(b));
    std::vector<Stack> x = advance(a, level[d - 1], b);
    if (x.empty()) {
      if (u) mb.uncertain_subtree(i);
      i = t.end[i];
      continue;
    }
    level[d] = std::move(x);
    up[d] = u;
    mb.accept_at(i);
    ++i;
  }
}

}  // namespace

namespace grammar_detail {
NodeMasks compute_node_masks(const Automaton& a, const TokenVocab& vocab, uint32_t node,
                             const Equivalence* eq, uint32_t base, const NodeMasks* base_masks) {
  MaskBuilder mb(vocab);
  if (base_masks) {
    DSV41_CHECK(eq && a.rule_of[base] == a.rule_of[node] && a.rule_is_leaf[a.rule_of[node]] &&
                eq->rules[a.rule_of[node]].slots > 0);
    walk_leaf_from_base(a, vocab, *eq, node, base, *base_masks, mb);
  } else if (a.rule_is_leaf[a.rule_of[node]])
    walk_leaf(a, vocab, node, mb);
  else
    walk_generic(a, vocab, node, mb);
  return mb.finish();
}
}  // namespace grammar_detail

// ---- TokenVocab ----

bool TokenVocab::is_end(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

std::string TokenVocab::placed_bytes(int32_t id) const {
  for (std::size_t k = 0; k < placed_.size(); ++k)
    if (placed_[k] == id) return std::string{kPlacedLead, static_cast<char>(k + 1)};
  return {};
}

Result<std::shared_ptr<const TokenVocab>> TokenVocab::create(std::vector<std::string> token_bytes,
                                                             const std::vector<int32_t>& excluded,
                                                             const std::vector<int32_t>& end_ids,
                                                             const std::vector<int32_t>& placed) {
  auto v = std::shared_ptr<TokenVocab>(new TokenVocab());
  const int64_t n = static_cast<int64_t>(token_bytes.size());
  if (n == 0 || n > (int64_t{1} << 30)) return Status::error("grammar vocabulary: bad size");
  v->bytes_ = std::move(token_bytes);
  v->excluded_.assign(n, 0);
  for (int32_t id : excluded) {
    if (id < 0 || id >= n)
      return Status::error("grammar vocabulary: excluded id " + std::to_string(id) +
                           " out of range");
    v->excluded_[id] = 1;
  }
  for (int32_t id : end_ids) {
    if (id < 0 || id >= n)
      return Status::error("grammar vocabulary: end id " + std::to_string(id) + " out of range");
    v->excluded_[id] = 1;  // end ids are handled apart from the trie
    v->end_ids_.push_back(id);
  }
  if (placed.size() > 255) return Status::error("grammar vocabulary: more than 255 placed ids");
  if (!placed.empty())  // the lead byte is private: no other token may spell it
    for (int32_t id = 0; id < n; ++id)
      if (v->bytes_[id].find(kPlacedLead) != std::string::npos) v->excluded_[id] = 1;
  for (std::size_t k = 0; k < placed.size(); ++k) {
    const int32_t id = placed[k];
    if (id < 0 || id >= n)
      return Status::error("grammar vocabulary: placed id " + std::to_string(id) + " out of range");
    if (v->is_end(id) || v->placed_bytes(id).size())
      return Status::error("grammar vocabulary: placed id " + std::to_string(id) +
                           " is an end id or placed twice");
    v->placed_.push_back(id);
    v->bytes_[id] = v->placed_bytes(id);
    v->excluded_[id] = 0;
  }
  std::vector<int32_t> order;
  for (int32_t id = 0; id < n; ++id) {
    if (v->bytes_[id].empty() || v->bytes_[id].size() > 60000) v->excluded_[id] = 1;
    if (!v->excluded_[id]) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
    return v->bytes_[x] != v->bytes_[y] ? v->bytes_[x] < v->bytes_[y] : x < y;
  });
  Trie& t = v->trie_;
  auto add_node = [&](uint8_t b, int depth) {
    t.byte.push_back(b);
    t.depth.push_back(static_cast<uint16_t>(depth));
    t.end.push_back(0);
    t.tok_begin.push_back(static_cast<uint32_t>(t.ids.size()));
    return static_cast<uint32_t>(t.byte.size()) - 1;
  };
  std::vector<uint32_t> path{add_node(0, 0)};
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = v->bytes_[id];
    std::size_t l = 0;
    if (prev)
      while (l < s.size() && l < prev->size() && s[l] == (*prev)[l]) ++l;
    while (path.size() > l + 1) {
      t.end[path.back()] = static_cast<uint32_t>(t.byte.size());
      path.pop_back();
    }
    for (std::size_t k = l; k < s.size(); ++k)
      path.push_back(add_node(static_cast<uint8_t>(s[k]), static_cast<int>(k + 1)));
    t.ids.push_back(id);
    v->max_depth_ = std::max(v->max_depth_, static_cast<int>(s.size()));
    prev = &s;
  }
  while (!path.empty()) {
    t.end[path.back()] = static_cast<uint32_t>(t.byte.size());
    path.pop_back();
  }
  t.tok_begin.push_back(static_cast<uint32_t>(t.ids.size()));  // sentinel
  // Heights bottom-up: a node's deepest descendant is its children's deepest (children of i are
  // i + 1, then end[] of each).
  const uint32_t nodes = static_cast<uint32_t>(t.byte.size());
  std::vector<uint16_t> deepest(t.depth);
  for (uint32_t i = nodes; i-- > 0;)
    for (uint32_t c = i + 1; c < t.end[i]; c = t.end[c])
      deepest[i] = std::max(deepest[i], deepest[c]);
  t.height.resize(nodes);
  for (uint32_t i = 0; i < nodes; ++i)
    t.height[i] = static_cast<uint16_t>(deepest[i] - t.depth[i] + 1);
  t.pos.assign(static_cast<std::size_t>(n), UINT32_MAX);
  for (uint32_t k = 0; k < t.ids.size(); ++k) t.pos[t.ids[k]] = k;
  return std::shared_ptr<const TokenVocab>(std::move(v));
}

Result<std::shared_ptr<const TokenVocab>> TokenVocab::from_table(
    const TokenizerTable& table, const std::vector<int32_t>& end_ids) {
  std::vector<std::string> bytes(table.size);
  std::vector<int32_t> excluded;
  for (const auto& [content, id] : table.added) excluded.push_back(static_cast<int32_t>(id));
  for (int64_t id = 0; id < table.size && id < static_cast<int64_t>(table.texts.size()); ++id)
    bytes[id] = table.texts[id].decoded;
  return create(std::move(bytes), excluded, end_ids);
}

Result<std::shared_ptr<const TokenVocab>> TokenVocab::from_tokenizer(
    const Tokenizer& tokenizer, const std::vector<int32_t>& end_ids,
    const std::vector<int32_t>& placed) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes(static_cast<std::size_t>(n));
  std::vector<int32_t> excluded;
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_added(id))
      excluded.push_back(id);
    else
      bytes[static_cast<std::size_t>(id)] = tokenizer.token_bytes(id);
  }
  return create(std::move(bytes), excluded, end_ids, placed);
}

// ---- Grammar ----

Grammar::~Grammar() = default;

Result<std::shared_ptr<const Grammar>> Grammar::finish(Result<grammar_detail::Automaton> a,
                                                       std::shared_ptr<const TokenVocab> vocab,
                                                       const GrammarOptions& options) {
  if (!a.is_ok()) return a.status();
  DSV41_CHECK(vocab != nullptr);
  auto g = std::shared_ptr<Grammar>(new Grammar());
  g->vocab_ = std::move(vocab);
  g->automaton_ = std::make_unique<grammar_detail::Automaton>(std::move(a.value()));
  uint32_t nn = g->automaton_->num_nodes();
  g->memo_ = std::make_unique<std::atomic<const NodeMasks*>[]>(nn);
  for (uint32_t i = 0; i < nn; ++i) g->memo_[i].store(nullptr, std::memory_order_relaxed);
  g->memo_owned_.resize(nn);
  g->equivalence_ = std::make_unique<grammar_detail::Equivalence>(
      grammar_detail::build_equivalence(*g->automaton_, g->vocab_->max_depth()));
  if (options.precompute_ms > 0) g->warm(options.precompute_ms);
  return std::shared_ptr<const Grammar>(std::move(g));
}

int64_t Grammar::num_states() const {
  return automaton_->num_nodes();
}

namespace {
// A base below this level of equivalence saves little of the walk (the vocabulary's first bytes
// already tell the nodes apart).
constexpr int kMinBaseLevel = 2;

// The computed node of node's rule most equivalent to it (the deepest kept level at which one
// shares its class) and that slot; {0, -1} if none. Under the memo mutex.
std::pair<uint32_t, int> best_base(const Equivalence& eq, const Automaton& a, uint32_t node) {
  const Equivalence::Rule& r = eq.rules[a.rule_of[node]];
  const int last = static_cast<int>(r.slots) - 1;  // any level: equal there = equal sets
  for (int s = last; s >= 0 && (s == last || eq.levels[s] >= kMinBaseLevel); --s) {
    const std::size_t row = static_cast<std::size_t>(s) * r.n;
    if (uint32_t rep = r.rep[row + r.cls[row + node - r.first]]) return {rep - 1, s};
  }
  return {0, -1};
}

// node's sets are computed: it now represents its class at every kept level. Under the mutex.
void note_computed(Equivalence& eq, const Automaton& a, uint32_t node) {
  Equivalence::Rule& r = eq.rules[a.rule_of[node]];
  for (uint32_t s = 0; s < r.slots; ++s) {
    const std::size_t row = static_cast<std::size_t>(s) * r.n;
    uint32_t& rep = r.rep[row + r.cls[row + node - r.first]];
    if (!rep) rep = node + 1;
  }
}
}  // namespace

const NodeMasks& Grammar::node_masks(uint32_t node) const {
  const NodeMasks* m = memo_[node].load(std::memory_order_acquire);
  if (m) return *m;
  // A computed node of the same rule equivalent to this one over the longest token has the very
  // same sets (shared, not copied); one equivalent over shorter strings is a base to derive them
  // from. Computed outside the lock (two threads may both compute; the first stored wins).
  Equivalence& eq = *equivalence_;
  const Equivalence::Rule& rule = eq.rules[automaton_->rule_of[node]];
  uint32_t base = 0;
  const NodeMasks* base_masks = nullptr;
  if (rule.slots > 0) {
    std::lock_guard<std::mutex> lock(memo_mutex_);
    auto [b, s] = best_base(eq, *automaton_, node);
    if (s >= 0) {
      base = b;
      base_masks = memo_[b].load(std::memory_order_acquire);
      if (s + 1 == static_cast<int>(rule.slots)) {
        memo_[node].store(base_masks, std::memory_order_release);
        return *base_masks;
      }
    }
  }
  auto fresh = std::make_unique<NodeMasks>(
      grammar_detail::compute_node_masks(*automaton_, *vocab_, node, &eq, base, base_masks));
  std::lock_guard<std::mutex> lock(memo_mutex_);
  m = memo_[node].load(std::memory_order_acquire);
  if (m) return *m;
  memo_owned_[node] = std::move(fresh);
  memo_[node].store(memo_owned_[node].get(), std::memory_order_release);
  if (rule.slots > 0) note_computed(eq, *automaton_, node);
  return *memo_owned_[node];
}

int64_t Grammar::warm(double max_ms) const {
  auto t0 = std::chrono::steady_clock::now();
  uint32_t nn = automaton_->num_nodes();
  for (uint32_t n = 0; n < nn; ++n) {
    if (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() >
        max_ms)
      return nn - n;
    (void)node_masks(n);
  }
  return 0;
}

std::size_t Grammar::memo_bytes() const {
  std::lock_guard<std::mutex> lock(memo_mutex_);
  std::size_t n = memo_owned_.size() * sizeof(void*) * 2 + equivalence_->bytes();
  for (const auto& m : memo_owned_)
    if (m)
      n += sizeof(NodeMasks) + m->accept_bits.capacity() * sizeof(uint64_t) +
           m->accept_list.capacity() * sizeof(int32_t) + m->uncertain.capacity() * sizeof(int32_t) +
           m->uncertain_lcp.capacity() * sizeof(uint16_t);
  return n;
}

// ---- Matcher ----

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  DSV41_CHECK(grammar_ != nullptr);
  State s;
  s.stacks = {Stack{grammar_->automaton().rule_start[0]}};
  close(grammar_->automaton(), s.stacks);
  history_.push_back(std::move(s));
}

bool Matcher::advance_bytes(std::string_view bytes, State& out) const {
  const State& cur = history_.back();
  if (cur.terminated) return false;
  std::vector<Stack> set = cur.stacks;
  for (char c : bytes) {
    set = advance(grammar_->automaton(), set, static_cast<uint8_t>(c));
    if (set.empty()) return false;
  }
  out.stacks = std::move(set);
  return true;
}

bool Matcher::accept_token(int32_t id) {
  const TokenVocab& v = grammar_->vocab();
  if (id < 0 || id >= v.size() || history_.back().terminated) return false;
  if (v.is_end(id)) {
    if (!is_complete()) return false;
    State s;
    s.terminated = true;
    history_.push_back(std::move(s));
    return true;
  }
  if (v.is_excluded(id)) return false;
  return accept_bytes(v.bytes(id));
}

bool Matcher::accept_bytes(std::string_view bytes) {
  State s;
  if (!advance_bytes(bytes, s)) return false;
  history_.push_back(std::move(s));
  return true;
}

void Matcher::rollback(int n) {
  DSV41_CHECK(n >= 0 && n <= num_accepted());
  history_.resize(history_.size() - n);
}

bool Matcher::is_complete() const {
  const State& s = history_.back();
  return !s.terminated && has_final_bottom(grammar_->automaton(), s.stacks);
}

bool Matcher::is_terminated() const {
  return history_.back().terminated;
}

namespace {
// Sets the bits of the uncertain tokens of m that the real stack s accepts. The ids are in byte
// order, so each walk resumes from the longest prefix it shares with the previous one.
void check_uncertain(const Automaton& a, const TokenVocab& v, const NodeMasks& m, const Stack& s,
                     std::span<uint64_t> words) {
  std::vector<std::vector<Stack>> level(v.max_depth() + 2);
  level[0] = {s};
  std::size_t valid = 0;  // levels 0..valid hold the previous token's prefixes
  for (std::size_t i = 0; i < m.uncertain.size(); ++i) {
    int32_t id = m.uncertain[i];
    const std::string& bytes = v.bytes(id);
    std::size_t d = std::min<std::size_t>(m.uncertain_lcp[i], valid);
    while (!level[d].empty() && d < bytes.size()) {
      level[d + 1] = advance(a, level[d], static_cast<uint8_t>(bytes[d]));
      ++d;
    }
    valid = d;
    if (!level[d].empty() && d == bytes.size()) words[id >> 6] |= uint64_t{1} << (id & 63);
  }
}
}  // namespace

void Matcher::fill_mask(std::span<uint64_t> words) const {
  const TokenVocab& v = grammar_->vocab();
  DSV41_CHECK(words.size() >= v.mask_words());
  std::fill(words.begin(), words.end(), 0);
  const State& st = history_.back();
  if (st.terminated) return;
  const Automaton& a = grammar_->automaton();
  for (const Stack& s : st.stacks) {
    const NodeMasks& m = grammar_->node_masks(s.back());
    if (!m.accept_bits.empty()) {
      const uint64_t* src = m.accept_bits.data();
      for (std::size_t k = 0; k < m.accept_bits.size(); ++k) words[k] |= src[k];
    } else {
      for (int32_t id : m.accept_list) words[id >> 6] |= uint64_t{1} << (id & 63);
    }
    if (!m.uncertain.empty()) check_uncertain(a, v, m, s, words);
  }
  if (is_complete())
    for (int32_t id : v.end_ids()) words[id >> 6] |= uint64_t{1} << (id & 63);
}

std::string Matcher::forced_bytes() const {
  const Automaton& a = grammar_->automaton();
  std::string out;
  std::vector<Stack> set = history_.back().stacks;
  if (history_.back().terminated) return out;
  while (out.size() < 4096 && !has_final_bottom(a, set)) {
    int only = -1;
    for (const Stack& s : set)
      for (int b = 0; b < 256 && only != -2; ++b)
        if (a.next(s.back(), static_cast<uint8_t>(b)) >= 0)
          only = (only == -1 || only == b) ? b : -2;
    if (only < 0) break;
    out.push_back(static_cast<char>(only));
    set = advance(a, set, static_cast<uint8_t>(only));
  }
  return out;
}

}  // namespace dsv41
