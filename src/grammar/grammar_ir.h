// Internal representation of the grammar layer: byte sets, the expression pool the front ends
// (schema, regex, choices) build, the compile budget, and the automaton the matcher runs (one
// deterministic byte automaton per rule, rules calling rules: a pushdown automaton).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"

namespace dsv41::grammar_detail {

struct ByteSet {
  uint64_t w[4] = {0, 0, 0, 0};
  void set(int b) { w[b >> 6] |= uint64_t{1} << (b & 63); }
  void set_range(int lo, int hi) {
    for (int b = lo; b <= hi; ++b) set(b);
  }
  bool test(int b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return (w[0] | w[1] | w[2] | w[3]) == 0; }
  int count() const;
  ByteSet& operator|=(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) w[i] |= o.w[i];
    return *this;
  }
  bool operator==(const ByteSet& o) const {
    return w[0] == o.w[0] && w[1] == o.w[1] && w[2] == o.w[2] && w[3] == o.w[3];
  }
};

// Time and state budget of one compilation. charge() counts states; over() says whether either
// limit is exceeded (the clock is read every 256 charges, so checking is cheap).
class Budget {
 public:
  explicit Budget(const GrammarOptions& o);
  Status charge(int64_t states = 1);
  Status check_time() const;

 private:
  std::chrono::steady_clock::time_point deadline_;
  int64_t states_ = 0, limit_ = 0, since_check_ = 0;
  double ms_ = 0;
};

enum class ExprKind : uint8_t { kEmpty, kBytes, kSeq, kAlt, kRepeat, kCall };
constexpr int kUnbounded = -1;

struct Expr {
  ExprKind kind = ExprKind::kEmpty;
  ByteSet bytes;          // kBytes
  std::vector<int> kids;  // kSeq, kAlt, kRepeat (one)
  int min = 0, max = 0;   // kRepeat (max kUnbounded = no limit)
  int rule = -1;          // kCall
};

// Expressions by index; a rule's body is one expression. Sharing a sub-expression is allowed (it is
// instantiated once per use).
class ExprPool {
 public:
  int empty();
  int bytes(const ByteSet& s);
  int byte_range(int lo, int hi);
  int lit(std::string_view s);
  int seq(std::vector<int> kids);
  int alt(std::vector<int> kids);
  int repeat(int kid, int min, int max);
  int opt(int kid) { return repeat(kid, 0, 1); }
  int call(int rule);
  int add(Expr e);  // a copy of an expression (its kids already in this pool)
  const Expr& at(int i) const { return e_[i]; }
  std::size_t size() const { return e_.size(); }

 private:
  std::vector<Expr> e_;
};

// What a front end produces: rules (bodies in the pool), rule 0 is the start.
struct Draft {
  ExprPool pool;
  std::vector<int> body;          // per rule; -1 while being defined
  std::vector<std::string> name;  // per rule, for errors (a schema path)
  int add_rule(std::string rule_name) {
    body.push_back(-1);
    name.push_back(std::move(rule_name));
    return static_cast<int>(body.size()) - 1;
  }
};

// The compiled automaton. Nodes are global; node n belongs to rule rule_of[n]. A stack of nodes is
// a position: the top node reads the next byte (next()), calls push a callee's start node over the
// caller's return node, and a final node may pop.
struct Automaton {
  struct Call {
    uint32_t callee_start;
    uint32_t ret;
  };
  std::vector<uint32_t> rule_of;
  std::vector<uint8_t> final;
  std::vector<uint32_t> trans_base;  // per node: offset into trans
  std::vector<int32_t> trans;        // per node, per byte class of its rule: next node or -1
  std::vector<uint8_t> byte_class;   // per rule, 256 entries
  std::vector<uint32_t> call_begin;  // per node (+1): its calls are calls[call_begin[n]..[n+1])
  std::vector<Call> calls;
  std::vector<uint32_t> rule_start;   // per rule
  std::vector<uint8_t> rule_is_leaf;  // per rule: no calls (one deterministic automaton)
  std::vector<ByteSet> follow;        // per rule: bytes that may come right after it returns

