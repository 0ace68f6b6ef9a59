// Helpers for io tests: a per-test temporary directory and raw safetensors byte builders.
#pragma once

#include <cstdint>
#include <string>

namespace dsv41::testing {

// A fresh empty directory under $TMPDIR (or /tmp), removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// 8-byte little-endian length + header + `data_bytes` bytes of a counting pattern.
std::string raw_safetensors(const std::string& header, std::size_t data_bytes);
void write_file(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);

}  // namespace dsv41::testing
