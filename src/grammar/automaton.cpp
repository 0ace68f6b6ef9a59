// Expressions -> automaton: each rule's expression becomes a Thompson NFA, then a deterministic
// automaton by subset construction (calls are symbols like bytes); dead states are pruned, left
// recursion through $ref is refused, and each rule's follow bytes are computed for the mask memo.
// Every state created is charged to the compile budget.
#include <algorithm>
#include <map>

#include "grammar/grammar_ir.h"

namespace dsv41::grammar_detail {

int ByteSet::count() const {
  int n = 0;
  for (uint64_t x : w) n += __builtin_popcountll(x);
  return n;
}

Budget::Budget(const GrammarOptions& o)
    : deadline_(std::chrono::steady_clock::now() +
                std::chrono::microseconds(static_cast<int64_t>(o.time_budget_ms * 1000))),
      limit_(o.state_budget),
      ms_(o.time_budget_ms) {}

Status Budget::charge(int64_t states) {
  states_ += states;
  if (states_ > limit_)
    return Status::error("grammar: the compiled automaton exceeds the state budget of " +
                             std::to_string(limit_) + " states",
                         ErrorKind::kCapacity);
  since_check_ += states;
  if (since_check_ >= 16) {
    since_check_ = 0;
    return check_time();
  }
  return Status::ok();
}

Status Budget::check_time() const {
  if (std::chrono::steady_clock::now() > deadline_)
    return Status::error("grammar: compilation exceeds the time budget of " +
                             std::to_string(static_cast<int64_t>(ms_)) + " ms",
                         ErrorKind::kCapacity);
  return Status::ok();
}

int ExprPool::empty() {
  e_.push_back(Expr{});
  return static_cast<int>(e_.size()) - 1;
}
int ExprPool::bytes(const ByteSet& s) {
  Expr x;
  x.kind = ExprKind::kBytes;
  x.bytes = s;
  e_.push_back(x);
  return static_cast<int>(e_.size()) - 1;
}
int ExprPool::byte_range(int lo, int hi) {
  ByteSet s;
  s.set_range(lo, hi);
  return bytes(s);
}
int ExprPool::lit(std::string_view s) {
  std::vector<int> kids;
  for (unsigned char c : s) kids.push_back(byte_range(c, c));
  return seq(std::move(kids));
}
int ExprPool::seq(std::vector<int> kids) {
  if (kids.size() == 1) return kids[0];
  Expr x;
  x.kind = kids.empty() ? ExprKind::kEmpty : ExprKind::kSeq;
  x.kids = std::move(kids);
  e_.push_back(std::move(x));
  return static_cast<int>(e_.size()) - 1;
}
int ExprPool::alt(std::vector<int> kids) {
  if (kids.size() == 1) return kids[0];
  Expr x;
  x.kind = ExprKind::kAlt;  // an empty alternation matches nothing
  x.kids = std::move(kids);
  e_.push_back(std::move(x));
  return static_cast<int>(e_.size()) - 1;
}
int ExprPool::repeat(int kid, int min, int max) {
  Expr x;
  x.kind = ExprKind::kRepeat;
  x.kids = {kid};
  x.min = min;
  x.max = max;
  e_.push_back(std::move(x));
  return static_cast<int>(e_.size()) - 1;
}
int ExprPool::add(Expr e) {
  e_.push_back(std::move(e));
  return static_cast<int>(e_.size()) - 1;
}
int ExprPool::call(int rule) {
  Expr x;
  x.kind = ExprKind::kCall;
  x.rule = rule;
  e_.push_back(std::move(x));
  return static_cast<int>(e_.size()) - 1;
}

namespace {

struct Nfa {
  struct State {
    std::vector<int> eps;
    std::vector<std::pair<int, int>> bytes;  // (byte set index, target)
    std::vector<std::pair<int, int>> calls;  // (rule, target)
  };
  std::vector<State> st;
  std::vector<ByteSet> sets;
  int add() {
    st.emplace_back();
    return static_cast<int>(st.size()) - 1;
  }
};

// Thompson construction of expression e between fresh states; returns (start, end).
class Emitter {
 public:
  Emitter(const ExprPool& pool, Nfa& nfa, Budget& budget)
      : pool_(pool), nfa_(nfa), budget_(budget) {}
  Status emit(int e, int from, int to, int depth) {
    if (depth > 4000) return Status::error("grammar: expression nesting too deep");
    const Expr& x = pool_.at(e);
    switch (x.kind) {
      case ExprKind::kEmpty:
        nfa_.st[from].eps.push_back(to);
        return Status::ok();
      case ExprKind::kBytes:
        nfa_.sets.push_back(x.bytes);
        nfa_.st[from].bytes.emplace_back(static_cast<int>(nfa_.sets.size()) - 1, to);
        return Status::ok();
      case ExprKind::kCall:
        nfa_.st[from].calls.emplace_back(x.rule, to);
        return Status::ok();
      case ExprKind::kSeq: {
        int cur = from;
        for (std::size_t i = 0; i < x.kids.size(); ++i) {
          int nxt = i + 1 == x.kids.size() ? to : fresh();
          DSV41_RETURN_IF_ERROR(budget_.charge());
          DSV41_RETURN_IF_ERROR(emit(x.kids[i], cur, nxt, depth + 1));
          cur = nxt;
        }
        return Status::ok();
      }
      case ExprKind::kAlt:
        for (int k : x.kids) DSV41_RETURN_IF_ERROR(emit(k, from, to, depth + 1));
        return Status::ok();
      case ExprKind::kRepeat: {
        int cur = from;
        for (int i = 0; i < x.min; ++i) {
          int nxt = fresh();
          DSV41_RETURN_IF_ERROR(budget_.charge());
          DSV41_RETURN_IF_ERROR(emit(x.kids[0], cur, nxt, depth + 1));
          cur = nxt;
        }
        if (x.max == kUnbounded) {
          int loop = fresh(), body_end = fresh();
          DSV41_RETURN_IF_ERROR(budget_.charge(2));
          nfa_.st[cur].eps.push_back(loop);
          DSV41_RETURN_IF_ERROR(emit(x.kids[0], loop, body_end, depth + 1));
          nfa_.st[body_end].eps.push_back(loop);
          nfa_.st[loop].eps.push_back(to);
          return Status::ok();
        }
        for (int i = x.min; i < x.max; ++i) {
          int nxt = fresh();
          DSV41_RETURN_IF_ERROR(budget_.charge());
          nfa_.st[cur].eps.push_back(to);
          DSV41_RETURN_IF_ERROR(emit(x.kids[0], cur, nxt, depth + 1));
          cur = nxt;
        }
        nfa_.st[cur].eps.push_back(to);
        return Status::ok();
      }
    }
    return Status::ok();
  }
  int fresh() { return nfa_.add(); }

