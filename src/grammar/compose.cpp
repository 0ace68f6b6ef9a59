// Composed grammars (GrammarComposer, Grammar::compose): literal bytes, placed tokens, JSON values
// under (sub-)schemas and raw regexes assembled into one draft under one compile budget. Each JSON
// value is drafted by the schema compiler on its own and spliced in (its rules renumbered), so a
// composition costs what its pieces cost.
#include <fmt/format.h>

#include "grammar/grammar.h"
#include "grammar/grammar_ir.h"

namespace dsv41 {

using grammar_detail::Budget;
using grammar_detail::Draft;
using grammar_detail::Expr;
using grammar_detail::ExprKind;

int GrammarComposer::add(Node n) {
  nodes_.push_back(std::move(n));
  return static_cast<int>(nodes_.size()) - 1;
}
int GrammarComposer::literal(std::string bytes) {
  return add({Kind::kLiteral, std::move(bytes), {}, 0, 0, 0, {}});
}
int GrammarComposer::token(int32_t placed_id) {
  return add({Kind::kToken, {}, {}, placed_id, 0, 0, {}});
}
int GrammarComposer::document(std::string schema_json) {
  for (std::size_t i = 0; i < docs_.size(); ++i)
    if (docs_[i] == schema_json) return static_cast<int>(i);
  docs_.push_back(std::move(schema_json));
  return static_cast<int>(docs_.size()) - 1;
}
int GrammarComposer::json_value(int doc, std::string pointer, std::string where) {
  return add({Kind::kJson, std::move(pointer), std::move(where), doc, 0, 0, {}});
}
int GrammarComposer::regex(std::string pattern, std::string where) {
  return add({Kind::kRegex, std::move(pattern), std::move(where), 0, 0, 0, {}});
}
int GrammarComposer::seq(std::vector<int> parts) {
  return add({Kind::kSeq, {}, {}, 0, 0, 0, std::move(parts)});
}
int GrammarComposer::alt(std::vector<int> alternatives) {
  return add({Kind::kAlt, {}, {}, 0, 0, 0, std::move(alternatives)});
}
int GrammarComposer::repeat(int part, int min, int max) {
  return add({Kind::kRepeat, {}, {}, 0, min, max, {part}});
}

std::string GrammarComposer::key(int root) const {
  // Every field of every node (lengths first, so no two compositions print alike) and every
  // document; the nodes not reachable from root cost a little text, never a wrong hit.
  std::string k = fmt::format("root {} docs {}\n", root, docs_.size());
  for (const std::string& d : docs_) k += fmt::format("{}:{}\n", d.size(), d);
  for (const Node& n : nodes_) {
    k += fmt::format("{} {} {} {} {}:{}{}:{}", int(n.kind), n.a, n.b, n.c, n.text.size(), n.text,
                     n.where.size(), n.where);
    for (int kid : n.kids) k += fmt::format(" {}", kid);
    k += '\n';
  }
  return k;
}

namespace {

// Appends src's rules and expressions to dst; returns the rule src's start became.
int splice(Draft& dst, const Draft& src) {
  const int base = static_cast<int>(dst.body.size());
  for (const std::string& name : src.name) dst.add_rule(name);
  std::vector<int> map(src.pool.size());
  for (std::size_t i = 0; i < src.pool.size(); ++i) {
    Expr e = src.pool.at(static_cast<int>(i));
    for (int& kid : e.kids) kid = map[static_cast<std::size_t>(kid)];
    if (e.kind == ExprKind::kCall) e.rule += base;
    map[i] = dst.pool.add(std::move(e));
  }
  for (std::size_t r = 0; r < src.body.size(); ++r)
    dst.body[base + r] = map[static_cast<std::size_t>(src.body[r])];
  return base;
}

class Composition {
 public:
  Composition(const GrammarComposer& c, const TokenVocab& vocab, const GrammarOptions& o,
              Budget& budget)
      : c_(c), vocab_(vocab), o_(o), budget_(budget), done_(c.nodes().size(), -1) {}

