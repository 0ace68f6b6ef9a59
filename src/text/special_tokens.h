// V4.1 special-token names (spec §11). Ids differ between the real tokenizer and the generated tiny
// ones, so code looks tokens up by these names, never by hard-coded ids.
#pragma once

namespace dsv41::tokens {

inline constexpr const char* kBos = "<｜begin▁of▁sentence｜>";
inline constexpr const char* kEos = "<｜end▁of▁sentence｜>";
inline constexpr const char* kPad = "<｜▁pad▁｜>";
inline constexpr const char* kSystem = "<｜System｜>";  // not flagged special in V4.1
inline constexpr const char* kUser = "<｜User｜>";
inline constexpr const char* kAssistant = "<｜Assistant｜>";
inline constexpr const char* kThinkBegin = "<think>";
inline constexpr const char* kThinkEnd = "</think>";
inline constexpr const char* kDsml = "｜DSML｜";
inline constexpr const char* kLatestReminder = "<｜latest_reminder｜>";
inline constexpr const char* kAction = "<｜action｜>";
inline constexpr const char* kQuery = "<｜query｜>";
inline constexpr const char* kAuthority = "<｜authority｜>";
inline constexpr const char* kDomain = "<｜domain｜>";
inline constexpr const char* kTitle = "<｜title｜>";
inline constexpr const char* kReadUrl = "<｜read_url｜>";
inline constexpr const char* kImage = "<｜deepseek_image｜>";
// Fill-in-the-middle (DeepSeek-V3's ids 128800-128802; the derived V4.1 table keeps them).
inline constexpr const char* kFimHole = "<｜fim▁hole｜>";
inline constexpr const char* kFimBegin = "<｜fim▁begin｜>";
inline constexpr const char* kFimEnd = "<｜fim▁end｜>";

}  // namespace dsv41::tokens
