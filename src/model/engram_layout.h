// Engram hash geometry derived from the config (spec §6.2): the prime table size of every hash
// column and each column's row offset into its layer's table. Primes: one global "used" set; per
// Engram layer, per n-gram order n = 2..max, restart at engram_vocab_size - 1 and take, per head,
// the next unused prime above the previous one. A layer's primes must sum to its
// engram_num_embeddings entry (the table's row count), which validation checks.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace dsv41 {

struct EngramLayerLayout {
  int64_t layer = 0;             // backbone layer index
  std::vector<int64_t> primes;   // (max_ngram-1) * n_heads columns: order-major, then head
  std::vector<int64_t> offsets;  // exclusive prefix sum of primes (table starts at 0)
  int64_t rows() const;          // sum of primes
};

bool is_prime_u64(uint64_t n);
std::vector<EngramLayerLayout> engram_layouts(const TextConfig& t);
// Checks Σ primes == engram_num_embeddings per layer; the error names the layer and both numbers.
Status check_engram_tables(const TextConfig& t);

}  // namespace dsv41