 private:
  const ExprPool& pool_;
  Nfa& nfa_;
  Budget& budget_;
};

void eps_close(const Nfa& nfa, std::vector<int>& set, std::vector<uint8_t>& mark) {
  std::vector<int> stack(set.begin(), set.end());
  for (int s : set) mark[s] = 1;
  while (!stack.empty()) {
    int s = stack.back();
    stack.pop_back();
    for (int t : nfa.st[s].eps)
      if (!mark[t]) mark[t] = 1, set.push_back(t), stack.push_back(t);
  }
  for (int s : set) mark[s] = 0;
  std::sort(set.begin(), set.end());
  set.erase(std::unique(set.begin(), set.end()), set.end());
}

// One rule's deterministic automaton with local node ids; calls name the callee rule.
struct RuleDfa {
  uint8_t cls[256] = {};
  int nclass = 1;
  std::vector<int32_t> trans;  // node * nclass + class
  std::vector<uint8_t> final;
  std::vector<std::vector<std::pair<int, int>>> calls;  // (callee rule, local target)
};

Result<RuleDfa> determinize(const Nfa& nfa, int start, int accept, Budget& budget) {
  RuleDfa d;
  // Byte classes: bytes no edge set tells apart share a class.
  std::vector<ByteSet> sets = nfa.sets;
  std::sort(sets.begin(), sets.end(), [](const ByteSet& a, const ByteSet& b) {
    return std::lexicographical_compare(a.w, a.w + 4, b.w, b.w + 4);
  });
  sets.erase(std::unique(sets.begin(), sets.end()), sets.end());
  int cls[256] = {};
  int n = 1;
  for (const ByteSet& s : sets) {
    std::map<std::pair<int, bool>, int> split;
    for (int b = 0; b < 256; ++b) {
      auto key = std::make_pair(cls[b], s.test(b));
      auto it = split.find(key);
      if (it == split.end()) it = split.emplace(key, static_cast<int>(split.size())).first;
      cls[b] = it->second;
    }
    n = static_cast<int>(split.size());
  }
  d.nclass = n;
  std::vector<int> rep(n, -1);
  for (int b = 0; b < 256; ++b) {
    d.cls[b] = static_cast<uint8_t>(cls[b]);
    if (rep[cls[b]] < 0) rep[cls[b]] = b;
  }
  std::vector<uint8_t> mark(nfa.st.size(), 0);
  std::map<std::vector<int>, int> ids;
  std::vector<std::vector<int>> todo;
  auto intern = [&](std::vector<int> set) -> Result<int> {
    eps_close(nfa, set, mark);
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    DSV41_RETURN_IF_ERROR(budget.charge());
    int id = static_cast<int>(todo.size());
    ids.emplace(set, id);
    todo.push_back(std::move(set));
    return id;
  };
  auto s0 = intern({start});
  if (!s0.is_ok()) return s0.status();
  for (std::size_t i = 0; i < todo.size(); ++i) {
    if (i % 16 == 15) DSV41_RETURN_IF_ERROR(budget.check_time());
    const std::vector<int> cur = todo[i];
    d.trans.resize((i + 1) * n, -1);
    d.final.push_back(std::binary_search(cur.begin(), cur.end(), accept));
    for (int k = 0; k < n; ++k) {
      std::vector<int> next;
      for (int s : cur)
        for (auto [set, t] : nfa.st[s].bytes)
          if (nfa.sets[set].test(rep[k])) next.push_back(t);
      if (next.empty()) continue;
      auto id = intern(std::move(next));
      if (!id.is_ok()) return id.status();
      d.trans[i * n + k] = id.value();
    }
    std::map<int, std::vector<int>> by_callee;
    for (int s : cur)
      for (auto [rule, t] : nfa.st[s].calls) by_callee[rule].push_back(t);
    d.calls.emplace_back();
    for (auto& [rule, targets] : by_callee) {
      auto id = intern(std::move(targets));
      if (!id.is_ok()) return id.status();
      d.calls[i].emplace_back(rule, id.value());
    }
  }
  return d;
}

// Removes states that cannot finish (so every live position can complete the document) and calls
// of rules that match nothing. False if the start rule matches nothing.
bool prune(Automaton& a) {
  uint32_t nn = a.num_nodes();
  std::vector<uint8_t> fin(a.final.begin(), a.final.end());
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t n = 0; n < nn; ++n) {
      if (fin[n]) continue;
      bool ok = false;
      for (int b = 0; b < 256 && !ok; ++b) {
        int32_t t = a.next(n, static_cast<uint8_t>(b));
        ok = t >= 0 && fin[t];
      }
      for (uint32_t c = a.call_begin[n]; c < a.call_begin[n + 1] && !ok; ++c)
        ok = fin[a.calls[c].callee_start] && fin[a.calls[c].ret];
      if (ok) fin[n] = 1, changed = true;
    }
  }
  for (int32_t& t : a.trans)
    if (t >= 0 && !fin[t]) t = -1;
  std::vector<Automaton::Call> calls;
  std::vector<uint32_t> begin(nn + 1, 0);
  for (uint32_t n = 0; n < nn; ++n) {
    begin[n] = static_cast<uint32_t>(calls.size());
    for (uint32_t c = a.call_begin[n]; c < a.call_begin[n + 1]; ++c)
      if (fin[a.calls[c].callee_start] && fin[a.calls[c].ret]) calls.push_back(a.calls[c]);
  }
  begin[nn] = static_cast<uint32_t>(calls.size());
  a.calls = std::move(calls);
  a.call_begin = std::move(begin);
  return fin[a.rule_start[0]] != 0;
}

