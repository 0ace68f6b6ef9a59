// SHA-256 via OpenSSL's EVP interface.
#include "io/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <vector>

#include "core/check.h"

namespace dsv41 {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  DSV41_CHECK(ctx_->md != nullptr);
  DSV41_CHECK(EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) == 1);
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(ctx_->md);
}

void Sha256::update(const void* data, std::size_t n) {
  if (n) DSV41_CHECK(EVP_DigestUpdate(ctx_->md, data, n) == 1);
}

std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  DSV41_CHECK(EVP_DigestFinal_ex(ctx_->md, md, &len) == 1);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

std::string sha256_hex(const void* data, std::size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.hex();
}

Result<std::string> sha256_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::error(path + ": cannot open");
  Sha256 h;
  std::vector<char> buf(1 << 20);
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update(buf.data(), n);
  const bool err = std::ferror(f) != 0;
  std::fclose(f);
  if (err) return Status::error(path + ": read error");
  return h.hex();
}

}  // namespace dsv41
