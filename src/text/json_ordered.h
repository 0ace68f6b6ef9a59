// Order-preserving JSON for request bodies and chat encoding. The V4.1 prompt re-serialises tool
// schemas and tool-call arguments exactly as Python's `json.dumps(..., ensure_ascii=False)` does on
// the client's objects, so key order must survive parsing. nlohmann::ordered_json keeps order but
// its own parser inserts keys with a linear search (quadratic on large objects); parse_json_ordered
// builds the same value in linear time through the SAX interface.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace dsv41 {

using OJson = nlohmann::ordered_json;

// Nesting deeper than this is refused (request bodies never need it; it bounds recursion in
// consumers such as python_json_dumps).
inline constexpr int kMaxJsonDepth = 128;

// Parses `text` keeping key order. A repeated key keeps its first position and takes the last value
// (Python's dict semantics). Errors name the byte offset.
Result<OJson> parse_json_ordered(std::string_view text);

// Python's json.dumps(value, ensure_ascii=False): separators ", " and ": ", non-ASCII kept raw,
// floats in repr() form (shortest round-trip digits, "1.0", "1e-05", "1e+16").
std::string python_json_dumps(const OJson& value);

// Python's repr() of a float (finite values; NaN/inf give "NaN"/"Infinity" as json.dumps does).
std::string python_float_repr(double value);

}  // namespace dsv41
