// A small JSON Schema checker for the structured-output tests (engine and server): the subset their
// schemas use (type object/array/string/integer/number/boolean/null, properties, required,
// additionalProperties false, items, maxItems, minItems, enum, minLength/maxLength in code points,
// minimum/maximum). Written apart from the grammar compiler, so it judges what the grammar made;
// the server tests also ask ajv (tests/js/grammar_judge.mjs) when node is there.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace dsv41::testing {

// Empty when `doc` (JSON text) satisfies `schema`; else what is wrong and where.
inline std::string json_check(const nlohmann::json& schema, const nlohmann::json& v,
                              const std::string& at = "") {
  auto code_points = [](const std::string& s) {
    std::size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  if (schema.contains("enum")) {
    for (const auto& e : schema["enum"])
      if (e == v) return "";
    return at + ": not one of the enum values";
  }
  if (schema.contains("type")) {
    const std::string t = schema["type"];
    const bool ok = t == "object"    ? v.is_object()
                    : t == "array"   ? v.is_array()
                    : t == "string"  ? v.is_string()
                    : t == "integer" ? v.is_number_integer()
                    : t == "number"  ? v.is_number()
                    : t == "boolean" ? v.is_boolean()
                    : t == "null"    ? v.is_null()
                                     : false;
    if (!ok) return at + ": not of type " + t;
  }
  if (v.is_object()) {
    const auto props = schema.value("properties", nlohmann::json::object());
    for (const auto& r : schema.value("required", nlohmann::json::array()))
      if (!v.contains(r.get<std::string>())) return at + ": required " + r.dump() + " missing";
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (auto e = json_check(props[k], x, at + "/" + k); !e.empty()) return e;
      } else if (schema.contains("additionalProperties") &&
                 schema["additionalProperties"] == false) {
        return at + ": property " + k + " is not allowed";
      }
    }
  }
  if (v.is_array()) {
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<std::size_t>())
      return at + ": more than maxItems";
    if (schema.contains("minItems") && v.size() < schema["minItems"].get<std::size_t>())
      return at + ": fewer than minItems";
    if (schema.contains("items"))
      for (std::size_t i = 0; i < v.size(); ++i)
        if (auto e = json_check(schema["items"], v[i], at + "/" + std::to_string(i)); !e.empty())
          return e;
  }
  if (v.is_string()) {
    const std::size_t n = code_points(v.get<std::string>());
    if (schema.contains("maxLength") && n > schema["maxLength"].get<std::size_t>())
      return at + ": longer than maxLength";
    if (schema.contains("minLength") && n < schema["minLength"].get<std::size_t>())
      return at + ": shorter than minLength";
  }
  if (v.is_number()) {
    if (schema.contains("minimum") && v.get<double>() < schema["minimum"].get<double>())
      return at + ": below minimum";
    if (schema.contains("maximum") && v.get<double>() > schema["maximum"].get<double>())
      return at + ": above maximum";
  }
  return "";
}

// Parses `text` and checks it; empty when it is a valid document.
inline std::string json_text_check(const nlohmann::json& schema, const std::string& text) {
  const auto v = nlohmann::json::parse(text, nullptr, false);
  if (v.is_discarded()) return "not JSON: " + text;
  const std::string e = json_check(schema, v);
  return e.empty() ? e : e + " in " + text;
}

}  // namespace dsv41::testing
