// Derivation of a V4.1-style tokenizer.json from DeepSeek-V3's (spec §11): the base BPE (128,000
// vocabulary entries, 127,741 merges, normalizer, pre-tokenizer, decoder) is kept byte for byte and
// the added-token table is rewritten to V4.1's: ids 0, 1, 2 and 128000..129279 (1,283 added tokens,
// 129,280 ids in all). Ids whose V4.1 content the spec names get that content (`<｜System｜>`
// 128799,
// `<think>` 128821, `</think>` 128822, `｜DSML｜` 128825, `<｜latest_reminder｜>` 128828, task
// tokens,
// `<｜deepseek_image｜>` 129264, multimodal span placeholders 129265..129270 and 129279); other ids
// keep V3's content, and ids V3 lacks become `<｜place▁holder▁no▁N｜>` (N = id - 128000).
// The result reproduces the released Engram token map exactly: 99,092 compressed ids, sha256 of the
// map as int32 LE c60a8632... (tests/text/v41_tokenizer_test.cpp).
#pragma once

#include <string>

#include "core/status.h"

namespace dsv41 {

inline constexpr int32_t kV41VocabSize = 129280;

// Returns the V4.1-style tokenizer.json text; `where` names the input in errors.
Result<std::string> derive_v41_tokenizer_json(const std::string& v3_tokenizer_json,
                                              const std::string& where);

}  // namespace dsv41
