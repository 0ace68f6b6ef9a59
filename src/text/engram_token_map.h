// The Engram compressed token map (spec §6.1): each token id -> a compressed id shared by all
// tokens whose decoded text normalises to the same key. Key = the decoded text after NFKC -> NFD ->
// removal of every General_Category M code point -> per-character lowercase (no context) -> runs of
// [ \t\r\n] to one space -> (a lone " " survives via a sentinel) -> trim of Unicode White_Space; an
// empty result keeps the unnormalised text; a decode that contains U+FFFD (a partial UTF-8 token)
// uses the raw vocabulary string instead. Compressed ids are given in order of first appearance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsv41 {

struct TokenText {
  std::string decoded;  // the single-id decode's bytes (before lossy UTF-8 conversion)
  std::string raw;  // the token's vocabulary string (byte-level alphabet) or added-token content
};

struct EngramTokenMap {
  std::vector<int32_t> map;  // token id -> compressed id
  int32_t size = 0;          // number of distinct keys
};

// Normalised key of one decoded text (valid UTF-8 expected).
Result<std::string> engram_normalize(const std::string& text);
Result<EngramTokenMap> build_engram_token_map(const std::vector<TokenText>& tokens);

}  // namespace dsv41
