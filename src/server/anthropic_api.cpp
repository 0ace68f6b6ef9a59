// Anthropic Messages (server/anthropic_api.h): request blocks -> ChatMessages -> V4.1 chat
// encoding; engine output -> content blocks through the same DSML/reasoning parser as chat
// completions, so reasoning and tool calls come back the same way through every API.
#include "server/anthropic_api.h"
#include "server/image_inputs.h"
#include "text/special_tokens.h"

#include <limits>

#include <fmt/format.h>

#include "server/assistant_blocks.h"
#include "server/generation_protocol.h"
#include "server/request_fields.h"
#include "text/chat.h"
#include "text/dsml_parser.h"

namespace dsv41 {

std::string anthropic_error_body(const ApiError& e) {
  const char* type = "api_error";
  switch (e.status) {
    case 400:
    case 405:
      type = "invalid_request_error";
      break;
    case 401:
      type = "authentication_error";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "not_found_error";
      break;
    case 413:
      type = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      break;
    case 503:
    case 529:
      type = "overloaded_error";
      break;
    default:
      type = e.status >= 400 && e.status < 500 ? "invalid_request_error" : "api_error";
  }
  OJson err = OJson::object();
  err["type"] = type;
  err["message"] = e.message;
  OJson body = OJson::object();
  body["type"] = "error";
  body["error"] = std::move(err);
  return dump_safe(body);
}

namespace {

// Text of a `content` that is a string or an array of text blocks (what system and tool_result
// accept); anything else is refused naming the block.
std::optional<ApiError> text_of(const OJson& v, const std::string& param, std::string& out) {
  static const TextPartRules kRules{{{"text", "text"}},
                                    {"image", "document"},
                                    "text block",
                                    "content block",
                                    "block",
                                    "only text blocks are accepted here, got '{}'"};
  return join_text_parts(v, param, kRules, out);
}

// Claude Code sends a first system block "x-anthropic-billing-header: ..." whose value changes on
// every request; encoded, it would make every prompt differ from its first block on and no prefix
// cache hit would survive. Such blocks are left out of the prompt (docs/server.md).
constexpr std::string_view kBillingHeader = "x-anthropic-billing-header";

OJson without_billing_header(const OJson& system) {
  if (!system.is_array()) return system;
  OJson kept = OJson::array();
  for (const OJson& b : system) {
    const auto type = b.is_object() ? b.find("type") : b.end();
    const auto text = b.is_object() ? b.find("text") : b.end();
    const bool billing = type != b.end() && *type == "text" && text != b.end() &&
                         text->is_string() &&
                         text->get_ref<const std::string&>().rfind(kBillingHeader, 0) == 0;
    if (!billing) kept.push_back(b);
  }
  return kept;
}

// One Anthropic message -> ChatMessages: a user message's tool_result blocks become tool messages
// (the encoder merges them into the user turn), its text blocks one user message; an assistant
// message's thinking / text / tool_use blocks one assistant message.
std::optional<ApiError> convert_message(const OJson& m, const std::string& param,
                                        std::vector<ChatMessage>& out) {
  if (!m.is_object()) return bad(param, "must be a message object");
  const OJson* role = m.contains("role") ? &m["role"] : nullptr;
  if (!role || !role->is_string()) return bad(param + ".role", "required: 'user' or 'assistant'");
  const std::string r = role->get<std::string>();
  if (r != "user" && r != "assistant")
    return bad(param + ".role", "must be 'user' or 'assistant', got '" + r + "'");
  if (!m.contains("content") || m["content"].is_null())
    return bad(param + ".content", "required field missing");
  const OJson& c = m["content"];
  ChatMessage msg;
  msg.role = r;
  if (c.is_string()) {
    msg.content = c.get<std::string>();
    out.push_back(std::move(msg));
    return std::nullopt;
  }
  if (!c.is_array() || c.empty())
    return bad(param + ".content", "must be a string or a non-empty array of blocks");
  std::string text, reasoning;
  bool has_text = false, has_reasoning = false, after_text = false;
  std::vector<std::string> images, image_params;  // a user message's image blocks, in order
  auto flush_user_text = [&] {
    if (!has_text) return;
    ChatMessage u;
    u.role = "user";
    u.content = text;
    u.images = std::move(images);
    u.image_params = std::move(image_params);
    images.clear();
    image_params.clear();
    out.push_back(std::move(u));
    text.clear();
    has_text = after_text = false;
  };
  for (std::size_t j = 0; j < c.size(); ++j) {
    const std::string p = fmt::format("{}.content[{}]", param, j);
    const OJson& b = c[j];
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      return bad(p, "must be a content block with a type");
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string())
        return bad(p + ".text", "must be a string");
      if (after_text) text += "\n\n";  // consecutive text blocks: joined as chat content parts
      text += b["text"].get<std::string>();
      has_text = after_text = true;
    } else if (r == "user" && type == "image") {
      // source {type: base64, media_type, data} (as a data: URL) or {type: url, url}; the
      // placeholder goes where the block is (as chat completions' image_url parts).
      const auto src = b.find("source");
      if (src == b.end() || !src->is_object() || !src->contains("type") ||
          !(*src)["type"].is_string())
        return bad(p + ".source", "must be an object with a type (base64 or url)");
      const std::string st = (*src)["type"].get<std::string>();
      if (st == "base64") {
        if (!src->contains("data") || !(*src)["data"].is_string() || !src->contains("media_type") ||
            !(*src)["media_type"].is_string())
          return bad(p + ".source", "a base64 source needs media_type and data strings");
        images.push_back("data:" + (*src)["media_type"].get<std::string>() + ";base64," +
                         (*src)["data"].get<std::string>());
      } else if (st == "url" && src->contains("url") && (*src)["url"].is_string()) {
        images.push_back((*src)["url"].get<std::string>());
      } else {
        return bad(p + ".source.type", "must be base64 or url (with a url string)");
      }
      image_params.push_back(p + ".source");
      text += tokens::kImage;
      has_text = true;
      after_text = false;
    } else if (type == "image") {
      return bad(p + ".type", "'image' blocks are taken in user messages only");
    } else if (type == "document") {
      return bad(p + ".type", "'document' blocks are not supported (this model reads text only)");
    } else if (r == "user" && type == "tool_result") {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
        return bad(p + ".tool_use_id", "must be a string");
      flush_user_text();  // keeps the blocks' order
      ChatMessage t;
      t.role = "tool";
      t.tool_call_id = b["tool_use_id"].get<std::string>();
      std::string result;
      if (b.contains("content") && !b["content"].is_null())
        if (auto e = text_of(b["content"], p + ".content", result)) return e;
      // is_error is checked but not encoded: V4.1's tool-result format has no error flag (the
      // result's text is what the model reads; docs/server.md).
      if (b.contains("is_error") && !b["is_error"].is_boolean())
        return bad(p + ".is_error", "must be a boolean");
      t.content = std::move(result);
      out.push_back(std::move(t));
    } else if (r == "assistant" && type == "thinking") {
      if (!b.contains("thinking") || !b["thinking"].is_string())
        return bad(p + ".thinking", "must be a string");
      reasoning += b["thinking"].get<std::string>();
      has_reasoning = true;
    } else if (r == "assistant" && type == "redacted_thinking") {
      // Opaque to this model: nothing of it can be encoded, so it is left out.
    } else if (r == "assistant" && type == "tool_use") {
      ChatToolCall call;
      if (!b.contains("id") || !b["id"].is_string()) return bad(p + ".id", "must be a string");
      if (!b.contains("name") || !b["name"].is_string() || b["name"].get<std::string>().empty())
        return bad(p + ".name", "must be a non-empty string");
      if (!b.contains("input") || !b["input"].is_object())
        return bad(p + ".input", "must be an object");
      call.id = b["id"].get<std::string>();
      call.name = b["name"].get<std::string>();
      call.arguments = b["input"];
      msg.tool_calls.push_back(std::move(call));
    } else {
      return bad(p + ".type", fmt::format("'{}' blocks are not accepted in a {} message", type, r));
    }
  }
  if (r == "user") {
    flush_user_text();
    return std::nullopt;
  }
  msg.content = text;
  if (has_reasoning) msg.reasoning = reasoning;
  out.push_back(std::move(msg));
  return std::nullopt;
}

