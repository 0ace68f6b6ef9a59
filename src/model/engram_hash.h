// Engram n-gram hashing (spec §6.2): per-layer multipliers drawn exactly as DeepSeek's reference
// draws them (NumPy default_rng(10007 * layer).integers(0, bound, 4), i.e. SeedSequence -> PCG64
// XSL-RR -> Lemire bounded integers), and the per-position hash of the compressed-id history into
// row indices of each Engram layer's table.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

#include "model/config.h"
#include "model/engram_layout.h"

namespace dsv41 {

inline constexpr int32_t kEngramDead = -1;  // history entry of an image-span token

// NumPy's PCG64 bit generator seeded through SeedSequence(entropy), as default_rng(entropy) does.
class NumpyPcg64 {
 public:
  explicit NumpyPcg64(uint64_t entropy);
  uint64_t next_u64();
  // Generator.integers(0, high) for int64 with high > 2^32 (64-bit Lemire rejection).
  uint64_t bounded(uint64_t high);

 private:
  __extension__ typedef unsigned __int128 U128;
  U128 state_ = 0, inc_ = 0;
};

// Multipliers of one Engram layer: 2 * v + 1 for v drawn in [0, bound), bound =
// max(1, (INT64_MAX / compressed_vocab) / 2), max_ngram_size of them.
std::vector<int64_t> engram_multipliers(int64_t layer, int64_t compressed_vocab, int64_t max_ngram);

class EngramHasher {
 public:
  explicit EngramHasher(const TextConfig& t);
  // Row indices (one per hash column, (max_ngram-1) * n_heads of them) for Engram layer `e` at
  // absolute position p of `history` (compressed ids, kEngramDead for image tokens).
  void hash(const std::vector<int32_t>& history, int64_t p, std::size_t e, int64_t* rows) const;
  std::size_t columns() const { return columns_; }
  const std::vector<EngramLayerLayout>& layouts() const { return layouts_; }
  const std::vector<std::vector<int64_t>>& multipliers() const { return mult_; }

 private:
  std::vector<EngramLayerLayout> layouts_;
  std::vector<std::vector<int64_t>> mult_;
  int64_t max_ngram_, n_heads_;
  int32_t pad_;
  std::size_t columns_;
};

// The compressed-id table of every token id (spec §6.1) from a model directory's tokenizer.json,
// checked against the config (engram_compressed_vocab_size; no more tokens than vocab_size) and
// extended to vocab_size with the pad id for ids beyond the tokenizer. Both forward paths load it.
Result<std::vector<int32_t>> load_engram_token_ids(const std::string& dir, const TextConfig& tc);

}  // namespace dsv41
