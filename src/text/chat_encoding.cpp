// The V4.1 prompt renderer: message preprocessing (tool messages merged into user turns, tool
// results ordered by call order, earlier reasoning dropped) and per-message rendering with the
// generation cue.
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "text/chat.h"
#include "text/special_tokens.h"

namespace dsv41 {
namespace {

using namespace tokens;

// A message after preprocessing: user turns carry blocks (text or tool result).
struct Block {
  bool tool_result = false;
  std::string text;
  std::string tool_use_id;
};
struct Msg {
  const ChatMessage* src = nullptr;
  std::string role;
  bool has_blocks = false;
  std::vector<Block> blocks;
  bool keep_reasoning = true;
};

constexpr const char* kEffortTemplate =
    "Reasoning Effort: {} (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

std::string render_tools(const std::vector<OJson>& tools) {
  std::string schemas;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    if (i) schemas += "\n";
    schemas += python_json_dumps(tools[i]);
  }
  const std::string calls = std::string("<") + kDsml + " calls>";
  const std::string calls_end = std::string("</") + kDsml + " calls>";
  const std::string inv = std::string("<") + kDsml + " invoke";
  const std::string inv_end = std::string("</") + kDsml + " invoke>";
  const std::string par = std::string("<") + kDsml + " parameter";
  const std::string par_end = std::string("</") + kDsml + " parameter>";
  std::string s;
  s += "## Tools\n\n";
  s += "You have access to a set of tools to help answer the user's question. You can invoke tools "
       "by "
       "writing a \"" +
       calls + "\" block like the following:\n\n";
  s += calls + "\n";
  s += inv + " name=\"$TOOL_NAME\">\n";
  s += par + " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE" + par_end + "\n";
  s += "...\n" + inv_end + "\n";
  s += inv + " name=\"$TOOL_NAME2\">\n...\n" + inv_end + "\n";
  s += calls_end + "\n\n";
  s += "String parameters should be specified as is and set `string=\"true\"`. For all other types "
       "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
       "`string=\"false\"`.\n\n";
  s += std::string("If thinking_mode is enabled (triggered by ") + kThinkBegin +
       "), you MUST output your complete reasoning inside " + kThinkBegin + "..." + kThinkEnd +
       " BEFORE any tool calls or final response.\n\n";
  s += std::string("Otherwise, output directly after ") + kThinkEnd +
       " with tool calls or final response.\n\n";
  s += "### Available Tool Schemas\n\n" + schemas + "\n\n";
  s += "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
       "calls.\n";
  return s;
}

// Arguments as a key/value object: an object as is; a JSON string (possibly double-encoded) parsed;
// anything else wrapped as {"arguments": original}.
OJson arguments_object(const OJson& original) {
  OJson args = original;
  for (int i = 0; i < 2 && args.is_string(); ++i) {
    auto parsed = parse_json_ordered(args.get_ref<const std::string&>());
    if (!parsed) break;
    args = std::move(*parsed);
  }
  if (args.is_object()) return args;
  OJson wrapped = OJson::object();
  wrapped["arguments"] = original;
  return wrapped;
}

std::string encode_arguments(const OJson& original) {
  OJson args = arguments_object(original);
  std::string out;
  bool first = true;
  for (const auto& [key, value] : args.items()) {
    if (!first) out += "\n";
    first = false;
    bool is_str = value.is_string();
    out +=
        fmt::format("<{} parameter name=\"{}\" string=\"{}\">{}</{} parameter>", kDsml, key,
                    is_str ? "true" : "false",
                    is_str ? value.get_ref<const std::string&>() : python_json_dumps(value), kDsml);
  }
  return out;
}

bool is_user_like(const std::vector<Msg>& msgs, std::size_t i) {
  const std::string& r = msgs[i].role;
  return r == "user" || r == "developer" || (r == "system" && i > 0);
}

long last_user_index(const std::vector<Msg>& msgs) {
  for (std::size_t i = msgs.size(); i-- > 0;)
    if (is_user_like(msgs, i)) return static_cast<long>(i);
  return -1;
}

// Tool messages become tool-result blocks of a user turn; consecutive user turns (and tool results
// following a user turn) merge into one turn.
std::vector<Msg> merge_tool_messages(const std::vector<ChatMessage>& messages) {
  std::vector<Msg> out;
  for (const ChatMessage& m : messages) {
    const bool prev_user = !out.empty() && out.back().role == "user" && out.back().has_blocks;
    if (m.role == "tool" || m.role == "user") {
      const bool tool = m.role == "tool";
      Block b{tool, m.content.value_or(""), tool ? m.tool_call_id : ""};
      if (!prev_user) {
        Msg u;
        u.src = &m;
        u.role = "user";
        u.has_blocks = true;
        out.push_back(std::move(u));
      }
      out.back().blocks.push_back(std::move(b));
    } else {
      Msg o;
      o.src = &m;
      o.role = m.role;
      out.push_back(std::move(o));
    }
  }
  return out;
}

// Reorders tool-result blocks of a user turn by the call order of the preceding assistant's
// tool_calls (stable; unknown ids sort as position 0), leaving text blocks in place.
void sort_tool_results(std::vector<Msg>& msgs) {
  std::map<std::string, std::size_t> order;
  for (Msg& m : msgs) {
    if (m.role == "assistant" && !m.src->tool_calls.empty()) {
      order.clear();
      for (std::size_t i = 0; i < m.src->tool_calls.size(); ++i)
        if (!m.src->tool_calls[i].id.empty()) order[m.src->tool_calls[i].id] = i;
    } else if (m.role == "user" && m.has_blocks) {
      std::vector<Block> tools;
      for (const Block& b : m.blocks)
        if (b.tool_result) tools.push_back(b);
      if (tools.size() < 2 || order.empty()) continue;
      auto rank = [&](const Block& b) {
        auto it = order.find(b.tool_use_id);
        return it == order.end() ? std::size_t(0) : it->second;
      };
      std::stable_sort(tools.begin(), tools.end(),
                       [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      std::size_t k = 0;
      for (Block& b : m.blocks)
        if (b.tool_result) b = tools[k++];
    }
  }
}

// Drops reasoning of assistant turns before the last user turn, and developer messages there.
std::vector<Msg> drop_thinking(std::vector<Msg> msgs) {
  long last = last_user_index(msgs);
  std::vector<Msg> out;
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    Msg& m = msgs[i];
    if (m.role == "user" || m.role == "system" || static_cast<long>(i) >= last) {
      out.push_back(std::move(m));
    } else if (m.role == "assistant") {
      m.keep_reasoning = false;
      out.push_back(std::move(m));
    }
  }
  return out;
}

struct RenderContext {
  const std::vector<Msg>& msgs;
  const ChatOptions& opt;
  bool drop;  // effective drop_thinking
};

std::string render_assistant(const RenderContext& ctx, std::size_t index, long last_user) {
  const Msg& m = ctx.msgs[index];
  const ChatMessage& src = *m.src;
  bool is_last = index + 1 == ctx.msgs.size();
  std::string tc;
  if (!src.tool_calls.empty()) tc = "\n\n" + encode_tool_calls_dsml(src.tool_calls);
  std::string content = src.content.value_or("");
  std::string rc = m.keep_reasoning ? src.reasoning.value_or("") : "";
  std::string thinking;
  if (ctx.opt.thinking) {
    if (!ctx.drop || static_cast<long>(index) > last_user) {
      thinking = rc + kThinkEnd;
      // Continuing a final message that so far holds only reasoning keeps the think block open.
      if (is_last && ctx.opt.continue_final_message && !rc.empty() && content.empty() && tc.empty())
        thinking = rc;
    }
  }
  std::string out = thinking + content + tc;
  if (!(is_last && ctx.opt.continue_final_message)) out += kEos;
  return out;
}

std::string render_message(const RenderContext& ctx, std::size_t index) {
  const std::vector<Msg>& msgs = ctx.msgs;
  const Msg& m = msgs[index];
  const ChatMessage& src = *m.src;
  const ChatOptions& opt = ctx.opt;
  long last_user = last_user_index(msgs);
  bool is_last = index + 1 == msgs.size();

  std::string effort =
      (index == 0 && opt.thinking) ? fmt::format(kEffortTemplate, opt.reasoning_effort) : "";
  std::string p = (index == 0 && (!effort.empty() || m.role == "system")) ? kSystem : "";
  p += effort;
  if (m.role == "system") {
    if (index > 0) p += kSystem;
    p += src.content.value_or("");
    if (!src.tools.empty()) p += "\n\n" + render_tools(src.tools);
  } else if (m.role == "developer") {
    p += std::string(kUser) + src.content.value_or("");
    if (!src.tools.empty()) p += "\n\n" + render_tools(src.tools);
  } else if (m.role == "user") {
    p += kUser;
    for (std::size_t i = 0; i < m.blocks.size(); ++i) {
      if (i) p += "\n\n";
      const Block& b = m.blocks[i];
      p += b.tool_result ? "<tool_result>" + b.text + "</tool_result>" : b.text;
    }
  } else {  // assistant
    p += render_assistant(ctx, index, last_user);
  }

  if (is_last && !opt.add_generation_prompt) return p;
  if (!is_last && msgs[index + 1].role != "assistant") return p;
  if (is_user_like(msgs, index) || (is_last && (m.role == "system" || m.role == "assistant"))) {
    p += kAssistant;
    bool open_think = opt.thinking && (!ctx.drop || static_cast<long>(index) >= last_user);
    p += open_think ? kThinkBegin : kThinkEnd;
  }
  return p;
}

}  // namespace

std::string encode_tool_calls_dsml(const std::vector<ChatToolCall>& calls) {
  std::string inner;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (i) inner += "\n";
    inner += fmt::format("<{0} invoke name=\"{1}\">\n{2}\n</{0} invoke>", kDsml, calls[i].name,
                         encode_arguments(calls[i].arguments));
  }
  return fmt::format("<{0} calls>\n{1}\n</{0} calls>", kDsml, inner);
}

