// Where an image part's file comes from besides a data: URL (issue 33 item 4, docs/vision.md
// "Image URLs and local files"): an http(s) URL the server fetches (only under
// `serve --allow-image-urls`; a size limit, a time limit over the whole fetch, redirects re-checked
// hop by hop) and a file:// URL read from under `serve --allowed-local-media-path DIR` (the path
// resolved first, regular files only). Both are off by default: a client able to name a URL or a
// path makes the server reach what it can reach. Errors say what was wrong, for a 400 naming the
// part (image_inputs.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "core/status.h"

namespace dsv41 {

// An image file's largest size, wherever it comes from: vision/image.h's decoder limit.
constexpr std::size_t kMaxImageBytes = std::size_t(32) << 20;

struct ImageSourceOptions {
  bool allow_urls = false;      // --allow-image-urls: http:// and https:// URLs are fetched
  std::string local_media_dir;  // --allowed-local-media-path, canonical; empty: file:// refused
  std::size_t max_bytes = kMaxImageBytes;
  // --image-url-timeout: one URL's fetch from the first connect to the last byte, redirects
  // included (each read's own timeout would bound a read, not a trickle of them).
  std::chrono::milliseconds timeout{10000};
  std::chrono::milliseconds connect_timeout{5000};  // each hop's connect (and TLS handshake)
  int max_redirects = 5;                            // hops followed after the first request
};

// What a fetch did (for tests and the log): the body bytes received, the requests made.
struct FetchReport {
  std::size_t bytes_received = 0;
  int requests = 0;
};

// An http:// or https:// URL's body (at most o.max_bytes; a PNG, JPEG, WebP or GIF by its first
// bytes), following at most o.max_redirects redirects to other http(s) URLs, within o.timeout.
// Refused: other schemes, user:password@ in the URL, a non-2xx answer, a larger body (cut off as
// soon as it passes the limit, not read on), a body that is no image. Does not look at
// o.allow_urls (the caller does).
Result<std::string> fetch_image_url(std::string_view url, const ImageSourceOptions& o,
                                    FetchReport* report = nullptr);

// A file:// URL's file (file:///abs/path or file://localhost/abs/path, %-escapes decoded): read
// only when its canonical path (symbolic links and .. resolved) lies inside
// o.local_media_dir, only a regular file (never a directory, FIFO or device), at most
// o.max_bytes.
Result<std::string> read_local_image(std::string_view url, const ImageSourceOptions& o);

// --allowed-local-media-path's directory, canonical (an error names the flag when it is not an
// existing directory).
Result<std::string> canonical_media_dir(const std::string& dir);

}  // namespace dsv41
