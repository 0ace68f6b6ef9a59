// The chat page and dashboard files (src/server/web), built into the binary at compile time by
// cmake/embed_files.cmake: `dsv41 serve` answers GET /, /dashboard and /web/NAME from these bytes
// and fetches nothing at run time.
#pragma once

#include <span>
#include <string_view>

namespace dsv41 {

struct WebAsset {
  std::string_view name;          // file name under src/server/web, served as /web/NAME
  std::string_view content_type;  // by its extension
  std::string_view body;
};

// Every file, sorted by name; the bytes live as long as the program.
std::span<const WebAsset> web_assets();

// The file called `name`, or nullptr.
inline const WebAsset* find_web_asset(std::string_view name) {
  for (const WebAsset& a : web_assets())
    if (a.name == name) return &a;
  return nullptr;
}

}  // namespace dsv41
