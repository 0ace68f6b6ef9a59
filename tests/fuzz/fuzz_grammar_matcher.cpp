// libFuzzer target: the matcher on a few fixed grammars (a strict object schema with formats,
// numbers and nesting, a recursive schema, JSON mode, a regex) fed arbitrary bytes in chunks; after
// each accepted chunk the mask equals accept_token id by id, a refused chunk leaves the state as it
// was, and rollback returns to earlier states exactly.
#include "grammar_fuzz_util.h"

namespace {

const std::vector<std::shared_ptr<const dsv41::Grammar>>& grammars() {
  using dsv41::Grammar;
  static const std::vector<std::shared_ptr<const Grammar>> g = [] {
    const auto& v = dsv41::fuzz::grammar_vocab();
    std::vector<std::shared_ptr<const Grammar>> out;
    for (const char* s : {
             R"({"type":"object","properties":{"s":{"type":"string","maxLength":3},
                "n":{"type":"number","minimum":-2,"maximum":2},"i":{"type":["integer","null"]},
                "d":{"type":"string","format":"date"},"e":{"enum":["a",1,null]},
                "l":{"type":"array","items":{"type":"boolean"},"maxItems":2}},
                "required":["s"],"additionalProperties":false})",
             R"({"$defs":{"t":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/t"}},
                {"type":"string","pattern":"^a+b?$"}]}},"$ref":"#/$defs/t"})"}) {
      auto r = Grammar::from_json_schema(s, v);
      if (!r.is_ok()) std::abort();
      out.push_back(r.value());
    }
    out.push_back(Grammar::any_json_object(v).value());
    out.push_back(Grammar::from_regex("[a-c]{1,3}(x|\\d+)?é", v).value());
    return out;
  }();
  return g;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace dsv41;
  if (size < 1) return 0;
  Matcher m(grammars()[data[0] % grammars().size()]);
  std::vector<std::string> accepted;  // what each accepted chunk was
  for (std::size_t at = 1; at < size;) {
    std::size_t n = std::min<std::size_t>(size - at, 1 + data[at] % 5);
    ++at;
    n = std::min(n, size - at);
    std::string chunk(reinterpret_cast<const char*>(data + at), n);
    at += n;
    int before = m.num_accepted();
    bool complete = m.is_complete();
    if (m.accept_bytes(chunk)) {
      accepted.push_back(chunk);
      fuzz::check_mask(m);
    } else if (m.num_accepted() != before || m.is_complete() != complete) {
      fuzz::invariant_failed("a refused chunk changed the state");
    }
  }
  // Roll back half and replay: the same states again.
  int back = m.num_accepted() / 2;
  bool complete = m.is_complete();
  m.rollback(back);
  for (std::size_t k = accepted.size() - back; k < accepted.size(); ++k)
    if (!m.accept_bytes(accepted[k])) fuzz::invariant_failed("replay after rollback refused");
  if (m.is_complete() != complete) fuzz::invariant_failed("rollback + replay differs");
  return 0;
}
