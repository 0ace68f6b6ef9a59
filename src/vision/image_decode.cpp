// Image decoding (image_decode.h). Each decoder reads the header first and checks the declared
// size against the limits, so a decompression bomb never gets its buffer. libpng and libjpeg
// report errors by longjmp: the functions that set the jump hold only objects constructed before
// it (their destructors still run when the function returns), and no C++ frame lies between the
// jump and its target. The conversions to RGB are the imaging library's: alpha dropped (not
// composited), palettes looked up, 16-bit samples cut to their high byte, except 16-bit grey,
// which the library holds as 32-bit integers and clips at 255.
#include "vision/image_decode.h"

#include <gif_lib.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include <csetjmp>
#include <cstring>

#include <fmt/format.h>

namespace dsv41 {
namespace {

Status too_large(ImageFormat f, int64_t w, int64_t h, const ImageLimits& l) {
  return Status::error(
      fmt::format("{} image of {}x{} pixels is over the limit ({} pixels, {} a side)",
                  image_format_name(f), w, h, l.max_pixels, l.max_side));
}

bool within(int64_t w, int64_t h, const ImageLimits& l) {
  return w >= 1 && h >= 1 && w <= l.max_side && h <= l.max_side && w * h <= l.max_pixels;
}

// ---- PNG ---------------------------------------------------------------------------------------

struct PngSource {
  const uint8_t* data;
  std::size_t size, pos;
};

struct PngError {
  std::jmp_buf jump;
  char message[200];
};

void png_error_fn(png_structp png, png_const_charp msg) {
  auto* e = static_cast<PngError*>(png_get_error_ptr(png));
  std::snprintf(e->message, sizeof(e->message), "%s", msg);
  std::longjmp(e->jump, 1);
}
void png_warning_fn(png_structp, png_const_charp) {}

void png_read_fn(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->size - src->pos < n) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

Result<RgbImage> decode_png(std::string_view bytes, const ImageLimits& limits) {
  // The size from IHDR (the first chunk, by the format) before libpng reads anything else.
  if (bytes.size() >= 24 && bytes.substr(12, 4) == "IHDR") {
    auto be32 = [&](std::size_t at) {
      const auto* p = reinterpret_cast<const uint8_t*>(bytes.data()) + at;
      return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
    };
    if (!within(be32(16), be32(20), limits))
      return too_large(ImageFormat::kPng, be32(16), be32(20), limits);
  }
  RgbImage img;
  std::vector<uint8_t> raw;  // decoded rows before the conversion to RGB
  std::vector<png_bytep> rows;
  PngError err{};
  PngSource src{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0};
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &err, png_error_fn, png_warning_fn);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_read_struct(&png, &info, nullptr);
    return Status::error("PNG: out of memory", ErrorKind::kInternal);
  }
  // (volatile: set after setjmp; the error path does not read them, but the compiler cannot know)
  volatile bool too_big = false;
  volatile png_uint_32 w = 0, h = 0;
  volatile int channels = 0, sixteen_grey = 0;
  if (setjmp(err.jump)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return Status::error(std::string("corrupt or truncated PNG: ") + err.message);
  }
  png_set_read_fn(png, &src, png_read_fn);
  png_read_info(png, info);
  w = png_get_image_width(png, info);
  h = png_get_image_height(png, info);
  if (!within(w, h, limits)) {
    too_big = true;
  } else {
    const int type = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    sixteen_grey = (type == PNG_COLOR_TYPE_GRAY && depth == 16);
    // (palette_to_rgb also turns a tRNS chunk into alpha, dropped below with the others)
    if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16 && !sixteen_grey) png_set_strip_16(png);
    if (depth == 16 && sixteen_grey) png_set_swap(png);  // (host order, read below)
    if (type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    channels = png_get_channels(png, info);
    const std::size_t stride = png_get_rowbytes(png, info);
    raw.resize(stride * h);
    rows.resize(h);
    for (png_uint_32 y = 0; y < h; ++y) rows[y] = raw.data() + y * stride;
    png_read_image(png, rows.data());
  }
  png_destroy_read_struct(&png, &info, nullptr);
  if (too_big) return too_large(ImageFormat::kPng, w, h, limits);
  img.width = w;
  img.height = h;
  img.rgb.resize(std::size_t(w) * h * 3);
  const std::size_t n = std::size_t(w) * h;
  if (sixteen_grey) {  // "I" mode, then I -> RGB clips at 255
    const auto* v = reinterpret_cast<const uint16_t*>(raw.data());
    for (std::size_t i = 0; i < n; ++i) {
      const uint8_t g = uint8_t(v[i] > 255 ? 255 : v[i]);
      img.rgb[3 * i] = img.rgb[3 * i + 1] = img.rgb[3 * i + 2] = g;
    }
  } else if (channels <= 2) {  // grey (and an alpha that a palette's tRNS may have added)
    for (std::size_t i = 0; i < n; ++i)
      img.rgb[3 * i] = img.rgb[3 * i + 1] = img.rgb[3 * i + 2] = raw[i * std::size_t(channels)];
  } else {
    for (std::size_t i = 0; i < n; ++i)
      std::memcpy(&img.rgb[3 * i], &raw[i * std::size_t(channels)], 3);
  }
  return img;
}

