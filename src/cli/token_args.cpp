// Token-id argument parsing shared by logits and explain.
#include "cli/token_args.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace dsv41::cli {

Result<std::vector<int32_t>> parse_tokens(const std::string& text, const std::string& where,
                                          bool allow_image) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&]() -> Status {
    if (cur.empty()) return Status::ok();
    if (cur == "IMG") {
      if (!allow_image)
        return Status::error(where + ": IMG (an image) is taken by `logits --image` only");
      ids.push_back(-1);
      cur.clear();
      return Status::ok();
    }
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(cur.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < 0 || v > INT32_MAX)
      return Status::error(where + ": '" + cur + "' is not a token id");
    ids.push_back(int32_t(v));
    cur.clear();
    return Status::ok();
  };
  for (char c : text) {
    if (c == ',' || std::isspace(static_cast<unsigned char>(c))) {
      DSV41_RETURN_IF_ERROR(flush());
    } else {
      cur += c;
    }
  }
  DSV41_RETURN_IF_ERROR(flush());
  if (ids.empty()) return Status::error(where + ": no token ids");
  return ids;
}

Result<std::vector<int32_t>> load_tokens(const std::string& tokens, const std::string& tokens_file,
                                         bool allow_image) {
  if (tokens_file.empty()) return parse_tokens(tokens, "--tokens", allow_image);
  std::ifstream f(tokens_file);
  if (!f) return Status::error("--tokens-file: cannot open " + tokens_file);
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_tokens(ss.str(), "--tokens-file " + tokens_file, allow_image);
}

// Chunk sizes of the requested mode over n tokens.
Result<int64_t> chunk_size(const std::string& mode, int64_t n) {
  if (mode == "prefill") return n;
  if (mode == "decode") return int64_t(1);
  if (mode.rfind("chunked:", 0) == 0) {
    char* end = nullptr;
    const long long c = std::strtoll(mode.c_str() + 8, &end, 10);
    if (*end == '\0' && c > 0) return int64_t(c);
  }
  return Status::error("--mode: '" + mode + "' is not prefill, decode or chunked:N (N >= 1)");
}

std::vector<std::vector<int32_t>> split_calls(const std::vector<int32_t>& ids, int64_t chunk,
                                              int64_t first_min) {
  std::vector<std::vector<int32_t>> calls;
  for (std::size_t b = 0; b < ids.size();) {
    const std::size_t len = std::size_t(b == 0 ? std::max(chunk, first_min) : chunk);
    const std::size_t e = std::min(ids.size(), b + len);
    calls.emplace_back(ids.begin() + long(b), ids.begin() + long(e));
    b = e;
  }
  return calls;
}

}  // namespace dsv41::cli
