// Logging: a thin layer over spdlog so the rest of the code depends on fmt-style calls only.
// Logs go to stderr (stdout is reserved for command output such as JSON).
#pragma once

#include <fmt/format.h>

#include <string>

namespace dsv41::log {

enum class Level { kDebug, kInfo, kWarn, kError };

void set_level(Level level);
void write(Level level, const std::string& message);

template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kError, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dsv41::log