// ---- JPEG --------------------------------------------------------------------------------------

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}
void jpeg_quiet(j_common_ptr, int) {}

Result<RgbImage> decode_jpeg(std::string_view bytes, const ImageLimits& limits) {
  RgbImage img;
  jpeg_decompress_struct cinfo{};
  JpegError err{};
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit;
  err.mgr.emit_message = jpeg_quiet;
  volatile bool too_big = false, cmyk = false;
  volatile int64_t w = 0, h = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return Status::error(std::string("corrupt or truncated JPEG: ") + err.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  w = cinfo.image_width;
  h = cinfo.image_height;
  cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  if (!within(w, h, limits)) {
    too_big = true;
  } else if (!cmyk) {
    cinfo.out_color_space = JCS_RGB;  // grey is replicated, YCbCr converted
    jpeg_start_decompress(&cinfo);
    img.width = w;
    img.height = h;
    img.rgb.resize(std::size_t(w * h * 3));
    while (cinfo.output_scanline < cinfo.output_height) {
      JSAMPROW row = img.rgb.data() + std::size_t(cinfo.output_scanline) * std::size_t(w) * 3;
      jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
  }
  jpeg_destroy_decompress(&cinfo);
  if (too_big) return too_large(ImageFormat::kJpeg, w, h, limits);
  if (cmyk) return Status::error("CMYK JPEG images are not supported (convert it to RGB)");
  return img;
}

// ---- WebP --------------------------------------------------------------------------------------

Result<RgbImage> decode_webp(std::string_view bytes, const ImageLimits& limits) {
  WebPBitstreamFeatures f{};
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  if (WebPGetFeatures(data, bytes.size(), &f) != VP8_STATUS_OK)
    return Status::error("corrupt or truncated WebP: the header cannot be read");
  if (f.has_animation) return Status::error("animated WebP images are not supported");
  if (!within(f.width, f.height, limits))
    return too_large(ImageFormat::kWebp, f.width, f.height, limits);
  RgbImage img;
  img.width = f.width;
  img.height = f.height;
  // RGBA then the alpha dropped: the library decodes to RGBA (unpremultiplied) and convert("RGB")
  // keeps the colour channels as they are.
  std::vector<uint8_t> rgba(std::size_t(img.width * img.height * 4));
  if (!WebPDecodeRGBAInto(data, bytes.size(), rgba.data(), rgba.size(), int(img.width * 4)))
    return Status::error("corrupt or truncated WebP: the decoder failed");
  img.rgb.resize(std::size_t(img.width * img.height * 3));
  for (std::size_t i = 0, n = std::size_t(img.width * img.height); i < n; ++i)
    std::memcpy(&img.rgb[3 * i], &rgba[4 * i], 3);
  return img;
}

// ---- GIF ---------------------------------------------------------------------------------------

struct GifSource {
  const uint8_t* data;
  std::size_t size, pos;
};

int gif_read_fn(GifFileType* gif, GifByteType* out, int n) {
  auto* src = static_cast<GifSource*>(gif->UserData);
  const std::size_t k = std::min<std::size_t>(std::size_t(n), src->size - src->pos);
  std::memcpy(out, src->data + src->pos, k);
  src->pos += k;
  return int(k);
}

// The first frame on a canvas of the logical screen's size, filled with the background colour
// where the frame does not reach.
Result<RgbImage> decode_gif(std::string_view bytes, const ImageLimits& limits) {
  GifSource src{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0};
  int error = 0;
  GifFileType* gif = DGifOpen(&src, gif_read_fn, &error);
  if (!gif) return Status::error(std::string("corrupt GIF: ") + GifErrorString(error));
  struct Closer {
    GifFileType* g;
    ~Closer() {
      int e = 0;
      DGifCloseFile(g, &e);
    }
  } closer{gif};
  const int64_t w = gif->SWidth, h = gif->SHeight;
  if (!within(w, h, limits)) return too_large(ImageFormat::kGif, w, h, limits);
  GifRecordType rec;
  do {
    if (DGifGetRecordType(gif, &rec) == GIF_ERROR)
      return Status::error(std::string("corrupt or truncated GIF: ") + GifErrorString(gif->Error));
    if (rec == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(gif, &code, &ext) == GIF_ERROR)
        return Status::error("corrupt or truncated GIF: an extension block");
      while (ext) {
        if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR)
          return Status::error("corrupt or truncated GIF: an extension block");
      }
    }
  } while (rec != IMAGE_DESC_RECORD_TYPE && rec != TERMINATE_RECORD_TYPE);
  if (rec != IMAGE_DESC_RECORD_TYPE) return Status::error("GIF without an image");
  if (DGifGetImageDesc(gif) == GIF_ERROR)
    return Status::error(std::string("corrupt GIF: ") + GifErrorString(gif->Error));
  const GifImageDesc& d = gif->Image;
  const ColorMapObject* cmap = d.ColorMap ? d.ColorMap : gif->SColorMap;
  if (!cmap) return Status::error("GIF without a colour table");
  if (d.Left < 0 || d.Top < 0 || d.Width < 1 || d.Height < 1 || d.Left + d.Width > w ||
      d.Top + d.Height > h)
    return Status::error("corrupt GIF: the first frame lies outside the image");
  std::vector<GifPixelType> idx(std::size_t(d.Width) * std::size_t(d.Height));
  auto line = [&](int64_t y) { return idx.data() + y * d.Width; };
  if (d.Interlace) {
    static const int kStart[4] = {0, 4, 2, 1}, kStep[4] = {8, 8, 4, 2};
    for (int pass = 0; pass < 4; ++pass)
      for (int64_t y = kStart[pass]; y < d.Height; y += kStep[pass])
        if (DGifGetLine(gif, line(y), d.Width) == GIF_ERROR)
          return Status::error("corrupt or truncated GIF: the first frame's pixels");
  } else {
    for (int64_t y = 0; y < d.Height; ++y)
      if (DGifGetLine(gif, line(y), d.Width) == GIF_ERROR)
        return Status::error("corrupt or truncated GIF: the first frame's pixels");
  }
  RgbImage img;
  img.width = w;
  img.height = h;
  img.rgb.resize(std::size_t(w * h * 3));
  auto put = [&](uint8_t* p, int c) {
    const GifColorType& col = cmap->Colors[c < cmap->ColorCount ? c : 0];
    p[0] = col.Red;
    p[1] = col.Green;
    p[2] = col.Blue;
  };
  const int bg = gif->SBackGroundColor;
  for (int64_t i = 0; i < w * h; ++i) put(&img.rgb[std::size_t(3 * i)], bg);
  for (int64_t y = 0; y < d.Height; ++y)
    for (int64_t x = 0; x < d.Width; ++x) put(img.row(y + d.Top) + (x + d.Left) * 3, line(y)[x]);
  return img;
}

}  // namespace

