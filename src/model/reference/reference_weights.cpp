// WeightReader: views over checkpoint tensors (see reference_weights.h).
#include "model/reference/reference_weights.h"

namespace dsv41::ref {
namespace {

std::string scale_name(const std::string& weight) {
  const std::string suf = ".weight";
  DSV41_CHECK_MSG(weight.size() > suf.size() &&
                      weight.compare(weight.size() - suf.size(), suf.size(), suf) == 0,
                  weight.c_str());
  return weight.substr(0, weight.size() - suf.size()) + ".scale";
}

}  // namespace

WeightView WeightReader::view(const std::string& name, bool flat) const {
  const Checkpoint::Entry* e = ckpt_.find(name);
  DSV41_CHECK_MSG(e != nullptr, name.c_str());  // the inventory check ran at load
  const auto& shape = e->info->shape;
  WeightView v;
  v.name = name;
  v.w = ckpt_.bytes(name).data();
  if (flat) {
    v.rows = 1;
    v.cols = int64_t(e->info->numel());
  } else {
    DSV41_CHECK_MSG(shape.size() == 2, name.c_str());
    v.rows = shape[0];
    v.cols = shape[1];
  }
  switch (e->info->dtype) {
    case DType::kBF16:
      v.kind = WeightView::Kind::kBF16;
      break;
    case DType::kF32:
      v.kind = WeightView::Kind::kF32;
      break;
    case DType::kF8_E4M3:
      v.kind = WeightView::Kind::kFP8;
      v.s = ckpt_.bytes(scale_name(name)).data();
      v.b0 = block_[0];
      v.b1 = block_[1];
      break;
    case DType::kI8:
      v.kind = WeightView::Kind::kFP4;
      v.s = ckpt_.bytes(scale_name(name)).data();
      v.cols *= 2;
      break;
    default:
      DSV41_CHECK_MSG(false, name.c_str());
  }
  DSV41_CHECK_MSG(!flat || v.kind == WeightView::Kind::kBF16 || v.kind == WeightView::Kind::kF32,
                  name.c_str());
  return v;
}

void WeightReader::release(const std::string& name) const {
  ckpt_.release(name);
  const std::string suf = ".weight";
  if (name.size() > suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0)
    ckpt_.release(scale_name(name));
}

}  // namespace dsv41::ref
