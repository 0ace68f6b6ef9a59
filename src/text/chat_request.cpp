// Validation of the chat part of an OpenAI request body into ChatMessage/ChatOptions. Every error
// names the offending parameter so the server can return it as OpenAI's `error.param`.
#include <fmt/format.h>

#include "text/chat.h"
#include "text/special_tokens.h"

namespace dsv41 {
namespace {

const char* type_name(const OJson& v) {
  switch (v.type()) {
    case OJson::value_t::null:
      return "null";
    case OJson::value_t::boolean:
      return "a boolean";
    case OJson::value_t::number_integer:
    case OJson::value_t::number_unsigned:
    case OJson::value_t::number_float:
      return "a number";
    case OJson::value_t::string:
      return "a string";
    case OJson::value_t::array:
      return "an array";
    case OJson::value_t::object:
      return "an object";
    default:
      return "an unsupported value";
  }
}

Status type_error(const std::string& param, const char* expected, const OJson& got) {
  return Status::error(fmt::format("{}: expected {}, got {}", param, expected, type_name(got)));
}

// Content: a string, null, or an array of parts: text parts joined by a blank line (the
// reference's separator for raw text parts); an image part (a user message's) becomes the image
// placeholder in place, with no separator around it (docs/decisions.md), its URL kept in `images`
// (null: images refused, as in a non-user message).
Result<std::optional<std::string>> parse_content(const OJson& v, const std::string& param,
                                                 std::vector<std::string>* images = nullptr,
                                                 std::vector<std::string>* image_params = nullptr) {
  if (v.is_null()) return std::optional<std::string>();
  if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
  if (!v.is_array()) return type_error(param, "a string or an array of content parts", v);
  // As OpenAI: an array holds at least one part (an empty string is how to send no text).
  if (v.empty()) return Status::error(param + ": an empty array (give at least one content part)");
  std::string joined;
  bool after_text = false;  // a text part follows another text part with a blank line
  for (std::size_t i = 0; i < v.size(); ++i) {
    const OJson& part = v[i];
    std::string p = fmt::format("{}[{}]", param, i);
    if (!part.is_object()) return type_error(p, "a content part object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      return Status::error(p + ".type: required string field missing");
    const std::string& t = type->get_ref<const std::string&>();
    if (t == "text" || t == "input_text" || t == "output_text") {
      auto text = part.find("text");
      if (text == part.end() || !text->is_string())
        return Status::error(p + ".text: required string field missing");
      if (after_text) joined += "\n\n";
      joined += text->get<std::string>();
      after_text = true;
    } else if (t == "image_url" && images) {
      // {"type": "image_url", "image_url": {"url": ..., "detail": ...}} (or the URL as a string)
      auto iu = part.find("image_url");
      const OJson* url = nullptr;
      if (iu != part.end() && iu->is_string()) url = &*iu;
      if (iu != part.end() && iu->is_object())
        if (auto u = iu->find("url"); u != iu->end() && u->is_string()) url = &*u;
      if (!url) return Status::error(p + ".image_url.url: required string field missing");
      images->push_back(url->get<std::string>());
      image_params->push_back(p + ".image_url");
      joined += tokens::kImage;
      after_text = false;
    } else if (t == "image_url" || t == "input_image" || t == "image_pil") {
      return Status::error(p + ".type: images are taken in user messages' image_url parts only");
    } else {
      return Status::error(
          fmt::format("{}.type: unsupported content part type '{}' (text only)", p, t));
    }
  }
  return std::optional<std::string>(std::move(joined));
}

Result<std::vector<ChatToolCall>> parse_tool_calls(const OJson& v, const std::string& param) {
  std::vector<ChatToolCall> calls;
  if (v.is_null()) return calls;
  if (!v.is_array()) return type_error(param, "an array", v);
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::string p = fmt::format("{}[{}]", param, i);
    const OJson& c = v[i];
    if (!c.is_object()) return type_error(p, "an object", c);
    ChatToolCall call;
    if (auto id = c.find("id"); id != c.end() && !id->is_null()) {
      if (!id->is_string()) return type_error(p + ".id", "a string", *id);
      call.id = id->get<std::string>();
    }
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object())
      return Status::error(p + ".function: required object missing");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string())
      return Status::error(p + ".function.name: required string field missing");
    call.name = name->get<std::string>();
    if (auto args = fn->find("arguments"); args != fn->end())
      call.arguments = *args;
    else
      call.arguments = "{}";
    if (call.id.empty()) {
      if (auto fid = fn->find("id"); fid != fn->end() && fid->is_string())
        call.id = fid->get<std::string>();
    }
    calls.push_back(std::move(call));
  }
  return calls;
}

