// The regex subset (docs/structured-outputs.md) to grammar expressions: literals, classes with
// ranges and negation, '.', \d \w \s (and negations), groups, '|', quantifiers * + ? {m,n} (lazy
// forms accepted: same language), anchors ^ $ at the ends of a top-level branch only. Characters
// become raw UTF-8 or JSON string content (escaped '"', '\\' and control characters).
#include <algorithm>

#include "grammar/grammar_ir.h"

namespace dsv41::grammar_detail {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr int kMaxRepeat = 1000;
constexpr int kMaxGroupDepth = 64;

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.emplace_back(lo, hi);
  }
  return out;
}

Ranges complement(const Ranges& in) {
  Ranges r = normalize(in), out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCp) out.emplace_back(next, kMaxCp);
  return out;
}

// Code point range -> UTF-8 byte-range sequences (the standard split at encoding-length and
// continuation-byte boundaries).
void utf8_split(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<int, int>>>& out) {
  if (lo > hi) return;
  for (uint32_t m : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (lo <= m && hi > m) {
      utf8_split(lo, m, out);
      utf8_split(m + 1, hi, out);
      return;
    }
  if (hi <= 0x7F) {
    out.push_back({{static_cast<int>(lo), static_cast<int>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    uint32_t mask = (1u << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        utf8_split(lo, lo | mask, out);
        utf8_split((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        utf8_split(lo, (hi & ~mask) - 1, out);
        utf8_split(hi & ~mask, hi, out);
        return;
      }
    }
  }
  auto enc = [](uint32_t cp) {
    std::vector<int> b;
    if (cp < 0x800) {
      b = {static_cast<int>(0xC0 | (cp >> 6)), static_cast<int>(0x80 | (cp & 0x3F))};
    } else if (cp < 0x10000) {
      b = {static_cast<int>(0xE0 | (cp >> 12)), static_cast<int>(0x80 | ((cp >> 6) & 0x3F)),
           static_cast<int>(0x80 | (cp & 0x3F))};
    } else {
      b = {static_cast<int>(0xF0 | (cp >> 18)), static_cast<int>(0x80 | ((cp >> 12) & 0x3F)),
           static_cast<int>(0x80 | ((cp >> 6) & 0x3F)), static_cast<int>(0x80 | (cp & 0x3F))};
    }
    return b;
  };
  std::vector<int> a = enc(lo), b = enc(hi);
  std::vector<std::pair<int, int>> seq;
  for (std::size_t k = 0; k < a.size(); ++k) seq.emplace_back(a[k], b[k]);
  out.push_back(std::move(seq));
}

int hex_digit_expr(ExprPool& pool, int v) {
  ByteSet s;
  const char* kHex = "0123456789abcdef";
  s.set(kHex[v]);
  if (v >= 10) s.set(kHex[v] - 'a' + 'A');
  return pool.bytes(s);
}

class Parser {
 public:
  Parser(std::vector<uint32_t> cps, ExprPool& pool, bool json_string, const std::string& where)
      : cp_(std::move(cps)), pool_(pool), json_(json_string), where_(where) {}

  Result<int> top(bool full) {
    std::vector<int> branches;
    while (true) {
      bool anchored_start = false, anchored_end = false;
      if (peek('^')) ++pos_, anchored_start = true;
      auto seq = sequence(0, &anchored_end);
      if (!seq.is_ok()) return seq.status();
      std::vector<int> parts;
      if (!full && !anchored_start) parts.push_back(any_star());
      parts.push_back(seq.value());
      if (!full && !anchored_end) parts.push_back(any_star());
      branches.push_back(pool_.seq(std::move(parts)));
      if (pos_ == cp_.size()) break;
      if (!peek('|')) return err("unbalanced ')'");
      ++pos_;
    }
    return pool_.alt(std::move(branches));
  }

 private:
  Status err(const std::string& what) const {
    return Status::error(where_ + ": " + what + " at character " + std::to_string(pos_));
  }
  bool peek(uint32_t c) const { return pos_ < cp_.size() && cp_[pos_] == c; }
  int any_star() {
    return pool_.repeat(char_class_expr(pool_, {{0, kMaxCp}}, json_), 0, kUnbounded);
  }

  Result<int> alternation(int depth) {
    std::vector<int> branches;
    while (true) {
      auto seq = sequence(depth, nullptr);
      if (!seq.is_ok()) return seq;
      branches.push_back(seq.value());
      if (!peek('|')) break;
      ++pos_;
    }
    return pool_.alt(std::move(branches));
  }

  // A concatenation up to '|', ')' or the end. At depth 0 a final '$' sets *anchored_end.
  Result<int> sequence(int depth, bool* anchored_end) {
    std::vector<int> items;
    while (pos_ < cp_.size() && !peek('|') && !peek(')')) {
      if (peek('$')) {
        ++pos_;
        bool at_end = pos_ == cp_.size() || peek('|');
        if (depth != 0 || !at_end || !anchored_end)
          return err("'$' is supported only at the end of the pattern");
        *anchored_end = true;
        break;
      }
      if (peek('^')) return err("'^' is supported only at the start of the pattern");
      auto atom = this->atom(depth);
      if (!atom.is_ok()) return atom;
      auto rep = quantified(atom.value());
      if (!rep.is_ok()) return rep;
      items.push_back(rep.value());
    }
    if (depth == 0 && peek(')')) return err("unbalanced ')'");
    return pool_.seq(std::move(items));
  }

  Result<int> number(int* out) {
    std::size_t start = pos_;
    int64_t v = 0;
    while (pos_ < cp_.size() && cp_[pos_] >= '0' && cp_[pos_] <= '9') {
      v = v * 10 + (cp_[pos_] - '0');
      if (v > kMaxRepeat) return err("repetition count above " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    if (pos_ == start) return err("expected a number in {}");
    *out = static_cast<int>(v);
    return 0;
  }

  Result<int> quantified(int atom) {
    if (pos_ >= cp_.size()) return atom;
    int min = 0, max = 0;
    uint32_t c = cp_[pos_];
    if (c == '*') {
      min = 0, max = kUnbounded, ++pos_;
    } else if (c == '+') {
      min = 1, max = kUnbounded, ++pos_;
    } else if (c == '?') {
      min = 0, max = 1, ++pos_;
    } else if (c == '{') {
      ++pos_;
      auto r = number(&min);
      if (!r.is_ok()) return r;
      max = min;
      if (peek(',')) {
        ++pos_;
        if (peek('}')) {
          max = kUnbounded;
        } else {
          r = number(&max);
          if (!r.is_ok()) return r;
        }
      }
      if (!peek('}')) return err("expected '}'");
      ++pos_;
      if (max != kUnbounded && max < min) return err("{m,n} with n < m");
    } else {
      return atom;
    }
    if (peek('?')) ++pos_;  // lazy: the same language
    if (pos_ < cp_.size() && (peek('*') || peek('+') || peek('{')))
      return err("a quantifier cannot follow a quantifier");
    return pool_.repeat(atom, min, max);
  }

  Result<int> atom(int depth) {
    uint32_t c = cp_[pos_];
    if (c == '(') {
      if (depth >= kMaxGroupDepth) return err("groups nested too deeply");
      ++pos_;
      if (peek('?')) {
        if (pos_ + 1 < cp_.size() && cp_[pos_ + 1] == ':')
          pos_ += 2;
        else
          return err("lookaround and named groups are not supported");
      }
      auto inner = alternation(depth + 1);
      if (!inner.is_ok()) return inner;
      if (!peek(')')) return err("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      return char_class_expr(pool_, complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}),
                             json_);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{' || c == '}' || c == ']')
      return err("unexpected '" + std::string(1, static_cast<char>(c)) + "'");
    Ranges r;
    if (c == '\\') {
      auto e = escape(false, &r);
      if (!e.is_ok()) return e.status();
    } else {
      ++pos_;
      r = {{c, c}};
    }
    return char_class_expr(pool_, r, json_);
  }

  // After '\\': fills *out with the escape's characters.
  Result<int> escape(bool in_class, Ranges* out) {
    ++pos_;
    if (pos_ >= cp_.size()) return err("pattern ends with '\\'");
    uint32_t c = cp_[pos_++];
    const Ranges kDigit = {{'0', '9'}};
    const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const Ranges kSpace = {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680},
                           {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                           {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
    switch (c) {
      case 'd':
        *out = kDigit;
        return 0;
      case 'D':
        *out = complement(kDigit);
        return 0;
      case 'w':
        *out = kWord;
        return 0;
      case 'W':
        *out = complement(kWord);
        return 0;
      case 's':
        *out = kSpace;
        return 0;
      case 'S':
        *out = complement(kSpace);
        return 0;
      case 't':
        *out = {{'\t', '\t'}};
        return 0;
      case 'n':
        *out = {{'\n', '\n'}};
        return 0;
      case 'r':
        *out = {{'\r', '\r'}};
        return 0;
      case 'v':
        *out = {{'\v', '\v'}};
        return 0;
      case 'f':
        *out = {{'\f', '\f'}};
        return 0;
      case '0':
        *out = {{0, 0}};
        return 0;
      case 'x':
      case 'u': {
        int n = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          if (pos_ >= cp_.size()) return err("short \\" + std::string(1, static_cast<char>(c)));
          uint32_t h = cp_[pos_++];
          int d = h >= '0' && h <= '9'                 ? static_cast<int>(h - '0')
                  : (h | 32) >= 'a' && (h | 32) <= 'f' ? static_cast<int>((h | 32) - 'a' + 10)
                                                       : -1;
          if (d < 0) return err("bad hex digit");
          v = v * 16 + static_cast<uint32_t>(d);
        }
        *out = {{v, v}};
        return 0;
      }
      default:
        break;
    }
    static const std::string kPunct = "^$\\.*+?()[]{}|/-";
    if (c < 128 && kPunct.find(static_cast<char>(c)) != std::string::npos) {
      *out = {{c, c}};
      return 0;
    }
    (void)in_class;
    return err("unsupported escape '\\" + std::string(1, c < 128 ? static_cast<char>(c) : '?') +
               "'");
  }

  Result<int> char_class() {
    ++pos_;  // '['
    bool negate = peek('^');
    if (negate) ++pos_;
    Ranges r;
    bool first = true;
    while (true) {
      if (pos_ >= cp_.size()) return err("missing ']'");
      if (peek(']') && !first) break;
      first = false;
      Ranges item;
      bool single = true;
      if (peek('\\')) {
        auto e = escape(true, &item);
        if (!e.is_ok()) return e.status();
        single = item.size() == 1 && item[0].first == item[0].second;
      } else {
        item = {{cp_[pos_], cp_[pos_]}};
        ++pos_;
      }
      if (single && peek('-') && pos_ + 1 < cp_.size() && cp_[pos_ + 1] != ']') {
        ++pos_;
        Ranges hi;
        if (peek('\\')) {
          auto e = escape(true, &hi);
          if (!e.is_ok()) return e.status();
          if (hi.size() != 1 || hi[0].first != hi[0].second) return err("bad class range");
        } else {
          hi = {{cp_[pos_], cp_[pos_]}};
          ++pos_;
        }
        if (hi[0].first < item[0].first) return err("class range out of order");
        item = {{item[0].first, hi[0].first}};
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    ++pos_;  // ']'
    return char_class_expr(pool_, negate ? complement(r) : normalize(r), json_);
  }

  std::vector<uint32_t> cp_;
  std::size_t pos_ = 0;
  ExprPool& pool_;
  bool json_;
  std::string where_;
};

// UTF-8 -> code points; false on ill-formed input.
bool decode_utf8(std::string_view s, std::vector<uint32_t>& out) {
  for (std::size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > kMaxCp || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    out.push_back(cp);
    i += n;
  }
  return true;
}

}  // namespace

int char_class_expr(ExprPool& pool, const Ranges& ranges_in, bool json_string) {
  Ranges ranges = normalize(ranges_in);
  // Surrogates are not characters (UTF-8 cannot hold them).
  Ranges keep;
  for (auto [lo, hi] : ranges) {
    if (lo > kMaxCp) continue;
    hi = std::min(hi, kMaxCp);
    if (hi < 0xD800 || lo > 0xDFFF) {
      keep.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) keep.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) keep.emplace_back(0xE000, hi);
  }
  std::vector<int> alts;
  auto contains = [&](uint32_t c) {
    for (auto [lo, hi] : keep)
      if (c >= lo && c <= hi) return true;
    return false;
  };
  Ranges raw;
  if (json_string) {
    if (contains('"')) alts.push_back(pool.lit("\\\""));
    if (contains('\\')) alts.push_back(pool.lit("\\\\"));
    bool all_controls = true;
    for (uint32_t c = 0; c < 0x20; ++c) all_controls = all_controls && contains(c);
    if (all_controls) {
      ByteSet short_esc;
      for (char e : std::string("btnfr")) short_esc.set(e);
      ByteSet hex;
      hex.set_range('0', '9'), hex.set_range('a', 'f'), hex.set_range('A', 'F');
      alts.push_back(pool.seq({pool.lit("\\"), pool.bytes(short_esc)}));
      alts.push_back(pool.seq({pool.lit("\\u00"), pool.byte_range('0', '1'), pool.bytes(hex)}));
    } else {
      for (uint32_t c = 0; c < 0x20; ++c) {
        if (!contains(c)) continue;
        std::vector<int> forms;
        char se = c == 8 ? 'b' : c == 9 ? 't' : c == 10 ? 'n' : c == 12 ? 'f' : c == 13 ? 'r' : 0;
        if (se) forms.push_back(pool.lit(std::string("\\") + se));
        forms.push_back(pool.seq({pool.lit("\\u00"), hex_digit_expr(pool, static_cast<int>(c >> 4)),
                                  hex_digit_expr(pool, static_cast<int>(c & 15))}));
        alts.push_back(pool.alt(std::move(forms)));
      }
    }
    for (auto [lo, hi] : keep) {
      // Raw characters: all but '"', '\\' and the controls.
      uint32_t a = std::max<uint32_t>(lo, 0x20);
      for (uint32_t cut : {uint32_t{'"'}, uint32_t{'\\'}}) {
        if (a <= cut && cut <= hi) {
          if (a < cut) raw.emplace_back(a, cut - 1);
          a = cut + 1;
        }
      }
      if (a <= hi) raw.emplace_back(a, hi);
    }
  } else {
    raw = keep;
  }
  std::vector<std::vector<std::pair<int, int>>> seqs;
  for (auto [lo, hi] : raw) utf8_split(lo, hi, seqs);
  // Single-byte ranges are merged into one byte set (fewer NFA edges).
  ByteSet ascii;
  for (const auto& s : seqs) {
    if (s.size() == 1) {
      ascii.set_range(s[0].first, s[0].second);
      continue;
    }
    std::vector<int> parts;
    for (auto [lo, hi] : s) parts.push_back(pool.byte_range(lo, hi));
    alts.push_back(pool.seq(std::move(parts)));
  }
  if (!ascii.empty()) alts.push_back(pool.bytes(ascii));
  return pool.alt(std::move(alts));
}

Result<int> regex_to_expr(std::string_view pattern, ExprPool& pool, bool json_string, bool full,
                          const std::string& where) {
  std::vector<uint32_t> cps;
  if (!decode_utf8(pattern, cps)) return Status::error(where + ": the pattern is not valid UTF-8");
  Parser p(std::move(cps), pool, json_string, where);
  return p.top(full);
}

}  // namespace dsv41::grammar_detail
