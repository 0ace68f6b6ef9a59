// Image parts of a request: their URLs read (data:, and image_sources.h's), the encoder call and
// the span expansion (image_inputs.h).
#include "server/image_inputs.h"

#include <fmt/format.h>

#include <array>
#include <cctype>

#include "server/request_fields.h"

namespace dsv41 {
namespace {

constexpr std::array<int8_t, 256> make_b64_table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = -1;
  const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(a[i])] = static_cast<int8_t>(i);
  return t;
}
constexpr auto kB64 = make_b64_table();

}  // namespace

std::optional<std::string> decode_base64(std::string_view s) {
  while (!s.empty() && s.back() == '=') s.remove_suffix(1);
  if (s.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(s.size() / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int8_t v = kB64[static_cast<uint8_t>(c)];
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

Result<std::string> read_data_url(std::string_view url, std::size_t max_bytes) {
  if (!url.starts_with("data:")) {
    const std::string scheme(url.substr(0, std::min<std::size_t>(url.find(':'), 16)));
    return Status::error(
        fmt::format("only data: URLs (data:image/png;base64,...) are accepted here, not '{}:' URLs",
                    scheme.size() < url.size() ? scheme : std::string("a bare string")));
  }
  const std::size_t comma = url.find(',');
  if (comma == std::string_view::npos) return Status::error("a data: URL without a ','");
  const std::string_view meta = url.substr(5, comma - 5), data = url.substr(comma + 1);
  if (!meta.ends_with(";base64"))
    return Status::error("a data: URL must be base64-encoded (data:<media type>;base64,<data>)");
  if (data.size() * 3 / 4 > max_bytes)
    return Status::error(fmt::format("the image is larger than {} MB", max_bytes >> 20));
  auto bytes = decode_base64(data);
  if (!bytes) return Status::error("the data: URL's payload is not valid base64");
  return std::move(*bytes);
}

Result<std::string> read_image_part(std::string_view url, const ImageSourceOptions& o) {
  const std::size_t colon = url.find(':');
  std::string scheme(
      colon == std::string_view::npos ? "" : url.substr(0, std::min(colon, std::size_t(16))));
  for (char& c : scheme) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (scheme == "data" && url.starts_with("data:")) return read_data_url(url, o.max_bytes);
  if (scheme == "http" || scheme == "https") {
    if (!o.allow_urls)
      return Status::error(
          "http(s) image URLs are fetched only when the server runs with --allow-image-urls "
          "(send the image as a data: URL: data:image/png;base64,...)");
    return fetch_image_url(url, o);
  }
  if (scheme == "file") return read_local_image(url, o);
  return Status::error(fmt::format(
      "only data: URLs (data:image/png;base64,...){}{} are accepted here, not {}",
      o.allow_urls ? ", http(s) URLs" : "",
      o.local_media_dir.empty() ? "" : " and file:// URLs under --allowed-local-media-path",
      colon == std::string_view::npos ? std::string("a bare string") : "'" + scheme + ":' URLs"));
}

std::optional<ApiError> expand_images(const std::vector<std::string>& urls,
                                      const std::vector<std::string>& params, ImageSupport* images,
                                      int32_t image_token_id, GenerationJob& job) {
  std::vector<int32_t>& prompt = job.request.prompt;
  std::size_t holes = 0;
  for (int32_t t : prompt) holes += t == image_token_id;
  if (urls.empty()) {
    if (holes == 0 || image_token_id < 0) return std::nullopt;
    // The placeholder typed as text with no image part: there is nothing to put there.
    return bad("messages", fmt::format("the text holds the image placeholder {} {} time(s) "
                                       "without an image part to fill it",
                                       "<｜deepseek_image｜>", holes));
  }
  if (!images || !images->encode || image_token_id < 0)
    return bad(params[0], "this model takes no images (it has no vision tower)");
  if (holes != urls.size())
    return bad("messages", fmt::format("the text holds the image placeholder <｜deepseek_image｜> "
                                       "{} time(s) besides its {} image part(s)",
                                       holes - std::min(holes, urls.size()), urls.size()));
  std::vector<int32_t> out;
  std::size_t next = 0;
  for (int32_t t : prompt) {
    if (t != image_token_id) {
      out.push_back(t);
      continue;
    }
    const std::size_t k = next++;
    auto file = read_image_part(urls[k], images->sources);
    if (!file) return bad(params[k], file.status().message());
    auto img = images->encode(*file);
    if (!img) return bad(params[k], img.status().message());
    (img->cached ? images->cache_hits : images->encodes).fetch_add(1);
    SliceImage si;
    si.start = int32_t(out.size());
    si.llm_w = img->llm_w;
    si.llm_h = img->llm_h;
    si.rows = img->rows;
    si.key = img->key;
    out.insert(out.end(), std::size_t(si.span()), image_token_id);
    job.request.images.push_back(std::move(si));
  }
  prompt = std::move(out);
  return std::nullopt;
}

std::optional<ApiError> expand_chat_images(const std::vector<ChatMessage>& messages,
                                           const ServedModel& model, GenerationJob& job) {
  std::vector<std::string> urls, params;
  for (const ChatMessage& m : messages) {
    urls.insert(urls.end(), m.images.begin(), m.images.end());
    params.insert(params.end(), m.image_params.begin(), m.image_params.end());
  }
  return expand_images(urls, params, model.images.get(), model.image_token_id, job);
}

}  // namespace dsv41
