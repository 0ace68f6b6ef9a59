// V4.1 added-token table (see v41_tokenizer.h).
#include "text/v41_tokenizer.h"

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
    {128799, tokens::kSystem, false},  {128821, tokens::kThinkBegin, false}, {128822, tokens::kThinkEnd, false},
    {128825, tokens::kDsml, false},    {128828, tokens::kLatestReminder, true}, {128829, tokens::kAction, true},
    {128830, tokens::kQuery, true},    {128831, tokens::kAuthority, true},  {128832, tokens::kDomain, true},
    {128836, tokens::kTitle, true},    {128845, tokens::kReadUrl, true},    {129264, tokens::kImage, true},
};

}  // namespace

Result<std::string> derive_v41_tokenizer_json(const std::string& v3, const std::string& where) {
  auto j = nlohmann::ordered_json::parse(v3, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("added_tokens") || !j["added_tokens"].is_array() ||
      !j.contains("model") || !j["model"].contains("vocab"))
    return Status::error(where + ": not a tokenizer.json with model.vocab and added_tokens");
  if (j["model"]["vocab"].size() != 128000)
    return Status::error(where + ": model.vocab has " + std::to_string(j["model"]["vocab"].size()) +
                         " entries; DeepSeek-V3's base vocabulary has 128000");
  std::map<int32_t, nlohmann::ordered_json> table;
  for (const auto& a : j["added_tokens"]) {
    if (!a.contains("id") || !a["id"].is_number_unsigned()) return Status::error(where + ": malformed added token");
    table[a["id"].get<int32_t>()] = a;
  }
  for (int32_t id : {0, 1, 2})
    if (!table.count(id)) return Status::error(where + ": added token " + std::to_string(id) + " is missing");
  auto make = [](int32_t id, const std::string& content, bool special) {
    return nlohmann::ordered_json{{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
                                  {"rstrip", false},   {"normalized", false}, {"special", special}};
  };
  for (int32_t id = 128000; id < kV41VocabSize; ++id)
    if (!table.count(id)) table[id] = make(id, "<｜place▁holder▁no▁" + std::to_string(id - 128000) + "｜>", true);
  for (const Named& n : kV41Named) table[n.id] = make(n.id, n.content, n.special);
  for (int32_t id : {129265, 129266, 129267, 129268, 129269, 129270, 129279})
    table[id] = make(id, "<|place_holder_mm_span_0" + std::to_string(id - 128865) + "|>", true);
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (auto& [id, a] : table) added.push_back(a);
  j["added_tokens"] = added;
  return j.dump(2) + "\n";
}

}  // namespace dsv41