// Nodes that can reach a final node through calls of nullable rules only, with nullable rules.
std::vector<uint8_t> eps_finish(const Automaton& a, std::vector<uint8_t>& nullable) {
  uint32_t nn = a.num_nodes();
  std::vector<uint8_t> ef(a.final.begin(), a.final.end());
  nullable.assign(a.rule_start.size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t r = 0; r < a.rule_start.size(); ++r)
      if (!nullable[r] && ef[a.rule_start[r]]) nullable[r] = 1, changed = true;
    for (uint32_t n = 0; n < nn; ++n) {
      if (ef[n]) continue;
      for (uint32_t c = a.call_begin[n]; c < a.call_begin[n + 1]; ++c)
        if (nullable[a.rule_of[a.calls[c].callee_start]] && ef[a.calls[c].ret]) {
          ef[n] = 1, changed = true;
          break;
        }
    }
  }
  return ef;
}

Status check_left_recursion(const Automaton& a, const std::vector<uint8_t>& nullable,
                            const std::vector<std::string>& names) {
  std::size_t nr = a.rule_start.size();
  std::vector<std::vector<int>> edges(nr);
  for (std::size_t r = 0; r < nr; ++r) {
    std::vector<uint32_t> todo{a.rule_start[r]}, seen{a.rule_start[r]};
    while (!todo.empty()) {
      uint32_t n = todo.back();
      todo.pop_back();
      for (uint32_t c = a.call_begin[n]; c < a.call_begin[n + 1]; ++c) {
        uint32_t callee = a.rule_of[a.calls[c].callee_start];
        edges[r].push_back(static_cast<int>(callee));
        uint32_t ret = a.calls[c].ret;
        if (nullable[callee] && std::find(seen.begin(), seen.end(), ret) == seen.end())
          seen.push_back(ret), todo.push_back(ret);
      }
    }
  }
  std::vector<uint8_t> color(nr, 0);  // 0 new, 1 on the path, 2 done
  for (std::size_t root = 0; root < nr; ++root) {
    if (color[root]) continue;
    std::vector<std::pair<int, std::size_t>> path{{static_cast<int>(root), 0}};
    color[root] = 1;
    while (!path.empty()) {
      auto& [r, i] = path.back();
      if (i == edges[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      int c = edges[r][i++];
      if (color[c] == 1)
        return Status::error("grammar: " + names[c] +
                             " refers to itself before any output (left recursion)");
      if (color[c] == 0) color[c] = 1, path.emplace_back(c, 0);
    }
  }
  return Status::ok();
}

void compute_follow(Automaton& a, const std::vector<uint8_t>& nullable,
                    const std::vector<uint8_t>& ef) {
  uint32_t nn = a.num_nodes();
  std::vector<ByteSet> first(nn);
  for (uint32_t n = 0; n < nn; ++n)
    for (int b = 0; b < 256; ++b)
      if (a.next(n, static_cast<uint8_t>(b)) >= 0) first[n].set(b);
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t n = 0; n < nn; ++n)
      for (uint32_t c = a.call_begin[n]; c < a.call_begin[n + 1]; ++c) {
        ByteSet s = first[n];
        s |= first[a.calls[c].callee_start];
        if (nullable[a.rule_of[a.calls[c].callee_start]]) s |= first[a.calls[c].ret];
        if (!(s == first[n])) first[n] = s, changed = true;
      }
  }
  a.follow.assign(a.rule_start.size(), ByteSet{});
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t n = 0; n < nn; ++n)
      for (uint32_t c = a.call_begin[n]; c < a.call_begin[n + 1]; ++c) {
        uint32_t callee = a.rule_of[a.calls[c].callee_start], ret = a.calls[c].ret;
        ByteSet s = a.follow[callee];
        s |= first[ret];
        if (ef[ret]) s |= a.follow[a.rule_of[ret]];
        if (!(s == a.follow[callee])) a.follow[callee] = s, changed = true;
      }
  }
}

}  // namespace

