// Image resizing bit-exact to the imaging library DeepSeek's preprocessing uses (Pillow's
// Image.resize with BICUBIC on 8-bit RGB): separable convolution, horizontal pass then vertical,
// coefficients in double normalised per output pixel then rounded to 22-bit fixed point, sums in
// 32-bit integers from half a unit, clipped to 0-255 after each pass.
#pragma once

#include <cstdint>

#include "vision/image.h"

namespace dsv41 {

// `in` resized to width x height (both >= 1). The same size returns a copy, as Pillow does.
RgbImage resize_bicubic(const RgbImage& in, int64_t width, int64_t height);

// Pillow's ImageOps.pad(in, (width, height), BICUBIC, color): the image scaled to fit inside
// (Python's round, half to even, for the scaled side), pasted centred (offset rounded the same
// way) on a canvas of `grey`.
RgbImage letterbox_bicubic(const RgbImage& in, int64_t width, int64_t height, uint8_t grey);

}  // namespace dsv41
