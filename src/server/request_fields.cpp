// Shared request-parsing helpers (server/request_fields.h): the context-length check every
// generation API applies, and the joining of text content parts the Messages and Responses parsers
// both accept.
#include "server/request_fields.h"

#include <algorithm>

namespace dsv41 {

// The prompt must leave room in the context, and an explicit max_tokens must fit in that room (as
// vLLM; a default max_tokens is only an upper bound, the engine stops at the context limit).
std::optional<ApiError> check_prompt_length(const GenerationJob& job, const ServedModel& model,
                                            const char* param) {
  const auto n = static_cast<int64_t>(job.request.prompt.size());
  if (n == 0) return bad(param, "the prompt is empty (0 tokens)");
  if (n >= model.max_context)
    return bad(param,
               fmt::format("the prompt has {} tokens; this model's context limit is {} tokens "
                           "(including the answer)",
                           n, model.max_context),
               "context_length_exceeded");
  const int64_t max_tokens = job.request.sampling.max_tokens;
  if (!job.max_tokens_param.empty() && max_tokens > model.max_context - n)
    return bad(job.max_tokens_param,
               fmt::format("{} is too large: this model's context limit is {} tokens and the "
                           "prompt has {}, so at most {} can be generated ({} > {} - {})",
                           max_tokens, model.max_context, n, model.max_context - n, max_tokens,
                           model.max_context, n));
  return std::nullopt;
}

std::optional<ApiError> join_text_parts(const OJson& v, const std::string& param,
                                        const TextPartRules& rules, std::string& out) {
  if (v.is_string()) {
    out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array())
    return bad(param, fmt::format("must be a string or an array of {}s", rules.list_noun));
  for (std::size_t j = 0; j < v.size(); ++j) {
    const std::string p = fmt::format("{}[{}]", param, j);
    const OJson& part = v[j];
    const auto type = part.is_object() ? part.find("type") : part.end();
    if (!part.is_object() || type == part.end() || !type->is_string())
      return bad(p, fmt::format("must be a {} with a type", rules.item_noun));
    const std::string t = type->get<std::string>();
    if (std::find(rules.media_types.begin(), rules.media_types.end(), t) != rules.media_types.end())
      return bad(p + ".type", fmt::format("'{}' {}s are not supported (this model reads text only)",
                                          t, rules.short_noun));
    const auto rule = std::find_if(rules.text_types.begin(), rules.text_types.end(),
                                   [&](const TextPartRules::TextType& r) { return t == r.type; });
    if (rule == rules.text_types.end())
      return bad(p + ".type", fmt::format(fmt::runtime(rules.unknown_type), t));
    const auto text = part.find(rule->field);
    if (text == part.end() || !text->is_string())
      return bad(p + "." + rule->field, "must be a string");
    if (j > 0) out += "\n\n";  // parts joined as chat completions join content parts
    out += text->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace dsv41