Result<std::string> encode_chat(const std::vector<ChatMessage>& messages,
                                const ChatOptions& options) {
  ChatOptions opt = options;
  if (opt.continue_final_message) {
    if (messages.empty() || messages.back().role != "assistant")
      return Status::error("continue_final_message: requires a final assistant message");
    opt.add_generation_prompt = false;
  }
  if (opt.reasoning_effort < 1 || opt.reasoning_effort > 100)
    return Status::error(
        fmt::format("reasoning_effort: {} is outside [1, 100]", opt.reasoning_effort));
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "developer" && messages[i].content.value_or("").empty())
      return Status::error(
          fmt::format("messages[{}].content: a developer message needs content", i));
  }
  std::vector<Msg> msgs = merge_tool_messages(messages);
  sort_tool_results(msgs);
  bool any_tools = std::any_of(messages.begin(), messages.end(),
                               [](const ChatMessage& m) { return !m.tools.empty(); });
  bool drop = opt.drop_thinking && !any_tools;
  if (opt.thinking && drop) msgs = drop_thinking(std::move(msgs));

  std::string prompt = opt.add_bos ? kBos : "";
  RenderContext ctx{msgs, opt, drop};
  for (std::size_t i = 0; i < msgs.size(); ++i) prompt += render_message(ctx, i);
  return prompt;
}

}  // namespace dsv41