Result<ChatMessage> parse_message(const OJson& m, const std::string& param) {
  if (!m.is_object()) return type_error(param, "a message object", m);
  ChatMessage msg;
  auto role = m.find("role");
  if (role == m.end() || !role->is_string())
    return Status::error(param + ".role: required string field missing");
  msg.role = role->get<std::string>();
  if (msg.role != "system" && msg.role != "developer" && msg.role != "user" &&
      msg.role != "assistant" && msg.role != "tool")
    return Status::error(fmt::format(
        "{}.role: invalid role '{}' (expected system, developer, user, assistant or tool)", param,
        msg.role));
  if (auto c = m.find("content"); c != m.end()) {
    const bool user = msg.role == "user";
    auto content = parse_content(*c, param + ".content", user ? &msg.images : nullptr,
                                 user ? &msg.image_params : nullptr);
    if (!content) return content.status();
    msg.content = std::move(*content);
  }
  // "reasoning" wins over "reasoning_content" (both names are in use by clients).
  for (const char* key : {"reasoning_content", "reasoning"}) {
    auto r = m.find(key);
    if (r == m.end() || r->is_null()) continue;
    if (!r->is_string()) return type_error(param + "." + key, "a string", *r);
    msg.reasoning = r->get<std::string>();
  }
  if (msg.role == "assistant") {
    if (auto tc = m.find("tool_calls"); tc != m.end()) {
      auto calls = parse_tool_calls(*tc, param + ".tool_calls");
      if (!calls) return calls.status();
      msg.tool_calls = std::move(*calls);
    }
  }
  if (auto pf = m.find("prefix"); pf != m.end() && !pf->is_null()) {
    if (!pf->is_boolean()) return type_error(param + ".prefix", "a boolean", *pf);
    if (pf->get<bool>() && msg.role != "assistant")
      return Status::error(param + ".prefix: only an assistant message can be a prefix");
    msg.prefix = pf->get<bool>();
  }
  if (msg.role == "tool") {
    if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null()) {
      if (!id->is_string()) return type_error(param + ".tool_call_id", "a string", *id);
      msg.tool_call_id = id->get<std::string>();
    }
  }
  if ((msg.role == "user" || msg.role == "tool") && !msg.content)
    return Status::error(param + ".content: required for role '" + msg.role + "'");
  if (msg.role == "developer" && (!msg.content || msg.content->empty()))
    return Status::error(param + ".content: a developer message needs non-empty content");
  return msg;
}

Status parse_tools(const OJson& v, std::vector<OJson>& out) {
  if (v.is_null()) return Status::ok();
  if (!v.is_array()) return type_error("tools", "an array", v);
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::string p = fmt::format("tools[{}]", i);
    const OJson& t = v[i];
    if (!t.is_object()) return type_error(p, "an object", t);
    if (auto type = t.find("type"); type != t.end() && !(type->is_string() && *type == "function"))
      return Status::error(p + ".type: only 'function' tools are supported");
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object())
      return Status::error(p + ".function: required object missing");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get_ref<const std::string&>().empty())
      return Status::error(p + ".function.name: required non-empty string");
    out.push_back(*fn);
  }
  return Status::ok();
}

Result<bool> get_bool(const OJson& obj, const char* key, const std::string& prefix, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return type_error(prefix + key, "a boolean", *it);
  return it->get<bool>();
}

// Applies an effort value: "none" switches thinking off; otherwise a name or 1..100.
Status apply_effort(const OJson& v, const std::string& param, ChatOptions& opt) {
  if (v.is_null()) return Status::ok();
  if (v.is_string() && v == "none") {
    opt.thinking = false;
    return Status::ok();
  }
  auto effort = parse_reasoning_effort(v, param);
  if (!effort) return effort.status();
  opt.reasoning_effort = *effort;
  return Status::ok();
}

}  // namespace

// DeepSeek's API folds its effort names onto the model's three levels (low, high, max); the
// numbers are the V4.1 encoder's (docs/chat.md "Thinking and effort": spec §11 and its Q10).
const std::vector<EffortName>& effort_names() {
  static const std::vector<EffortName> kNames = {
      {"minimal", "low", 25}, {"low", "low", 25},  {"medium", "high", 50}, {"high", "high", 50},
      {"xhigh", "high", 50},  {"max", "max", 100}, {"ultra", "max", 100}};
  return kNames;
}