  Result<Draft> run(int root) {
    d_.add_rule("composed");
    auto body = expr(root, 0);
    if (!body.is_ok()) return body.status();
    d_.body[0] = body.value();
    return std::move(d_);
  }

 private:
  Result<int> expr(int i, int depth) {
    using Kind = GrammarComposer::Kind;
    if (i < 0 || std::size_t(i) >= c_.nodes().size() || depth > 256)
      return Status::error("grammar composition: bad node " + std::to_string(i));
    DSV41_RETURN_IF_ERROR(budget_.charge());
    const GrammarComposer::Node& n = c_.nodes()[std::size_t(i)];
    switch (n.kind) {
      case Kind::kLiteral:
        return d_.pool.lit(n.text);
      case Kind::kToken: {
        const std::string b = vocab_.placed_bytes(static_cast<int32_t>(n.a));
        if (b.empty())
          return Status::error(
              fmt::format("grammar composition: token {} is not placed in the vocabulary", n.a));
        return d_.pool.lit(b);
      }
      case Kind::kJson: {
        // A value used twice is one rule.
        if (done_[std::size_t(i)] >= 0) return d_.pool.call(done_[std::size_t(i)]);
        if (n.a < 0 || std::size_t(n.a) >= c_.documents().size())
          return Status::error("grammar composition: bad document");
        auto sub = grammar_detail::draft_from_schema(c_.documents()[std::size_t(n.a)], o_, budget_,
                                                     n.text);
        if (!sub.is_ok()) return sub.status().with_context(n.where + ": ");
        done_[std::size_t(i)] = splice(d_, sub.value());
        return d_.pool.call(done_[std::size_t(i)]);
      }
      case Kind::kRegex: {
        auto e = grammar_detail::regex_to_expr(n.text, d_.pool, false, true, n.where);
        if (!e.is_ok()) return e.status();
        return e.value();
      }
      case Kind::kSeq:
      case Kind::kAlt: {
        std::vector<int> kids;
        for (int k : n.kids) {
          auto e = expr(k, depth + 1);
          if (!e.is_ok()) return e;
          kids.push_back(e.value());
        }
        return n.kind == Kind::kSeq ? d_.pool.seq(std::move(kids)) : d_.pool.alt(std::move(kids));
      }
      case Kind::kRepeat: {
        if (n.b < 0 || (n.c != grammar_detail::kUnbounded && n.c < n.b) || n.c > 100000)
          return Status::error("grammar composition: bad repetition bounds");
        auto e = expr(n.kids.at(0), depth + 1);
        if (!e.is_ok()) return e;
        return d_.pool.repeat(e.value(), static_cast<int>(n.b), static_cast<int>(n.c));
      }
    }
    return Status::error("grammar composition: unknown node kind");
  }

  const GrammarComposer& c_;
  const TokenVocab& vocab_;
  GrammarOptions o_;
  Budget& budget_;
  Draft d_;
  std::vector<int> done_;  // per node: its spliced rule (kJson), -1 before
};

}  // namespace

Result<std::shared_ptr<const Grammar>> Grammar::compose(const GrammarComposer& composer, int root,
                                                        std::shared_ptr<const TokenVocab> vocab,
                                                        const GrammarOptions& options) {
  if (!vocab) return Status::error("grammar composition: no vocabulary");
  if (options.max_whitespace < 0 || options.max_whitespace > 64 || !(options.time_budget_ms > 0) ||
      options.state_budget <= 0)
    return Status::error("grammar: bad options");
  Budget budget(options);
  Composition c(composer, *vocab, options, budget);
  auto draft = c.run(root);
  if (!draft.is_ok()) return draft.status();
  auto automaton = grammar_detail::build_automaton(draft.value(), budget);
  return finish(std::move(automaton), std::move(vocab), options);
}

}  // namespace dsv41
