// The OpenAI fields of structured outputs and the compiled-grammar cache (structured_outputs.h).
#include "server/structured_outputs.h"

#include <fmt/format.h>

#include "server/request_fields.h"
#include "text/special_tokens.h"

namespace dsv41 {

std::shared_ptr<GrammarCache> ServedModel::make_grammar_cache() {
  return std::make_shared<GrammarCache>();
}

Result<std::shared_ptr<const TokenVocab>> GrammarCache::vocab_for(const Tokenizer& tok) {
  // Under mu_. One vocabulary per tokenizer (a served model has one; another clears the cache).
  if (tok_ == &tok && vocab_) return vocab_;
  const int32_t eos = tok.token_id(tokens::kEos);
  if (eos < 0) return Status::error("this model's tokenizer has no end-of-sentence token");
  auto v = TokenVocab::from_tokenizer(tok, {eos});
  if (!v) return v.status();
  tok_ = &tok;
  vocab_ = *v;
  tool_vocab_.reset();
  lru_.clear();
  index_.clear();
  return vocab_;
}

Result<std::shared_ptr<const TokenVocab>> GrammarCache::tool_vocab(const Tokenizer& tok) {
  std::lock_guard<std::mutex> lock(mu_);
  auto v = vocab_for(tok);
  if (!v) return v.status();
  if (tool_vocab_) return tool_vocab_;
  // V4.1's tokenizer has the DSML marker as an added token: the tool grammars write it as that
  // token (what the model was trained on), never spelled by bytes.
  std::vector<int32_t> placed;
  const int32_t dsml = tok.token_id(tokens::kDsml);
  if (dsml >= 0 && tok.is_added(dsml)) placed.push_back(dsml);
  auto t = TokenVocab::from_tokenizer(tok, {tok.token_id(tokens::kEos)}, placed);
  if (!t) return t.status();
  tool_vocab_ = *t;
  return tool_vocab_;
}

Result<std::shared_ptr<const Grammar>> GrammarCache::lookup(const Tokenizer& tok, bool tools,
                                                            const std::string& key,
                                                            const Compile& compile) {
  std::shared_ptr<const TokenVocab> vocab;
  if (tools) {
    auto v = tool_vocab(tok);
    if (!v) return v.status();
    vocab = *v;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto v = vocab_for(tok);
    if (!v) return v.status();
    if (!tools) vocab = *v;
    if (tools && vocab != tool_vocab_) return Status::error("the tokenizer changed meanwhile");
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      if (!it->second->status) return it->second->status;
      return it->second->grammar;
    }
  }
  Result<std::shared_ptr<const Grammar>> g = compile(vocab);
  std::lock_guard<std::mutex> lock(mu_);
  ++compiles_;
  if ((tools ? tool_vocab_ : vocab_) != vocab) return g;  // another tokenizer came meanwhile
  if (index_.count(key)) return g;  // compiled twice at once: the first one stays
  lru_.push_front({key, g ? *g : nullptr, g ? Status::ok() : g.status()});
  index_[key] = lru_.begin();
  // The memos keep filling as requests visit new states: weighed again at every insertion.
  std::size_t bytes = 0;
  for (const Entry& e : lru_) bytes += e.grammar ? e.grammar->memo_bytes() : 0;
  while (lru_.size() > 1 && (lru_.size() > capacity_ || bytes > max_bytes_)) {
    bytes -= lru_.back().grammar ? lru_.back().grammar->memo_bytes() : 0;
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
  return g;
}

std::string GrammarCache::options_key() const {
  return fmt::format("{}|{}|{}|{}", options_.max_whitespace, options_.time_budget_ms,
                     options_.state_budget, options_.precompute_ms);
}

Result<std::shared_ptr<const Grammar>> GrammarCache::get(const Tokenizer& tok, Kind kind,
                                                         const std::string& spec) {
  // The key holds everything the grammar depends on: the kind, the text, the options.
  const std::string key = fmt::format("{}|{}\n{}", int(kind), options_key(), spec);
  return lookup(tok, false, key, [&](std::shared_ptr<const TokenVocab> vocab) {
    switch (kind) {
      case Kind::kJsonSchema:
        return Grammar::from_json_schema(spec, vocab, options_);
      case Kind::kJsonObject:
        return Grammar::any_json_object(vocab, options_);
      case Kind::kRegex:
        return Grammar::from_regex(spec, vocab, options_);
      case Kind::kChoice:
        break;
    }
    std::vector<std::string> choices;
    for (const auto& c : nlohmann::json::parse(spec)) choices.push_back(c.get<std::string>());
    return Grammar::from_choices(choices, vocab, options_);
  });
}

Result<std::shared_ptr<const Grammar>> GrammarCache::get_composed(const Tokenizer& tok,
                                                                  const GrammarComposer& composer,
                                                                  int root) {
  const std::string key = fmt::format("composed|{}\n{}", options_key(), composer.key(root));
  return lookup(tok, true, key, [&](std::shared_ptr<const TokenVocab> vocab) {
    return Grammar::compose(composer, root, vocab, options_);
  });
}

int64_t GrammarCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}
std::size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}
int64_t GrammarCache::compiles() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compiles_;
}

