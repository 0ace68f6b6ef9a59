// SHA-256 (OpenSSL EVP) for manifests and checkpoint identity: incremental and one-shot, hex
// output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace dsv41 {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, std::size_t n);
  std::string hex();  // finishes; the object must not be updated afterwards

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string sha256_hex(const void* data, std::size_t n);
// sha256 of a whole file (streamed); errors name the file.
Result<std::string> sha256_file(const std::string& path);

}  // namespace dsv41
