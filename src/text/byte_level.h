// The byte-level alphabet of GPT-2-style BPE tokenizers (used by DeepSeek's tokenizer.json): each
// byte 0..255 maps to one printable code point, so token strings are valid Unicode. Printable
// Latin-1 bytes map to themselves; the other 68 bytes map to U+0100.. in byte order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsv41 {

// UTF-8 of the code point standing for byte b.
const std::string& byte_to_symbol(uint8_t b);
// Bytes of a token string written in the byte-level alphabet; nullopt if a character is outside it.
std::optional<std::string> symbols_to_bytes(std::string_view token);
// Appends the UTF-8 encoding of code point cp.
void append_utf8(std::string& out, uint32_t cp);
// True if s is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool is_valid_utf8(std::string_view s);
// s with every maximal ill-formed subsequence replaced by U+FFFD (Rust's String::from_utf8_lossy,
// which the byte-level decoder uses).
std::string utf8_lossy(std::string_view s);
// Length of the ill-formed prefix at s[i] that one U+FFFD replaces (the "maximal subpart": the
// longest prefix of a well-formed sequence, at least 1 byte).
std::size_t utf8_invalid_prefix(std::string_view s, std::size_t i);

}  // namespace dsv41
