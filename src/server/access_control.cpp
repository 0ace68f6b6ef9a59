// API keys and the CORS policy (access_control.h): parsing, constant-time key checks, and the
// headers of CORS answers.
#include "server/access_control.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <fstream>

#include <fmt/format.h>

#include "core/check.h"
#include "text/json_ordered.h"

namespace dsv41 {
namespace {

std::array<unsigned char, 32> sha256(std::string_view s) {
  std::array<unsigned char, 32> d{};
  unsigned int n = 0;
  DSV41_CHECK(EVP_Digest(s.data(), s.size(), d.data(), &n, EVP_sha256(), nullptr) == 1 && n == 32);
  return d;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool listed(const std::vector<std::string>& list, std::string_view v, bool case_insensitive) {
  for (const std::string& x : list)
    if (x == "*" || (case_insensitive ? iequals(x, v) : x == v)) return true;
  return false;
}

std::string joined(const std::vector<std::string>& list) {
  std::string out;
  for (const std::string& x : list) out += (out.empty() ? "" : ", ") + x;
  return out;
}

}  // namespace

Result<ApiKeys> ApiKeys::load(const std::vector<std::string>& flag_keys, const std::string& file,
                              const std::string& env_value) {
  ApiKeys keys;
  auto add = [&](std::string_view key, const std::string& source) -> Status {
    const std::string_view k = trim(key);
    if (k.empty()) return Status::error(source + ": an API key is empty");
    keys.digests_.push_back(sha256(k));
    return Status::ok();
  };
  for (const std::string& k : flag_keys)
    if (Status st = add(k, "--api-key"); !st.is_ok()) return st;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) return Status::error(fmt::format("--api-key-file: cannot read {}", file));
    std::string line;
    std::size_t found = 0;
    while (std::getline(in, line)) {
      const std::string_view t = trim(line);
      if (t.empty() || t.front() == '#') continue;
      if (Status st = add(t, "--api-key-file " + file); !st.is_ok()) return st;
      ++found;
    }
    if (in.bad()) return Status::error(fmt::format("--api-key-file: cannot read {}", file));
    if (found == 0) return Status::error(fmt::format("--api-key-file: {} holds no key", file));
  }
  if (!env_value.empty())
    if (Status st = add(env_value, "DSV41_API_KEY"); !st.is_ok()) return st;
  return keys;
}

bool ApiKeys::accepts(std::string_view authorization, std::string_view x_api_key) const {
  if (digests_.empty()) return true;
  std::string_view bearer;
  authorization = trim(authorization);
  if (authorization.size() > 7 && iequals(authorization.substr(0, 7), "bearer "))
    bearer = trim(authorization.substr(7));
  x_api_key = trim(x_api_key);
  const Digest a = sha256(bearer), b = sha256(x_api_key);
  int ok = 0;
  for (const Digest& d : digests_) {
    ok |= !bearer.empty() && CRYPTO_memcmp(a.data(), d.data(), d.size()) == 0;
    ok |= !x_api_key.empty() && CRYPTO_memcmp(b.data(), d.data(), d.size()) == 0;
  }
  return ok != 0;
}

bool path_needs_key(std::string_view path, bool metrics_public) {
  if (path == "/health" || path == "/" || path == "/dashboard" || path.starts_with("/web/"))
    return false;
  if (path == "/metrics") return !metrics_public;
  return true;
}

Status CorsPolicy::parse_list(const std::string& flag, const std::string& value,
                              std::vector<std::string>* out) {
  out->clear();
  const std::string_view v = trim(value);
  if (!v.empty() && v.front() == '[') {
    auto j = parse_json_ordered(std::string(v));
    if (!j || !j->is_array())
      return Status::error(fmt::format("{}: not a JSON array of strings: {}", flag,
                                       j ? std::string(v) : std::string(j.status().message())));
    for (const auto& e : *j) {
      if (!e.is_string() || trim(e.get<std::string>()).empty())
        return Status::error(fmt::format("{}: every element must be a non-empty string", flag));
      out->emplace_back(trim(e.get<std::string>()));
    }
    return Status::ok();
  }
  std::size_t at = 0;
  while (at <= v.size()) {
    const std::size_t comma = std::min(v.find(',', at), v.size());
    const std::string_view item = trim(v.substr(at, comma - at));
    if (item.empty()) return Status::error(fmt::format("{}: an empty element in '{}'", flag, v));
    out->emplace_back(item);
    at = comma + 1;
  }
  return Status::ok();
}

bool CorsPolicy::origin_allowed(std::string_view origin) const {
  return !origin.empty() && listed(o_.origins, origin, false);
}

std::vector<std::pair<std::string, std::string>> CorsPolicy::response_headers(
    std::string_view origin) const {
  std::vector<std::pair<std::string, std::string>> h;
  if (!origin_allowed(origin)) return h;
  const bool any = std::find(o_.origins.begin(), o_.origins.end(), "*") != o_.origins.end();
  h.emplace_back("Access-Control-Allow-Origin",
                 any && !o_.credentials ? std::string("*") : std::string(origin));
  if (o_.credentials) h.emplace_back("Access-Control-Allow-Credentials", "true");
  if (!any || o_.credentials) h.emplace_back("Vary", "Origin");
  return h;
}

std::optional<std::vector<std::pair<std::string, std::string>>> CorsPolicy::preflight(
    std::string_view origin, std::string_view method, std::string_view request_headers) const {
  if (!origin_allowed(origin) || method.empty() || !listed(o_.methods, method, false))
    return std::nullopt;
  std::size_t at = 0;
  while (at < request_headers.size()) {
    const std::size_t comma = std::min(request_headers.find(',', at), request_headers.size());
    const std::string_view hname = trim(request_headers.substr(at, comma - at));
    if (!hname.empty() && !listed(o_.headers, hname, true)) return std::nullopt;
    at = comma + 1;
  }
  auto h = response_headers(origin);
  const bool any_method = std::find(o_.methods.begin(), o_.methods.end(), "*") != o_.methods.end();
  h.emplace_back("Access-Control-Allow-Methods",
                 any_method ? "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT" : joined(o_.methods));
  // With "*" the requested headers are echoed (a literal "*" is not honoured with credentials).
  const bool any_header = std::find(o_.headers.begin(), o_.headers.end(), "*") != o_.headers.end();
  const std::string allowed = any_header ? std::string(trim(request_headers)) : joined(o_.headers);
  if (!allowed.empty()) h.emplace_back("Access-Control-Allow-Headers", allowed);
  h.emplace_back("Access-Control-Max-Age", "600");
  return h;
}

bool is_loopback_host(std::string_view host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  return host.starts_with("127.") &&
         host.find_first_not_of("0123456789.") == std::string_view::npos;
}

}  // namespace dsv41
