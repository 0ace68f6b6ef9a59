// Who may use the server and from which web origins (issue 37 items 2 and 3), independent of the
// HTTP library: API keys (--api-key, --api-key-file, DSV41_API_KEY; accepted as
// `Authorization: Bearer KEY` or `x-api-key: KEY`, compared in constant time) and the CORS policy
// (--allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials, vLLM's names).
// The HTTP server asks these objects and writes what they answer.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace dsv41 {

class ApiKeys {
 public:
  // Keys from the flag's values, a file (one a line; blank lines and lines starting with '#'
  // skipped; surrounding whitespace trimmed) and the environment variable's value (empty: none).
  // An empty key, or a file that cannot be read or holds no key, is an error naming its source.
  static Result<ApiKeys> load(const std::vector<std::string>& flag_keys, const std::string& file,
                              const std::string& env_value);
  bool enabled() const { return !digests_.empty(); }
  std::size_t size() const { return digests_.size(); }
  // Whether a request carrying these header values (absent: empty) may pass. Every key is
  // compared, each by its SHA-256 digest with CRYPTO_memcmp, so neither the time taken nor its
  // early exit tells how much of a guess was right, nor how long the keys are.
  bool accepts(std::string_view authorization, std::string_view x_api_key) const;

 private:
  using Digest = std::array<unsigned char, 32>;
  std::vector<Digest> digests_;
};

// Which paths need a key when keys are set: every API route; not /health (probes), not the page's
// files (/, /dashboard, /web/...: the page asks for the key itself), and /metrics only unless
// `metrics_public`.
bool path_needs_key(std::string_view path, bool metrics_public);

struct CorsOptions {
  std::vector<std::string> origins;  // exact origins, or "*"; empty: no cross-origin access
  std::vector<std::string> methods = {"*"};
  std::vector<std::string> headers = {"*"};
  bool credentials = false;
};

class CorsPolicy {
 public:
  // Each list from a JSON array of strings (vLLM's form, '["https://a.example"]') or a
  // comma-separated list; errors name the flag.
  static Status parse_list(const std::string& flag, const std::string& value,
                           std::vector<std::string>* out);
  explicit CorsPolicy(CorsOptions o = {}) : o_(std::move(o)) {}
  bool enabled() const { return !o_.origins.empty(); }
  bool origin_allowed(std::string_view origin) const;
  // The headers of an answer to a request from `origin` (none when the origin is not allowed).
  // With credentials, a "*" origin list answers the request's own origin (browsers refuse "*"
  // with credentials), and Vary: Origin says the answer depends on it.
  std::vector<std::pair<std::string, std::string>> response_headers(std::string_view origin) const;
  // A preflight (OPTIONS with Access-Control-Request-Method): nullopt when refused (origin,
  // method or a requested header not allowed; the caller answers 400 as Starlette does), else
  // the headers of the 200 answer.
  std::optional<std::vector<std::pair<std::string, std::string>>> preflight(
      std::string_view origin, std::string_view method, std::string_view request_headers) const;

 private:
  CorsOptions o_;
};

// Whether `host` (the --host value) is a loopback address: 127.0.0.0/8, ::1 or localhost.
bool is_loopback_host(std::string_view host);

}  // namespace dsv41