namespace {

// A compile error as a 400 on `param`: the grammar's message ("json_schema: unsupported keyword
// "not" at /properties/x") names the keyword and its path; a budget refusal says which.
ApiError compile_error(const std::string& param, const Status& st) {
  ApiError e = bad(param, st.message());
  if (st.kind() == ErrorKind::kCapacity) e.code = "grammar_too_complex";
  return e;
}

struct Asked {
  GrammarCache::Kind kind;
  std::string spec;
  std::string param;  // the field it came from, for errors
};

// The json_schema fields of `holder` (name, strict, schema; description is free), named under
// `prefix`. A schema absent or null is any JSON value unless `required` (the Responses API).
// strict or not, the output follows the schema exactly (the grammar has no lenient mode).
std::optional<ApiError> read_json_schema(const OJson& holder, const std::string& prefix,
                                         bool required, std::optional<Asked>& asked) {
  if (const auto n = holder.find("name"); n != holder.end() && !n->is_string())
    return bad(prefix + ".name", "must be a string");
  if (const auto s = holder.find("strict"); s != holder.end() && !s->is_null() && !s->is_boolean())
    return bad(prefix + ".strict", "must be a boolean");
  const auto schema = holder.find("schema");
  const bool absent = schema == holder.end() || schema->is_null();
  if (absent && required) return bad(prefix + ".schema", "required (a JSON Schema object)");
  if (!absent && !schema->is_object() && !schema->is_boolean())
    return bad(prefix + ".schema", "must be a JSON Schema object");
  asked = Asked{GrammarCache::Kind::kJsonSchema, absent ? "{}" : dump_safe(*schema),
                prefix + ".schema"};
  return std::nullopt;
}

// A format object {"type": text | json_object | json_schema, ...} named `param`: chat's
// response_format holds the schema's fields in a nested "json_schema" object, the Responses
// API's text.format holds them itself (`nested` false) and requires the schema.
std::optional<ApiError> read_format(const OJson& f, const std::string& param, bool nested,
                                    std::optional<Asked>& asked) {
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    return bad(param, "must be an object with a string \"type\"");
  const std::string type = f["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    asked = Asked{GrammarCache::Kind::kJsonObject, "", param};
    return std::nullopt;
  }
  if (type != "json_schema")
    return bad(param + ".type",
               fmt::format("\"{}\" is not supported (text, json_object or json_schema)", type));
  if (!nested) return read_json_schema(f, param, true, asked);
  const auto js = f.find("json_schema");
  if (js == f.end() || !js->is_object())
    return bad(param + ".json_schema", "required (an object with name and schema)");
  return read_json_schema(*js, param + ".json_schema", false, asked);
}

// The grammar `asked` names, compiled (or from the cache) into the request's constraint.
std::optional<ApiError> compile_into(const Asked& asked, const Tokenizer& tok, GrammarCache& cache,
                                     GenerationJob& job) {
  auto g = cache.get(tok, asked.kind, asked.spec);
  if (!g) return compile_error(asked.param, g.status());
  job.request.constraint = *g;
  return std::nullopt;
}

// vLLM's structured_outputs: exactly one of json (a schema, object or JSON text), regex, choice,
// json_object (true); grammar and structural_tag are refused; its whitespace options are not
// implemented except their no-op values.
std::optional<ApiError> read_structured_outputs(const OJson& so, std::optional<Asked>& asked) {
  if (!so.is_object()) return bad("structured_outputs", "must be an object");
  int kinds = 0;
  for (const auto& [k, v] : so.items()) {
    if (v.is_null()) continue;
    const std::string param = "structured_outputs." + k;
    if (k == "json") {
      ++kinds;
      if (v.is_string()) {
        asked = Asked{GrammarCache::Kind::kJsonSchema, v.get<std::string>(), param};
      } else if (v.is_object() || v.is_boolean()) {
        asked = Asked{GrammarCache::Kind::kJsonSchema, dump_safe(v), param};
      } else {
        return bad(param, "must be a JSON Schema (an object or its JSON text)");
      }
    } else if (k == "regex") {
      ++kinds;
      if (!v.is_string()) return bad(param, "must be a string (a regular expression)");
      asked = Asked{GrammarCache::Kind::kRegex, v.get<std::string>(), param};
    } else if (k == "choice") {
      ++kinds;
      if (!v.is_array() || v.empty()) return bad(param, "must be a non-empty array of strings");
      for (const auto& c : v)
        if (!c.is_string() || c.get<std::string>().empty())
          return bad(param, "must hold non-empty strings");
      asked = Asked{GrammarCache::Kind::kChoice, v.dump(), param};
    } else if (k == "json_object") {
      if (!v.is_boolean()) return bad(param, "must be a boolean");
      if (v.get<bool>()) {
        ++kinds;
        asked = Asked{GrammarCache::Kind::kJsonObject, "", param};
      }
    } else if (k == "grammar" || k == "structural_tag") {
      return bad(param, "is not supported (json, regex, choice and json_object are)");
    } else if (k == "disable_any_whitespace") {
      // The grammar writes compact JSON: no whitespace either way.
      if (!v.is_boolean()) return bad(param, "must be a boolean");
    } else if (k == "disable_fallback" || k == "disable_additional_properties") {
      if (!v.is_boolean()) return bad(param, "must be a boolean");
      if (k == "disable_additional_properties" && !v.get<bool>())
        continue;  // the default: additional properties follow the schema
    } else if (k == "whitespace_pattern") {
      return bad(param, "is not supported (the JSON written is compact)");
    } else if (k == "backend" || k == "_backend" || k == "_backend_was_auto") {
      continue;  // vLLM's backend choice: this server has one
    } else {
      return bad(param, "is not a structured_outputs field (json, regex, choice, json_object)");
    }
  }
  if (kinds != 1)
    return bad("structured_outputs", kinds == 0
                                         ? "needs one of json, regex, choice or json_object"
                                         : "may set only one of json, regex, choice, json_object");
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_structured_output(const OJson& body, const Tokenizer& tok,
                                                GrammarCache& cache, GenerationJob& job) {
  std::optional<Asked> from_rf, from_so;
  if (const auto rf = body.find("response_format"); rf != body.end() && !rf->is_null())
    if (auto e = read_format(*rf, "response_format", true, from_rf)) return e;
  if (const auto so = body.find("structured_outputs"); so != body.end() && !so->is_null())
    if (auto e = read_structured_outputs(*so, from_so)) return e;
  if (from_rf && from_so)
    return bad("structured_outputs", "cannot be combined with a response_format other than text");
  const std::optional<Asked>& asked = from_rf ? from_rf : from_so;
  if (!asked) return std::nullopt;
  return compile_into(*asked, tok, cache, job);
}

std::optional<ApiError> parse_responses_text_format(const OJson& format, const Tokenizer& tok,
                                                    GrammarCache& cache, GenerationJob& job) {
  std::optional<Asked> asked;
  if (auto e = read_format(format, "text.format", false, asked)) return e;
  if (!asked) return std::nullopt;
  return compile_into(*asked, tok, cache, job);
}

}  // namespace dsv41