Result<Automaton> build_automaton(const Draft& draft, Budget& budget) {
  std::vector<RuleDfa> dfas;
  for (std::size_t r = 0; r < draft.body.size(); ++r) {
    DSV41_CHECK(draft.body[r] >= 0);
    Nfa nfa;
    Emitter em(draft.pool, nfa, budget);
    int s = em.fresh(), t = em.fresh();
    DSV41_RETURN_IF_ERROR(em.emit(draft.body[r], s, t, 0));
    auto d = determinize(nfa, s, t, budget);
    if (!d.is_ok()) return d.status();
    dfas.push_back(std::move(d.value()));
  }
  Automaton a;
  uint32_t base = 0;
  for (const RuleDfa& d : dfas) {
    a.rule_start.push_back(base);
    base += static_cast<uint32_t>(d.final.size());
  }
  a.call_begin.push_back(0);
  for (std::size_t r = 0; r < dfas.size(); ++r) {
    const RuleDfa& d = dfas[r];
    uint32_t start = a.rule_start[r];
    a.byte_class.insert(a.byte_class.end(), d.cls, d.cls + 256);
    a.rule_is_leaf.push_back(1);
    for (std::size_t n = 0; n < d.final.size(); ++n) {
      a.rule_of.push_back(static_cast<uint32_t>(r));
      a.final.push_back(d.final[n]);
      a.trans_base.push_back(static_cast<uint32_t>(a.trans.size()));
      for (int k = 0; k < d.nclass; ++k) {
        int32_t t = d.trans[n * d.nclass + k];
        a.trans.push_back(t < 0 ? -1 : static_cast<int32_t>(start) + t);
      }
      for (auto [rule, t] : d.calls[n]) {
        a.calls.push_back({a.rule_start[rule], start + static_cast<uint32_t>(t)});
        a.rule_is_leaf[r] = 0;
      }
      a.call_begin.push_back(static_cast<uint32_t>(a.calls.size()));
    }
  }
  if (!prune(a)) return Status::error("grammar: the constraint admits no output at all");
  std::vector<uint8_t> nullable;
  std::vector<uint8_t> ef = eps_finish(a, nullable);
  DSV41_RETURN_IF_ERROR(check_left_recursion(a, nullable, draft.name));
  compute_follow(a, nullable, ef);
  for (std::size_t r = 0; r < dfas.size(); ++r) {
    bool leaf = true;
    uint32_t end = r + 1 < dfas.size() ? a.rule_start[r + 1] : a.num_nodes();
    for (uint32_t n = a.rule_start[r]; n < end; ++n)
      leaf = leaf && a.call_begin[n] == a.call_begin[n + 1];
    a.rule_is_leaf[r] = leaf;
  }
  DSV41_RETURN_IF_ERROR(budget.check_time());
  return a;
}

}  // namespace dsv41::grammar_detail
