// An 8-bit RGB image in memory (row-major, 3 bytes a pixel) and the limits a decoded image must
// respect before any pixel buffer is allocated (hostile inputs: decompression bombs, strips).
#pragma once

#include <cstdint>
#include <vector>

namespace dsv41 {

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3
  uint8_t* row(int64_t y) { return rgb.data() + y * width * 3; }
  const uint8_t* row(int64_t y) const { return rgb.data() + y * width * 3; }
};

struct ImageLimits {
  int64_t max_pixels = 40'000'000;  // width x height as the file declares it
  int64_t max_side = 20'000;        // either side
  int64_t max_bytes = 32 << 20;     // the encoded file
};

}  // namespace dsv41
