// Helpers the request parsers of every API share: typed access to optional JSON fields with
// errors naming the field, the 400 they produce, serialisation that never throws, the context
// check and text content parts (defined in request_fields.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "server/openai_api.h"  // ApiError
#include "text/json_ordered.h"

namespace dsv41 {

// Serialises without ever throwing: invalid UTF-8 (which no path should produce) becomes U+FFFD.
inline std::string dump_safe(const OJson& j) {
  return j.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

inline ApiError bad(std::string param, std::string message, std::string code = {}) {
  ApiError e;
  e.status = 400;
  e.message = param.empty() ? message : param + ": " + message;
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

// A 400 from a text-layer error whose message already starts with the parameter.
inline ApiError bad_from(std::string param, const std::string& message) {
  ApiError e = bad(std::move(param), "");
  e.message = message;
  return e;
}

// Typed access to optional body fields; null counts as absent.
class Fields {
 public:
  explicit Fields(const OJson& b) : b_(b) {}
  std::optional<ApiError> err;

  const OJson* get(const char* k) const {
    auto it = b_.find(k);
    return it == b_.end() || it->is_null() ? nullptr : &*it;
  }
  bool boolean(const char* k, bool& out) {
    const OJson* v = get(k);
    if (!v) return true;
    if (!v->is_boolean()) return fail(k, "must be a boolean");
    out = v->get<bool>();
    return true;
  }
  bool number(const char* k, double lo, double hi, bool lo_open, double& out) {
    const OJson* v = get(k);
    if (!v) return true;
    if (!v->is_number()) return fail(k, "must be a number");
    double x = v->get<double>();
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
      return fail(k,
                  fmt::format("{} is outside {}{}, {}]", v->dump(), lo_open ? "(" : "[", lo, hi));
    out = x;
    return true;
  }
  bool integer(const char* k, int64_t lo, int64_t hi, int64_t& out) {
    const OJson* v = get(k);
    if (!v) return true;
    if (!v->is_number_integer()) return fail(k, "must be an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
      return fail(k, fmt::format("{} is outside [{}, {}]", v->dump(), lo, hi));
    int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) return fail(k, fmt::format("{} is outside [{}, {}]", x, lo, hi));
    out = x;
    return true;
  }
  bool fail(const std::string& k, std::string message) {
    err = bad(k, std::move(message));
    return false;
  }

 private:
  const OJson& b_;
};

// The prompt must leave room in the context, and an explicit max_tokens (job.max_tokens_param)
// must fit in that room, as vLLM; `param` names the prompt's field in errors.
std::optional<ApiError> check_prompt_length(const GenerationJob& job, const ServedModel& model,
                                            const char* param);

// How one API's content lists read as text: the part types taken as text (and the field holding
// it), the media types refused as unsupported, and the nouns its errors use.
struct TextPartRules {
  struct TextType {
    std::string type, field;
  };
  std::vector<TextType> text_types;
  std::vector<std::string> media_types;
  std::string list_noun;     // "must be a string or an array of <list_noun>s"
  std::string item_noun;     // "must be a <item_noun> with a type"
  std::string short_noun;    // "'image' <short_noun>s are not supported"
  std::string unknown_type;  // fmt pattern for any other type, {} = the type
};

// A `content` that is a string or a list of text parts, joined with a blank line (as chat
// completions join content parts); anything else is a 400 naming the part.
std::optional<ApiError> join_text_parts(const OJson& v, const std::string& param,
                                        const TextPartRules& rules, std::string& out);

}  // namespace dsv41