Result<int> parse_reasoning_effort(const OJson& v, const std::string& param) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    for (const EffortName& e : effort_names())
      if (s == e.name) return e.value;
  } else if (v.is_number_integer()) {
    auto n = v.get<std::int64_t>();
    if (n >= 1 && n <= 100) return static_cast<int>(n);
  }
  return Status::error(
      fmt::format("{}: must be 'none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max', 'ultra' "
                  "or an integer within [1, 100], got {}",
                  param, v.dump()));
}

Status parse_thinking_switch(const OJson& v, const std::string& param, bool& thinking) {
  if (v.is_null()) return Status::ok();
  auto type = v.is_object() ? v.find("type") : v.end();
  if (!v.is_object() || type == v.end() || !type->is_string())
    return Status::error(param + ": must be an object {\"type\": \"enabled\"|\"disabled\"}");
  if (*type != "enabled" && *type != "disabled")
    return Status::error(
        fmt::format("{}.type: must be 'enabled' or 'disabled', got {}", param, type->dump()));
  thinking = *type == "enabled";
  return Status::ok();
}

bool generation_starts_in_reasoning(const std::vector<ChatMessage>& messages,
                                    const ChatOptions& options) {
  if (!options.thinking) return false;
  if (!options.continue_final_message || messages.empty()) return true;
  const ChatMessage& last = messages.back();
  return last.reasoning && !last.reasoning->empty() && last.content.value_or("").empty() &&
         last.tool_calls.empty();
}

void attach_tools(std::vector<ChatMessage>& messages, std::vector<OJson> tools) {
  if (tools.empty()) return;
  // Tools live in the first system message; one is created at the front when there is none.
  for (auto& m : messages)
    if (m.role == "system") {
      m.tools = std::move(tools);
      return;
    }
  ChatMessage empty;
  empty.role = "system";
  empty.content = "";
  empty.tools = std::move(tools);
  messages.insert(messages.begin(), std::move(empty));
}

Result<ChatRequest> parse_chat_request(const OJson& body) {
  if (!body.is_object()) return type_error("body", "a JSON object", body);
  ChatRequest req;
  auto msgs = body.find("messages");
  if (msgs == body.end()) return Status::error("messages: required field missing");
  if (!msgs->is_array()) return type_error("messages", "an array", *msgs);
  if (msgs->empty()) return Status::error("messages: must contain at least one message");
  for (std::size_t i = 0; i < msgs->size(); ++i) {
    auto m = parse_message((*msgs)[i], fmt::format("messages[{}]", i));
    if (!m) return m.status();
    // DeepSeek's chat prefix completion: only the last message is continued.
    if (m->prefix && i + 1 != msgs->size())
      return Status::error(fmt::format(
          "messages[{}].prefix: only the last message can be a prefix (it is continued)", i));
    req.messages.push_back(std::move(*m));
  }
  std::vector<OJson> tools;
  if (auto t = body.find("tools"); t != body.end()) DSV41_RETURN_IF_ERROR(parse_tools(*t, tools));
  attach_tools(req.messages, std::move(tools));

  ChatOptions& opt = req.options;
  if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
    if (!k->is_object()) return type_error("chat_template_kwargs", "an object", *k);
    const std::string pre = "chat_template_kwargs.";
    bool has_thinking = false;
    for (const char* key : {"enable_thinking", "thinking"}) {
      auto b = get_bool(*k, key, pre, false);
      if (!b) return b.status();
      if (k->contains(key) && !(*k)[key].is_null()) {
        opt.thinking = has_thinking ? (opt.thinking || *b) : *b;
        has_thinking = true;
      }
    }
    auto drop = get_bool(*k, "drop_thinking", pre, true);
    if (!drop) return drop.status();
    opt.drop_thinking = *drop;
    if (auto e = k->find("reasoning_effort"); e != k->end())
      DSV41_RETURN_IF_ERROR(apply_effort(*e, pre + "reasoning_effort", opt));
  }
  // DeepSeek's switch overrides the template kwargs, and the top-level OpenAI effort overrides the
  // template's (its "none" still switches thinking off).
  if (auto t = body.find("thinking"); t != body.end())
    DSV41_RETURN_IF_ERROR(parse_thinking_switch(*t, "thinking", opt.thinking));
  if (auto e = body.find("reasoning_effort"); e != body.end())
    DSV41_RETURN_IF_ERROR(apply_effort(*e, "reasoning_effort", opt));
  auto agp = get_bool(body, "add_generation_prompt", "", true);
  if (!agp) return agp.status();
  opt.add_generation_prompt = *agp;
  auto cont = get_bool(body, "continue_final_message", "", false);
  if (!cont) return cont.status();
  opt.continue_final_message = *cont || req.messages.back().prefix;
  return req;
}

}  // namespace dsv41
