// OpenAI's Responses API, stateless (POST /v1/responses): `input` as a string or items (messages,
// function_call, function_call_output, reasoning) mapped onto V4.1's chat encoding; the answer as
// output items (reasoning with reasoning_text, message with output_text, function_call) or the
// Responses stream events. `store: true` and `previous_response_id` are refused (nothing is kept).
// docs/server.md has the mapping.
#pragma once

#include <optional>

#include "server/forced_tools.h"  // ToolForcing
#include "server/openai_api.h"    // ApiError, GenerationJob, ServedModel
#include "text/chat.h"

namespace dsv41 {

// The conversation of a Responses body as the chat encoder takes it (instructions, input items,
// tools attached; options: thinking and effort); what parse_responses_request encodes.
// `reasoning_echo`: the request's reasoning as the response repeats it; `tool_choice`: auto, none,
// required or function; `forcing`: required or the named function.
std::optional<ApiError> responses_conversation(const OJson& body, ChatRequest& chat,
                                               bool& extract_tools, OJson& reasoning_echo,
                                               std::string& tool_choice,
                                               ToolForcing* forcing = nullptr);

std::optional<ApiError> parse_responses_request(const OJson& body, const ServedModel& model,
                                                const Tokenizer& tok, GenerationJob& job);

}  // namespace dsv41
