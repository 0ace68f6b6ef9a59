// spdlog-backed implementation of core/log.h: one stderr logger, created on first use.
#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace dsv41::log {
namespace {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto lg = spdlog::stderr_color_mt("dsv41");
    lg->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
    return lg;
  }();
  return *l;
}

spdlog::level::level_enum to_spd(Level level) {
  switch (level) {
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarn:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

void set_level(Level level) {
  logger().set_level(to_spd(level));
}
void write(Level level, const std::string& message) {
  logger().log(to_spd(level), message);
}

}  // namespace dsv41::log
