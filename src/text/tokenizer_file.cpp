// tokenizer.json id-table parsing and the tiny tokenizer generator.
#include "text/tokenizer_file.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/text_file.h"
#include "text/byte_level.h"
#include "text/special_tokens.h"

namespace dsv41 {
namespace {

using ojson = nlohmann::ordered_json;

// Words whose merge chains make up the tiny vocabulary (lowercase and capitalised, with and without
// a leading space); enough for demo text to tokenize into multi-byte tokens.
constexpr const char* kWords[] = {
    "the",   "of",     "and",  "to",   "in",    "is",     "that",  "it",    "was",   "for",
    "on",    "are",    "as",   "with", "he",    "they",   "at",    "be",    "this",  "have",
    "from",  "or",     "one",  "had",  "by",    "word",   "but",   "not",   "what",  "all",
    "were",  "we",     "when", "your", "can",   "said",   "there", "use",   "an",    "each",
    "which", "she",    "do",   "how",  "their", "if",     "will",  "up",    "other", "about",
    "out",   "many",   "then", "them", "these", "so",     "some",  "her",   "would", "make",
    "like",  "him",    "into", "time", "has",   "look",   "two",   "more",  "write", "go",
    "see",   "number", "no",   "way",  "could", "people", "my",    "than",  "first", "water",
    "been",  "call",   "who",  "its",  "now",   "find",   "long",  "down",  "day",   "did",
    "get",   "come",   "made", "may",  "part",  "hello",  "world", "model", "token", "deep",
    "seek",  "code",   "data", "you",  "yes",
};

}  // namespace

Result<TokenizerTable> parse_tokenizer_json(const std::string& text, const std::string& where) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::error(where + ": not a JSON object");
  if (!j.contains("model") || !j["model"].is_object() || !j["model"].contains("vocab") ||
      !j["model"]["vocab"].is_object())
    return Status::error(where + ": missing model.vocab");
  std::map<int64_t, TokenText> by_id;
  TokenizerTable t;
  if (j.contains("added_tokens")) {
    if (!j["added_tokens"].is_array())
      return Status::error(where + ": added_tokens is not an array");
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_unsigned() ||
          !a.contains("content") || !a["content"].is_string())
        return Status::error(where + ": malformed added_tokens entry");
      const int64_t id = a["id"].get<int64_t>();
      const std::string content = a["content"].get<std::string>();
      by_id[id] = TokenText{content, content};
      t.added[content] = id;
    }
  }
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
    if (!it->is_number_unsigned())
      return Status::error(where + ": model.vocab['" + it.key() + "'] is not an id");
    if (by_id.count(it->get<int64_t>())) continue;  // an added token: decodes to its content
    auto bytes = symbols_to_bytes(it.key());
    if (!bytes)
      return Status::error(where + ": model.vocab token '" + it.key() +
                           "' is not in the byte-level alphabet");
    by_id[it->get<int64_t>()] = TokenText{*bytes, it.key()};
  }
  if (by_id.empty()) return Status::error(where + ": empty vocabulary");
  t.size = by_id.rbegin()->first + 1;
  if (int64_t(by_id.size()) != t.size)
    return Status::error(where + ": token ids are not contiguous (" + std::to_string(by_id.size()) +
                         " tokens, max id " + std::to_string(t.size - 1) + ")");
  for (auto& [id, tt] : by_id) t.texts.push_back(std::move(tt));
  return t;
}

Result<TokenizerTable> read_tokenizer_file(const std::string& path) {
  auto text = read_text_file(path);
  if (!text) return text.status();
  return parse_tokenizer_json(text.value(), path);
}