  uint32_t num_nodes() const { return static_cast<uint32_t>(rule_of.size()); }
  int32_t next(uint32_t node, uint8_t b) const {
    return trans[trans_base[node] + byte_class[rule_of[node] * 256 + b]];
  }
};

// Per node, which tokens are allowed whatever lies below it on the stack (accepted: a bitset over
// the vocabulary, or a list when short) and which depend on it (uncertain: ids in byte order, each
// with its common prefix length with the previous one, checked against the real stack at run time).
struct NodeMasks {
  std::vector<uint64_t> accept_bits;  // empty when accept_list is used
  std::vector<int32_t> accept_list;
  std::vector<int32_t> uncertain;
  std::vector<uint16_t> uncertain_lcp;
};

// Bounded-length equivalence of the nodes of each leaf rule (equivalence.cpp): nodes x and y are
// h-equivalent when every byte string of length <= h is read alike from both (each prefix defined
// or not, final or not). Kept per rule at some levels h (every h <= 16, sparser above), rounding a
// query's length up to a kept level (finer classes: never a wrong answer). A rule without a table
// (not a leaf, or too big to refine cheaply) has slots == 0.
struct Equivalence {
  struct Rule {
    uint32_t first = 0, n = 0, slots = 0;
    std::vector<uint16_t> cls;  // [slot * n + node - first]: the node's class at that level
    // [slot * n + class]: 1 + a node of that class whose token sets are computed, 0 if none.
    // Mutable state of a shared grammar: guarded by the grammar's memo mutex.
    std::vector<uint32_t> rep;
  };
  std::vector<uint16_t> levels;      // per slot, the level h it holds
  std::vector<uint16_t> level_slot;  // per h in [0, max depth]: the first slot with level >= h
  std::vector<Rule> rules;

  // The slot standing for strings of up to h bytes in rule r (r has a table).
  uint32_t slot(const Rule& r, int h) const {
    uint32_t s =
        level_slot[std::min<std::size_t>(static_cast<std::size_t>(h), level_slot.size() - 1)];
    return s < r.slots ? s : r.slots - 1;
  }
  // x and y (nodes of rule r) are h-equivalent.
  bool same(const Rule& r, int h, uint32_t x, uint32_t y) const {
    const std::size_t base = static_cast<std::size_t>(slot(r, h)) * r.n - r.first;
    return r.cls[base + x] == r.cls[base + y];
  }
  std::size_t bytes() const;
};

Result<Automaton> build_automaton(const Draft& draft, Budget& budget);
// max_depth: the longest token of the vocabulary in bytes (no level above it is needed).
Equivalence build_equivalence(const Automaton& a, int max_depth);
// The token sets of `node`: a walk of the vocabulary's trie from it, or, given the computed sets of
// a node of the same leaf rule (base), a walk of only the subtrees where the two may differ.
NodeMasks compute_node_masks(const Automaton& a, const TokenVocab& vocab, uint32_t node,
                             const Equivalence* eq = nullptr, uint32_t base = 0,
                             const NodeMasks* base_masks = nullptr);

// Front ends. Each returns the draft (rule 0 = the start).
// `pointer` (a JSON pointer, "" = the root): the draft of that sub-schema, $refs resolved in the
// whole document, paths in errors from the root.
Result<Draft> draft_from_schema(std::string_view schema_json, const GrammarOptions& o,
                                Budget& budget, const std::string& pointer = "");
Draft draft_any_json_object(const GrammarOptions& o);

// Regex (docs/structured-outputs.md subset) into pool expressions. json_string: characters are
// written as JSON string content (escapes for '"', '\\' and controls); else raw UTF-8. full: the
// whole text must match (anchors optional); else JSON Schema search semantics (unanchored ends
// match any text). `where` names the pattern in errors.
Result<int> regex_to_expr(std::string_view pattern, ExprPool& pool, bool json_string, bool full,
                          const std::string& where);
// A set of code point ranges as one character of output (raw UTF-8 or JSON string content).
int char_class_expr(ExprPool& pool, const std::vector<std::pair<uint32_t, uint32_t>>& ranges,
                    bool json_string);

}  // namespace dsv41::grammar_detail
