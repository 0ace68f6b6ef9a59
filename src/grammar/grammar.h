// Structured outputs, public API (docs/structured-outputs.md): a constraint (JSON Schema, plain
// JSON object, regex, choice list) compiled against one vocabulary into an immutable Grammar that
// threads share, and the per-sequence Matcher that advances by tokens and fills token masks.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dsv41 {

struct TokenizerTable;
class Tokenizer;

// The vocabulary as the grammar sees it: each id's bytes, the ids never allowed inside a
// constrained output (special/added tokens, empty tokens) and the end ids (EOS, stop tokens)
// allowed only when the document is complete. Built once per model, shared by every grammar
// compiled against it.
class TokenVocab {
 public:
  // token_bytes[id] = the raw bytes id decodes to; excluded ids never appear in a mask except as
  // end ids. Ids of end_ids outside [0, size) are an input error.
  // `placed`: excluded (added) tokens a grammar may still write where it names them
  // (GrammarComposer::token: the DSML marker of a forced tool call). Each gets private bytes,
  // kPlacedLead then one byte 1..255 (its index + 1), which no other token can spell: with any
  // placed id, every other token holding the byte 0xFF (never part of UTF-8 text, so never needed
  // by a constraint) is excluded too. At most 255 placed ids.
  static Result<std::shared_ptr<const TokenVocab>> create(std::vector<std::string> token_bytes,
                                                          const std::vector<int32_t>& excluded,
                                                          const std::vector<int32_t>& end_ids,
                                                          const std::vector<int32_t>& placed = {});
  static constexpr char kPlacedLead = '\xFF';
  // From a tokenizer.json table: every added token (special or not) is excluded.
  static Result<std::shared_ptr<const TokenVocab>> from_table(const TokenizerTable& table,
                                                              const std::vector<int32_t>& end_ids);
  // From a loaded tokenizer (the engine's): every added token is excluded but the `placed` ones.
  static Result<std::shared_ptr<const TokenVocab>> from_tokenizer(
      const Tokenizer& tokenizer, const std::vector<int32_t>& end_ids,
      const std::vector<int32_t>& placed = {});

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  std::size_t mask_words() const { return (bytes_.size() + 63) / 64; }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  bool is_end(int32_t id) const;
  bool is_excluded(int32_t id) const { return excluded_[id] != 0; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  // The private bytes of a placed id ("" when id is not placed).
  std::string placed_bytes(int32_t id) const;
  const std::vector<int32_t>& placed_ids() const { return placed_; }

  // The byte trie of the allowed tokens in preorder (lexicographic), walked once per cached mask.
  struct Trie {
    std::vector<uint8_t> byte;        // edge byte into node i (node 0 = root, unused)
    std::vector<uint16_t> depth;      // bytes from the root
    std::vector<uint32_t> end;        // one past the last node of i's subtree
    std::vector<uint32_t> tok_begin;  // tokens ending at node i: ids[tok_begin[i]..tok_begin[i+1])
    std::vector<int32_t> ids;         // token ids in preorder
    // Bytes of the deepest token of i's subtree below i's parent (depth of it - depth[i] + 1):
    // how far a walk from i's parent can read inside the subtree.
    std::vector<uint16_t> height;
    std::vector<uint32_t> pos;  // per token id: its index in ids (UINT32_MAX if not in the trie)
  };
  const Trie& trie() const { return trie_; }
  int max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<uint8_t> excluded_;
  std::vector<int32_t> end_ids_;
  std::vector<int32_t> placed_;
  Trie trie_;
  int max_depth_ = 0;
};

struct GrammarOptions {
  // Optional whitespace between JSON tokens: 0 = compact JSON only (the default: a model cannot
  // loop on whitespace); N > 0 allows up to N bytes of [ \t\n] at each structural gap.
  int max_whitespace = 0;
  // Compile budgets: exceeding either returns an error (ErrorKind::kCapacity), never a stall.
  double time_budget_ms = 1000;
  int64_t state_budget = 200000;  // automaton states over all rules
  // After compiling, the per-state token sets are computed for up to this long (the rest fill on
  // first use, each costing up to ~2 ms on a 129k vocabulary): trades compile time for mask p99.
  // Most states derive their sets from an equivalent computed one in microseconds, so typical
  // schemas finish well within it (docs/structured-outputs.md); it bounds a compile near 100 ms.
  double precompute_ms = 80;
};

// A grammar built from pieces (forced tool calls: literal wrappers around JSON values): nodes are
// literal bytes, a placed token of the vocabulary, a JSON value under a schema (or a sub-schema of
// a document, its $refs resolved in the whole document), a raw-text regex, and sequences,
// alternations and bounded repetitions of nodes. Build it, then Grammar::compose(composer, root).
// key() is a canonical text of everything that goes in (a cache key with the options).
class GrammarComposer {
 public:
  int literal(std::string bytes);
  int token(int32_t placed_id);  // the vocabulary's placed token (TokenVocab::create's `placed`)
  // The JSON text of a schema document (kept once, however many values use it).
  int document(std::string schema_json);
  // A JSON value under the sub-schema at JSON pointer `pointer` ("" = the whole document) of
  // `doc`; `where` names it in errors (prefixed to the schema compiler's message).
  int json_value(int doc, std::string pointer, std::string where);
  // Raw UTF-8 text matching the whole regex (docs/structured-outputs.md subset).
  int regex(std::string pattern, std::string where);
  int seq(std::vector<int> parts);
  int alt(std::vector<int> alternatives);
  int repeat(int part, int min, int max);  // max -1: unbounded
  std::string key(int root) const;

