// Bounded-length equivalence of the nodes of each leaf rule (Moore's partition refinement, kept
// level by level): what lets one node's token sets be derived from another's (node_masks.cpp).
// Two nodes are h-equivalent when every byte string of length <= h is read alike from both (each
// prefix defined or not, final or not). A trie subtree whose tokens are at most h bytes deep below
// a pair of h-equivalent states is classified identically from both, so it need not be walked.
// Counted strings (maxLength N) are the reason: their N "remaining k" nodes are pairwise distinct
// but min(k, k')-equivalent, and most of the vocabulary is shorter than that.
#include <algorithm>

#include "grammar/grammar_ir.h"

namespace dsv41::grammar_detail {

namespace {

constexpr uint32_t kDead = 0xFFFFFFFFu;
// Refinement work (nodes x byte classes x rounds) above which a rule keeps plain walks: the
// tables are an optimization, never worth seconds of compile.
constexpr int64_t kMaxWork = 24'000'000;
constexpr uint32_t kMaxRuleNodes = 65535;  // classes fit uint16_t

// The levels kept: every level up to 16 (short tokens dominate the vocabulary), then sparser; a
// lookup rounds its length up to the next kept level (finer classes: still exact, walks a little
// more). The last level is the vocabulary's deepest token.
std::vector<uint16_t> kept_levels(int max_depth) {
  std::vector<uint16_t> out;
  for (int h = 0; h < max_depth; h += h < 16 ? 1 : h < 64 ? 4 : h < 256 ? 16 : 64)
    out.push_back(static_cast<uint16_t>(h));
  out.push_back(static_cast<uint16_t>(std::max(max_depth, 0)));
  return out;
}

// One refinement round: next[x] = the class of (cur[x], cur[delta(x, c)] for every class c).
// Returns the number of classes, or -1 when the work budget is spent.
int refine(const Automaton& a, uint32_t first, uint32_t n, int k, const std::vector<uint32_t>& cur,
           std::vector<uint32_t>& next, int64_t& work) {
  work += int64_t{n} * (k + 1);
  if (work > kMaxWork) return -1;
  std::vector<uint32_t> sig(static_cast<std::size_t>(n) * (k + 1));
  for (uint32_t x = 0; x < n; ++x) {
    uint32_t* s = &sig[static_cast<std::size_t>(x) * (k + 1)];
    s[0] = cur[x];
    const int32_t* row = &a.trans[a.trans_base[first + x]];
    for (int c = 0; c < k; ++c) s[c + 1] = row[c] < 0 ? kDead : cur[row[c] - first];
  }
  // Open addressing on a hash of the signature; equal hashes are compared in full.
  std::size_t cap = 1;
  while (cap < 2 * std::size_t{n}) cap <<= 1;
  std::vector<uint32_t> slot(cap, kDead);  // representative node per slot
  uint32_t classes = 0;
  next.assign(n, 0);
  for (uint32_t x = 0; x < n; ++x) {
    const uint32_t* s = &sig[static_cast<std::size_t>(x) * (k + 1)];
    uint64_t h = 1469598103934665603ull;
    for (int c = 0; c <= k; ++c) h = (h ^ s[c]) * 1099511628211ull;
    for (std::size_t i = (h ^ (h >> 29)) & (cap - 1);; i = (i + 1) & (cap - 1)) {
      if (slot[i] == kDead) {
        slot[i] = x;
        next[x] = classes++;
        break;
      }
      const uint32_t* r = &sig[static_cast<std::size_t>(slot[i]) * (k + 1)];
      if (std::equal(s, s + k + 1, r)) {
        next[x] = next[slot[i]];
        break;
      }
    }
  }
  return static_cast<int>(classes);
}

}  // namespace

Equivalence build_equivalence(const Automaton& a, int max_depth) {
  Equivalence e;
  e.levels = kept_levels(max_depth);
  e.level_slot.assign(static_cast<std::size_t>(max_depth) + 1, 0);
  for (int h = 0, s = 0; h <= max_depth; ++h) {
    while (e.levels[s] < h) ++s;
    e.level_slot[h] = static_cast<uint16_t>(s);
  }
  const std::size_t nr = a.rule_start.size();
  e.rules.resize(nr);
  int64_t work = 0;
  for (std::size_t r = 0; r < nr; ++r) {
    const uint32_t first = a.rule_start[r];
    const uint32_t end = r + 1 < nr ? a.rule_start[r + 1] : a.num_nodes();
    const uint32_t n = end - first;
    if (!a.rule_is_leaf[r] || n < 2 || n > kMaxRuleNodes) continue;
    int k = 0;
    for (int b = 0; b < 256; ++b) k = std::max(k, a.byte_class[r * 256 + b] + 1);
    std::vector<uint32_t> cur(n), next;
    for (uint32_t x = 0; x < n; ++x) cur[x] = a.final[first + x];
    std::vector<uint16_t> table;
    uint32_t count = 0;
    for (uint32_t x = 0; x < n; ++x) count = std::max(count, cur[x] + 1);
    bool ok = true;
    for (int h = 0, s = 0;; ++h) {
      // cur is the partition at level h. Stable (= the previous one) or deep enough: it stands
      // for every kept level from here on.
      if (h > 0) {
        int c = refine(a, first, n, k, cur, next, work);
        if (c < 0) {
          ok = false;
          break;
        }
        const bool stable = static_cast<uint32_t>(c) == count;
        count = static_cast<uint32_t>(c);
        cur.swap(next);
        if (stable) {
          table.insert(table.end(), cur.begin(), cur.end());
          break;
        }
      }
      if (e.levels[s] == h) {
        table.insert(table.end(), cur.begin(), cur.end());
        if (++s == static_cast<int>(e.levels.size())) break;
      }
    }
    if (!ok) continue;
    Equivalence::Rule& rule = e.rules[r];
    rule.first = first;
    rule.n = n;
    rule.slots = static_cast<uint32_t>(table.size() / n);
    rule.cls = std::move(table);
    rule.rep.assign(rule.cls.size(), 0);
  }
  return e;
}

std::size_t Equivalence::bytes() const {
  std::size_t b = sizeof(*this) + level_slot.size() * 2 + levels.size() * 2;
  for (const Rule& r : rules) b += sizeof(Rule) + r.cls.size() * 2 + r.rep.size() * 4;
  return b;
}

}  // namespace dsv41::grammar_detail
