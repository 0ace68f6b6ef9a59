// A compiled Oniguruma regex (the engine Hugging Face tokenizers use for pre-tokenizer patterns),
// kept in its own translation unit because oniguruma.h and ICU both define `UChar`.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dsv41 {

class OnigRegex {
 public:
  static Result<std::unique_ptr<OnigRegex>> compile(const std::string& pattern,
                                                    const std::string& where);
  ~OnigRegex();
  // Splits s keeping every match as its own piece (split behaviour "Isolated"); empty pieces are
  // dropped and an empty match advances by one character. Thread-safe.
  void split_isolated(std::string_view s, std::vector<std::string>* out) const;

 private:
  OnigRegex() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41
