// Weights of the reference, read straight from the official layout through the checkpoint's mmap
// and dequantized exactly row by row as they are used (spec §3.1): BF16/F32 as is, F8_E4M3 x E8M0
// (block shape from quantization_config.weight_block_size), I8-packed MXFP4 x E8M0 per 32. No
// dequantized copy is kept, so a layer's weights can be dropped from memory (release) once used:
// that is what lets the oracle stream the 510 GB checkpoint with a few GB of RAM.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtypes.h"
#include "io/checkpoint.h"

namespace dsv41::ref {

struct WeightView {
  enum class Kind { kBF16, kF32, kFP8, kFP4 };
  Kind kind = Kind::kF32;
  int64_t rows = 0, cols = 0;  // logical shape (FP4: unpacked columns)
  const uint8_t* w = nullptr;  // weight bytes
  const uint8_t* s = nullptr;  // scale bytes (FP8, FP4)
  int64_t b0 = 32, b1 = 32;    // FP8 block shape
  std::string name;            // weight tensor name (for release)

  // Exact dequantization of row r into out[cols].
  template <typename T>
  void row(int64_t r, T* out) const {
    switch (kind) {
      case Kind::kBF16:
        for (int64_t c = 0; c < cols; ++c) {
          uint16_t b;
          std::memcpy(&b, w + 2 * (r * cols + c), 2);
          out[c] = T(bf16_to_float(b));
        }
        break;
      case Kind::kF32:
        for (int64_t c = 0; c < cols; ++c) {
          float f;
          std::memcpy(&f, w + 4 * (r * cols + c), 4);
          out[c] = T(f);
        }
        break;
      case Kind::kFP8: {
        const uint8_t* srow = s + (r / b0) * ((cols + b1 - 1) / b1);
        const uint8_t* wr = w + r * cols;
        for (int64_t c0 = 0; c0 < cols; c0 += b1) {
          const T sc = T(e8m0_to_double(srow[c0 / b1]));
          for (int64_t c = c0; c < std::min(cols, c0 + b1); ++c)
            out[c] = T(e4m3_to_float(wr[c])) * sc;
        }
        break;
      }
      case Kind::kFP4: {
        const uint8_t* wr = w + r * (cols / 2);
        const uint8_t* srow = s + r * (cols / 32);
        for (int64_t c0 = 0; c0 < cols; c0 += 32) {
          const T sc = T(e8m0_to_double(srow[c0 / 32]));
          for (int64_t c = c0; c < c0 + 32; ++c)
            out[c] = T(e2m1_to_float(e2m1_nibble(wr, std::size_t(c)))) * sc;
        }
        break;
      }
    }
  }
};

// y[r] = sum_c W[r, c] x[c] for rows [r0, r0 + n) (n = -1: all), summed left to right in T.
template <typename T>
void matvec(const WeightView& w, const T* x, T* y, int64_t r0 = 0, int64_t n = -1) {
  thread_local std::vector<T> buf;
  buf.resize(std::size_t(w.cols));
  if (n < 0) n = w.rows - r0;
  for (int64_t r = 0; r < n; ++r) {
    w.row(r0 + r, buf.data());
    T acc = 0;
    for (int64_t c = 0; c < w.cols; ++c) acc += buf[std::size_t(c)] * x[c];
    y[r] = acc;
  }
}

class WeightReader {
 public:
  WeightReader(const Checkpoint& ckpt, std::vector<int64_t> block)
      : ckpt_(ckpt), block_(std::move(block)) {}

  // Any-shape BF16/F32 tensor, flattened (small tensors: norms, biases, sinks).
  template <typename T>
  std::vector<T> vec(const std::string& name) const {
    const WeightView v = view(name, /*flat=*/true);
    std::vector<T> out(std::size_t(v.cols));
    v.row(0, out.data());
    return out;
  }
  // 2-D weight [out, in] in BF16, F32, F8_E4M3 (+ .scale) or I8 MXFP4 (+ .scale).
  WeightView mat(const std::string& name) const { return view(name, false); }
  // Drops the resident pages of a weight and its scale.
  void release(const std::string& name) const;

 private:
  WeightView view(const std::string& name, bool flat) const;
  const Checkpoint& ckpt_;
  std::vector<int64_t> block_;
};

}  // namespace dsv41::ref