// tools: [{name, description, input_schema}] -> OpenAI function objects for the encoder.
std::optional<ApiError> convert_tools(const OJson& v, std::vector<OJson>& out) {
  if (!v.is_array()) return bad("tools", "must be an array");
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string p = fmt::format("tools[{}]", i);
    const OJson& t = v[i];
    if (!t.is_object()) return bad(p, "must be an object");
    if (t.contains("type") && !t["type"].is_null() &&
        !(t["type"].is_string() && t["type"] == "custom"))
      return bad(p + ".type",
                 "only custom tools (name, description, input_schema) are supported, not " +
                     t["type"].dump());
    if (!t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty())
      return bad(p + ".name", "must be a non-empty string");
    if (!t.contains("input_schema") || !t["input_schema"].is_object())
      return bad(p + ".input_schema", "must be a JSON schema object");
    OJson fn = OJson::object();
    fn["name"] = t["name"];
    if (t.contains("description") && !t["description"].is_null()) {
      if (!t["description"].is_string()) return bad(p + ".description", "must be a string");
      fn["description"] = t["description"];
    }
    fn["parameters"] = t["input_schema"];
    out.push_back(std::move(fn));
  }
  return std::nullopt;
}

// thinking, as DeepSeek's Anthropic format reads it (docs/chat.md "Thinking and effort"): absent,
// {"type": "enabled"} or {"type": "adaptive"} -> thinking mode at the default effort (high);
// {"type": "disabled"} -> chat mode; {"type": "enabled", "budget_tokens": N} (N >= 1024, below
// max_tokens) caps the reasoning at N tokens (`budget`) and picks the effort of the budget:
// <= 4,096 low, <= 32,768 high, more max. output_config.effort (any name of the effort table, or
// 1-100) overrides the effort.
std::optional<ApiError> convert_thinking(const OJson& body, int64_t max_tokens, bool count_only,
                                         ChatOptions& opt, int64_t& budget) {
  opt.thinking = true;
  budget = -1;
  const auto th = body.find("thinking");
  if (th != body.end() && !th->is_null()) {
    const OJson& v = *th;
    if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
      return bad("thinking", "must be an object with a type ('enabled', 'disabled' or 'adaptive')");
    const std::string type = v["type"].get<std::string>();
    if (type != "enabled" && type != "disabled" && type != "adaptive")
      return bad("thinking.type",
                 "must be 'enabled', 'disabled' or 'adaptive', got '" + type + "'");
    opt.thinking = type != "disabled";
    const auto b = v.find("budget_tokens");
    if (type == "enabled" && b != v.end() && !b->is_null()) {
      if (!b->is_number_integer()) return bad("thinking.budget_tokens", "must be an integer");
      budget = b->get<int64_t>();
      if (budget < 1024) return bad("thinking.budget_tokens", "must be at least 1024");
      if (!count_only && budget >= max_tokens)
        return bad("thinking.budget_tokens",
                   fmt::format("must be less than max_tokens ({} >= {})", budget, max_tokens));
      opt.reasoning_effort = budget <= 4096 ? 25 : budget <= 32768 ? 50 : 100;
    }
  }
  const auto oc = body.find("output_config");
  if (oc != body.end() && !oc->is_null()) {
    if (!oc->is_object()) return bad("output_config", "must be an object");
    const auto e = oc->find("effort");
    if (e != oc->end() && !e->is_null()) {
      auto effort = parse_reasoning_effort(*e, "output_config.effort");
      if (!effort) return bad_from("output_config.effort", effort.status().message());
      opt.reasoning_effort = *effort;
    }
  }
  return std::nullopt;
}

