// JSON Schema (draft 2020-12 subset) -> grammar rules. Every sub-schema becomes a rule (identical
// sub-schemas share one, so they share their memoized token sets); scalars become call-free rules,
// objects and arrays call their members. A keyword outside the supported set is an error naming it
// and its JSON-pointer path: nothing is silently ignored. Policies: docs/structured-outputs.md.
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "grammar/grammar_ir.h"

namespace dsv41::grammar_detail {

namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxSchemaDepth = 128;
constexpr int64_t kMaxMagnitude = 999999999999999;  // 15 digits: exact in a double
constexpr int kMaxFractionDigits = 15;

const std::set<std::string> kAnnotations = {"title",    "description", "$schema",  "$id",
                                            "examples", "default",     "$comment", "deprecated",
                                            "readOnly", "writeOnly"};
const std::set<std::string> kSupported = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "prefixItems",
                                          "minItems",
                                          "maxItems",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "$defs",
                                          "definitions",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "nullable"};

std::string pointer_escape(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

int json_depth(const Json& j, int depth) {
  if (depth > kMaxSchemaDepth) return depth;
  int best = depth;
  if (j.is_object() || j.is_array())
    for (const auto& v : j) {
      best = std::max(best, json_depth(v, depth + 1));
      if (best > kMaxSchemaDepth) break;
    }
  return best;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const GrammarOptions& o, Budget& budget)
      : root_(root), o_(o), budget_(budget) {}

  Result<Draft> run(const std::string& pointer) {
    int start = d_.add_rule(pointer.empty() ? "schema" : pointer);
    const Json* at = &root_;
    if (!pointer.empty()) {
      auto target = resolve_ref(Json("#" + pointer), "");
      if (!target.is_ok()) return target.status();
      at = target.value();
    }
    auto body = schema_expr(*at, pointer, 0);
    if (!body.is_ok()) return body.status();
    d_.body[start] = body.value();
    return std::move(d_);
  }

 private:
  Status err(const std::string& path, const std::string& what) const {
    return Status::error("json_schema: " + what + " at " + (path.empty() ? "/" : path));
  }
  int p(std::string_view s) { return d_.pool.lit(s); }
  // Optional whitespace (GrammarOptions::max_whitespace bytes at most).
  int ws() {
    if (o_.max_whitespace <= 0) return d_.pool.empty();
    ByteSet s;
    s.set(' '), s.set('\t'), s.set('\n');
    return d_.pool.repeat(d_.pool.bytes(s), 0, o_.max_whitespace);
  }
  int tok(const char* s) { return d_.pool.seq({ws(), p(s), ws()}); }

  // A rule for the sub-schema (shared by identical sub-schemas); returns the call expression.
  Result<int> schema_call(const Json& s, const std::string& path, int depth) {
    std::string key = s.dump();
    auto it = rules_.find(key);
    if (it != rules_.end()) return d_.pool.call(it->second);
    int r = d_.add_rule(path.empty() ? "/" : path);
    rules_.emplace(key, r);
    auto body = schema_expr(s, path, depth);
    if (!body.is_ok()) return body.status();
    d_.body[r] = body.value();
    return d_.pool.call(r);
  }

  Result<const Json*> resolve_ref(const Json& ref, const std::string& path) {
    if (!ref.is_string()) return err(path + "/$ref", "$ref must be a string");
    std::string s = ref.get<std::string>();
    if (s.empty() || s[0] != '#')
      return err(path + "/$ref", "only local $ref (\"#...\") is supported, not \"" + s + "\"");
    const Json* cur = &root_;
    std::string rest = s.substr(1);
    std::size_t i = 0;
    while (i < rest.size()) {
      if (rest[i] != '/') return err(path + "/$ref", "bad JSON pointer \"" + s + "\"");
      std::size_t j = rest.find('/', i + 1);
      std::string tokn = rest.substr(i + 1, j == std::string::npos ? std::string::npos : j - i - 1);
      std::string key;
      for (std::size_t k = 0; k < tokn.size(); ++k) {
        if (tokn[k] == '~' && k + 1 < tokn.size() && (tokn[k + 1] == '0' || tokn[k + 1] == '1'))
          key += tokn[k + 1] == '0' ? '~' : '/', ++k;
        else
          key += tokn[k];
      }
      if (cur->is_object() && cur->contains(key)) {
        cur = &(*cur)[key];
      } else if (cur->is_array() && !key.empty() &&
                 key.find_first_not_of("0123456789") == std::string::npos && key.size() < 9 &&
                 std::stoul(key) < cur->size()) {
        cur = &(*cur)[std::stoul(key)];
      } else {
        return err(path + "/$ref", "$ref \"" + s + "\" points to nothing");
      }
      i = j == std::string::npos ? rest.size() : j;
    }
    return cur;
  }

  Result<int> ref_call(const Json& ref, const std::string& path) {
    auto target = resolve_ref(ref, path);
    if (!target.is_ok()) return target.status();
    std::string key = "$ref:" + ref.get<std::string>();
    auto it = rules_.find(key);
    if (it != rules_.end()) return d_.pool.call(it->second);
    int r = d_.add_rule(path + "/$ref (" + ref.get<std::string>() + ")");
    rules_.emplace(key, r);
    // The target's own path is the pointer; depth restarts (recursion goes through rules).
    auto body = schema_expr(*target.value(), ref.get<std::string>().substr(1), 0);
    if (!body.is_ok()) return body.status();
    d_.body[r] = body.value();
    return d_.pool.call(r);
  }

  Status check_keywords(const Json& s, const std::string& path) {
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k) || kSupported.count(k)) continue;
      return err(path + "/" + pointer_escape(k), "unsupported keyword \"" + k + "\"");
    }
    return Status::ok();
  }

  Result<int> schema_expr(const Json& s, const std::string& path, int depth) {
    DSV41_RETURN_IF_ERROR(budget_.charge());
    if (depth > kMaxSchemaDepth) return err(path, "schema nested too deeply");
    if (s.is_boolean()) return s.get<bool>() ? any_value() : d_.pool.alt({});
    if (!s.is_object()) return err(path, "a schema must be an object or a boolean");
    DSV41_RETURN_IF_ERROR(check_keywords(s, path));
    auto only = [&](const char* owner, std::set<std::string> allowed) -> Status {
      for (const auto& [k, v] : s.items())
        if (!kAnnotations.count(k) && !allowed.count(k) && k != "$defs" && k != "definitions")
          return err(path + "/" + pointer_escape(k),
                     "keyword \"" + k + "\" beside \"" + owner + "\" is not supported");
      return Status::ok();
    };
    if (s.contains("$ref")) {
      DSV41_RETURN_IF_ERROR(only("$ref", {"$ref"}));
      return ref_call(s["$ref"], path);
    }
    for (const char* comb : {"anyOf", "oneOf"}) {
      if (!s.contains(comb)) continue;
      DSV41_RETURN_IF_ERROR(only(comb, {comb}));
      const Json& list = s[comb];
      if (!list.is_array() || list.empty())
        return err(path + "/" + comb, std::string(comb) + " must be a non-empty array");
      std::vector<int> alts;
      for (std::size_t i = 0; i < list.size(); ++i) {
        auto c = schema_call(list[i], path + "/" + comb + "/" + std::to_string(i), depth + 1);
        if (!c.is_ok()) return c;
        alts.push_back(c.value());
      }
      return d_.pool.alt(std::move(alts));
    }
    if (s.contains("allOf")) return all_of(s, path, depth);
    // Types: declared, else inferred from the keywords present.
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const auto& x : t) {
          if (!x.is_string()) return err(path + "/type", "type entries must be strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return err(path + "/type", "type must be a string or a non-empty array");
      }
    }
    if (s.contains("nullable")) {
      if (!s["nullable"].is_boolean()) return err(path + "/nullable", "nullable must be a boolean");
      if (s["nullable"].get<bool>()) types.push_back("null");
    }
    if (s.contains("enum") || s.contains("const")) return literals(s, path, types);
    bool typed = s.contains("type");
    if (!typed) {
      auto has = [&](std::initializer_list<const char*> ks) {
        for (const char* k : ks)
          if (s.contains(k)) return true;
        return false;
      };
      if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
      if (has({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
      if (has({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
      if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}))
        types.push_back("number");
      bool only_null = types.size() == 1 && types[0] == "null";
      if (types.empty() || only_null) return any_value();  // nullable alone adds nothing
    }
    std::vector<int> alts;
    std::set<std::string> seen;
    for (const std::string& t : types) {
      if (!seen.insert(t).second) continue;
      auto e = typed_expr(s, t, path, depth);
      if (!e.is_ok()) return e;
      alts.push_back(e.value());
    }
    return d_.pool.alt(std::move(alts));
  }

  Result<int> typed_expr(const Json& s, const std::string& t, const std::string& path, int depth) {
    if (t == "null") return p("null");
    if (t == "boolean") return d_.pool.alt({p("true"), p("false")});
    if (t == "string") return string_expr(s, path);
    if (t == "integer") return integer_expr(s, path);
    if (t == "number") return number_expr(s, path);
    if (t == "object") return object_expr(s, path, depth);
    if (t == "array") return array_expr(s, path, depth);
    return err(path + "/type", "unknown type \"" + t + "\"");
  }

  Result<int> literals(const Json& s, const std::string& path,
                       const std::vector<std::string>& types) {
    std::vector<Json> values;
    if (s.contains("const")) values.push_back(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) return err(path + "/enum", "enum must be an array");
      for (const auto& v : s["enum"]) values.push_back(v);
    }
    for (const auto& [k, v] : s.items())
      if (!kAnnotations.count(k) && k != "enum" && k != "const" && k != "type" && k != "nullable" &&
          k != "$defs" && k != "definitions")
        return err(path + "/" + pointer_escape(k),
                   "keyword \"" + k + "\" beside enum/const is not supported");
    auto type_ok = [&](const Json& v) {
      if (types.empty()) return true;
      for (const std::string& t : types) {
        if ((t == "null" && v.is_null()) || (t == "boolean" && v.is_boolean()) ||
            (t == "string" && v.is_string()) || (t == "object" && v.is_object()) ||
            (t == "array" && v.is_array()) || (t == "number" && v.is_number()) ||
            (t == "integer" && v.is_number() &&
             (v.is_number_integer() || std::trunc(v.get<double>()) == v.get<double>())))
          return true;
      }
      return false;
    };
    std::vector<int> alts;
    for (const Json& v : values)
      if (type_ok(v)) alts.push_back(p(v.dump()));
    if (s.contains("const") && s.contains("enum")) {
      // Both must hold: keep the const only if the enum lists it.
      bool listed = false;
      for (const auto& v : s["enum"]) listed = listed || v == s["const"];
      if (!listed) return d_.pool.alt({});
      return type_ok(s["const"]) ? p(s["const"].dump()) : d_.pool.alt({});
    }
    return d_.pool.alt(std::move(alts));
  }

  Result<int> count_kw(const Json& s, const char* k, const std::string& path, int64_t def,
                       int64_t* out) {
    *out = def;
    if (!s.contains(k)) return 0;
    const Json& v = s[k];
    if (!v.is_number_integer() &&
        !(v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>()))
      return err(path + "/" + k, std::string(k) + " must be a non-negative integer");
    double x = v.get<double>();
    if (x < 0) return err(path + "/" + k, std::string(k) + " must be a non-negative integer");
    if (x > 100000) return err(path + "/" + k, std::string(k) + " above 100000 is not supported");
    *out = static_cast<int64_t>(x);
    return 0;
  }

  Result<int> string_expr(const Json& s, const std::string& path) {
    int64_t min = 0, max = kUnbounded;
    auto r = count_kw(s, "minLength", path, 0, &min);
    if (!r.is_ok()) return r;
    r = count_kw(s, "maxLength", path, kUnbounded, &max);
    if (!r.is_ok()) return r;
    bool has_len = s.contains("minLength") || s.contains("maxLength");
    int content = -1;
    if (s.contains("pattern") || s.contains("format")) {
      const char* kw = s.contains("pattern") ? "pattern" : "format";
      if (s.contains("pattern") && s.contains("format"))
        return err(path + "/format", "format together with pattern is not supported");
      if (has_len)
        return err(path + "/" + kw,
                   std::string(kw) + " together with minLength/maxLength is not supported");
      if (!s[kw].is_string()) return err(path + "/" + kw, std::string(kw) + " must be a string");
      std::string text = s[kw].get<std::string>();
      std::string regex = text;
      bool full = false;
      if (s.contains("format")) {
        auto f = format_regex(text);
        if (f.empty()) return err(path + "/format", "unsupported format \"" + text + "\"");
        regex = f, full = true;
      }
      auto e = regex_to_expr(regex, d_.pool, true, full,
                             std::string("json_schema: ") + kw + " at " + path + "/" + kw);
      if (!e.is_ok()) return e;
      content = e.value();
    } else {
      if (max != kUnbounded && max < min) return d_.pool.alt({});
      content = d_.pool.repeat(json_char(), static_cast<int>(min), static_cast<int>(max));
    }
    return d_.pool.seq({p("\""), content, p("\"")});
  }

  // One character of JSON string content: raw UTF-8 (not '"', '\\', controls) or an escape;
  // \u escapes of surrogates are not produced (one escape = one character for length counts).
  int json_char() {
    if (json_char_ >= 0) return json_char_;
    ByteSet hex;
    hex.set_range('0', '9'), hex.set_range('a', 'f'), hex.set_range('A', 'F');
    ByteSet hex_no_d = hex;
    ByteSet d;
    d.set('d'), d.set('D');
    for (int b : {'d', 'D'}) hex_no_d.w[b >> 6] &= ~(uint64_t{1} << (b & 63));
    int hx = d_.pool.bytes(hex);
    int u = d_.pool.seq(
        {p("\\u"),
         d_.pool.alt({d_.pool.seq({d_.pool.bytes(hex_no_d), hx, hx, hx}),
                      d_.pool.seq({d_.pool.bytes(d), d_.pool.byte_range('0', '7'), hx, hx})})});
    ByteSet simple;
    for (char c : std::string("\"\\/bfnrt")) simple.set(c);
    int esc = d_.pool.seq({p("\\"), d_.pool.bytes(simple)});
    int raw = char_class_expr(d_.pool, {{0x20, 0x10FFFF}}, true);
    json_char_ = d_.pool.alt({raw, esc, u});
    return json_char_;
  }

  static std::string format_regex(const std::string& f) {
    const std::string leap = "(\\d\\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)";
    const std::string date =
        "(\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-"
        "9]|"
        "1\\d|2[0-8]))|" +
        leap + "-02-29)";
    const std::string time =
        "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,9})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)";
    if (f == "date") return date;
    if (f == "date-time") return date + "T" + time;
    if (f == "uuid")
      return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
    // Unbounded runs keep the automaton small (bounded ones multiply its states).
    if (f == "email") return "[a-zA-Z0-9_+-]+(\\.[a-zA-Z0-9_+-]+)*@([a-zA-Z0-9]+\\.)+[a-zA-Z]{2,}";
    return "";
  }

  // Bounds as an inclusive integer range [lo, hi] (rounded inward, 15-digit magnitudes).
  Result<int> bounds(const Json& s, const std::string& path, int64_t* lo, int64_t* hi) {
    double l = -static_cast<double>(kMaxMagnitude), h = static_cast<double>(kMaxMagnitude);
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      if (!s[k].is_number()) return err(path + "/" + k, std::string(k) + " must be a number");
      double v = s[k].get<double>();
      if (!std::isfinite(v)) return err(path + "/" + k, std::string(k) + " must be finite");
      std::string kw = k;
      if (kw == "minimum") l = std::max(l, std::ceil(v));
      if (kw == "maximum") h = std::min(h, std::floor(v));
      if (kw == "exclusiveMinimum") l = std::max(l, std::floor(v) + 1);
      if (kw == "exclusiveMaximum") h = std::min(h, std::ceil(v) - 1);
    }
    l = std::max(l, -static_cast<double>(kMaxMagnitude));
    h = std::min(h, static_cast<double>(kMaxMagnitude));
    *lo = static_cast<int64_t>(l), *hi = static_cast<int64_t>(h);
    return 0;
  }

  // Decimal digits of every integer in [a, b] (0 <= a <= b), without leading zeros.
  int nonneg_range(int64_t a, int64_t b) {
    std::vector<int> alts;
    std::string sa = std::to_string(a), sb = std::to_string(b);
    for (std::size_t len = sa.size(); len <= sb.size(); ++len) {
      int64_t pow = 1;
      for (std::size_t k = 1; k < len; ++k) pow *= 10;
      int64_t lo = std::max(a, len == 1 ? 0 : pow), hi = std::min(b, pow * 10 - 1);
      if (lo > hi) continue;
      alts.push_back(same_len(std::to_string(lo), std::to_string(hi)));
    }
    return d_.pool.alt(std::move(alts));
  }
  int same_len(const std::string& lo, const std::string& hi) {
    if (lo.empty()) return d_.pool.empty();
    if (lo[0] == hi[0])
      return d_.pool.seq({d_.pool.byte_range(lo[0], lo[0]), same_len(lo.substr(1), hi.substr(1))});
    std::size_t n = lo.size() - 1;
    bool lo_zeros = lo.find_first_not_of('0', 1) == std::string::npos;
    bool hi_nines = hi.find_first_not_of('9', 1) == std::string::npos;
    int digit = d_.pool.byte_range('0', '9');
    auto any = [&](std::size_t k) {
      return d_.pool.repeat(digit, static_cast<int>(k), static_cast<int>(k));
    };
    std::vector<int> alts;
    char first_full = lo_zeros ? lo[0] : static_cast<char>(lo[0] + 1);
    char last_full = hi_nines ? hi[0] : static_cast<char>(hi[0] - 1);
    if (!lo_zeros)
      alts.push_back(d_.pool.seq(
          {d_.pool.byte_range(lo[0], lo[0]), same_len(lo.substr(1), std::string(n, '9'))}));
    if (first_full <= last_full)
      alts.push_back(d_.pool.seq({d_.pool.byte_range(first_full, last_full), any(n)}));
    if (!hi_nines)
      alts.push_back(d_.pool.seq(
          {d_.pool.byte_range(hi[0], hi[0]), same_len(std::string(n, '0'), hi.substr(1))}));
    return d_.pool.alt(std::move(alts));
  }

  Result<int> integer_expr(const Json& s, const std::string& path) {
    int64_t lo = 0, hi = 0;
    auto r = bounds(s, path, &lo, &hi);
    if (!r.is_ok()) return r;
    std::vector<int> alts;
    if (lo < 0 && std::max<int64_t>(1, -hi) <= -lo)
      alts.push_back(d_.pool.seq({p("-"), nonneg_range(std::max<int64_t>(1, -hi), -lo)}));
    if (hi >= 0 && std::max<int64_t>(lo, 0) <= hi)
      alts.push_back(nonneg_range(std::max<int64_t>(lo, 0), hi));
    return d_.pool.alt(std::move(alts));
  }

  // Magnitudes m.f in [a, b]: integer part in [a, b-1] with any fraction, or b with a zero one.
  int magnitude(int64_t a, int64_t b) {
    int digit = d_.pool.byte_range('0', '9');
    int frac = d_.pool.opt(d_.pool.seq({p("."), d_.pool.repeat(digit, 1, kMaxFractionDigits)}));
    int zero_frac =
        d_.pool.opt(d_.pool.seq({p("."), d_.pool.repeat(p("0"), 1, kMaxFractionDigits)}));
    std::vector<int> alts;
    if (a <= b - 1) alts.push_back(d_.pool.seq({nonneg_range(a, b - 1), frac}));
    alts.push_back(d_.pool.seq({nonneg_range(b, b), zero_frac}));
    return d_.pool.alt(std::move(alts));
  }

  Result<int> number_expr(const Json& s, const std::string& path) {
    bool bounded = s.contains("minimum") || s.contains("maximum") ||
                   s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum");
    int64_t lo = 0, hi = 0;
    auto r = bounds(s, path, &lo, &hi);
    if (!r.is_ok()) return r;
    if (!bounded) {
      int digit = d_.pool.byte_range('0', '9');
      int intpart = d_.pool.alt(
          {p("0"), d_.pool.seq({d_.pool.byte_range('1', '9'), d_.pool.repeat(digit, 0, 14)})});
      int frac = d_.pool.opt(d_.pool.seq({p("."), d_.pool.repeat(digit, 1, kMaxFractionDigits)}));
      ByteSet e, sign;
      e.set('e'), e.set('E'), sign.set('+'), sign.set('-');
      int exp = d_.pool.opt(d_.pool.seq(
          {d_.pool.bytes(e), d_.pool.opt(d_.pool.bytes(sign)), d_.pool.repeat(digit, 1, 2)}));
      return d_.pool.seq({d_.pool.opt(p("-")), intpart, frac, exp});
    }
    std::vector<int> alts;
    if (lo < 0) {
      int64_t a = std::max<int64_t>(-hi, 0), b = -lo;
      if (a <= b) alts.push_back(d_.pool.seq({p("-"), magnitude(a, b)}));
    }
    if (hi >= 0) {
      int64_t a = std::max<int64_t>(lo, 0);
      if (a <= hi) alts.push_back(magnitude(a, hi));
    }
    return d_.pool.alt(std::move(alts));
  }

  Result<int> object_expr(const Json& s, const std::string& path, int depth) {
    std::vector<std::pair<std::string, int>> props;  // key literal, value call
    std::vector<bool> req;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return err(path + "/required", "required must be an array");
      for (const auto& x : s["required"]) {
        if (!x.is_string()) return err(path + "/required", "required entries must be strings");
        required.insert(x.get<std::string>());
      }
    }
    std::set<std::string> declared;
    if (s.contains("properties")) {
      if (!s["properties"].is_object())
        return err(path + "/properties", "properties must be an object");
      for (const auto& [k, v] : s["properties"].items()) {
        auto c = schema_call(v, path + "/properties/" + pointer_escape(k), depth + 1);
        if (!c.is_ok()) return c;
        props.emplace_back(Json(k).dump(), c.value());
        req.push_back(required.count(k) > 0);
        declared.insert(k);
      }
    }
    for (const std::string& k : required)  // required but undeclared: any value
      if (!declared.count(k)) {
        props.emplace_back(Json(k).dump(), any_value());
        req.push_back(true);
      }
    int extra_value = -1;  // additional keys (only when no property is declared)
    if (s.contains("additionalProperties")) {
      const Json& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>()) && props.empty()) {
        auto c = schema_call(ap, path + "/additionalProperties", depth + 1);
        if (!c.is_ok()) return c;
        extra_value = c.value();
      }
    } else if (props.empty()) {
      extra_value = any_value();
    }
    if (extra_value >= 0) {
      int kv = d_.pool.seq({any_string(), tok(":"), extra_value});
      int list = d_.pool.opt(
          d_.pool.seq({kv, d_.pool.repeat(d_.pool.seq({tok(","), kv}), 0, kUnbounded)}));
      return d_.pool.seq({p("{"), ws(), list, ws(), p("}")});
    }
    // Declared properties in schema order; optional ones may be left out. rest[i][first]: the
    // properties from i on, first = nothing written yet (no comma before the next one).
    std::size_t n = props.size();
    std::vector<int> rest_first(n + 1), rest_more(n + 1);
    rest_first[n] = rest_more[n] = d_.pool.empty();
    for (std::size_t i = n; i-- > 0;) {
      int kv = d_.pool.seq({p(props[i].first), tok(":"), props[i].second});
      int with_first = d_.pool.seq({kv, rest_more[i + 1]});
      int with_more = d_.pool.seq({tok(","), kv, rest_more[i + 1]});
      rest_first[i] = req[i] ? with_first : d_.pool.alt({with_first, rest_first[i + 1]});
      rest_more[i] = req[i] ? with_more : d_.pool.alt({with_more, rest_more[i + 1]});
    }
    return d_.pool.seq({p("{"), ws(), rest_first[0], ws(), p("}")});
  }

  Result<int> array_expr(const Json& s, const std::string& path, int depth) {
    int64_t min = 0, max = kUnbounded;
    auto r = count_kw(s, "minItems", path, 0, &min);
    if (!r.is_ok()) return r;
    r = count_kw(s, "maxItems", path, kUnbounded, &max);
    if (!r.is_ok()) return r;
    std::vector<int> prefix;
    if (s.contains("prefixItems")) {
      const Json& pi = s["prefixItems"];
      if (!pi.is_array()) return err(path + "/prefixItems", "prefixItems must be an array");
      for (std::size_t i = 0; i < pi.size(); ++i) {
        auto c = schema_call(pi[i], path + "/prefixItems/" + std::to_string(i), depth + 1);
        if (!c.is_ok()) return c;
        prefix.push_back(c.value());
      }
    }
    int item = -1;  // -1: no items beyond the prefix
    if (!s.contains("items")) {
      item = any_value();
    } else if (!(s["items"].is_boolean() && !s["items"].get<bool>())) {
      auto c = schema_call(s["items"], path + "/items", depth + 1);
      if (!c.is_ok()) return c;
      item = c.value();
    }
    const int64_t k = static_cast<int64_t>(prefix.size());
    std::vector<int> alts;
    // Arrays that stop inside the prefix (j elements).
    for (int64_t j = 0; j < k; ++j) {
      if (j < min || (max != kUnbounded && j > max)) continue;
      std::vector<int> parts;
      for (int64_t i = 0; i < j; ++i) {
        if (i > 0) parts.push_back(tok(","));
        parts.push_back(prefix[i]);
      }
      alts.push_back(d_.pool.seq(std::move(parts)));
    }
    if (max == kUnbounded || k <= max) {
      std::vector<int> parts;
      for (int64_t i = 0; i < k; ++i) {
        if (i > 0) parts.push_back(tok(","));
        parts.push_back(prefix[i]);
      }
      int64_t emin = std::max<int64_t>(0, min - k);
      int64_t emax = max == kUnbounded ? kUnbounded : max - k;
      if (item >= 0 && emax != 0) {
        if (k > 0) {
          parts.push_back(d_.pool.repeat(d_.pool.seq({tok(","), item}), static_cast<int>(emin),
                                         static_cast<int>(emax)));
          alts.push_back(d_.pool.seq(std::move(parts)));
        } else {
          int more = d_.pool.repeat(d_.pool.seq({tok(","), item}),
                                    static_cast<int>(std::max<int64_t>(0, emin - 1)),
                                    emax == kUnbounded ? kUnbounded : static_cast<int>(emax - 1));
          alts.push_back(d_.pool.seq({item, more}));
          if (emin == 0) alts.push_back(d_.pool.empty());
        }
      } else if (emin == 0) {
        alts.push_back(d_.pool.seq(std::move(parts)));
      }
    }
    return d_.pool.seq({p("["), ws(), d_.pool.alt(std::move(alts)), ws(), p("]")});
  }

  // allOf of object schemas: properties and required merged (with this schema's own).
  Result<int> all_of(const Json& s, const std::string& path, int depth) {
    Json merged = Json::object();
    merged["type"] = "object";
    Json props = Json::object(), required = Json::array();
    std::vector<const Json*> strict_members;
    std::vector<std::pair<const Json*, std::string>> parts{{&s, path}};
    const Json& list = s["allOf"];
    if (!list.is_array() || list.empty())
      return err(path + "/allOf", "allOf must be a non-empty array");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Json* m = &list[i];
      std::string mp = path + "/allOf/" + std::to_string(i);
      for (int hops = 0; m->is_object() && m->contains("$ref") && hops < 32; ++hops) {
        auto t = resolve_ref((*m)["$ref"], mp);
        if (!t.is_ok()) return t.status();
        m = t.value();
      }
      parts.emplace_back(m, mp);
    }
    for (auto [m, mp] : parts) {
      if (!m->is_object()) return err(mp, "allOf members must be object schemas");
      DSV41_RETURN_IF_ERROR(check_keywords(*m, mp));
      for (const auto& [k, v] : m->items()) {
        if (kAnnotations.count(k) || k == "allOf" || k == "$defs" || k == "definitions") continue;
        if (k == "type" && v == "object") continue;
        if (k == "properties" && v.is_object()) {
          for (const auto& [pk, pv] : v.items()) {
            if (props.contains(pk) && props[pk] != pv)
              return err(mp + "/properties/" + pointer_escape(pk),
                         "allOf: property \"" + pk + "\" defined differently twice");
            props[pk] = pv;
          }
          continue;
        }
        if (k == "required" && v.is_array()) {
          for (const auto& x : v) required.push_back(x);
          continue;
        }
        if (k == "additionalProperties" && v.is_boolean()) {
          if (!v.get<bool>()) strict_members.push_back(m);
          continue;
        }
        return err(mp + "/" + pointer_escape(k),
                   "allOf is supported for object schemas (properties, required, "
                   "additionalProperties: bool) only; \"" +
                       k + "\" found");
      }
    }
    // A member with additionalProperties: false forbids every key it does not declare itself, also
    // the other members' (JSON Schema evaluates members independently).
    for (const Json* m : strict_members) {
      Json kept = Json::object();
      for (const auto& [pk, pv] : props.items())
        if (m->contains("properties") && (*m)["properties"].is_object() &&
            (*m)["properties"].contains(pk))
          kept[pk] = pv;
      for (const auto& r : required)
        if (r.is_string() && !kept.contains(r.get<std::string>()))
          return err(path + "/allOf",
                     "allOf: required property " + r.dump() +
                         " is forbidden by a member's additionalProperties: false");
      props = kept;
    }
    merged["properties"] = props;
    merged["required"] = required;
    return object_expr(merged, path, depth);
  }

  // Shared rules for values without a schema (JSON mode, {}, untyped items).
  int any_string() {
    if (any_string_ < 0) {
      any_string_ = d_.add_rule("(any string)");
      d_.body[any_string_] =
          d_.pool.seq({p("\""), d_.pool.repeat(json_char(), 0, kUnbounded), p("\"")});
    }
    return d_.pool.call(any_string_);
  }

 public:
  int any_value() {
    if (any_value_ >= 0) return d_.pool.call(any_value_);
    any_value_ = d_.add_rule("(any value)");
    int obj = d_.add_rule("(any object)"), arr = d_.add_rule("(any array)"),
        num = d_.add_rule("(any number)");
    auto n = number_expr(Json::object(), "");
    d_.body[num] = n.value();
    int v = d_.pool.call(any_value_);
    int kv = d_.pool.seq({any_string(), tok(":"), v});
    d_.body[obj] = d_.pool.seq(
        {p("{"), ws(),
         d_.pool.opt(d_.pool.seq({kv, d_.pool.repeat(d_.pool.seq({tok(","), kv}), 0, kUnbounded)})),
         ws(), p("}")});
    d_.body[arr] = d_.pool.seq(
        {p("["), ws(),
         d_.pool.opt(d_.pool.seq({v, d_.pool.repeat(d_.pool.seq({tok(","), v}), 0, kUnbounded)})),
         ws(), p("]")});
    d_.body[any_value_] = d_.pool.alt({d_.pool.call(obj), d_.pool.call(arr), any_string(),
                                       d_.pool.call(num), p("true"), p("false"), p("null")});
    any_object_ = obj;
    return d_.pool.call(any_value_);
  }
  int any_object_rule() {
    any_value();
    return any_object_;
  }
  Draft run_any_object() {
    int start = d_.add_rule("(json object)");
    int obj = any_object_rule();
    d_.body[start] = d_.pool.call(obj);
    return std::move(d_);
  }

 private:
  const Json& root_;
  GrammarOptions o_;
  Budget& budget_;
  Draft d_;
  std::map<std::string, int> rules_;
  int json_char_ = -1, any_string_ = -1, any_value_ = -1, any_object_ = -1;
};

}  // namespace

Result<Draft> draft_from_schema(std::string_view schema_json, const GrammarOptions& o,
                                Budget& budget, const std::string& pointer) {
  Json root = Json::parse(schema_json, nullptr, false);
  if (root.is_discarded()) return Status::error("json_schema: the schema is not valid JSON");
  if (json_depth(root, 0) > kMaxSchemaDepth)
    return Status::error("json_schema: the schema is nested deeper than " +
                         std::to_string(kMaxSchemaDepth) + " levels");
  SchemaCompiler c(root, o, budget);
  return c.run(pointer);
}

Draft draft_any_json_object(const GrammarOptions& o) {
  Json root = Json::object();
  Budget budget(o);
  SchemaCompiler c(root, o, budget);
  return c.run_any_object();
}

}  // namespace dsv41::grammar_detail
