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

#include <vector>

namespace dsv41 {
struct TensorSpec;
}

namespace dsv41::testing {
// Writes a valid safetensors file whose data section is a hole (ftruncate): headers are real,
// tensor bytes read as zeros and take no disk space. Used to prove header-only inspection at full
// scale.
void write_sparse_safetensors(const std::string& path, const std::vector<TensorSpec>& specs);
}  // namespace dsv41::testing
