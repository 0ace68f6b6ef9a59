// read_text_file / write_text_file.
#include "io/text_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace dsv41 {

Result<std::string> read_text_file(const std::string& path, std::size_t limit) {
  std::error_code ec;
  const auto sz = std::filesystem::file_size(path, ec);
  if (ec) return Status::error(path + ": cannot open: " + ec.message());
  if (sz > limit)
    return Status::error(path + ": file too large (" + std::to_string(sz) + " bytes)");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Status write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::error(path + ": cannot create");
  out << text;
  out.close();
  if (!out) return Status::error(path + ": write failed");
  return Status::ok();
}

}  // namespace dsv41
