// Forced tool calls: the DSML calls block as a composed grammar (forced_tools.h). The layout is
// the chat encoder's (text/chat_encoding.cpp encode_tool_calls_dsml, after the answer's blank
// line), which the DSML parser reads back:
//   \n\n<M calls>\n<M invoke name="T">\n<M parameter name="P" string="true|false">V</M parameter>
//   \n...\n</M invoke>[\n<M invoke ...>...</M invoke>]\n</M calls>
// M is the DSML marker, written as its added token when the tokenizer has one. Parameters come in
// the schema's `properties` order, required ones always, optional ones may be left out. A plain
// string parameter ({"type": "string"}, optional min/maxLength up to 1000) is written as the
// template's string="true" raw text (no "</" inside: the parser's closing tag cannot appear); every
// other one as string="false" JSON under its sub-schema (the parser parses it back).
// Strict tools under tool_choice auto get the same block minus its "\n\n<M" opening, started by
// the engine when the model itself writes the marker after "<" (a trigger constraint); there a
// non-strict tool's invoke keeps only the syntax (free parameter names and values).
#include "server/forced_tools.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "server/request_fields.h"
#include "text/chat.h"
#include "text/special_tokens.h"

namespace dsv41 {

namespace {

const std::set<std::string> kAnnotations = {"title",    "description", "$schema",  "$id",
                                            "examples", "default",     "$comment", "deprecated",
                                            "readOnly", "writeOnly"};

std::string pointer_escape(const std::string& key) {
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

// Raw text in which no closing tag can begin: '<' only when no '/' follows.
const char* const kRawAny = "(?:[^<]|<+[^</])*<*";

// The raw-text regex of a plain string parameter, or "" when it is written as JSON.
std::string raw_string_regex(const OJson& s) {
  if (!s.is_object() || !s.contains("type") || s["type"] != "string") return {};
  int64_t lo = 0, hi = -1;
  for (const auto& [k, v] : s.items()) {
    if (k == "type" || kAnnotations.count(k)) continue;
    if ((k != "minLength" && k != "maxLength") || !v.is_number_integer()) return {};
    const int64_t n = v.get<int64_t>();
    if (n < 0 || n > 1000) return {};  // the regex subset's counts stop at 1000: JSON then
    (k == "minLength" ? lo : hi) = n;
  }
  if (hi >= 0 && hi < lo) return {};  // nothing fits: the schema compiler says so
  // Bounded: characters but '<' (a subset of the strings allowed). Unbounded: '<' only when no
  // '/' follows, so no closing tag can begin inside the value.
  if (hi >= 0) return fmt::format("[^<]{{{},{}}}", lo, hi);
  if (lo > 0) return fmt::format("[^<]{{{},}}", lo);
  return kRawAny;
}

class CallsBuilder {
 public:
  CallsBuilder(GrammarComposer& c, const TokenVocab& vocab, const Tokenizer& tok) : c_(c) {
    const int32_t dsml = tok.token_id(tokens::kDsml);
    placed_ = dsml >= 0 && !vocab.placed_bytes(dsml).empty() ? dsml : -1;
  }
  // The marker (its placed token, else its bytes) between two literals.
  int tag(const std::string& before, const std::string& after) {
    const int m = placed_ >= 0 ? c_.token(placed_) : c_.literal(tokens::kDsml);
    return c_.seq({c_.literal(before), m, c_.literal(after)});
  }

  // One invoke of `fn` (index i); a 400 names the field for a schema the grammar cannot take.
  std::optional<ApiError> invoke(const OJson& fn, std::size_t i, const ToolFieldNames& names,
                                 int& out) {
    const std::string name = fn.value("name", std::string());
    const std::string name_param = fmt::format(fmt::runtime(names.name), i);
    if (name.find_first_of("\"<>") != std::string::npos)
      return bad(name_param, "a forced or strict tool's name cannot hold '\"', '<' or '>'");
    const std::string where = fmt::format(fmt::runtime(names.parameters), i);
    std::vector<Param> params;
    if (auto e = read_params(fn, where, params)) return e;
    // Optional parameters may be left out: rest[k] = the parameters from k on (first: nothing
    // written yet, no newline before the next one).
    const std::size_t n = params.size();
    std::vector<int> first(n + 1), more(n + 1);
    first[n] = more[n] = c_.seq({});
    for (std::size_t k = n; k-- > 0;) {
      const int with_first = c_.seq({params[k].node, more[k + 1]});
      const int with_more = c_.seq({c_.literal("\n"), params[k].node, more[k + 1]});
      first[k] = params[k].required ? with_first : c_.alt({with_first, first[k + 1]});
      more[k] = params[k].required ? with_more : c_.alt({with_more, more[k + 1]});
    }
    out = c_.seq({tag("<", " invoke name=\"" + name + "\">\n"), first[0], tag("\n</", " invoke>")});
    return std::nullopt;
  }

  // A non-strict tool's invoke under a strict-tools grammar: its name, then parameters in the
  // template's syntax with any names and values (raw text or any JSON), so the parser still
  // reads it, whatever the tool's schema (not compiled: it may be one the grammar cannot take).
  int free_invoke(const std::string& name, const std::string& where) {
    const int value =
        c_.alt({c_.seq({c_.literal("true\">"), c_.regex(kRawAny, where)}),
                c_.seq({c_.literal("false\">"), c_.json_value(c_.document("{}"), "", where)})});
    const int param = c_.seq({tag("<", " parameter name=\""), c_.regex("[^\"<>\n]{1,64}", where),
                              c_.literal("\" string=\""), value, tag("</", " parameter>")});
    const int params =
        c_.alt({c_.seq({}), c_.seq({param, c_.repeat(c_.seq({c_.literal("\n"), param}), 0, -1)})});
    return c_.seq({tag("<", " invoke name=\"" + name + "\">\n"), params, tag("\n</", " invoke>")});
  }

  // The whole block: invokes separated by newlines, one or (unless single) more. `after_marker`:
  // from just after the opening tag's marker (what a trigger constraint continues).
  int calls(int invoke, bool single, bool after_marker = false) {
    std::vector<int> parts = {after_marker ? c_.literal(" calls>\n") : tag("\n\n<", " calls>\n"),
                              invoke};
    if (!single) parts.push_back(c_.repeat(c_.seq({c_.literal("\n"), invoke}), 0, -1));
    parts.push_back(tag("\n</", " calls>"));
    return c_.seq(std::move(parts));
  }

 private:
  struct Param {
    int node;
    bool required;
  };

  int param(const std::string& key, const OJson* schema, int doc, const std::string& where) {
    const std::string raw = schema ? raw_string_regex(*schema) : std::string();
    const std::string head = " parameter name=\"" + key + "\" string=\"";
    int value;
    if (!raw.empty()) {
      value = c_.seq({tag("<", head + "true\">"), c_.regex(raw, where)});
    } else {
      const int v = schema ? c_.json_value(doc, "/properties/" + pointer_escape(key), where)
                           : c_.json_value(c_.document("{}"), "", where);
      value = c_.seq({tag("<", head + "false\">"), v});
    }
    return c_.seq({value, tag("</", " parameter>")});
  }

  std::optional<ApiError> read_params(const OJson& fn, const std::string& where,
                                      std::vector<Param>& out) {
    const auto ps = fn.find("parameters");
    if (ps == fn.end() || ps->is_null()) return std::nullopt;  // no parameters: none written
    if (!ps->is_object()) return bad(where, "must be a JSON schema object");
    for (const auto& [k, v] : ps->items()) {
      if (kAnnotations.count(k) || k == "properties" || k == "required" ||
          k == "additionalProperties" || k == "$defs" || k == "definitions")
        continue;
      if (k == "type" && v == "object") continue;
      return bad(
          where,
          fmt::format("a forced or strict tool call needs an object schema (type, properties, "
                      "required, additionalProperties, $defs); \"{}\" at the top "
                      "level is not supported",
                      k));
    }
    std::set<std::string> required;
    if (const auto r = ps->find("required"); r != ps->end()) {
      if (!r->is_array()) return bad(where + ".required", "must be an array of names");
      for (const auto& x : *r) {
        if (!x.is_string()) return bad(where + ".required", "must be an array of names");
        required.insert(x.get<std::string>());
      }
    }
    const int doc = c_.document(dump_safe(*ps));
    std::set<std::string> declared;
    if (const auto pr = ps->find("properties"); pr != ps->end()) {
      if (!pr->is_object()) return bad(where + ".properties", "must be an object");
      for (const auto& [k, v] : pr->items()) {
        if (k.empty() || k.find_first_of("\"<>") != std::string::npos)
          return bad(
              where + ".properties",
              "a forced or strict tool's parameter name must be non-empty without '\"', '<', '>'");
        out.push_back({param(k, &v, doc, where), required.count(k) > 0});
        declared.insert(k);
      }
    }
    for (const std::string& k : required)  // required but not declared: any JSON value
      if (!declared.count(k)) {
        if (k.empty() || k.find_first_of("\"<>") != std::string::npos)
          return bad(
              where + ".required",
              "a forced or strict tool's parameter name must be non-empty without '\"', '<', '>'");
        out.push_back({param(k, nullptr, doc, where), true});
      }
    return std::nullopt;
  }

  GrammarComposer& c_;
  int32_t placed_ = -1;
};

// Compiles the composed calls grammar into `out`; a 400 names where it failed.
std::optional<ApiError> compile_calls(const GrammarComposer& c, int root, const Tokenizer& tok,
                                      GrammarCache& cache, std::shared_ptr<const Grammar>& out) {
  auto g = cache.get_composed(tok, c, root);
  if (g) {
    out = *g;
    return std::nullopt;
  }
  // A schema's error starts with the field it came from (the `where` of its values).
  const std::string& msg = g.status().message();
  const std::size_t colon = msg.find(": ");
  std::string param = colon == std::string::npos || msg.compare(0, 5, "tools") != 0
                          ? std::string("tools")
                          : msg.substr(0, colon);
  ApiError e = bad_from(param, msg);
  if (g.status().kind() == ErrorKind::kCapacity) e.code = "grammar_too_complex";
  return e;
}

}  // namespace

std::optional<ApiError> read_tool_strict(const OJson& tool, const std::string& field,
                                         bool& strict) {
  strict = false;
  const auto st = tool.find("strict");
  if (st == tool.end() || st->is_null()) return std::nullopt;
  if (!st->is_boolean()) return bad(field, "must be a boolean");
  strict = st->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_tools_strict(const OJson* tools, std::size_t n,
                                          std::vector<bool>& strict) {
  strict.assign(n, false);
  if (!tools) return std::nullopt;
  for (std::size_t i = 0; i < n && i < tools->size(); ++i) {
    bool on = false;
    if (auto e = read_tool_strict((*tools)[i], fmt::format("tools[{}].strict", i), on)) return e;
    strict[i] = on;
  }
  return std::nullopt;
}

std::optional<ApiError> constrain_strict_tools(const ToolForcing& forcing,
                                               const std::vector<OJson>& functions,
                                               const std::vector<bool>& strict,
                                               const ToolFieldNames& names, const Tokenizer& tok,
                                               GrammarCache& cache, GenerationJob& job) {
  if (forcing.mode != ToolForcing::Mode::kAuto || !job.extract_tools) return std::nullopt;
  if (std::find(strict.begin(), strict.end(), true) == strict.end()) return std::nullopt;
  // A response format makes the whole answer one JSON document: no call can begin in it.
  if (job.request.constraint) return std::nullopt;
  std::size_t first_strict = 0;
  while (!strict[first_strict]) ++first_strict;
  const std::string strict_field = fmt::format(fmt::runtime(names.strict), first_strict);
  auto vocab = cache.tool_vocab(tok);
  if (!vocab) return bad(strict_field, vocab.status().message());
  const int32_t marker = tok.token_id(tokens::kDsml);
  // The trigger is the marker token the model samples: a tokenizer that spells it in bytes has
  // no single token to start on.
  if (marker < 0 || (*vocab)->placed_bytes(marker).empty())
    return bad(strict_field,
               "strict tools need the DSML marker as a token of this model's tokenizer");
  GrammarComposer c;
  CallsBuilder b(c, **vocab, tok);
  std::vector<int> invokes;
  for (std::size_t i = 0; i < functions.size(); ++i) {
    int node = -1;
    if (i < strict.size() && strict[i]) {
      if (auto e = b.invoke(functions[i], i, names, node)) return e;
    } else {
      const std::string name = functions[i].value("name", std::string());
      if (name.find_first_of("\"<>") != std::string::npos)
        return bad(fmt::format(fmt::runtime(names.name), i),
                   "with strict tools, no tool's name can hold '\"', '<' or '>'");
      node = b.free_invoke(name, fmt::format(fmt::runtime(names.parameters), i));
    }
    invokes.push_back(node);
  }
  const int root = b.calls(c.alt(std::move(invokes)), job.single_tool_call, true);
  std::shared_ptr<const Grammar> g;
  if (auto e = compile_calls(c, root, tok, cache, g)) return e;
  job.request.constraint = std::move(g);
  job.request.constraint_trigger = marker;
  job.request.constraint_trigger_after = "<";
  job.request.constraint_after_reasoning = job.thinking;
  return std::nullopt;
}

std::vector<OJson> declared_functions(const std::vector<ChatMessage>& messages) {
  std::vector<OJson> out;
  for (const ChatMessage& m : messages) out.insert(out.end(), m.tools.begin(), m.tools.end());
  return out;
}

std::optional<ApiError> check_tool_forcing(const ToolForcing& forcing,
                                           const std::vector<OJson>& functions,
                                           const ToolFieldNames& names) {
  if (!forcing.forced()) return std::nullopt;
  if (functions.empty())
    return bad(names.choice, "forces a tool call, but the request declares no tools");
  if (forcing.mode == ToolForcing::Mode::kRequired) return std::nullopt;
  for (const OJson& fn : functions)
    if (fn.value("name", std::string()) == forcing.name) return std::nullopt;
  return bad(names.choice,
             fmt::format("names the tool \"{}\", which is not in tools", forcing.name));
}

std::optional<ApiError> force_tool_calls(const ToolForcing& forcing,
                                         const std::vector<OJson>& functions,
                                         const ToolFieldNames& names, const Tokenizer& tok,
                                         GrammarCache& cache, GenerationJob& job) {
  if (!forcing.forced()) return std::nullopt;
  if (auto e = check_tool_forcing(forcing, functions, names)) return e;
  if (job.request.constraint)
    return bad(names.choice,
               "a forced tool call cannot be combined with a response format (the calls are the "
               "whole answer)");
  auto vocab = cache.tool_vocab(tok);
  if (!vocab) return bad(names.choice, vocab.status().message());
  GrammarComposer c;
  CallsBuilder b(c, **vocab, tok);
  std::vector<int> invokes;
  for (std::size_t i = 0; i < functions.size(); ++i) {
    if (forcing.mode == ToolForcing::Mode::kNamed &&
        functions[i].value("name", std::string()) != forcing.name)
      continue;
    int node = -1;
    if (auto e = b.invoke(functions[i], i, names, node)) return e;
    invokes.push_back(node);
    if (forcing.mode == ToolForcing::Mode::kNamed) break;  // the first tool of that name
  }
  const int root = b.calls(c.alt(std::move(invokes)), job.single_tool_call);
  std::shared_ptr<const Grammar> g;
  if (auto e = compile_calls(c, root, tok, cache, g)) return e;
  job.request.constraint = std::move(g);
  job.extract_tools = true;
  job.request.constraint_after_reasoning = job.thinking;
  return std::nullopt;
}

}  // namespace dsv41
