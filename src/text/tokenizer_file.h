// Reading and generating Hugging Face `tokenizer.json` files at the level checkpoint tooling needs:
// the id -> token table (vocabulary plus added tokens) and each id's single-token decode. The full
// tokenizer (pre-tokenizer, merges, encode) lives elsewhere in text/.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "text/engram_token_map.h"

namespace dsv41 {

struct TokenizerTable {
  int64_t size = 0;                      // max id + 1
  std::vector<TokenText> texts;          // per id
  std::map<std::string, int64_t> added;  // added-token content -> id
  int64_t id_of(const std::string& added_content) const {
    auto it = added.find(added_content);
    return it == added.end() ? -1 : it->second;
  }
};

Result<TokenizerTable> parse_tokenizer_json(const std::string& json_text, const std::string& where);
Result<TokenizerTable> read_tokenizer_file(const std::string& path);

struct GeneratedTokenizer {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
};

// A small deterministic byte-level BPE in DeepSeek's real file format: ids 0/1/2 = BOS/EOS/pad, the
// 256 byte symbols, merges that build a few hundred common English words (with and without a
// leading space), then V4.1's other special tokens by their real names (text/special_tokens.h).
GeneratedTokenizer make_tiny_tokenizer();

}  // namespace dsv41
