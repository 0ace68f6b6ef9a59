// Image decoding and resizing (src/vision) against the independent judge, Debian's Pillow
// (tests/vision/pillow_judge.py): every format and colour mode decodes to the same RGB bytes as
// Image.open(...).convert("RGB"); BICUBIC resize and ImageOps.pad give the same bytes for
// reductions, enlargements and mixed sizes; hostile files are refused before their pixels are
// allocated.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "io/test_util.h"
#include "vision/image_decode.h"
#include "vision/preprocess.h"
#include "vision/resample.h"

namespace dsv41 {
namespace {

using testing::read_file;
using testing::TempDir;
using testing::write_file;

const char* kJudge = DSV41_VISION_TEST_DIR "/pillow_judge.py";

// Runs the judge on a job list; false (with its output) when it fails.
::testing::AssertionResult judge(const TempDir& dir, const nlohmann::json& jobs) {
  write_file(dir.file("jobs.json"), jobs.dump());
  const std::string cmd = std::string("/usr/bin/python3 ") + kJudge + " " + dir.file("jobs.json") +
                          " > " + dir.file("judge.log") + " 2>&1";
  if (std::system(cmd.c_str()) != 0)
    return ::testing::AssertionFailure() << "the Pillow judge failed (scripts/setup.sh installs "
                                            "python3-pil): "
                                         << read_file(dir.file("judge.log"));
  return ::testing::AssertionSuccess();
}

RgbImage random_image(int64_t w, int64_t h, uint32_t seed) {
  std::mt19937 rng(seed);
  RgbImage im;
  im.width = w;
  im.height = h;
  im.rgb.resize(std::size_t(w * h * 3));
  // Smooth areas and sharp edges both: a gradient plus noise plus a few saturated blocks.
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        int v = int((x * 255 / std::max<int64_t>(1, w - 1) + y * (c + 1) * 3) % 256);
        v += int(rng() % 61) - 30;
        if (((x / 7) + (y / 5)) % 11 == 0) v = (c == 1) ? 255 : 0;
        im.row(y)[x * 3 + c] = uint8_t(std::clamp(v, 0, 255));
      }
  return im;
}

std::string bytes_of(const RgbImage& im) {
  return std::string(im.rgb.begin(), im.rgb.end());
}

TEST(Vision, EveryFormatAndModeDecodesAsTheImagingLibraryDoes) {
  TempDir dir;
  ASSERT_TRUE(judge(dir, nlohmann::json::array({{{"op", "make"}, {"dir", dir.file("s")}}})));
  const char* files[] = {"rgb.png",     "rgba.png",   "grey.png",      "grey16.png",
                         "palette.png", "q90.jpg",    "q95_444.jpg",   "progressive.jpg",
                         "grey.jpg",    "lossy.webp", "lossless.webp", "alpha.webp",
                         "image.gif"};
  nlohmann::json jobs = nlohmann::json::array();
  for (const char* f : files)
    jobs.push_back({{"op", "decode"},
                    {"in", dir.file(std::string("s/") + f)},
                    {"out", dir.file(std::string(f) + ".rgb")}});
  ASSERT_TRUE(judge(dir, jobs));
  for (const char* f : files) {
    auto im = decode_image(read_file(dir.file(std::string("s/") + f)));
    ASSERT_TRUE(im.is_ok()) << f << ": " << im.status().message();
    auto dims = nlohmann::json::parse(read_file(dir.file(std::string(f) + ".rgb.json")));
    EXPECT_EQ(im->width, dims["w"].get<int64_t>()) << f;
    EXPECT_EQ(im->height, dims["h"].get<int64_t>()) << f;
    const std::string want = read_file(dir.file(std::string(f) + ".rgb"));
    const std::string got = bytes_of(*im);
    ASSERT_EQ(got.size(), want.size()) << f;
    std::size_t diff = 0;
    for (std::size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
    EXPECT_EQ(diff, 0u) << f << ": " << diff << " of " << got.size() << " bytes differ";
  }
}

TEST(Vision, BicubicResizeAndPadAreTheImagingLibrarysBitForBit) {
  TempDir dir;
  struct Case {
    int64_t w, h, ow, oh;
  };
  // Reductions (integer and not), enlargements, one axis only, extreme ratios, 1-pixel sides.
  const Case cases[] = {{64, 48, 32, 24},  {100, 75, 37, 29},  {37, 23, 111, 69}, {50, 40, 50, 13},
                        {50, 40, 91, 40},  {640, 12, 28, 28},  {12, 640, 28, 56}, {1, 1, 14, 14},
                        {333, 222, 14, 1}, {97, 61, 546, 546}, {546, 300, 14, 28}};
  nlohmann::json jobs = nlohmann::json::array();
  std::vector<RgbImage> ins;
  for (std::size_t k = 0; k < std::size(cases); ++k) {
    const Case& c = cases[k];
    ins.push_back(random_image(c.w, c.h, uint32_t(k + 1)));
    write_file(dir.file(std::to_string(k) + ".raw"), bytes_of(ins.back()));
    for (const char* op : {"resize", "pad"})
      jobs.push_back({{"op", op},
                      {"in", dir.file(std::to_string(k) + ".raw")},
                      {"w", c.w},
                      {"h", c.h},
                      {"ow", c.ow},
                      {"oh", c.oh},
                      {"out", dir.file(std::to_string(k) + "." + op)}});
  }
  ASSERT_TRUE(judge(dir, jobs));
  for (std::size_t k = 0; k < std::size(cases); ++k) {
    const Case& c = cases[k];
    const RgbImage r = resize_bicubic(ins[k], c.ow, c.oh);
    EXPECT_EQ(bytes_of(r), read_file(dir.file(std::to_string(k) + ".resize")))
        << c.w << "x" << c.h << " -> " << c.ow << "x" << c.oh;
    const RgbImage p = letterbox_bicubic(ins[k], c.ow, c.oh, 127);
    EXPECT_EQ(bytes_of(p), read_file(dir.file(std::to_string(k) + ".pad")))
        << "pad " << c.w << "x" << c.h << " -> " << c.ow << "x" << c.oh;
  }
}

// A PNG signature and an IHDR chunk declaring w x h (valid CRC), then nothing.
std::string png_header(uint32_t w, uint32_t h) {
  auto be32 = [](uint32_t v) {
    return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  };
  std::string chunk = "IHDR" + be32(w) + be32(h) + std::string{8, 2, 0, 0, 0};
  const uint32_t crc =
      uint32_t(crc32(0, reinterpret_cast<const Bytef*>(chunk.data()), uInt(chunk.size())));
  return std::string("\x89PNG\r\n\x1a\n", 8) + be32(13) + chunk + be32(crc);
}

TEST(Vision, HostileFilesAreRefusedBeforeTheirPixels) {
  TempDir dir;
  ASSERT_TRUE(judge(dir, nlohmann::json::array({{{"op", "make"}, {"dir", dir.file("s")}}})));
  // Declared sizes over the limits: a bomb and a 1 x 100000 strip.
  for (auto [w, h] :
       {std::pair{100000u, 100000u}, std::pair{1u, 100000u}, std::pair{9000u, 9000u}}) {
    auto r = decode_image(png_header(w, h));
    ASSERT_FALSE(r.is_ok()) << w << "x" << h;
    EXPECT_NE(r.status().message().find("over the limit"), std::string::npos)
        << r.status().message();
  }
  // Truncated files of every format, and bytes that are no image.
  for (const char* f : {"rgb.png", "q90.jpg", "lossy.webp", "image.gif", "progressive.jpg"}) {
    const std::string whole = read_file(dir.file(std::string("s/") + f));
    for (std::size_t cut : {std::size_t(12), whole.size() / 2, whole.size() - 3}) {
      auto r = decode_image(whole.substr(0, cut));
      // (A JPEG cut near its end may still decode: libjpeg pads a missing tail; never a crash.)
      if (!r.is_ok())
        EXPECT_FALSE(r.status().message().empty()) << f;
      else
        EXPECT_GT(r->width, 0) << f;
    }
  }
  auto none = decode_image("GIF88 not really");
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("PNG, JPEG, WebP or GIF"), std::string::npos);
  ImageLimits small;
  small.max_bytes = 100;
  EXPECT_FALSE(decode_image(read_file(dir.file("s/rgb.png")), small).is_ok());
}

// The resize plan's branches (spec §9.1), by hand.
TEST(Vision, ThePlanCoversEveryBranch) {
  // Large enough: each side rounded up to 14; 58 x 43 patches, 20 x 15 tokens.
  ImagePlan p = plan_image_grid(800, 600);
  EXPECT_EQ(p.width, 812);
  EXPECT_EQ(p.height, 602);
  EXPECT_EQ(p.vit_w, 58);
  EXPECT_EQ(p.llm_w, 20);
  EXPECT_EQ(p.llm_h, 15);
  EXPECT_EQ(p.span, 15 * 21 + 2);
  EXPECT_FALSE(p.plain_resize);
  // Below min_pixels: scaled by sqrt(295936 / 5000) with int(): 769 x 384, then 770 x 392.
  p = plan_image_grid(100, 50);
  EXPECT_EQ(p.width, 770);
  EXPECT_EQ(p.height, 392);
  EXPECT_EQ(p.span, 10 * 20 + 2);
  // Over max_image_tokens: shrunk until the span fits, the aspect kept, close to the cap.
  p = plan_image_grid(4000, 3000);
  EXPECT_LE(p.span, 1024);
  EXPECT_GT(p.span, 900);
  EXPECT_NEAR(double(p.width) / double(p.height), 4.0 / 3.0, 0.05);
  // Very tall: shrunk to one column of patches (14 pixels) at least.
  p = plan_image_grid(10, 40000);
  EXPECT_LE(p.span, 1024);
  EXPECT_EQ(p.width, 14);
  EXPECT_EQ(p.llm_w, 1);
  // max_wh_ratio set: a wider image is cut to the ratio in the plan and resized plainly.
  ImagePlanOptions ratio;
  ratio.max_wh_ratio = 2;
  p = plan_image_grid(1000, 200, ratio);
  EXPECT_TRUE(p.plain_resize);
  EXPECT_LE(double(p.width) / double(p.height), 2.1);
  EXPECT_FALSE(plan_image_grid(300, 200, ratio).plain_resize);
}

// The pixels the ViT sees, from the file, against the judge; then the patch tensor's layout and
// values (bf16 of 2u/255 - 1, which equals the fp32 formula for every u, spec §9.1).
TEST(Vision, PlannedPixelsAndPatchesAreTheProcessors) {
  TempDir dir;
  ASSERT_TRUE(judge(dir, nlohmann::json::array({{{"op", "make"}, {"dir", dir.file("s")}}})));
  ImagePlanOptions ratio;
  ratio.max_wh_ratio = 1.2;  // q90.jpg (45 x 27) is wider: the plain resize
  struct Case {
    const char* file;
    ImagePlanOptions opt;
  };
  const Case cases[] = {
      {"rgb.png", {}}, {"q90.jpg", ratio}, {"lossless.webp", {}}, {"image.gif", {}}};
  nlohmann::json jobs = nlohmann::json::array();
  std::vector<ImagePlan> plans;
  for (const Case& c : cases) {
    auto im = decode_image(read_file(dir.file(std::string("s/") + c.file)));
    ASSERT_TRUE(im.is_ok());
    plans.push_back(plan_image_grid(im->width, im->height, c.opt));
    jobs.push_back({{"op", "planned"},
                    {"in", dir.file(std::string("s/") + c.file)},
                    {"ow", plans.back().width},
                    {"oh", plans.back().height},
                    {"plain", plans.back().plain_resize},
                    {"out", dir.file(std::string(c.file) + ".px")}});
  }
  EXPECT_TRUE(plans[1].plain_resize);
  ASSERT_TRUE(judge(dir, jobs));
  for (std::size_t k = 0; k < std::size(cases); ++k) {
    auto im = decode_image(read_file(dir.file(std::string("s/") + cases[k].file)));
    const RgbImage px = plan_pixels(*im, plans[k]);
    ASSERT_EQ(bytes_of(px), read_file(dir.file(std::string(cases[k].file) + ".px")))
        << cases[k].file;
    const std::vector<uint16_t> t = patch_tensor(px, 14);
    ASSERT_EQ(int64_t(t.size()), plans[k].vit_w * plans[k].vit_h * 588);
    // Spot checks of the layout: patch (gy, gx), channel c, pixel (y, x).
    std::mt19937 rng{uint32_t(k)};
    for (int s = 0; s < 200; ++s) {
      const int64_t gy = rng() % plans[k].vit_h, gx = rng() % plans[k].vit_w;
      const int c = int(rng() % 3), y = int(rng() % 14), x = int(rng() % 14);
      const uint8_t u = px.row(gy * 14 + y)[(gx * 14 + x) * 3 + c];
      const double v = 2.0 * u / 255.0 - 1.0;  // bf16 by rounding to nearest even, in double
      const float fv = float(v);
      uint32_t bits;
      std::memcpy(&bits, &fv, 4);
      const uint16_t want = uint16_t((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
      EXPECT_EQ(t[std::size_t(((gy * plans[k].vit_w + gx) * 3 + c) * 196 + y * 14 + x)], want);
    }
  }
}

}  // namespace
}  // namespace dsv41
