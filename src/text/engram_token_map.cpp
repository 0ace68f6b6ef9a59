// ICU-based implementation of the Engram token-map normalisation (rules in engram_token_map.h).
#include "text/engram_token_map.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include <unordered_map>

#include "text/byte_level.h"

namespace dsv41 {
namespace {

constexpr UChar32 kSentinel = 0xE000;

// Rust char::is_whitespace (Unicode White_Space), which the tokenizers crate's Strip uses.
bool rust_whitespace(UChar32 c) {
  return u_hasBinaryProperty(c, UCHAR_WHITE_SPACE);
}

bool is_mark(UChar32 c) {
  const int8_t t = u_charType(c);
  return t == U_NON_SPACING_MARK || t == U_COMBINING_SPACING_MARK || t == U_ENCLOSING_MARK;
}

// Full lowercase mapping of one code point on its own (root locale, no context such as final
// sigma).
void lower_one(UChar32 c, icu::UnicodeString& out) {
  UChar src[2];
  int32_t n = 0;
  U16_APPEND_UNSAFE(src, n, c);
  UChar dst[8];
  UErrorCode st = U_ZERO_ERROR;
  const int32_t m = u_strToLower(dst, 8, src, n, "", &st);
  if (U_FAILURE(st))
    out.append(c);
  else
    out.append(dst, m);
}

}  // namespace

Result<std::string> engram_normalize(const std::string& text) {
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* nfkc = icu::Normalizer2::getNFKCInstance(st);
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(st);
  if (U_FAILURE(st))
    return Status::error(std::string("ICU normalizers unavailable: ") + u_errorName(st));
  icu::UnicodeString s =
      nfd->normalize(nfkc->normalize(icu::UnicodeString::fromUTF8(text), st), st);
  if (U_FAILURE(st))
    return Status::error(std::string("ICU normalisation failed: ") + u_errorName(st));
  icu::UnicodeString lowered;
  for (int32_t i = 0; i < s.length();) {
    const UChar32 c = s.char32At(i);
    i += U16_LENGTH(c);
    if (!is_mark(c)) lower_one(c, lowered);
  }
  // Runs of the four ASCII whitespace characters become one space.
  icu::UnicodeString collapsed;
  bool in_run = false;
  for (int32_t i = 0; i < lowered.length();) {
    const UChar32 c = lowered.char32At(i);
    i += U16_LENGTH(c);
    const bool ws = c == ' ' || c == '\t' || c == '\r' || c == '\n';
    if (ws) {
      if (!in_run) collapsed.append(UChar32(' '));
      in_run = true;
    } else {
      collapsed.append(c);
      in_run = false;
    }
  }
  if (collapsed == icu::UnicodeString(u" ")) collapsed = icu::UnicodeString(kSentinel);
  int32_t b = 0, e = collapsed.length();
  while (b < e && rust_whitespace(collapsed.char32At(b))) b += U16_LENGTH(collapsed.char32At(b));
  while (e > b) {
    const int32_t prev = collapsed.moveIndex32(e, -1);
    if (!rust_whitespace(collapsed.char32At(prev))) break;
    e = prev;
  }
  icu::UnicodeString trimmed(collapsed, b, e - b);
  trimmed.findAndReplace(icu::UnicodeString(kSentinel), icu::UnicodeString(u" "));
  std::string out;
  trimmed.toUTF8String(out);
  return out;
}

Result<EngramTokenMap> build_engram_token_map(const std::vector<TokenText>& tokens) {
  EngramTokenMap m;
  m.map.reserve(tokens.size());
  std::unordered_map<std::string, int32_t> ids;
  static const std::string kReplacement = "\xEF\xBF\xBD";
  for (const TokenText& t : tokens) {
    std::string key;
    if (!is_valid_utf8(t.decoded) || t.decoded.find(kReplacement) != std::string::npos) {
      key = t.raw;
    } else {
      auto k = engram_normalize(t.decoded);
      if (!k) return k.status();
      key = k->empty() ? t.decoded : *k;
    }
    auto [it, inserted] = ids.emplace(key, int32_t(ids.size()));
    m.map.push_back(it->second);
  }
  m.size = int32_t(ids.size());
  return m;
}

}  // namespace dsv41
