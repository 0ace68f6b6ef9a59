// WeightReader: dequantization of each official dtype (see reference_weights.h).
#include "model/reference/reference_weights.h"

#include <cstring>

namespace dsv41::ref {
namespace {

std::string scale_name(const std::string& weight) {
  const std::string suf = ".weight";
  DSV41_CHECK(weight.size() > suf.size() &&
              weight.compare(weight.size() - suf.size(), suf.size(), suf) == 0);
  return weight.substr(0, weight.size() - suf.size()) + ".scale";
}

}  // namespace

template <typename T>
std::vector<T> WeightReader<T>::vec(const std::string& name) const {
  const Checkpoint::Entry* e = ckpt_.find(name);
  DSV41_CHECK_MSG(e != nullptr, name.c_str());  // the inventory check ran at load
  const auto bytes = ckpt_.bytes(name);
  const uint64_t n = e->info->numel();
  std::vector<T> out(n);
  if (e->info->dtype == DType::kBF16) {
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      out[i] = T(bf16_to_float(b));
    }
  } else {
    DSV41_CHECK_MSG(e->info->dtype == DType::kF32, name.c_str());
    for (uint64_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      out[i] = T(f);
    }
  }
  return out;
}

template <typename T>
Mat<T> WeightReader<T>::mat(const std::string& name) const {
  const Checkpoint::Entry* e = ckpt_.find(name);
  DSV41_CHECK_MSG(e != nullptr && e->info->shape.size() == 2, name.c_str());
  Mat<T> m;
  m.rows = e->info->shape[0];
  m.cols = e->info->shape[1];
  const auto w = ckpt_.bytes(name);
  switch (e->info->dtype) {
    case DType::kBF16:
    case DType::kF32:
      m.v = vec(name);
      break;
    case DType::kF8_E4M3: {
      const auto s = ckpt_.bytes(scale_name(name));
      const int64_t b0 = block_[0], b1 = block_[1], sc = (m.cols + b1 - 1) / b1;
      m.v.resize(std::size_t(m.rows * m.cols));
      for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c)
          m.v[std::size_t(r * m.cols + c)] =
              T(e4m3_to_float(w[std::size_t(r * m.cols + c)])) *
              T(e8m0_to_double(s[std::size_t((r / b0) * sc + c / b1)]));
      break;
    }
    case DType::kI8: {  // MXFP4: [out, in/2] packed, scale [out, in/32]
      const auto s = ckpt_.bytes(scale_name(name));
      m.cols *= 2;
      m.v.resize(std::size_t(m.rows * m.cols));
      for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c)
          m.v[std::size_t(r * m.cols + c)] =
              T(e2m1_to_float(e2m1_nibble(w.data() + r * m.cols / 2, std::size_t(c)))) *
              T(e8m0_to_double(s[std::size_t(r * (m.cols / 32) + c / 32)]));
      break;
    }
    default:
      DSV41_CHECK_MSG(false, name.c_str());
  }
  return m;
}

template class WeightReader<float>;
template class WeightReader<double>;

}  // namespace dsv41::ref
