// libFuzzer target: the grammar compilers (JSON Schema, regex, choices) on arbitrary input within
// small budgets: any input compiles or is refused with a message, never a crash or a stall; a
// compiled grammar's start state and the state after its forced bytes have exact masks.
#include "grammar_fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace dsv41;
  if (size < 1) return 0;
  GrammarOptions o;
  o.max_whitespace = data[0] & 1 ? 2 : 0;
  o.time_budget_ms = 300;
  o.state_budget = 20000;
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  Result<std::shared_ptr<const Grammar>> g = Status::error("unset");
  switch ((data[0] >> 1) % 4) {
    case 0:
    case 1:
      g = Grammar::from_json_schema(text, fuzz::grammar_vocab(), o);
      break;
    case 2:
      g = Grammar::from_regex(text, fuzz::grammar_vocab(), o);
      break;
    default: {
      std::vector<std::string> choices;
      std::size_t at = 0;
      for (std::size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
        choices.push_back(text.substr(at, nl - at));
      choices.push_back(text.substr(at));
      g = Grammar::from_choices(choices, fuzz::grammar_vocab(), o);
    }
  }
  if (!g.is_ok()) {
    if (g.status().message().empty()) fuzz::invariant_failed("an error without a message");
    return 0;
  }
  Matcher m(g.value());
  fuzz::check_mask(m);
  std::string forced = m.forced_bytes();
  if (!forced.empty()) {
    if (!m.accept_bytes(forced)) fuzz::invariant_failed("forced bytes refused");
    fuzz::check_mask(m);
  }
  return 0;
}
