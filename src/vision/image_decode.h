// Decoding an image file's bytes into 8-bit RGB as DeepSeek's preprocessing sees it (the imaging
// library's open + convert("RGB")): PNG (libpng), JPEG (libjpeg-turbo), WebP (libwebp) and GIF
// (giflib, the first frame). Sizes are checked against ImageLimits from the file's header, before
// any pixel buffer is allocated; corrupt or truncated files are errors naming the format and what
// the decoder said. EXIF orientation is not applied (DeepSeek's processor does not apply it).
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "vision/image.h"

namespace dsv41 {

enum class ImageFormat { kUnknown, kPng, kJpeg, kWebp, kGif };

ImageFormat sniff_image_format(std::string_view bytes);
const char* image_format_name(ImageFormat f);

Result<RgbImage> decode_image(std::string_view bytes, const ImageLimits& limits = {});

}  // namespace dsv41
