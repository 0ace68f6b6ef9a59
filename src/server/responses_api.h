// OpenAI's Responses API, stateless (POST /v1/responses): `input` as a string or items (messages,
// function_call, function_call_output, reasoning) mapped onto V4.1's chat encoding; the answer as
// output items (reasoning with reasoning_text, message with output_text, function_call) or the
// Responses stream events. `store: true` and `previous_response_id` are refused (nothing is kept).
// docs/server.md has the mapping.
#pragma once

#include <optional>

#include "server/openai_api.h"  // ApiError, GenerationJob, ServedModel

namespace dsv41 {

std::optional<ApiError> parse_responses_request(const OJson& body, const ServedModel& model,
                                                const Tokenizer& tok, GenerationJob& job);

}  // namespace dsv41