std::optional<ApiError> parse_sampling(Fields& f, const OJson& body, SamplingParams& s) {
  if (!f.number("temperature", 0, 1, false, s.temperature)) return f.err;
  if (!f.number("top_p", 0, 1, true, s.top_p)) return f.err;
  int64_t top_k = s.top_k;  // a server default when the request sets none
  if (!f.integer("top_k", 0, std::numeric_limits<int32_t>::max(), top_k)) return f.err;
  s.top_k = static_cast<int>(top_k);
  if (const OJson* st = f.get("stop_sequences")) {
    if (!st->is_array()) return bad("stop_sequences", "must be an array of strings");
    if (st->size() > 16) return bad("stop_sequences", "at most 16 stop sequences");
    for (const auto& x : *st) {
      if (!x.is_string() || x.get<std::string>().empty())
        return bad("stop_sequences", "must hold non-empty strings");
      s.stop.push_back(x.get<std::string>());
    }
  }
  if (const OJson* md = f.get("metadata")) {
    if (!md->is_object()) return bad("metadata", "must be an object");
    if (md->contains("user_id") && !(*md)["user_id"].is_null() && !(*md)["user_id"].is_string())
      return bad("metadata.user_id", "must be a string");
  }
  (void)body;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> messages_conversation(const OJson& body, int64_t max_tokens,
                                              bool count_only, ChatRequest& chat,
                                              bool& extract_tools, int64_t* budget,
                                              bool* single_call, ToolForcing* forcing) {
  Fields f(body);
  std::vector<ChatMessage>& msgs = chat.messages;
  ChatOptions& opt = chat.options;
  const OJson* sys = f.get("system");
  const OJson system = sys ? without_billing_header(*sys) : OJson();
  if (sys && !(sys->is_array() && !sys->empty() && system.empty())) {  // not billing blocks only
    ChatMessage s;
    s.role = "system";
    std::string text;
    if (auto e = text_of(system, "system", text)) return e;
    s.content = std::move(text);
    msgs.push_back(std::move(s));
  }
  const OJson* ms = f.get("messages");
  if (!ms) return bad("messages", "required field missing");
  if (!ms->is_array() || ms->empty()) return bad("messages", "must be a non-empty array");
  for (std::size_t i = 0; i < ms->size(); ++i)
    if (auto e = convert_message((*ms)[i], fmt::format("messages[{}]", i), msgs)) return e;
  std::vector<OJson> tools;
  if (const OJson* t = f.get("tools"))
    if (auto e = convert_tools(*t, tools)) return e;
  const bool has_tools = !tools.empty();
  attach_tools(msgs, std::move(tools));
  std::string tool_choice = "auto";
  if (const OJson* tc = f.get("tool_choice")) {
    if (!tc->is_object() || !tc->contains("type") || !(*tc)["type"].is_string())
      return bad("tool_choice", "must be an object with a type");
    tool_choice = (*tc)["type"].get<std::string>();
    const auto one = tc->find("disable_parallel_tool_use");
    if (one != tc->end() && !one->is_null()) {
      if (!one->is_boolean())
        return bad("tool_choice.disable_parallel_tool_use", "must be a boolean");
      if (single_call) *single_call = one->get<bool>();
    }
    if (tool_choice == "any" || tool_choice == "tool") {
      if (forcing) forcing->mode = ToolForcing::Mode::kRequired;
      if (tool_choice == "tool") {
        const auto name = tc->find("name");
        if (name == tc->end() || !name->is_string())
          return bad("tool_choice.name", "required with type 'tool' (the name of a tool in tools)");
        if (forcing) {
          forcing->mode = ToolForcing::Mode::kNamed;
          forcing->name = name->get<std::string>();
        }
      }
    } else if (tool_choice != "auto" && tool_choice != "none") {
      return bad("tool_choice.type",
                 "must be 'auto', 'any', 'tool' or 'none', got '" + tool_choice + "'");
    }
  }
  int64_t asked = -1;
  if (auto e = convert_thinking(body, max_tokens, count_only, opt, asked)) return e;
  if (budget) *budget = asked;
  if (msgs.empty()) return bad("messages", "no message with content");  // guard: cannot happen
  // A final assistant message is a prefill the answer continues (Anthropic's rule).
  opt.continue_final_message = msgs.back().role == "assistant";
  extract_tools = has_tools && tool_choice != "none";
  return std::nullopt;
}

std::optional<ApiError> parse_messages_request(const OJson& body, const ServedModel& model,
                                               const Tokenizer& tok, bool count_only,
                                               GenerationJob& job) {
  if (!body.is_object()) return bad("", "the request body must be a JSON object");
  Fields f(body);
  const OJson* m = f.get("model");
  if (!m) return bad("model", "required field missing");
  if (!m->is_string()) return bad("model", "must be a string");
  if (!model.serves(m->get<std::string>())) return model_not_found(m->get<std::string>(), model);
  job.model = model.name;
  job.chat = true;
  int64_t max_tokens = 0;
  if (!count_only) {
    if (!f.get("max_tokens")) return bad("max_tokens", "required field missing");
    if (!f.integer("max_tokens", 1, std::numeric_limits<int32_t>::max(), max_tokens)) return f.err;
    job.request.sampling.max_tokens = static_cast<int>(max_tokens);
    job.max_tokens_param = "max_tokens";
    if (!f.boolean("stream", job.stream)) return f.err;
  }
  model.sampling_defaults.apply(job.request.sampling);  // the request's own fields win
  if (auto e = parse_sampling(f, body, job.request.sampling)) return e;

  ChatRequest chat;
  bool extract_tools = false;
  int64_t budget = -1;
  ToolForcing forcing;
  if (auto e = messages_conversation(body, max_tokens, count_only, chat, extract_tools, &budget,
                                     &job.single_tool_call, &forcing))
    return e;
  const ToolFieldNames tool_names{"tool_choice", "tools[{}].name", "tools[{}].input_schema",
                                  "tools[{}].strict"};
  const std::vector<OJson> functions = declared_functions(chat.messages);
  if (auto e = check_tool_forcing(forcing, functions, tool_names)) return e;
  const std::vector<ChatMessage>& msgs = chat.messages;
  const ChatOptions& opt = chat.options;
  auto prompt = encode_chat(msgs, opt);
  if (!prompt) return bad("messages", prompt.status().message());
  // Generation starts inside the reasoning in thinking mode, unless a prefill already closed it.
  job.thinking = generation_starts_in_reasoning(msgs, opt);
  apply_reasoning_budget(model, budget, job);
  job.extract_tools = extract_tools;
  job.request.prompt = tok.encode(*prompt);
  if (auto e = expand_chat_images(msgs, model, job)) return e;
  // count_tokens answers for any length: a prompt over the context is what a client asks it about.
  if (count_only) return std::nullopt;
  if (auto e = check_prompt_length(job, model, "messages")) return e;
  // tool_choice any / tool: the answer is a calls block of the tools' schemas (after the
  // reasoning in thinking mode).
  if (auto e = force_tool_calls(forcing, functions, tool_names, tok, *model.grammars, job))
    return e;
  // tool_choice auto with strict tools (Anthropic's strict tool use): a call the model begins
  // follows its tool's input_schema.
  std::vector<bool> strict;
  if (auto e = read_tools_strict(f.get("tools"), functions.size(), strict)) return e;
  return constrain_strict_tools(forcing, functions, strict, tool_names, tok, *model.grammars, job);
}

namespace {

std::string event(const char* name, const OJson& data) {
  return fmt::format("event: {}\ndata: {}\n\n", name, dump_safe(data));
}

// One message's response: content blocks from the parser's events (server/assistant_blocks.h); a
// stream sends each block's start when its first delta arrives and its stop when another follows.
class MessagesWriter final : public ResponseWriter, BlockListener {
 public:
  MessagesWriter(const GenerationJob& job, const std::string& id)
      : job_(job), id_("msg_" + id), parser_(job.thinking, job.extract_tools) {
    parser_.set_single_call(job.single_tool_call);
  }

  // message_start waits for the engine's first output: its usage splits the prompt into computed
  // and cached tokens, which the engine knows once the request is admitted (until then only pings
  // go out, which clients skip).
  std::vector<std::string> stream_begin() override { return {}; }
  std::vector<std::string> stream_output(std::size_t, const RequestOutput& out) override {
    if (!started_) {
      started_ = true;
      OJson msg = message_json();
      msg["content"] = OJson::array();
      msg["stop_reason"] = nullptr;
      msg["stop_sequence"] = nullptr;
      msg["usage"] = usage_json(int64_t(job_.request.prompt.size()), out.cached_prompt_tokens, 0);
      frames_ = {event("message_start", {{"type", "message_start"}, {"message", std::move(msg)}}),
                 event("ping", {{"type", "ping"}})};
    }
    absorb(out, this);
    return std::move(frames_);
  }
  std::vector<std::string> stream_end() override {
    OJson delta = {{"stop_reason", stop_reason()}, {"stop_sequence", stop_sequence()}};
    // Cumulative, as Anthropic's message_delta usage is (clients overwrite message_start's).
    OJson usage = usage_json(prompt_tokens_, cached_tokens_, completion_tokens_);
    return {event("message_delta",
                  {{"type", "message_delta"}, {"delta", std::move(delta)}, {"usage", usage}}),
            event("message_stop", {{"type", "message_stop"}})};
  }
  std::vector<std::string> stream_error(const ApiError& e) override {
    auto body = parse_json_ordered(anthropic_error_body(e));
    return {event("error", body ? *body : OJson::object())};
  }
  std::string stream_heartbeat() const override { return event("ping", {{"type", "ping"}}); }
  void add(std::size_t, const RequestOutput& out) override { absorb(out, nullptr); }
  std::string body() override {
    OJson msg = message_json();
    OJson content = OJson::array();
    const auto& blocks = grouper_.blocks();
    for (std::size_t i = 0; i < blocks.size(); ++i) content.push_back(block_json(i, blocks[i]));
    msg["content"] = std::move(content);
    msg["stop_reason"] = stop_reason();
    msg["stop_sequence"] = stop_sequence();
    msg["usage"] = usage_json(prompt_tokens_, cached_tokens_, completion_tokens_);
    return dump_safe(msg);
  }

 private:
  // Stream events of the blocks as they form (BlockListener).
  void opened(std::size_t i, const AssistantBlock& b) override {
    OJson start = block_json(i, b);
    if (b.kind == AssistantBlock::Kind::kToolCall) start["input"] = OJson::object();
    frames_.push_back(event(
        "content_block_start",
        {{"type", "content_block_start"}, {"index", i}, {"content_block", std::move(start)}}));
  }
  void grew(std::size_t i, const AssistantBlock& b, const std::string& d) override {
    if (b.kind == AssistantBlock::Kind::kToolCall)  // the arguments as they are generated
      delta(i, {{"type", "input_json_delta"}, {"partial_json", d}});
    else if (b.kind == AssistantBlock::Kind::kReasoning)
      delta(i, {{"type", "thinking_delta"}, {"thinking", d}});
    else
      delta(i, {{"type", "text_delta"}, {"text", d}});
  }
  void closed(std::size_t i, const AssistantBlock&) override {
    frames_.push_back(event("content_block_stop", {{"type", "content_block_stop"}, {"index", i}}));
  }
  void delta(std::size_t i, OJson d) {
    frames_.push_back(
        event("content_block_delta",
              {{"type", "content_block_delta"}, {"index", i}, {"delta", std::move(d)}}));
  }

  void absorb(const RequestOutput& out, BlockListener* listener) {
    std::vector<AssistantEvent> events;
    parser_.feed(out.text, events);
    if (out.finished) parser_.finish(events);
    grouper_.feed(events, listener);
    if (out.finished) {
      grouper_.close(listener);
      reason_ = out.reason;
      stop_ = out.stop;
      prompt_tokens_ = out.prompt_tokens;
      cached_tokens_ = out.cached_prompt_tokens;
      completion_tokens_ = out.completion_tokens;
    }
  }
  OJson block_json(std::size_t i, const AssistantBlock& b) const {
    switch (b.kind) {
      case AssistantBlock::Kind::kReasoning:
        return {{"type", "thinking"}, {"thinking", b.text}, {"signature", ""}};
      case AssistantBlock::Kind::kText:
        return {{"type", "text"}, {"text", b.text}};
      default:
        return {{"type", "tool_use"},
                {"id", fmt::format("toolu_{}_{}", id_.substr(4), i)},
                {"name", b.call.name},
                {"input", b.call.arguments}};
    }
  }
  OJson message_json() const {
    return {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", job_.model}};
  }
  // Anthropic's accounting: the prompt is input_tokens + cache_creation_input_tokens +
  // cache_read_input_tokens. The prefix cache is automatic and writing to it costs nothing beyond
  // computing the prompt, so every computed prompt token is an input token and the cache creation
  // count is 0; the cache reads are the tokens the prefix cache gave the request.
  static OJson usage_json(int64_t prompt, int64_t cached, int64_t out) {
    return {{"input_tokens", prompt - cached},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", cached},
            {"output_tokens", out}};
  }
  bool stopped_by_sequence() const {
    const auto& seqs = job_.request.sampling.stop;
    return reason_ == FinishReason::kStop && !stop_.empty() &&
           std::find(seqs.begin(), seqs.end(), stop_) != seqs.end();
  }
  std::string stop_reason() const {
    if (reason_ == FinishReason::kLength) return "max_tokens";
    if (grouper_.tool_calls() > 0) return "tool_use";
    if (stopped_by_sequence()) return "stop_sequence";
    return "end_turn";
  }
  OJson stop_sequence() const { return stopped_by_sequence() ? OJson(stop_) : OJson(nullptr); }

  const GenerationJob& job_;
  std::string id_;
  AssistantStreamParser parser_;
  BlockGrouper grouper_;
  std::vector<std::string> frames_;  // stream: what the blocks' changes produced
  FinishReason reason_ = FinishReason::kNone;
  std::string stop_;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0;
  bool started_ = false;  // stream: message_start sent
};

class MessagesApi final : public GenerationApi {
 public:
  const char* endpoint() const override { return "/v1/messages"; }
  std::optional<ApiError> parse(const OJson& body, const ServedModel& model, const Tokenizer& tok,
                                GenerationJob& job) const override {
    return parse_messages_request(body, model, tok, false, job);
  }
  std::unique_ptr<ResponseWriter> writer(const GenerationJob& job, const Tokenizer&,
                                         const std::string& id, int64_t) const override {
    return std::make_unique<MessagesWriter>(job, id);
  }
  std::string error_body(const ApiError& e) const override { return anthropic_error_body(e); }
};

}  // namespace

std::unique_ptr<GenerationApi> anthropic_messages_api() {
  return std::make_unique<MessagesApi>();
}

}  // namespace dsv41
