// V4.1 added-token table (see v41_tokenizer.h).
#include "text/v41_tokenizer.h"

#include <cctype>
#include <map>
#include <nlohmann/json.hpp>

#include "text/special_tokens.h"

namespace dsv41 {
namespace {

struct Named {
  int32_t id;
  const char* content;
  bool special;
};

// The ids spec §11 names for V4.1. `special` decides whether skip_special_tokens drops the token:
// <｜System｜> is documented as not special; the chat/DSML markers stay visible in decoded text.
const Named kV41Named[] = {
    {128799, tokens::kSystem, false},        {128821, tokens::kThinkBegin, false},
    {128822, tokens::kThinkEnd, false},      {128825, tokens::kDsml, false},
    {128828, tokens::kLatestReminder, true}, {128829, tokens::kAction, true},
    {128830, tokens::kQuery, true},          {128831, tokens::kAuthority, true},
    {128832, tokens::kDomain, true},         {128836, tokens::kTitle, true},
    {128845, tokens::kReadUrl, true},        {129264, tokens::kImage, true},
};

// [begin, end) of the JSON value of the top-level key `key` in `text` (a string-aware bracket
// scan), so the rest of the file can be kept byte for byte. Returns false if not found.
bool find_top_level_value(const std::string& text, const std::string& key, std::size_t* begin,
                          std::size_t* end) {
  int depth = 0;
  bool in_str = false;
  const std::string quoted = "\"" + key + "\"";
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_str) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_str = false;
      continue;
    }
    if (c == '"') {
      if (depth == 1 && text.compare(i, quoted.size(), quoted) == 0) {
        std::size_t k = text.find(':', i + quoted.size());
        if (k == std::string::npos) return false;
        ++k;
        while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
        // Scan the value: an array or object with nesting, strings skipped.
        int d = 0;
        bool s = false;
        for (std::size_t m = k; m < text.size(); ++m) {
          const char x = text[m];
          if (s) {
            if (x == '\\')
              ++m;
            else if (x == '"')
              s = false;
          } else if (x == '"') {
            s = true;
          } else if (x == '[' || x == '{') {
            ++d;
          } else if (x == ']' || x == '}') {
            if (--d == 0) {
              *begin = k;
              *end = m + 1;
              return true;
            }
          }
        }
        return false;
      }
      in_str = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

}  // namespace

Result<std::string> derive_v41_tokenizer_json(const std::string& v3, const std::string& where) {
  // A std::map-backed DOM for reading (an order-preserving one is quadratic on 128,000 vocab keys);
  // the output splices the new table into the original text so everything else stays
  // byte-identical.
  auto j = nlohmann::json::parse(v3, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("added_tokens") ||
      !j["added_tokens"].is_array() || !j.contains("model") || !j["model"].contains("vocab"))
    return Status::error(where + ": not a tokenizer.json with model.vocab and added_tokens");
  if (j["model"]["vocab"].size() != 128000)
    return Status::error(where + ": model.vocab has " + std::to_string(j["model"]["vocab"].size()) +
                         " entries; DeepSeek-V3's base vocabulary has 128000");
  std::map<int32_t, nlohmann::ordered_json> table;  // small: ~1,300 entries
  for (const auto& a : j["added_tokens"]) {
    if (!a.contains("id") || !a["id"].is_number_unsigned())
      return Status::error(where + ": malformed added token");
    table[a["id"].get<int32_t>()] = nlohmann::ordered_json::parse(a.dump());
  }
  for (int32_t id : {0, 1, 2})
    if (!table.count(id))
      return Status::error(where + ": added token " + std::to_string(id) + " is missing");
  auto make = [](int32_t id, const std::string& content, bool special) {
    return nlohmann::ordered_json{{"id", id},          {"content", content}, {"single_word", false},
                                  {"lstrip", false},   {"rstrip", false},    {"normalized", false},
                                  {"special", special}};
  };
  for (int32_t id = 128000; id < kV41VocabSize; ++id)
    if (!table.count(id))
      table[id] = make(id, "<｜place▁holder▁no▁" + std::to_string(id - 128000) + "｜>", true);
  for (const Named& n : kV41Named) table[n.id] = make(n.id, n.content, n.special);
  for (int32_t id : {129265, 129266, 129267, 129268, 129269, 129270, 129279})
    table[id] = make(id, "<|place_holder_mm_span_0" + std::to_string(id - 128865) + "|>", true);
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (auto& [id, a] : table) added.push_back(a);
  std::size_t b = 0, e = 0;
  if (!find_top_level_value(v3, "added_tokens", &b, &e))
    return Status::error(where + ": added_tokens not found");
  return v3.substr(0, b) + added.dump(2) + v3.substr(e);
}

}  // namespace dsv41
