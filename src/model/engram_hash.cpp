// NumPy-compatible PCG64 seeding and Engram hashing (see engram_hash.h).
#include "model/engram_hash.h"

#include <filesystem>
#include <limits>

#include "core/check.h"
#include "text/engram_token_map.h"
#include "text/tokenizer_file.h"

namespace dsv41 {
namespace {

// numpy.random.SeedSequence with a 4-word pool, hashing constants of its reference implementation.
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd,
                   kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

// SeedSequence(entropy).generate_state(4, uint64).
std::array<uint64_t, 4> seed_sequence_state(uint64_t entropy) {
  std::vector<uint32_t> words;
  do {
    words.push_back(uint32_t(entropy & 0xFFFFFFFFu));
    entropy >>= 32;
  } while (entropy);
  uint32_t pool[4];
  uint32_t hc = kInitA;
  for (std::size_t i = 0; i < 4; ++i) pool[i] = hashmix(i < words.size() ? words[i] : 0u, hc);
  for (std::size_t s = 0; s < 4; ++s)
    for (std::size_t d = 0; d < 4; ++d)
      if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], hc));
  for (std::size_t s = 4; s < words.size(); ++s)
    for (std::size_t d = 0; d < 4; ++d) pool[d] = mix(pool[d], hashmix(words[s], hc));
  uint32_t out32[8];
  uint32_t hb = kInitB;
  for (std::size_t i = 0; i < 8; ++i) {
    uint32_t v = pool[i % 4];
    v ^= hb;
    hb *= kMultB;
    v *= hb;
    v ^= v >> kXShift;
    out32[i] = v;
  }
  std::array<uint64_t, 4> out;
  for (std::size_t i = 0; i < 4; ++i)
    out[i] = uint64_t(out32[2 * i]) | (uint64_t(out32[2 * i + 1]) << 32);
  return out;
}

}  // namespace

NumpyPcg64::NumpyPcg64(uint64_t entropy) {
  const auto v = seed_sequence_state(entropy);
  const U128 mult = (U128(2549297995355413924ull) << 64) | 4865540595714422341ull;
  const U128 initstate = (U128(v[0]) << 64) | v[1];
  const U128 initseq = (U128(v[2]) << 64) | v[3];
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  state_ = state_ * mult + inc_;
  state_ += initstate;
  state_ = state_ * mult + inc_;
}

uint64_t NumpyPcg64::next_u64() {
  const U128 mult = (U128(2549297995355413924ull) << 64) | 4865540595714422341ull;
  state_ = state_ * mult + inc_;
  const uint64_t hi = uint64_t(state_ >> 64), lo = uint64_t(state_);
  const unsigned rot = unsigned(hi >> 58);
  const uint64_t x = hi ^ lo;
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint64_t NumpyPcg64::bounded(uint64_t high) {
  const uint64_t rng_excl = high;  // integers(0, high): inclusive range high - 1
  U128 m = U128(next_u64()) * rng_excl;
  uint64_t leftover = uint64_t(m);
  if (leftover < rng_excl) {
    const uint64_t threshold = (0 - rng_excl) % rng_excl;
    while (leftover < threshold) {
      m = U128(next_u64()) * rng_excl;
      leftover = uint64_t(m);
    }
  }
  return uint64_t(m >> 64);
}

std::vector<int64_t> engram_multipliers(int64_t layer, int64_t compressed_vocab,
                                        int64_t max_ngram) {
  const int64_t bound =
      std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / compressed_vocab) / 2);
  DSV41_CHECK_MSG(bound > (int64_t(1) << 32),
                  "Engram multiplier bound must exceed 2^32 (64-bit draw path)");
  NumpyPcg64 rng(uint64_t(10007 * layer));
  std::vector<int64_t> m;
  for (int64_t i = 0; i < max_ngram; ++i)
    m.push_back(2 * int64_t(rng.bounded(uint64_t(bound))) + 1);
  return m;
}

EngramHasher::EngramHasher(const TextConfig& t)
    : layouts_(engram_layouts(t)),
      max_ngram_(t.engram_max_ngram_size),
      n_heads_(t.engram_n_heads),
      pad_(int32_t(t.engram_pad_token_id)),
      columns_(std::size_t((t.engram_max_ngram_size - 1) * t.engram_n_heads)) {
  for (const auto& l : layouts_)
    mult_.push_back(
        engram_multipliers(l.layer, t.engram_compressed_vocab_size, t.engram_max_ngram_size));
}

void EngramHasher::hash(const std::vector<int32_t>& history, int64_t p, std::size_t e,
                        int64_t* rows) const {
  // tok[s] = history[p - s], or pad once the look-back is blocked (before 0 or past a DEAD token).
  uint64_t tok[16];  // max_ngram_size <= 16 (config validation)
  bool blocked = false;
  for (int64_t s = 0; s < max_ngram_; ++s) {
    blocked = blocked || p < s || history[std::size_t(p - s)] == kEngramDead;
    tok[s] = uint64_t(int64_t(blocked ? pad_ : history[std::size_t(p - s)]));
  }
  const auto& mult = mult_[e];
  const auto& lay = layouts_[e];
  uint64_t r =
      tok[0] * uint64_t(mult[0]);  // wrapping uint64, as the reference's int64 never overflows
  for (int64_t n = 2; n <= max_ngram_; ++n) {
    r ^= tok[n - 1] * uint64_t(mult[std::size_t(n - 1)]);
    for (int64_t h = 0; h < n_heads_; ++h) {
      const std::size_t c = std::size_t((n - 2) * n_heads_ + h);
      rows[c] = int64_t(r % uint64_t(lay.primes[c])) + lay.offsets[c];
    }
  }
}

Result<std::vector<int32_t>> load_engram_token_ids(const std::string& dir, const TextConfig& tc) {
  auto tok = read_tokenizer_file((std::filesystem::path(dir) / "tokenizer.json").string());
  if (!tok) return tok.status();
  auto map = build_engram_token_map(tok->texts);
  if (!map) return map.status();
  if (map->size != tc.engram_compressed_vocab_size)
    return Status::error(dir + "/tokenizer.json: the Engram token map has " +
                         std::to_string(map->size) +
                         " compressed ids but config.json says engram_compressed_vocab_size = " +
                         std::to_string(tc.engram_compressed_vocab_size));
  if (tok->size > tc.vocab_size)
    return Status::error(dir + "/tokenizer.json: " + std::to_string(tok->size) +
                         " tokens exceed vocab_size " + std::to_string(tc.vocab_size));
  std::vector<int32_t> ids = std::move(map->map);
  ids.resize(std::size_t(tc.vocab_size), int32_t(tc.engram_pad_token_id));
  return ids;
}

}  // namespace dsv41
