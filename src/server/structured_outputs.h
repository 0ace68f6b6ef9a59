// Structured outputs in the OpenAI APIs (issue 32; docs/structured-outputs.md): chat completions'
// and completions' `response_format` (json_object, json_schema) and vLLM's `structured_outputs`
// (json, regex, choice, json_object) read into a constraint on the request (GenerationRequest::
// constraint), compiled against the model's vocabulary on the request's own thread (never the
// engine's). Compiled grammars are kept in a small LRU keyed by (kind, text, options), refusals
// too, so a client repeating a schema (or a schema that exceeds the compile budget) pays its
// compilation once.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/status.h"
#include "grammar/grammar.h"
#include "server/openai_api.h"  // ApiError, GenerationJob
#include "text/json_ordered.h"
#include "text/tokenizer.h"

namespace dsv41 {

class GrammarCache {
 public:
  // At most `capacity` grammars, weighing at most `max_bytes` together (their memos of per-state
  // token sets: a few MB each on a 129k vocabulary); the least recently used go first, the newest
  // always stays.
  explicit GrammarCache(std::size_t capacity = 64, std::size_t max_bytes = std::size_t(256) << 20,
                        GrammarOptions options = {})
      : capacity_(capacity), max_bytes_(max_bytes), options_(options) {}
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice };
  // The grammar of `spec` (kJsonSchema: the schema's JSON text; kRegex: the pattern; kChoice: a
  // JSON array of the strings; kJsonObject: ignored) over `tok`'s vocabulary, its end id EOS.
  // Errors: kInvalidArgument (the message names the keyword and its path), kCapacity (a compile
  // budget). Thread-safe; compilation runs outside the lock.
  Result<std::shared_ptr<const Grammar>> get(const Tokenizer& tok, Kind kind,
                                             const std::string& spec);
  // A composed grammar (forced tool calls) over `tok`'s vocabulary with the added DSML marker
  // token placed (TokenVocab::placed_bytes; none when the tokenizer has no such added token),
  // keyed by the composer's key(root) and the options; same errors and caching as get().
  Result<std::shared_ptr<const Grammar>> get_composed(const Tokenizer& tok,
                                                      const GrammarComposer& composer, int root);
  // The vocabulary get_composed() compiles against (built once): composers read its placed ids.
  Result<std::shared_ptr<const TokenVocab>> tool_vocab(const Tokenizer& tok);
  int64_t hits() const;
  int64_t compiles() const;
  std::size_t size() const;

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const Grammar> grammar;
    Status status;
  };
  Result<std::shared_ptr<const TokenVocab>> vocab_for(const Tokenizer& tok);
  std::string options_key() const;
  using Compile =
      std::function<Result<std::shared_ptr<const Grammar>>(std::shared_ptr<const TokenVocab>)>;
  Result<std::shared_ptr<const Grammar>> lookup(const Tokenizer& tok, bool tools,
                                                const std::string& key, const Compile& compile);
  std::size_t capacity_, max_bytes_;
  GrammarOptions options_;
  mutable std::mutex mu_;
  const Tokenizer* tok_ = nullptr;  // the vocabulary below is this tokenizer's
  std::shared_ptr<const TokenVocab> vocab_;
  std::shared_ptr<const TokenVocab> tool_vocab_;  // vocab_ with the DSML marker placed
  std::list<Entry> lru_;                          // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  int64_t hits_ = 0, compiles_ = 0;
};

// Reads `response_format` and `structured_outputs` of an OpenAI chat or completions body into
// job.request.constraint (none: unconstrained). A 400 names the field: an unknown type, a
// malformed field, an unsupported schema keyword (with its path in the schema), a schema over the
// compile budget.
std::optional<ApiError> parse_structured_output(const OJson& body, const Tokenizer& tok,
                                                GrammarCache& cache, GenerationJob& job);

// The Responses API's `text.format` ({"type": "text"}, {"type": "json_object"} or {"type":
// "json_schema", "name", "schema", "strict", "description"}, flat as that API has it), read into
// the same constraint; errors name text.format.*.
std::optional<ApiError> parse_responses_text_format(const OJson& format, const Tokenizer& tok,
                                                    GrammarCache& cache, GenerationJob& job);

}  // namespace dsv41
