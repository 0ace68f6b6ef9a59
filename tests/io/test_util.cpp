// Implementation of the io test helpers.
#include "io/test_util.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dsv41::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/dsv41_test_XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string raw_safetensors(const std::string& header, std::size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xFF);
  out += header;
  for (std::size_t i = 0; i < data_bytes; ++i) out += char(i * 7 + 1);
  return out;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace dsv41::testing

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace dsv41::testing {

void write_sparse_safetensors(const std::string& path, const std::vector<TensorSpec>& specs) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  for (const auto& s : specs) {
    h[s.name] = {{"dtype", std::string(dtype_name(s.dtype))},
                 {"shape", s.shape},
                 {"data_offsets", {off, off + s.nbytes()}}};
    off += s.nbytes();
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) head[std::size_t(i)] = char((n >> (8 * i)) & 0xFF);
  write_file(path, head + header);
  if (::truncate(path.c_str(), off_t(8 + n + off)) != 0)
    throw std::runtime_error("truncate failed: " + path);
}

}  // namespace dsv41::testing
