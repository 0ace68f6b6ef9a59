// Linear-time order-preserving JSON parse (SAX) and a Python-compatible serialiser.
#include "text/json_ordered.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

namespace dsv41 {
namespace {

// Builds an OJson from SAX events. Containers are appended to in place; a pointer to an element of
// a parent container stays valid while it is open because the parent only grows after it closes.
class OrderedBuilder {
 public:
  using number_integer_t = OJson::number_integer_t;
  using number_unsigned_t = OJson::number_unsigned_t;
  using number_float_t = OJson::number_float_t;
  using string_t = OJson::string_t;
  using binary_t = OJson::binary_t;

  explicit OrderedBuilder(OJson& root) : root_(root) {}

  bool null() { return put(OJson(nullptr)); }
  bool boolean(bool v) { return put(OJson(v)); }
  bool number_integer(number_integer_t v) { return put(OJson(v)); }
  bool number_unsigned(number_unsigned_t v) { return put(OJson(v)); }
  bool number_float(number_float_t v, const string_t&) { return put(OJson(v)); }
  bool string(string_t& v) { return put(OJson(std::move(v))); }
  bool binary(binary_t&) { return fail("binary values are not JSON"); }
  bool start_object(std::size_t) { return open(OJson::object()); }
  bool start_array(std::size_t) { return open(OJson::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(string_t& k) {
    pending_key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    error_ = fmt::format("invalid JSON at byte {}: {}", position, e.what());
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  struct Open {
    OJson* value;
    std::unique_ptr<std::unordered_map<std::string, std::size_t>> keys;  // built past kLinearKeys
  };
  static constexpr std::size_t kLinearKeys = 16;

  bool fail(std::string message) {
    error_ = std::move(message);
    return false;
  }
  // Places `v` in the current container (or as the root); returns its address.
  OJson* place(OJson&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Open& top = stack_.back();
    if (top.value->is_array()) {
      auto& arr = top.value->get_ref<OJson::array_t&>();
      arr.push_back(std::move(v));
      return &arr.back();
    }
    auto& obj = top.value->get_ref<OJson::object_t&>();
    using Base = std::vector<std::pair<const std::string, OJson>>;
    Base& items = obj;
    std::size_t found = items.size();
    if (top.keys) {
      auto it = top.keys->find(pending_key_);
      if (it != top.keys->end()) found = it->second;
    } else {
      for (std::size_t i = 0; i < items.size(); ++i)
        if (items[i].first == pending_key_) found = i;
    }
    if (found < items.size()) {  // repeated key: first position, last value
      items[found].second = std::move(v);
      return &items[found].second;
    }
    items.emplace_back(pending_key_, std::move(v));
    if (!top.keys && items.size() > kLinearKeys) {
      top.keys = std::make_unique<std::unordered_map<std::string, std::size_t>>();
      for (std::size_t i = 0; i < items.size(); ++i) top.keys->emplace(items[i].first, i);
    } else if (top.keys) {
      top.keys->emplace(pending_key_, items.size() - 1);
    }
    return &items.back().second;
  }
  bool put(OJson&& v) {
    place(std::move(v));
    return true;
  }
  bool open(OJson&& container) {
    if (static_cast<int>(stack_.size()) >= kMaxJsonDepth)
      return fail(fmt::format("JSON nested deeper than {} levels", kMaxJsonDepth));
    OJson* slot = place(std::move(container));
    stack_.push_back(Open{slot, nullptr});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  OJson& root_;
  std::vector<Open> stack_;
  std::string pending_key_;
  std::string error_;
};

void dump_string(const std::string& s, std::string& out) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

void dump(const OJson& v, std::string& out) {
  switch (v.type()) {
    case OJson::value_t::null:
      out += "null";
      break;
    case OJson::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case OJson::value_t::number_integer:
      out += std::to_string(v.get<std::int64_t>());
      break;
    case OJson::value_t::number_unsigned:
      out += std::to_string(v.get<std::uint64_t>());
      break;
    case OJson::value_t::number_float:
      out += python_float_repr(v.get<double>());
      break;
    case OJson::value_t::string:
      dump_string(v.get_ref<const std::string&>(), out);
      break;
    case OJson::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump(e, out);
      }
      out.push_back(']');
      break;
    }
    case OJson::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [k, e] : v.items()) {
        if (!first) out += ", ";
        first = false;
        dump_string(k, out);
        out += ": ";
        dump(e, out);
      }
      out.push_back('}');
      break;
    }
    default:
      out += "null";
      break;  // binary/discarded never come from parse_json_ordered
  }
}

}  // namespace

Result<OJson> parse_json_ordered(std::string_view text) {
  OJson root;
  OrderedBuilder builder(root);
  bool ok =
      OJson::sax_parse(text.begin(), text.end(), &builder, nlohmann::detail::input_format_t::json,
                       /*strict=*/true);
  if (!ok) {
    return Status::error(builder.error().empty() ? std::string("invalid JSON") : builder.error());
  }
  return root;
}

std::string python_json_dumps(const OJson& value) {
  std::string out;
  dump(value, out);
  return out;
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form: "d.ddde[+-]x".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  std::size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp10 = std::atoi(sci.c_str() + e + 1);
  // Python: value = 0.d1d2... x 10^decpt; fixed notation when -4 < decpt <= 16.
  int decpt = exp10 + 1;
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
    } else if (static_cast<std::size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<std::size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(decpt)) + "." +
             digits.substr(static_cast<std::size_t>(decpt));
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  }
  return out;
}

}  // namespace dsv41
