// Engram prime/offset derivation (see engram_layout.h). Primality by deterministic Miller-Rabin.
#include "model/engram_layout.h"

#include <set>
#include <string>

namespace dsv41 {
namespace {

__extension__ using U128 = unsigned __int128;

uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m) {
  return uint64_t(U128(a) * b % m);
}

uint64_t pow_mod(uint64_t a, uint64_t e, uint64_t m) {
  uint64_t r = 1;
  a %= m;
  while (e) {
    if (e & 1) r = mul_mod(r, a, m);
    a = mul_mod(a, a, m);
    e >>= 1;
  }
  return r;
}

}  // namespace

bool is_prime_u64(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) d >>= 1, ++s;
  // These bases are a proof of primality for every n < 2^64.
  for (uint64_t a : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    uint64_t x = pow_mod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s; ++r) {
      x = mul_mod(x, x, n);
      if (x == n - 1) {
        composite = false;
        break;
      }
    }
    if (composite) return false;
  }
  return true;
}

int64_t EngramLayerLayout::rows() const {
  int64_t s = 0;
  for (int64_t p : primes) s += p;
  return s;
}

std::vector<EngramLayerLayout> engram_layouts(const TextConfig& t) {
  std::set<int64_t> used;
  std::vector<EngramLayerLayout> out;
  for (int64_t layer : t.engram_layer_ids) {
    EngramLayerLayout l;
    l.layer = layer;
    for (int64_t n = 2; n <= t.engram_max_ngram_size; ++n) {
      int64_t cur = t.engram_vocab_size - 1;
      for (int64_t h = 0; h < t.engram_n_heads; ++h) {
        do {
          ++cur;
          while (!is_prime_u64(uint64_t(cur))) ++cur;
        } while (used.count(cur));
        used.insert(cur);
        l.primes.push_back(cur);
      }
    }
    int64_t off = 0;
    for (int64_t p : l.primes) l.offsets.push_back(off), off += p;
    out.push_back(std::move(l));
  }
  return out;
}

Status check_engram_tables(const TextConfig& t) {
  const auto layouts = engram_layouts(t);
  for (std::size_t i = 0; i < layouts.size() && i < t.engram_num_embeddings.size(); ++i) {
    if (layouts[i].rows() != t.engram_num_embeddings[i])
      return Status::error("text_config.engram_num_embeddings[" + std::to_string(i) +
                           "]: " + std::to_string(t.engram_num_embeddings[i]) +
                           " rows, but the hash primes of Engram layer " +
                           std::to_string(layouts[i].layer) + " sum to " +
                           std::to_string(layouts[i].rows()));
  }
  return Status::ok();
}

}  // namespace dsv41