  enum class Kind : uint8_t { kLiteral, kToken, kJson, kRegex, kSeq, kAlt, kRepeat };
  struct Node {
    Kind kind;
    std::string text;  // kLiteral bytes, kJson pointer, kRegex pattern
    std::string where;
    int64_t a = 0, b = 0, c = 0;  // kToken id; kJson doc; kRepeat min, max
    std::vector<int> kids;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<std::string>& documents() const { return docs_; }

 private:
  int add(Node n);
  std::vector<Node> nodes_;
  std::vector<std::string> docs_;
};

namespace grammar_detail {
struct Automaton;
struct Equivalence;
struct NodeMasks;
}  // namespace grammar_detail

// A compiled constraint: immutable except for its memo of per-state token sets, which fills lazily
// (thread-safe) or at once with warm(). Share it across sequences with shared_ptr.
class Grammar {
 public:
  // JSON Schema (draft 2020-12 subset, docs/structured-outputs.md); schema_json is its text.
  static Result<std::shared_ptr<const Grammar>> from_json_schema(
      std::string_view schema_json, std::shared_ptr<const TokenVocab> vocab,
      const GrammarOptions& options = {});
  // Any JSON object (OpenAI's response_format json_object).
  static Result<std::shared_ptr<const Grammar>> any_json_object(
      std::shared_ptr<const TokenVocab> vocab, const GrammarOptions& options = {});
  // The whole output matches the regex (the subset of docs/structured-outputs.md).
  static Result<std::shared_ptr<const Grammar>> from_regex(std::string_view pattern,
                                                           std::shared_ptr<const TokenVocab> vocab,
                                                           const GrammarOptions& options = {});
  // The output is exactly one of the strings.
  static Result<std::shared_ptr<const Grammar>> from_choices(
      const std::vector<std::string>& choices, std::shared_ptr<const TokenVocab> vocab,
      const GrammarOptions& options = {});
  // A composed grammar (GrammarComposer), `root` its start node; errors as the pieces' own, or
  // kInvalidArgument for a token the vocabulary has not placed.
  static Result<std::shared_ptr<const Grammar>> compose(const GrammarComposer& composer, int root,
                                                        std::shared_ptr<const TokenVocab> vocab,
                                                        const GrammarOptions& options = {});
  ~Grammar();

  const TokenVocab& vocab() const { return *vocab_; }
  int64_t num_states() const;
  // Computes every state's token sets now (else the first visit of a state pays for its own), or
  // as many as fit in max_ms; returns how many states are left to fill lazily.
  int64_t warm(double max_ms = 1e300) const;
  // Bytes held by the memo of per-state token sets (it grows as states are first visited): what a
  // cache of compiled grammars weighs them by.
  std::size_t memo_bytes() const;

  // Internal (matcher.cpp).
  const grammar_detail::Automaton& automaton() const { return *automaton_; }
  const grammar_detail::NodeMasks& node_masks(uint32_t node) const;

 private:
  Grammar() = default;
  static Result<std::shared_ptr<const Grammar>> finish(Result<grammar_detail::Automaton> a,
                                                       std::shared_ptr<const TokenVocab> vocab,
                                                       const GrammarOptions& options);
  std::shared_ptr<const TokenVocab> vocab_;
  std::unique_ptr<grammar_detail::Automaton> automaton_;
  // Which nodes' token sets can be derived from (or are) another's; null without leaf rules.
  std::unique_ptr<grammar_detail::Equivalence> equivalence_;
  mutable std::mutex memo_mutex_;
  mutable std::unique_ptr<std::atomic<const grammar_detail::NodeMasks*>[]> memo_;
  mutable std::vector<std::unique_ptr<grammar_detail::NodeMasks>> memo_owned_;
};

// One sequence's position in a grammar. Not thread-safe; copy it to fork (speculation) or use
// rollback(). The end ids are accepted only when the document is complete; after one, nothing.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar);

  // Advances by the token's bytes; false (state unchanged) if the grammar refuses it.
  bool accept_token(int32_t id);
  // Advances by raw bytes (a prompt-supplied prefix, tests); false (unchanged) if refused.
  bool accept_bytes(std::string_view bytes);
  // Undoes the last n accepted tokens/byte strings (n <= num_accepted()).
  void rollback(int n);
  int num_accepted() const { return static_cast<int>(history_.size()) - 1; }

  // Bit id of words is set iff token id may come next. words.size() >= vocab().mask_words().
  void fill_mask(std::span<uint64_t> words) const;
  // The document is complete here (an end id may come next).
  bool is_complete() const;
  // An end id was accepted: the output is over.
  bool is_terminated() const;
  // The bytes that must come next whatever is chosen (empty when there is a choice or at the end).
  std::string forced_bytes() const;

  // A stack of automaton nodes, bottom first; a state is a set of them (nondeterminism).
  using Stack = std::vector<uint32_t>;
  struct State {
    std::vector<Stack> stacks;
    bool terminated = false;
  };

 private:
  bool advance_bytes(std::string_view bytes, State& out) const;
  std::shared_ptr<const Grammar> grammar_;
  std::vector<State> history_;  // history_[0] = start; back() = now
};

}  // namespace dsv41
