// V4.1 chat encoding (spec §11): OpenAI-style messages to the prompt text the model was trained on,
// without Jinja. Follows DeepSeek's V4.1 reference encoder as published in vLLM's
// deepseek_v41_encoding.py (commit 21f4c25c) for every byte: BOS, <｜System｜> rules, thinking vs
// chat mode with a numeric reasoning effort, tool schemas in the system message, tool results
// merged into user turns, earlier reasoning dropped unless tools are present, DSML tool calls of
// assistant turns. Choices where the reference is silent or internal-only are listed in
// docs/chat.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "text/json_ordered.h"

namespace dsv41 {

struct ChatToolCall {
  std::string id;
  std::string name;
  OJson arguments;  // as sent: usually a JSON string, possibly an object
};

struct ChatMessage {
  std::string role;  // system | developer | user | assistant | tool
  std::optional<std::string> content;
  std::optional<std::string> reasoning;  // "reasoning" or "reasoning_content"
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string tool_call_id;              // tool
  std::vector<OJson> tools;              // function objects declared in a system/developer message
  bool prefix = false;  // assistant: DeepSeek's chat prefix completion (continued, not answered)
  // user: the URLs of its image parts, in order; the content holds the image placeholder
  // (<｜deepseek_image｜>) where each one goes. `image_params` names each part for errors
  // ("messages[1].content[2].image_url").
  std::vector<std::string> images, image_params;
};

struct ChatOptions {
  bool thinking = true;
  int reasoning_effort = 50;  // 1..100; "high" (the reference default) = 50
  bool drop_thinking = true;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool add_bos = true;
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  ChatOptions options;
};

// Reads the chat part of an OpenAI request body: messages, tools, chat_template_kwargs
// {thinking|enable_thinking, reasoning_effort, drop_thinking}, DeepSeek's top-level
// thinking {"type": "enabled"|"disabled"} (overrides the kwargs), top-level reasoning_effort
// (overrides), add_generation_prompt, continue_final_message (also set by a final assistant
// message with DeepSeek's `prefix: true`). Errors name the parameter ("messages[2].content").
Result<ChatRequest> parse_chat_request(const OJson& body);

// Declares function tools (OpenAI function objects {name, description, parameters}) in the first
// system message, creating an empty one at the front when there is none (how the encoder wants
// them). Nothing happens for an empty list.
void attach_tools(std::vector<ChatMessage>& messages, std::vector<OJson> tools);
// One effort name of DeepSeek's API, the level it folds to and the template's number for it.
struct EffortName {
  const char* name;
  const char* level;  // low | high | max
  int value;          // Reasoning Effort N of the prompt
};
// Every name every API accepts (minimal, low -> low 25; medium, high, xhigh -> high 50; max,
// ultra -> max 100): the one table docs/chat.md gives.
const std::vector<EffortName>& effort_names();
// Maps an effort given as a name of effort_names() or an integer 1..100. "none" is handled by the
// caller (it switches thinking off). Errors name `param`.
Result<int> parse_reasoning_effort(const OJson& value, const std::string& param);
// DeepSeek's thinking switch {"type": "enabled"|"disabled"} (`param` names it in errors): sets
// `thinking`; null leaves it as it is.
Status parse_thinking_switch(const OJson& value, const std::string& param, bool& thinking);

// Whether generation starts inside the reasoning: thinking mode, unless the final assistant
// message being continued (continue_final_message, prefix) has already closed it (it has content or
// tool calls, or no reasoning).
bool generation_starts_in_reasoning(const std::vector<ChatMessage>& messages,
                                    const ChatOptions& options);

// The prompt text. Errors (e.g. continue_final_message without a final assistant message, an empty
// developer message) name the parameter.
Result<std::string> encode_chat(const std::vector<ChatMessage>& messages,
                                const ChatOptions& options);

// The DSML text of one assistant tool-call block as the encoder writes it (without the leading
// blank line); exposed for the parser's round-trip tests.
std::string encode_tool_calls_dsml(const std::vector<ChatToolCall>& calls);

}  // namespace dsv41
