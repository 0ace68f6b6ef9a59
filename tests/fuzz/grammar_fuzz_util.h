// What the grammar fuzz targets share: a small byte-level vocabulary (every byte plus merged
// pieces, an end id and an excluded special id) and the invariant that a mask equals what
// accept_token takes, token by token.
#pragma once

#include <string>
#include <vector>

#include "fuzz_util.h"
#include "grammar/grammar.h"

namespace dsv41::fuzz {

inline const std::shared_ptr<const TokenVocab>& grammar_vocab() {
  static const std::shared_ptr<const TokenVocab> v = [] {
    std::vector<std::string> b = {"<eos>", "<special>"};
    for (int i = 0; i < 256; ++i) b.push_back(std::string(1, static_cast<char>(i)));
    for (const char* s : {"{\"", "\":", "\",\"", "\"}", "]}", "true", "null", "12", "-0", ".5",
                          "e+", "\\n", "\\u00", "é", "\xe6\x97", "\x97\xa5", "ab", "\"\"", "},{"})
      b.push_back(s);
    auto r = TokenVocab::create(b, {1}, {0});
    if (!r.is_ok()) std::abort();
    return r.value();
  }();
  return v;
}

// The mask of m equals, id by id, what accept_token takes (checked by accepting and rolling back).
inline void check_mask(const Matcher& m) {
  const TokenVocab& v = *grammar_vocab();
  std::vector<uint64_t> mask(v.mask_words());
  m.fill_mask(mask);
  Matcher probe = m;
  for (int32_t id = 0; id < v.size(); ++id) {
    bool in_mask = (mask[id >> 6] >> (id & 63)) & 1;
    bool taken = probe.accept_token(id);
    if (in_mask != taken) invariant_failed("mask differs from accept_token");
    if (taken) probe.rollback(1);
    if (v.is_end(id) && taken != m.is_complete()) invariant_failed("end id vs is_complete");
  }
}

}  // namespace dsv41::fuzz
