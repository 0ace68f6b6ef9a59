// Grammar front doors: each constraint kind drafted into rules, compiled within the budget, and
// bound to its vocabulary.
#include "grammar/grammar.h"

#include "grammar/grammar_ir.h"

namespace dsv41 {

using grammar_detail::Budget;
using grammar_detail::Draft;

namespace {
Result<grammar_detail::Automaton> compile_draft(Result<Draft> draft, Budget& budget) {
  if (!draft.is_ok()) return draft.status();
  return grammar_detail::build_automaton(draft.value(), budget);
}
Status check_options(const GrammarOptions& o) {
  if (o.max_whitespace < 0 || o.max_whitespace > 64)
    return Status::error("grammar: max_whitespace must be in [0, 64]");
  if (!(o.time_budget_ms > 0) || o.state_budget <= 0)
    return Status::error("grammar: the compile budgets must be positive");
  return Status::ok();
}
}  // namespace

Result<std::shared_ptr<const Grammar>> Grammar::from_json_schema(
    std::string_view schema_json, std::shared_ptr<const TokenVocab> vocab,
    const GrammarOptions& options) {
  DSV41_RETURN_IF_ERROR(check_options(options));
  Budget budget(options);
  return finish(
      compile_draft(grammar_detail::draft_from_schema(schema_json, options, budget), budget),
      std::move(vocab), options);
}

Result<std::shared_ptr<const Grammar>> Grammar::any_json_object(
    std::shared_ptr<const TokenVocab> vocab, const GrammarOptions& options) {
  DSV41_RETURN_IF_ERROR(check_options(options));
  Budget budget(options);
  return finish(compile_draft(grammar_detail::draft_any_json_object(options), budget),
                std::move(vocab), options);
}

Result<std::shared_ptr<const Grammar>> Grammar::from_regex(std::string_view pattern,
                                                           std::shared_ptr<const TokenVocab> vocab,
                                                           const GrammarOptions& options) {
  DSV41_RETURN_IF_ERROR(check_options(options));
  Budget budget(options);
  Draft d;
  d.add_rule("regex");
  auto e = grammar_detail::regex_to_expr(pattern, d.pool, false, true, "regex");
  if (!e.is_ok()) return e.status();
  d.body[0] = e.value();
  return finish(compile_draft(std::move(d), budget), std::move(vocab), options);
}

Result<std::shared_ptr<const Grammar>> Grammar::from_choices(
    const std::vector<std::string>& choices, std::shared_ptr<const TokenVocab> vocab,
    const GrammarOptions& options) {
  DSV41_RETURN_IF_ERROR(check_options(options));
  if (choices.empty()) return Status::error("choice: the list is empty");
  Budget budget(options);
  Draft d;
  d.add_rule("choice");
  std::vector<int> alts;
  for (const std::string& c : choices) {
    if (c.empty()) return Status::error("choice: an entry is empty");
    alts.push_back(d.pool.lit(c));
  }
  d.body[0] = d.pool.alt(std::move(alts));
  return finish(compile_draft(std::move(d), budget), std::move(vocab), options);
}

}  // namespace dsv41