GeneratedTokenizer make_tiny_tokenizer() {
  ojson vocab = ojson::object();
  std::vector<std::string> id_to_token;
  auto add_vocab = [&](const std::string& tok) {
    vocab[tok] = id_to_token.size();
    id_to_token.push_back(tok);
  };
  ojson added = ojson::array();
  auto add_special = [&](const std::string& content, bool special, bool in_vocab) {
    added.push_back({{"id", in_vocab ? id_to_token.size() : 0},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", special}});
    return added.size() - 1;
  };
  for (const char* s : {tokens::kBos, tokens::kEos, tokens::kPad}) {
    add_special(s, true, true);
    add_vocab(s);
  }
  for (int b = 0; b < 256; ++b) add_vocab(byte_to_symbol(uint8_t(b)));
  std::vector<std::string> merges;
  std::set<std::string> have(id_to_token.begin(), id_to_token.end());
  for (const char* w : kWords) {
    const std::string lower = w;
    std::string cap = lower;
    cap[0] = char(cap[0] - 'a' + 'A');
    std::string spaced_lower(1, ' '), spaced_cap(1, ' ');
    spaced_lower += lower;
    spaced_cap += cap;
    for (const std::string& word : {lower, spaced_lower, cap, spaced_cap}) {
      std::string cur = byte_to_symbol(uint8_t(word[0]));
      for (std::size_t i = 1; i < word.size(); ++i) {
        const std::string next = byte_to_symbol(uint8_t(word[i]));
        const std::string merged = cur + next;
        if (!have.count(merged)) {
          merges.push_back(cur + " " + next);
          add_vocab(merged);
          have.insert(merged);
        }
        cur = merged;
      }
    }
  }
  struct Special {
    const char* content;
    bool special;
  };
  const Special specials[] = {
      {tokens::kSystem, false},        {tokens::kUser, true},      {tokens::kAssistant, true},
      {tokens::kThinkBegin, false},    {tokens::kThinkEnd, false}, {tokens::kDsml, false},
      {tokens::kLatestReminder, true}, {tokens::kAction, true},    {tokens::kQuery, true},
      {tokens::kAuthority, true},      {tokens::kDomain, true},    {tokens::kTitle, true},
      {tokens::kReadUrl, true},        {tokens::kImage, true},
  };
  int64_t next_id = int64_t(id_to_token.size());
  for (const Special& s : specials) {
    const std::size_t k = add_special(s.content, s.special, false);
    added[k]["id"] = next_id++;
  }
  ojson pre = ojson::array();
  auto split = [&](const std::string& re) {
    pre.push_back({{"type", "Split"},
                   {"pattern", {{"Regex", re}}},
                   {"behavior", "Isolated"},
                   {"invert", false}});
  };
  split("\\p{N}{1,3}");
  split("[一-龥\u3040-ゟ゠-ヿ]+");
  split(
      "[!\"#$%&'()*+,\\-./"
      ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
      "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+");
  pre.push_back({{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", true},
                 {"use_regex", false}});
  ojson tj;
  tj["version"] = "1.0";
  tj["truncation"] = nullptr;
  tj["padding"] = nullptr;
  tj["added_tokens"] = added;
  tj["normalizer"] = {{"type", "Sequence"}, {"normalizers", ojson::array()}};
  tj["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", pre}};
  tj["post_processor"] = {{"type", "ByteLevel"},
                          {"add_prefix_space", true},
                          {"trim_offsets", false},
                          {"use_regex", true}};
  tj["decoder"] = {{"type", "ByteLevel"},
                   {"add_prefix_space", true},
                   {"trim_offsets", true},
                   {"use_regex", true}};
  tj["model"] = {{"type", "BPE"},
                 {"dropout", nullptr},
                 {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr},
                 {"fuse_unk", false},
                 {"byte_fallback", false},
                 {"vocab", vocab},
                 {"merges", merges}};
  auto added_token = [](const char* content) {
    return ojson{{"__type", "AddedToken"}, {"content", content}, {"lstrip", false},
                 {"normalized", true},     {"rstrip", false},    {"single_word", false}};
  };
  ojson cfg;
  cfg["add_bos_token"] = false;
  cfg["add_eos_token"] = false;
  cfg["bos_token"] = added_token(tokens::kBos);
  cfg["eos_token"] = added_token(tokens::kEos);
  cfg["pad_token"] =
      added_token(tokens::kEos);  // as in the released file (config.json says pad = 2)
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["legacy"] = true;
  cfg["model_max_length"] = 1048576;
  cfg["unk_token"] = nullptr;
  cfg["tokenizer_class"] = "LlamaTokenizerFast";
  return GeneratedTokenizer{tj.dump(2) + "\n", cfg.dump(2) + "\n"};
}

}  // namespace dsv41
