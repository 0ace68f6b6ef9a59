// Image files from http(s) URLs and from under --allowed-local-media-path (image_sources.h).
#include "server/image_sources.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

namespace dsv41 {
namespace {

using Clock = std::chrono::steady_clock;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string size_text(std::size_t bytes) {
  return bytes % (1u << 20) == 0 ? fmt::format("{} MB", bytes >> 20)
                                 : fmt::format("{} bytes", bytes);
}

std::string secs_text(std::chrono::milliseconds t) {
  return fmt::format("{:g} s", double(t.count()) / 1e3);
}

// The decoders' formats by their first bytes, so that a body that is no image (an HTML error page
// answered with 200) is cut off after a few bytes instead of read to the limit. The decoder
// (vision/) still judges the whole file; this only refuses early.
enum class Sniff { kImage, kNotImage, kTooShort };
Sniff sniff_image(std::string_view b) {
  // `magic` at byte `at`, or as much of it as b holds (too short to tell yet).
  const auto matches = [&](std::string_view magic, std::size_t at = 0) {
    if (b.size() <= at) return true;
    const std::string_view part = b.substr(at, magic.size());
    return part == magic.substr(0, part.size());
  };
  const bool png = matches("\x89PNG\r\n\x1a\n"), jpeg = matches("\xff\xd8\xff"),
             gif = matches("GIF87a") || matches("GIF89a"),
             webp = matches("RIFF") && matches("WEBP", 8);
  if (!png && !jpeg && !gif && !webp) return Sniff::kNotImage;
  return b.size() >= 12 ? Sniff::kImage : Sniff::kTooShort;
}

// An http(s) URL taken apart: what the client connects to and what it asks for.
struct HttpUrl {
  bool https = false;
  std::string host;  // an IPv6 literal without its brackets
  int port = 0;
  std::string authority;  // host[:port] as written: the Host header
  std::string target;     // path and query ("/" at least), the fragment dropped
  std::string origin() const { return (https ? "https://" : "http://") + authority; }
};

Result<HttpUrl> parse_http_url(std::string_view url) {
  for (char c : url)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return Status::error("the URL holds a space or a control character (escape it as %XX)");
  const std::size_t sep = url.find("://");
  const std::string scheme = lower(url.substr(0, std::min(sep, std::size_t(16))));
  if (sep == std::string_view::npos || (scheme != "http" && scheme != "https"))
    return Status::error("only http:// and https:// URLs are fetched");
  HttpUrl u;
  u.https = scheme == "https";
  std::string_view rest = url.substr(sep + 3);
  const std::size_t end = rest.find_first_of("/?#");
  const std::string_view auth = rest.substr(0, end);
  rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
  if (auth.find('@') != std::string_view::npos)
    return Status::error("a user name or password in the URL (user@host) is not supported");
  std::string_view host = auth, port;
  if (auth.starts_with('[')) {
    const std::size_t close = auth.find(']');
    if (close == std::string_view::npos) return Status::error("an IPv6 host without its ']'");
    host = auth.substr(1, close - 1);
    std::string_view after = auth.substr(close + 1);
    if (!after.empty() && !after.starts_with(':'))
      return Status::error("junk after the IPv6 host's ']'");
    if (!after.empty()) port = after.substr(1);
  } else if (const std::size_t colon = auth.rfind(':'); colon != std::string_view::npos) {
    host = auth.substr(0, colon);
    port = auth.substr(colon + 1);
  }
  if (host.empty()) return Status::error("the URL names no host");
  u.port = u.https ? 443 : 80;
  if (!port.empty()) {
    if (port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        std::stoi(std::string(port)) < 1 || std::stoi(std::string(port)) > 65535)
      return Status::error(fmt::format("the port '{}' is not a number from 1 to 65535", port));
    u.port = std::stoi(std::string(port));
  }
  u.host = std::string(host);
  u.authority = std::string(auth);
  u.target = std::string(rest.substr(0, rest.find('#')));
  if (u.target.empty() || u.target[0] == '?') u.target = "/" + u.target;
  return u;
}

// A redirect's Location against the URL that answered it (RFC 3986 §5.2's common cases: an
// absolute URL, //authority..., /path..., a relative path; the next hop is re-checked anyway).
std::string resolve_location(const HttpUrl& base, const std::string& loc) {
  const std::size_t colon = loc.find(':');
  if (colon != std::string::npos && loc.find_first_of("/?#") > colon) return loc;  // has a scheme
  if (loc.starts_with("//")) return (base.https ? "https:" : "http:") + loc;
  if (loc.starts_with('/')) return base.origin() + loc;
  const std::string path = base.target.substr(0, base.target.find('?'));
  return base.origin() + path.substr(0, path.rfind('/') + 1) + loc;
}

// Cuts a fetch at its deadline: ClientImpl::stop() from this thread shuts the socket down, which
// ends a read blocked anywhere (status line, headers, body). The clients' read timeouts bound one
// read each, not a trickle of them. Repeated every 50 ms past the deadline, in case the fetch was
// between sockets (resolving a name, or the next hop) the first time.
class Watchdog {
 public:
  explicit Watchdog(Clock::time_point deadline)
      : thread_([this, deadline] {
          std::unique_lock lock(m_);
          if (cv_.wait_until(lock, deadline, [&] { return done_; })) return;
          fired_ = true;
          while (!done_) {
            if (client_) client_->stop();
            cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return done_; });
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(m_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // The client of the current hop (nullptr before it is destroyed).
  void watch(httplib::ClientImpl* c) {
    std::lock_guard lock(m_);
    client_ = c;
  }
  bool fired() {
    std::lock_guard lock(m_);
    return fired_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false, fired_ = false;
  httplib::ClientImpl* client_ = nullptr;
  std::thread thread_;  // last: started once the members it reads exist
};

template <class Rep, class Period>
std::pair<time_t, time_t> sec_usec(std::chrono::duration<Rep, Period> d) {
  const auto us =
      std::max<int64_t>(1000, std::chrono::duration_cast<std::chrono::microseconds>(d).count());
  return {time_t(us / 1000000), time_t(us % 1000000)};
}

std::string no_image(const std::string& content_type) {
  return fmt::format("the body is no PNG, JPEG, WebP or GIF image (Content-Type: {})",
                     content_type.empty() ? "none" : content_type);
}

// One hop: the answer's status, Location, and (2xx) body.
struct Hop {
  int status = 0;
  std::string location, content_type, body;
  std::optional<std::string> refused;  // why the body was cut off (size, not an image)
  httplib::Error error = httplib::Error::Success;
};

Hop get_once(const HttpUrl& u, const ImageSourceOptions& o, Clock::time_point deadline,
             Watchdog& dog, FetchReport& report) {
  std::unique_ptr<httplib::ClientImpl> c;
  if (u.https)
    c = std::make_unique<httplib::SSLClient>(u.host, u.port);
  else
    c = std::make_unique<httplib::ClientImpl>(u.host, u.port);
  Hop hop;
  const auto left =
      std::max(deadline - Clock::now(), Clock::duration(std::chrono::milliseconds(1)));
  const auto [cs, cus] = sec_usec(std::min<Clock::duration>(left, o.connect_timeout));
  const auto [rs, rus] = sec_usec(left);
  c->set_connection_timeout(cs, cus);
  c->set_read_timeout(rs, rus);
  c->set_write_timeout(rs, rus);
  c->set_follow_location(false);  // redirects are followed here, each hop checked again
  c->enable_server_certificate_verification(true);
  const httplib::Headers headers = {{"Host", u.authority},
                                    {"Accept", "image/*"},
                                    {"Accept-Encoding", "identity"},
                                    {"User-Agent", "dsv41"}};
  Sniff sniff = Sniff::kTooShort;
  auto on_response = [&](const httplib::Response& r) {
    hop.status = r.status;
    hop.location = r.get_header_value("Location");
    hop.content_type = r.get_header_value("Content-Type");
    if (r.status < 200 || r.status >= 300) return false;  // nothing of the body is read
    if (r.has_header("Content-Length")) {
      const std::string len = r.get_header_value("Content-Length");
      if (len.size() > 15 || std::stoull("0" + len) > o.max_bytes) {
        hop.refused = fmt::format("its Content-Length ({} bytes) is over the {} limit", len,
                                  size_text(o.max_bytes));
        return false;
      }
    }
    return true;
  };
  auto on_data = [&](const char* data, std::size_t n) {
    report.bytes_received += n;
    if (hop.body.size() + n > o.max_bytes) {
      hop.refused =
          fmt::format("the body is larger than {} (cut off there)", size_text(o.max_bytes));
      return false;
    }
    hop.body.append(data, n);
    if (sniff == Sniff::kTooShort) sniff = sniff_image(hop.body);
    if (sniff == Sniff::kNotImage) {
      hop.refused = no_image(hop.content_type);
      return false;
    }
    return Clock::now() < deadline;
  };
  dog.watch(c.get());
  ++report.requests;
  auto res = c->Get(u.target, headers, on_response, on_data);
  dog.watch(nullptr);
  hop.error = res.error();
  if (hop.status >= 200 && hop.status < 300 && !hop.refused && res &&
      sniff_image(hop.body) != Sniff::kImage)
    hop.refused = hop.body.empty() ? "the body is empty" : no_image(hop.content_type);
  return hop;
}

std::string error_text(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "could not connect";
    case httplib::Error::ConnectionTimeout:
      return "the connection timed out";
    case httplib::Error::Read:
      return "the answer could not be read";
    case httplib::Error::Write:
      return "the request could not be sent";
    case httplib::Error::SSLConnection:
      return "the TLS handshake failed";
    case httplib::Error::SSLLoadingCerts:
      return "the CA certificates could not be loaded";
    case httplib::Error::SSLServerVerification:
      return "the server's certificate could not be verified";
    default:
      return "the fetch failed (" + httplib::to_string(e) + ")";
  }
}

std::string percent_decode(std::string_view s, bool* ok) {
  std::string out;
  *ok = true;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      *ok = false;
      return {};
    }
    out += char(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
    i += 2;
  }
  if (out.find('\0') != std::string::npos) *ok = false;
  return out;
}

bool inside(const std::string& path, const std::string& dir) {
  return dir == "/" ? path.starts_with('/') : path.starts_with(dir + "/");
}

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

Result<std::string> fetch_image_url(std::string_view url, const ImageSourceOptions& o,
                                    FetchReport* report) {
  FetchReport local;
  FetchReport& rep = report ? *report : local;
  const Clock::time_point deadline = Clock::now() + o.timeout;
  Watchdog dog(deadline);
  std::string at(url);
  for (int hops = 0;; ++hops) {
    auto u = parse_http_url(at);
    if (!u)
      return Status::error(hops == 0
                               ? u.status().message()
                               : fmt::format("redirected to {}: {}", at, u.status().message()));
    Hop hop = get_once(*u, o, deadline, dog, rep);
    if (dog.fired() || (!hop.refused && hop.error != httplib::Error::Success &&
                        Clock::now() >= deadline - std::chrono::milliseconds(20)))
      return Status::error(
          fmt::format("fetching {} took longer than the server's limit of {} "
                      "(--image-url-timeout)",
                      at, secs_text(o.timeout)));
    if (hop.refused) return Status::error(fmt::format("{}: {}", at, *hop.refused));
    if (hop.status >= 300 && hop.status < 400 && !hop.location.empty()) {
      if (hops >= o.max_redirects)
        return Status::error(fmt::format("{} redirects more than {} times", url, o.max_redirects));
      at = resolve_location(*u, hop.location);
      continue;
    }
    if (hop.status != 0 && (hop.status < 200 || hop.status >= 300))
      return Status::error(fmt::format("{} answered HTTP {}", at, hop.status));
    if (hop.error != httplib::Error::Success)
      return Status::error(fmt::format("{}: {}", at, error_text(hop.error)));
    return std::move(hop.body);
  }
}

Result<std::string> read_local_image(std::string_view url, const ImageSourceOptions& o) {
  if (o.local_media_dir.empty())
    return Status::error(
        "file:// URLs are read only when the server runs with --allowed-local-media-path DIR");
  const bool slashes = lower(url.substr(0, 7)) == "file://";
  std::string_view rest = url.substr(slashes ? 7 : 0);
  if (lower(rest.substr(0, 10)) == "localhost/") rest.remove_prefix(9);
  if (!slashes || !rest.starts_with('/'))
    return Status::error(
        "a file:// URL names an absolute path on the server, with no host "
        "(file:///path/to/image.png)");
  rest = rest.substr(0, rest.find_first_of("?#"));
  bool ok = false;
  const std::string path = percent_decode(rest, &ok);
  if (!ok) return Status::error("the file:// URL holds a bad %-escape");
  // The path with .. and symbolic links resolved must lie inside the directory; a path that does
  // not resolve is judged by its lexical form, so that the answer tells nothing about files
  // outside the directory.
  std::error_code ec;
  const std::filesystem::path canonical = std::filesystem::canonical(path, ec);
  const std::string outside = "the file is outside the server's --allowed-local-media-path";
  if (ec) {
    const std::string lexical = std::filesystem::path(path).lexically_normal().string();
    if (!inside(lexical, o.local_media_dir)) return Status::error(outside);
    return Status::error("no such file under --allowed-local-media-path");
  }
  if (!inside(canonical.string(), o.local_media_dir)) return Status::error(outside);
  struct stat st {};
  if (::stat(canonical.c_str(), &st) != 0) return Status::error("the file cannot be read");
  if (!S_ISREG(st.st_mode))
    return Status::error(fmt::format("the path is {}, not a regular file", kind_of(st.st_mode)));
  // O_NONBLOCK: a FIFO swapped in since the stat does not block the open; O_NOFOLLOW: nor a link.
  const int fd = ::open(canonical.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return Status::error("the file cannot be opened");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  // What was opened, not what was resolved a moment before: a directory on the path swapped for a
  // link in between shows as another file, or (through /proc, where it is mounted) another path.
  struct stat opened {};
  if (::fstat(fd, &opened) != 0 || !S_ISREG(opened.st_mode) || opened.st_dev != st.st_dev ||
      opened.st_ino != st.st_ino)
    return Status::error("the file changed while it was opened");
  char link[4096];
  const ssize_t n = ::readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), link, sizeof(link) - 1);
  if (n > 0 && !inside(std::string(link, std::size_t(n)), o.local_media_dir))
    return Status::error(outside);
  if (std::size_t(st.st_size) > o.max_bytes)
    return Status::error(fmt::format("the file is larger than {}", size_text(o.max_bytes)));
  std::string bytes(std::size_t(st.st_size), '\0');
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += std::size_t(r);
  }
  bytes.resize(got);  // a file that shrank meanwhile: what was there (the decoder judges it)
  return bytes;
}

Result<std::string> canonical_media_dir(const std::string& dir) {
  std::error_code ec;
  const auto canonical = std::filesystem::canonical(dir, ec);
  if (ec || !std::filesystem::is_directory(canonical, ec))
    return Status::error(
        fmt::format("--allowed-local-media-path {}: not an existing directory", dir));
  return canonical.string();
}

}  // namespace dsv41