ImageFormat sniff_image_format(std::string_view b) {
  auto starts = [&](std::string_view m, std::size_t at = 0) {
    return b.size() >= at + m.size() && b.substr(at, m.size()) == m;
  };
  if (starts("\x89PNG\r\n\x1a\n")) return ImageFormat::kPng;
  if (starts("\xff\xd8\xff")) return ImageFormat::kJpeg;
  if (starts("RIFF") && starts("WEBP", 8)) return ImageFormat::kWebp;
  if (starts("GIF87a") || starts("GIF89a")) return ImageFormat::kGif;
  return ImageFormat::kUnknown;
}

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kGif:
      return "GIF";
    default:
      return "unknown";
  }
}

Result<RgbImage> decode_image(std::string_view bytes, const ImageLimits& limits) {
  if (int64_t(bytes.size()) > limits.max_bytes)
    return Status::error(fmt::format("image file of {} bytes is over the limit ({} bytes)",
                                     bytes.size(), limits.max_bytes));
  switch (sniff_image_format(bytes)) {
    case ImageFormat::kPng:
      return decode_png(bytes, limits);
    case ImageFormat::kJpeg:
      return decode_jpeg(bytes, limits);
    case ImageFormat::kWebp:
      return decode_webp(bytes, limits);
    case ImageFormat::kGif:
      return decode_gif(bytes, limits);
    default:
      return Status::error("not an image this server reads (PNG, JPEG, WebP or GIF)");
  }
}

}  // namespace dsv41
