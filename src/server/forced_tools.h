// Forced tool calls (issue 32; docs/structured-outputs.md "Forced tool calls"): tool_choice
// "required" / a named tool in every API becomes a constraint on the answer, a grammar of
// DeepSeek's DSML calls block (text/chat_encoding.cpp's layout) whose invokes name a declared
// tool (or the named one) and whose parameters follow that tool's JSON schema, so the DSML parser
// returns them as tool calls. Compiled (and cached) through GrammarCache on the request's thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/openai_api.h"  // ApiError, GenerationJob
#include "server/structured_outputs.h"
#include "text/chat.h"
#include "text/json_ordered.h"

namespace dsv41 {

struct ToolForcing {
  enum class Mode { kAuto, kNone, kRequired, kNamed };
  Mode mode = Mode::kAuto;
  std::string name;  // kNamed
  bool forced() const { return mode == Mode::kRequired || mode == Mode::kNamed; }
};

// How an API names things in its errors: the tool_choice field and, with "{}" for the tool's
// index, a tool's name and parameters schema (chat: "tools[{}].function.parameters").
struct ToolFieldNames {
  std::string choice = "tool_choice";
  std::string name = "tools[{}].function.name";
  std::string parameters = "tools[{}].function.parameters";
  std::string strict = "tools[{}].function.strict";
};

// Checks a forced choice against the declared tools (`functions`: OpenAI function objects {name,
// description, parameters}, as attached to the chat messages): no tools, or a named tool not
// declared, is a 400 naming names.choice.
std::optional<ApiError> check_tool_forcing(const ToolForcing& forcing,
                                           const std::vector<OJson>& functions,
                                           const ToolFieldNames& names);

// Sets job.request.constraint to the calls block `forcing` asks for (kRequired: one or more calls
// of any declared tool, exactly one when job.single_tool_call; kNamed: calls of that tool) and
// constraint_after_reasoning in thinking mode. Nothing for auto/none. A 400 names the field: a
// tool's parameters schema the grammar does not support (keyword and path), a combination with
// another constraint (response_format), a budget.
std::optional<ApiError> force_tool_calls(const ToolForcing& forcing,
                                         const std::vector<OJson>& functions,
                                         const ToolFieldNames& names, const Tokenizer& tok,
                                         GrammarCache& cache, GenerationJob& job);

// A tool's `strict` (absent or null: false); a 400 naming `field` when it is not a boolean.
std::optional<ApiError> read_tool_strict(const OJson& tool, const std::string& field, bool& strict);
// The top-level `strict` of each of the first n entries of a request's `tools` (Responses,
// Anthropic: tools[i].strict), into strict[0..n); `tools` null: none is.
std::optional<ApiError> read_tools_strict(const OJson* tools, std::size_t n,
                                          std::vector<bool>& strict);

// Strict tools under tool_choice auto (strict[i]: functions[i] is strict; nothing when none is,
// when the choice is not auto, when no tools are extracted, or under a response format, whose
// JSON answer holds no call): the answer is free until the model writes the DSML marker right
// after "<"; from there it must be the rest of a calls block ("<M" + " calls>\n<M invoke ..."),
// strict tools' parameters following their schemas, other tools' invokes free within the DSML
// syntax, then the end. Sets job.request.constraint with constraint_trigger (the marker's id,
// after "<") and constraint_after_reasoning in thinking mode. A 400 as for force_tool_calls.
std::optional<ApiError> constrain_strict_tools(const ToolForcing& forcing,
                                               const std::vector<OJson>& functions,
                                               const std::vector<bool>& strict,
                                               const ToolFieldNames& names, const Tokenizer& tok,
                                               GrammarCache& cache, GenerationJob& job);

// The function objects attached to a chat request's messages (every message's tools, in order).
std::vector<OJson> declared_functions(const std::vector<ChatMessage>& messages);

}  // namespace dsv41
