// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens): the request shape
// (system, messages of text / thinking / tool_use / tool_result blocks, tools with input_schema,
// tool_choice, thinking, stop_sequences) mapped onto V4.1's chat encoding, and the response as
// content blocks (thinking, text, tool_use) or Anthropic's stream events. docs/server.md has the
// mapping (thinking budget -> reasoning effort, what is refused).
#pragma once

#include <optional>
#include <string>

#include "server/forced_tools.h"  // ToolForcing
#include "server/openai_api.h"    // ApiError, GenerationJob, ServedModel
#include "text/chat.h"

namespace dsv41 {

// {"type": "error", "error": {"type", "message"}}, the type from the status (invalid_request_error,
// not_found_error, request_too_large, rate_limit_error, api_error, overloaded_error).
std::string anthropic_error_body(const ApiError& e);

// The conversation of a Messages body as the chat encoder takes it (system, messages, tools
// attached; options: thinking and effort, continue_final_message for a final assistant prefill);
// what parse_messages_request encodes. `max_tokens` bounds thinking.budget_tokens, which `budget`
// receives (-1: none); `single_call`: tool_choice.disable_parallel_tool_use; `forcing`:
// tool_choice any (required) or tool (named).
std::optional<ApiError> messages_conversation(const OJson& body, int64_t max_tokens,
                                              bool count_only, ChatRequest& chat,
                                              bool& extract_tools, int64_t* budget = nullptr,
                                              bool* single_call = nullptr,
                                              ToolForcing* forcing = nullptr);

// Parses a Messages request into `job` (chat prompt tokenized); `count_only`: the count_tokens
// body (no max_tokens, nothing generated, any length: the context limit is not checked).
std::optional<ApiError> parse_messages_request(const OJson& body, const ServedModel& model,
                                               const Tokenizer& tok, bool count_only,
                                               GenerationJob& job);

}  // namespace dsv41
