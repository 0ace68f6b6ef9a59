// Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json` (the format DeepSeek ships):
// added/special tokens matched first (leftmost-longest, on the raw text), then the normalizer
// (empty sequence, NFC or NFKC), the pre-tokenizer sequence (regex Split with Oniguruma, behaviour
// Isolated; ByteLevel without its own regex), BPE merges by rank, and the ByteLevel decoder.
// Anything outside that subset is refused at load with the field named, never silently mis-encoded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dsv41 {

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& path);
  static Result<std::unique_ptr<Tokenizer>> from_json(const std::string& json_text,
                                                      const std::string& where);
  ~Tokenizer();

  // Token ids of `text` (no BOS/EOS added). Invalid UTF-8 is first replaced by U+FFFD, as a JS
  // string or a Rust String would hold it. Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;
  // Bytes of the ids joined, then UTF-8 with U+FFFD for ill-formed sequences; special added tokens
  // are dropped when skip_special. Ids outside the vocabulary are an error naming the position.
  Result<std::string> decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // Raw bytes of one token (added tokens: their content), before UTF-8 validation.
  std::string token_bytes(int32_t id) const;

  int32_t vocab_size() const;  // max id + 1
  int32_t token_id(
      std::string_view token) const;  // added-token content or vocab string; -1 if none
  bool is_special(int32_t id) const;
  // An added token of tokenizer.json (special or not): matched on the raw text, never by BPE.
  bool is_added(int32_t id) const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41
