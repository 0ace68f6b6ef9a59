// libFuzzer target: arbitrary bytes as an image file (PNG, JPEG, WebP, GIF by their magic bytes):
// decoded within small limits or refused with a message, never a crash, a leak or an allocation
// beyond the limits; a decoded image goes through the resize plan, the planned pixels and the
// patch tensor, whose sizes must agree.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "vision/image_decode.h"
#include "vision/preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace dsv41;
  ImageLimits limits;
  limits.max_pixels = 1 << 20;
  limits.max_side = 4096;
  auto im = decode_image(std::string_view(reinterpret_cast<const char*>(data), size), limits);
  if (!im.is_ok()) {
    if (im.status().message().empty()) std::abort();
    return 0;
  }
  if (im->width < 1 || im->height < 1 || int64_t(im->rgb.size()) != im->width * im->height * 3)
    std::abort();
  ImagePlanOptions o;
  o.min_pixels = 196;  // small plans: the fuzzer's time goes to the decoders
  o.max_tokens = 32;
  o.max_wh_ratio = (size & 1) ? 2.0 : 0.0;
  const ImagePlan plan = plan_image_grid(im->width, im->height, o);
  if (plan.span > o.max_tokens || plan.width % 14 || plan.height % 14) std::abort();
  const RgbImage px = plan_pixels(*im, plan);
  if (px.width != plan.width || px.height != plan.height) std::abort();
  if (int64_t(patch_tensor(px, 14).size()) != plan.vit_w * plan.vit_h * 588) std::abort();
  return 0;
}
