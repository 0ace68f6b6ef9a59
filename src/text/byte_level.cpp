// Byte-level alphabet tables and UTF-8 helpers.
#include "text/byte_level.h"

#include <array>
#include <unordered_map>

namespace dsv41 {
namespace {

struct Tables {
  std::array<std::string, 256> sym;
  std::unordered_map<uint32_t, uint8_t> rev;
  Tables() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? uint32_t(b) : next++;
      append_utf8(sym[b], cp);
      rev[cp] = uint8_t(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

// Decodes one UTF-8 sequence at s[i]; returns the code point and advances i, or -1 if malformed.
int64_t decode_one(std::string_view s, std::size_t& i) {
  const auto c0 = uint8_t(s[i]);
  int len;
  uint32_t cp;
  if (c0 < 0x80)
    len = 1, cp = c0;
  else if (c0 >= 0xC2 && c0 <= 0xDF)
    len = 2, cp = c0 & 0x1F;
  else if (c0 >= 0xE0 && c0 <= 0xEF)
    len = 3, cp = c0 & 0x0F;
  else if (c0 >= 0xF0 && c0 <= 0xF4)
    len = 4, cp = c0 & 0x07;
  else
    return -1;
  if (i + std::size_t(len) > s.size()) return -1;
  for (int k = 1; k < len; ++k) {
    const auto c = uint8_t(s[i + std::size_t(k)]);
    if ((c & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (c & 0x3F);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return -1;
  i += std::size_t(len);
  return cp;
}

}  // namespace

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

const std::string& byte_to_symbol(uint8_t b) {
  return tables().sym[b];
}

std::optional<std::string> symbols_to_bytes(std::string_view token) {
  std::string out;
  std::size_t i = 0;
  while (i < token.size()) {
    const int64_t cp = decode_one(token, i);
    if (cp < 0) return std::nullopt;
    auto it = tables().rev.find(uint32_t(cp));
    if (it == tables().rev.end()) return std::nullopt;
    out += char(it->second);
  }
  return out;
}

std::size_t utf8_invalid_prefix(std::string_view s, std::size_t i) {
  const auto c0 = uint8_t(s[i]);
  std::size_t len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF)
    len = 2;
  else if (c0 >= 0xE0 && c0 <= 0xEF)
    len = 3, lo = c0 == 0xE0 ? 0xA0 : 0x80, hi = c0 == 0xED ? 0x9F : 0xBF;
  else if (c0 >= 0xF0 && c0 <= 0xF4)
    len = 4, lo = c0 == 0xF0 ? 0x90 : 0x80, hi = c0 == 0xF4 ? 0x8F : 0xBF;
  else
    return 1;
  std::size_t k = 1;
  for (; k < len && i + k < s.size(); ++k) {
    const auto c = uint8_t(s[i + k]);
    if (k == 1 ? (c < lo || c > hi) : (c & 0xC0) != 0x80) break;
  }
  return k;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = i;
    if (decode_one(s, j) >= 0) {
      out.append(s.substr(i, j - i));
      i = j;
    } else {
      out += "\xEF\xBF\xBD";
      i += utf8_invalid_prefix(s, i);
    }
  }
  return out;
}

bool is_valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size())
    if (decode_one(s, i) < 0) return false;
  return true;
}

}  // namespace dsv41
