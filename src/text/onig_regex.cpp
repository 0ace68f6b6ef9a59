// OnigRegex: Oniguruma compile and search loop (UTF-8, default syntax, as the onig crate uses).
#include "text/onig_regex.h"

#include <oniguruma.h>

namespace dsv41 {
namespace {

struct OnigInit {
  OnigInit() {
    OnigEncoding encs[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encs, 1);
  }
};

std::size_t utf8_char_len(std::string_view s, std::size_t i) {
  const auto c = uint8_t(s[i]);
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

}  // namespace

struct OnigRegex::Impl {
  regex_t* reg = nullptr;
};

Result<std::unique_ptr<OnigRegex>> OnigRegex::compile(const std::string& pattern,
                                                      const std::string& where) {
  static OnigInit init;
  std::unique_ptr<OnigRegex> r(new OnigRegex());
  r->impl_ = std::make_unique<Impl>();
  OnigErrorInfo einfo;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&r->impl_->reg, p, p + pattern.size(), ONIG_OPTION_NONE,
                          ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &einfo);
  if (rc != ONIG_NORMAL) {
    OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(msg, rc, &einfo);
    r->impl_->reg = nullptr;
    return Status::error(where + ": regex does not compile: " + reinterpret_cast<char*>(msg));
  }
  return r;
}

OnigRegex::~OnigRegex() {
  if (impl_ && impl_->reg) onig_free(impl_->reg);
}

void OnigRegex::split_isolated(std::string_view s, std::vector<std::string>* out) const {
  OnigRegion* region = onig_region_new();
  const auto* str = reinterpret_cast<const OnigUChar*>(s.data());
  const auto* end = str + s.size();
  std::size_t pos = 0, prev = 0;
  while (pos <= s.size()) {
    const int r = onig_search(impl_->reg, str, end, str + pos, end, region, ONIG_OPTION_NONE);
    if (r < 0) break;
    const auto b = std::size_t(region->beg[0]), e = std::size_t(region->end[0]);
    if (e == b) {  // empty match: nothing to emit, step one character
      if (b >= s.size()) break;
      pos = b + utf8_char_len(s, b);
      continue;
    }
    if (b > prev) out->emplace_back(s.substr(prev, b - prev));
    out->emplace_back(s.substr(b, e - b));
    prev = pos = e;
  }
  if (prev < s.size()) out->emplace_back(s.substr(prev));
  onig_region_free(region, 1);
}

}  // namespace dsv41
