// OpenAI Responses (server/responses_api.h): input items -> ChatMessages -> V4.1 chat encoding;
// engine output -> output items through the same reasoning/DSML parser and block grouping as the
// other APIs (server/assistant_blocks.h).
#include "server/responses_api.h"

#include <limits>

#include <fmt/format.h>

#include "server/assistant_blocks.h"
#include "server/generation_protocol.h"
#include "server/image_inputs.h"
#include "server/reasoning_count.h"
#include "server/request_fields.h"
#include "server/structured_outputs.h"
#include "text/chat.h"
#include "text/special_tokens.h"

namespace dsv41 {
namespace {

// The text of a message's `content`: a string or parts of the text types; images, files and
// audio are refused naming the part.
std::optional<ApiError> parts_text(const OJson& v, const std::string& param, std::string& out) {
  static const TextPartRules kRules{
      {{"input_text", "text"}, {"output_text", "text"}, {"text", "text"}, {"refusal", "refusal"}},
      {"input_image", "input_file", "input_audio"},
      "content part",
      "content part",
      "part",
      "unknown content part type '{}'"};
  return join_text_parts(v, param, kRules, out);
}

// A user message's content with input_image parts (image_url: a URL string): the placeholder in
// place of each image, text parts joined as parts_text joins them, the URLs into `m`.
std::optional<ApiError> user_parts_with_images(const OJson& c, const std::string& param,
                                               ChatMessage& m) {
  std::string text;
  bool after_text = false;
  for (std::size_t j = 0; j < c.size(); ++j) {
    const std::string pj = fmt::format("{}[{}]", param, j);
    const OJson& part = c[j];
    const auto type = part.is_object() ? part.find("type") : part.end();
    if (type == part.end() || !type->is_string()) return bad(pj + ".type", "must be a string");
    if (*type == "input_image") {
      const auto url = part.find("image_url");
      if (url == part.end() || !url->is_string())
        return bad(pj + ".image_url", part.contains("file_id")
                                          ? "file_id images are not supported (give image_url)"
                                          : "must be a string");
      m.images.push_back(url->get<std::string>());
      m.image_params.push_back(pj + ".image_url");
      text += tokens::kImage;
      after_text = false;
      continue;
    }
    std::string one;  // a text part, checked by the usual rules
    if (auto e = parts_text(OJson::array({part}), param, one)) {  // named as part j, not 0
      const std::string as0 = param + "[0]";
      if (e->param.starts_with(as0)) e->param = pj + e->param.substr(as0.size());
      if (e->message.starts_with(as0)) e->message = pj + e->message.substr(as0.size());
      return e;
    }
    if (after_text) text += "\n\n";
    text += one;
    after_text = true;
  }
  m.content = std::move(text);
  return std::nullopt;
}

bool has_input_image(const OJson& c) {
  if (!c.is_array()) return false;
  for (const OJson& part : c)
    if (part.is_object() && part.value("type", OJson()) == "input_image") return true;
  return false;
}

std::optional<ApiError> string_field(const OJson& item, const char* key, const std::string& param,
                                     std::string& out, bool non_empty = false) {
  const auto it = item.find(key);
  if (it == item.end() || !it->is_string() || (non_empty && it->get<std::string>().empty()))
    return bad(param + "." + key, non_empty ? "must be a non-empty string" : "must be a string");
  out = it->get<std::string>();
  return std::nullopt;
}

// The reasoning text of a reasoning item: its reasoning_text content, else its summary texts.
std::optional<ApiError> reasoning_text(const OJson& item, const std::string& param,
                                       std::string& out) {
  for (const char* key : {"content", "summary"}) {
    const auto it = item.find(key);
    if (it == item.end() || it->is_null()) continue;
    if (!it->is_array()) return bad(param + "." + key, "must be an array");
    for (std::size_t j = 0; j < it->size(); ++j) {
      const OJson& part = (*it)[j];
      const auto text = part.is_object() ? part.find("text") : part.end();
      if (!part.is_object() || text == part.end() || !text->is_string())
        return bad(fmt::format("{}.{}[{}].text", param, key, j), "must be a string");
      if (j > 0) out += "\n\n";
      out += text->get<std::string>();
    }
    if (!out.empty()) break;
  }
  return std::nullopt;
}

// The assistant message an item of the current turn belongs to: the last message when it is an
// assistant one that `fits`, otherwise a new one.
ChatMessage& assistant_turn(std::vector<ChatMessage>& msgs, bool fits) {
  if (msgs.empty() || msgs.back().role != "assistant" || !fits) {
    ChatMessage a;
    a.role = "assistant";
    a.content = "";
    msgs.push_back(std::move(a));
  }
  return msgs.back();
}

std::optional<ApiError> convert_item(const OJson& item, const std::string& p,
                                     std::vector<ChatMessage>& msgs) {
  if (!item.is_object()) return bad(p, "must be an input item object");
  const auto type_it = item.find("type");
  std::string type = "message";
  if (type_it != item.end() && !type_it->is_null()) {
    if (!type_it->is_string()) return bad(p + ".type", "must be a string");
    type = type_it->get<std::string>();
  }
  if (type == "message") {
    std::string role;
    if (auto e = string_field(item, "role", p, role)) return e;
    if (role != "user" && role != "system" && role != "developer" && role != "assistant")
      return bad(p + ".role", "must be user, system, developer or assistant, got '" + role + "'");
    const auto c = item.find("content");
    if (c == item.end() || c->is_null()) return bad(p + ".content", "required field missing");
    if (role == "user" && has_input_image(*c)) {
      ChatMessage m;
      m.role = role;
      if (auto e = user_parts_with_images(*c, p + ".content", m)) return e;
      msgs.push_back(std::move(m));
      return std::nullopt;
    }
    std::string text;
    if (auto e = parts_text(*c, p + ".content", text)) return e;
    if (role == "assistant") {
      ChatMessage& a =
          assistant_turn(msgs, !msgs.empty() && msgs.back().content.value_or("").empty() &&
                                   msgs.back().tool_calls.empty());
      a.content = std::move(text);
      return std::nullopt;
    }
    ChatMessage m;
    m.role = role;
    m.content = std::move(text);
    msgs.push_back(std::move(m));
    return std::nullopt;
  }
  if (type == "function_call") {
    ChatToolCall call;
    std::string args;
    if (auto e = string_field(item, "call_id", p, call.id, true)) return e;
    if (auto e = string_field(item, "name", p, call.name, true)) return e;
    if (auto e = string_field(item, "arguments", p, args)) return e;
    call.arguments = args;  // the JSON text, as chat completions' tool_calls carry it
    assistant_turn(msgs, true).tool_calls.push_back(std::move(call));
    return std::nullopt;
  }
  if (type == "function_call_output") {
    ChatMessage t;
    t.role = "tool";
    if (auto e = string_field(item, "call_id", p, t.tool_call_id, true)) return e;
    const auto out = item.find("output");
    if (out == item.end() || out->is_null()) return bad(p + ".output", "required field missing");
    std::string text;
    if (auto e = parts_text(*out, p + ".output", text)) return e;
    t.content = std::move(text);
    msgs.push_back(std::move(t));
    return std::nullopt;
  }
  if (type == "reasoning") {
    std::string text;
    if (auto e = reasoning_text(item, p, text)) return e;
    // Consecutive reasoning items belong to one turn: their texts join (before its message).
    const bool more = !msgs.empty() && msgs.back().role == "assistant" &&
                      msgs.back().content.value_or("").empty() && msgs.back().tool_calls.empty();
    ChatMessage& a = assistant_turn(msgs, more);
    a.reasoning = a.reasoning && !a.reasoning->empty() ? *a.reasoning + "\n\n" + text : text;
    return std::nullopt;
  }
  if (type == "item_reference")
    return bad(p + ".type",
               "item references need stored responses, which this server keeps none of");
  return bad(p + ".type", "unsupported input item type '" + type + "'");
}

// tools: [{type: "function", name, description, parameters}] -> function objects.
std::optional<ApiError> convert_responses_tools(const OJson& v, std::vector<OJson>& out) {
  if (!v.is_array()) return bad("tools", "must be an array");
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string p = fmt::format("tools[{}]", i);
    const OJson& t = v[i];
    if (!t.is_object()) return bad(p, "must be an object");
    const auto type = t.find("type");
    if (type == t.end() || !type->is_string() || *type != "function")
      return bad(p + ".type", "only function tools are supported");
    std::string name;
    if (auto e = string_field(t, "name", p, name, true)) return e;
    OJson fn = OJson::object();
    fn["name"] = name;
    if (const auto d = t.find("description"); d != t.end() && !d->is_null()) {
      if (!d->is_string()) return bad(p + ".description", "must be a string");
      fn["description"] = *d;
    }
    if (const auto ps = t.find("parameters"); ps != t.end() && !ps->is_null()) {
      if (!ps->is_object()) return bad(p + ".parameters", "must be a JSON schema object");
      fn["parameters"] = *ps;
    }
    out.push_back(std::move(fn));
  }
  return std::nullopt;
}

// reasoning.effort: none -> chat mode; any other name of the effort table (text/chat.h, the same
// for every API: minimal, low -> low; medium, high, xhigh -> high; max, ultra -> max) or 1-100 ->
// thinking at that effort. Default, as DeepSeek's: thinking at high.
std::optional<ApiError> convert_reasoning(const OJson* r, ChatOptions& opt, OJson& echo) {
  opt.thinking = true;
  opt.reasoning_effort = 50;
  echo = {{"effort", "high"}, {"summary", nullptr}};
  if (!r) return std::nullopt;
  if (!r->is_object()) return bad("reasoning", "must be an object");
  const auto e = r->find("effort");
  if (e == r->end() || e->is_null()) return std::nullopt;
  if (e->is_string() && *e == "none") {
    opt.thinking = false;
  } else {
    auto effort = parse_reasoning_effort(*e, "reasoning.effort");
    if (!effort) return bad_from("reasoning.effort", effort.status().message());
    opt.reasoning_effort = *effort;
  }
  echo["effort"] = *e;
  return std::nullopt;
}

// What the stateless server refuses or ignores of the request's bookkeeping fields.
std::optional<ApiError> check_stateless(Fields& f) {
  bool store = false;
  if (!f.boolean("store", store)) return f.err;
  if (store)
    return bad("store", "this server keeps no responses: send store: false or leave it out");
  if (f.get("previous_response_id"))
    return bad("previous_response_id",
               "this server keeps no responses: send the whole conversation as input items");
  if (f.get("conversation"))
    return bad("conversation", "this server keeps no conversations: send them as input items");
  bool background = false;
  if (!f.boolean("background", background)) return f.err;
  if (background) return bad("background", "background responses are not supported");
  // (text.format is read with the model's vocabulary, in parse_responses_request)
  if (const OJson* text = f.get("text"); text && !text->is_object())
    return bad("text", "must be an object");
  if (const OJson* md = f.get("metadata"); md && !md->is_object())
    return bad("metadata", "must be an object");
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> responses_conversation(const OJson& body, ChatRequest& chat,
                                               bool& extract_tools, OJson& reasoning_echo,
                                               std::string& tool_choice, ToolForcing* forcing) {
  Fields f(body);
  std::vector<ChatMessage>& msgs = chat.messages;
  ChatOptions& opt = chat.options;
  if (const OJson* ins = f.get("instructions")) {
    if (!ins->is_string()) return bad("instructions", "must be a string");
    ChatMessage sys;
    sys.role = "system";
    sys.content = ins->get<std::string>();
    msgs.push_back(std::move(sys));
  }
  const OJson* input = f.get("input");
  if (!input) return bad("input", "required field missing");
  if (input->is_string()) {
    ChatMessage u;
    u.role = "user";
    u.content = input->get<std::string>();
    msgs.push_back(std::move(u));
  } else if (input->is_array() && !input->empty()) {
    for (std::size_t i = 0; i < input->size(); ++i)
      if (auto e = convert_item((*input)[i], fmt::format("input[{}]", i), msgs)) return e;
  } else {
    return bad("input", "must be a string or a non-empty array of input items");
  }
  std::vector<OJson> tools;
  if (const OJson* t = f.get("tools"))
    if (auto e = convert_responses_tools(*t, tools)) return e;
  const bool has_tools = !tools.empty();
  attach_tools(msgs, std::move(tools));
  tool_choice = "auto";
  if (const OJson* tc = f.get("tool_choice")) {
    // "auto", "none", "required" or {"type": "function", "name": N}.
    if (tc->is_string() && (*tc == "auto" || *tc == "none" || *tc == "required")) {
      tool_choice = tc->get<std::string>();
      if (forcing && tool_choice == "required") forcing->mode = ToolForcing::Mode::kRequired;
    } else if (tc->is_object() && tc->value("type", OJson()) == "function") {
      const auto name = tc->find("name");
      if (name == tc->end() || !name->is_string())
        return bad("tool_choice.name", "required (the name of a function in tools)");
      tool_choice = "function";
      if (forcing) {
        forcing->mode = ToolForcing::Mode::kNamed;
        forcing->name = name->get<std::string>();
      }
    } else {
      return bad("tool_choice",
                 "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                 "\"name\": ...}");
    }
  }
  if (auto e = convert_reasoning(f.get("reasoning"), opt, reasoning_echo)) return e;
  extract_tools = has_tools && tool_choice != "none";
  return std::nullopt;
}

std::optional<ApiError> parse_responses_request(const OJson& body, const ServedModel& model,
                                                const Tokenizer& tok, GenerationJob& job) {
  if (!body.is_object()) return bad("", "the request body must be a JSON object");
  Fields f(body);
  const OJson* m = f.get("model");
  if (!m) return bad("model", "required field missing");
  if (!m->is_string()) return bad("model", "must be a string");
  if (!model.serves(m->get<std::string>())) return model_not_found(m->get<std::string>(), model);
  job.model = model.name;
  job.chat = true;
  if (auto e = check_stateless(f)) return e;
  if (!f.boolean("stream", job.stream)) return f.err;
  SamplingParams& s = job.request.sampling;
  model.sampling_defaults.apply(s);  // the request's own fields, read below, win
  if (!f.number("temperature", 0, 2, false, s.temperature)) return f.err;
  if (!f.number("top_p", 0, 1, true, s.top_p)) return f.err;
  int64_t max_tokens = model.default_max_tokens();
  if (!f.integer("max_output_tokens", 1, std::numeric_limits<int32_t>::max(), max_tokens))
    return f.err;
  s.max_tokens = static_cast<int>(max_tokens);
  if (f.get("max_output_tokens")) job.max_tokens_param = "max_output_tokens";
  bool parallel = true;
  if (!f.boolean("parallel_tool_calls", parallel)) return f.err;
  job.single_tool_call = !parallel;

  ChatRequest chat;
  bool extract_tools = false;
  OJson reasoning_echo;
  std::string tool_choice;
  ToolForcing forcing;
  if (auto e =
          responses_conversation(body, chat, extract_tools, reasoning_echo, tool_choice, &forcing))
    return e;
  const ToolFieldNames tool_names{"tool_choice", "tools[{}].name", "tools[{}].parameters",
                                  "tools[{}].strict"};
  const std::vector<OJson> functions = declared_functions(chat.messages);
  if (auto e = check_tool_forcing(forcing, functions, tool_names)) return e;
  const std::vector<ChatMessage>& msgs = chat.messages;
  const ChatOptions& opt = chat.options;
  auto prompt = encode_chat(msgs, opt);
  if (!prompt) return bad("input", prompt.status().message());
  job.thinking = opt.thinking;
  apply_reasoning_budget(model, -1, job);  // the server's cap (Responses has no budget field)
  job.extract_tools = extract_tools;
  job.request.prompt = tok.encode(*prompt);
  if (auto e = expand_chat_images(msgs, model, job)) return e;
  // text.format: json_object / json_schema constrain the answer (after the reasoning in thinking
  // mode), compiled once every cheaper check passed.
  OJson format_echo = {{"type", "text"}};
  if (const OJson* text = f.get("text")) {
    const auto fm = text->find("format");
    if (fm != text->end() && !fm->is_null()) {
      if (auto e = check_prompt_length(job, model, "input")) return e;
      if (auto e = parse_responses_text_format(*fm, tok, *model.grammars, job)) return e;
      format_echo = *fm;
    }
  }
  // tool_choice required / a named function: the answer is a calls block of the tools' schemas.
  if (auto e = force_tool_calls(forcing, functions, tool_names, tok, *model.grammars, job))
    return e;
  // tool_choice auto with strict tools (tools[i].strict true; absent counts as false here):
  // a call the model begins follows its tool's schema.
  std::vector<bool> strict;
  if (auto e = read_tools_strict(f.get("tools"), functions.size(), strict)) return e;
  if (auto e =
          constrain_strict_tools(forcing, functions, strict, tool_names, tok, *model.grammars, job))
    return e;
  job.request.constraint_after_reasoning = job.thinking && job.request.constraint != nullptr;
  const OJson* ins = f.get("instructions");
  const OJson* tl = f.get("tools");
  const OJson* md = f.get("metadata");
  job.echo = {
      {"instructions", ins ? *ins : OJson(nullptr)},
      {"max_output_tokens", f.get("max_output_tokens") ? OJson(max_tokens) : OJson(nullptr)},
      {"parallel_tool_calls", parallel},
      {"reasoning", reasoning_echo},
      {"temperature", s.temperature},
      {"top_p", s.top_p},
      {"tool_choice", f.get("tool_choice") ? *f.get("tool_choice") : OJson(tool_choice)},
      {"tools", tl ? *tl : OJson::array()},
      {"metadata", md ? *md : OJson::object()},
      {"text", {{"format", format_echo}}}};
  return check_prompt_length(job, model, "input");
}

namespace {

// One response: output items from the parser's blocks; a stream announces each item when its
// first delta arrives and completes it when another follows.
class ResponsesWriter final : public ResponseWriter, BlockListener {
 public:
  ResponsesWriter(const GenerationJob& job, const Tokenizer& tok, const std::string& id,
                  int64_t created)
      : job_(job),
        reasoning_(tok, job.thinking, job.extract_tools),
        id_(id),
        created_(created),
        parser_(job.thinking, job.extract_tools) {
    parser_.set_single_call(job.single_tool_call);
  }

  std::vector<std::string> stream_begin() override {
    OJson r = response_json("in_progress");
    emit("response.created", {{"response", r}});
    emit("response.in_progress", {{"response", std::move(r)}});
    return std::move(frames_);
  }
  std::vector<std::string> stream_output(std::size_t, const RequestOutput& out) override {
    absorb(out, this);
    return std::move(frames_);
  }
  std::vector<std::string> stream_end() override {
    const bool complete = reason_ != FinishReason::kLength;
    emit(complete ? "response.completed" : "response.incomplete",
         {{"response", response_json(complete ? "completed" : "incomplete")}});
    return std::move(frames_);
  }
  std::vector<std::string> stream_error(const ApiError& e) override {
    emit("error", {{"code", e.code.empty() ? OJson(nullptr) : OJson(e.code)},
                   {"message", e.message},
                   {"param", nullptr}});
    return std::move(frames_);
  }
  std::string stream_heartbeat() const override { return ": keep-alive\n\n"; }
  void add(std::size_t, const RequestOutput& out) override { absorb(out, nullptr); }
  std::string body() override {
    return dump_safe(response_json(reason_ == FinishReason::kLength ? "incomplete" : "completed"));
  }

 private:
  // Stream events of the items as they form (BlockListener).
  void opened(std::size_t i, const AssistantBlock& b) override {
    OJson item = item_json(i, b, "in_progress");
    if (b.kind == AssistantBlock::Kind::kToolCall) {
      item["arguments"] = "";
      emit("response.output_item.added", {{"output_index", i}, {"item", std::move(item)}});
      return;
    }
    item["content"] = OJson::array();
    emit("response.output_item.added", {{"output_index", i}, {"item", std::move(item)}});
    emit("response.content_part.added", {{"item_id", item_id(i, b)},
                                         {"output_index", i},
                                         {"content_index", 0},
                                         {"part", part_json(b, "")}});
  }
  void grew(std::size_t i, const AssistantBlock& b, const std::string& d) override {
    if (b.kind == AssistantBlock::Kind::kToolCall) {  // the arguments as they are generated
      emit("response.function_call_arguments.delta",
           {{"item_id", item_id(i, b)}, {"output_index", i}, {"delta", d}});
      return;
    }
    OJson e = {{"item_id", item_id(i, b)}, {"output_index", i}, {"content_index", 0}, {"delta", d}};
    if (b.kind == AssistantBlock::Kind::kReasoning) {
      emit("response.reasoning_text.delta", std::move(e));
    } else {
      e["logprobs"] = OJson::array();
      emit("response.output_text.delta", std::move(e));
    }
  }
  void closed(std::size_t i, const AssistantBlock& b) override {
    const std::string status = final_item_status(i);
    if (b.kind == AssistantBlock::Kind::kToolCall) {
      emit("response.function_call_arguments.done", {{"item_id", item_id(i, b)},
                                                     {"output_index", i},
                                                     {"name", b.call.name},
                                                     {"arguments", b.arguments()}});
    } else {
      OJson done = {
          {"item_id", item_id(i, b)}, {"output_index", i}, {"content_index", 0}, {"text", b.text}};
      if (b.kind == AssistantBlock::Kind::kText) done["logprobs"] = OJson::array();
      emit(b.kind == AssistantBlock::Kind::kText ? "response.output_text.done"
                                                 : "response.reasoning_text.done",
           std::move(done));
      emit("response.content_part.done", {{"item_id", item_id(i, b)},
                                          {"output_index", i},
                                          {"content_index", 0},
                                          {"part", part_json(b, b.text)}});
    }
    emit("response.output_item.done", {{"output_index", i}, {"item", item_json(i, b, status)}});
  }

  void emit(const char* type, OJson data) {
    OJson e = OJson::object();
    e["type"] = type;
    for (auto& [k, v] : data.items()) e[k] = std::move(v);
    e["sequence_number"] = sequence_++;
    frames_.push_back(fmt::format("event: {}\ndata: {}\n\n", type, dump_safe(e)));
  }
  void absorb(const RequestOutput& out, BlockListener* listener) {
    std::vector<AssistantEvent> events;
    parser_.feed(out.text, events);
    if (out.finished) parser_.finish(events);
    reasoning_.feed(out.tokens);
    grouper_.feed(events, listener);
    if (out.finished) {
      reason_ = out.reason;
      prompt_tokens_ = out.prompt_tokens;
      completion_tokens_ = out.completion_tokens;
      cached_tokens_ = out.cached_prompt_tokens;
      // Only the item still open when max_output_tokens cut the answer is incomplete.
      if (reason_ == FinishReason::kLength && grouper_.is_open())
        incomplete_item_ = int64_t(grouper_.blocks().size()) - 1;
      grouper_.close(listener);
    }
  }
  std::string final_item_status(std::size_t i) const {
    const auto& blocks = grouper_.blocks();
    const bool aborted = i < blocks.size() && blocks[i].aborted;  // a streamed call that was cut
    return int64_t(i) == incomplete_item_ || aborted ? "incomplete" : "completed";
  }
  std::string item_id(std::size_t i, const AssistantBlock& b) const {
    const char* prefix = b.kind == AssistantBlock::Kind::kReasoning ? "rs"
                         : b.kind == AssistantBlock::Kind::kText    ? "msg"
                                                                    : "fc";
    return fmt::format("{}_{}_{}", prefix, id_, i);
  }
  static OJson part_json(const AssistantBlock& b, const std::string& text) {
    if (b.kind == AssistantBlock::Kind::kReasoning)
      return {{"type", "reasoning_text"}, {"text", text}};
    return {{"type", "output_text"},
            {"text", text},
            {"annotations", OJson::array()},
            {"logprobs", OJson::array()}};
  }
  OJson item_json(std::size_t i, const AssistantBlock& b, const std::string& status) const {
    switch (b.kind) {
      case AssistantBlock::Kind::kReasoning:
        return {{"type", "reasoning"},
                {"id", item_id(i, b)},
                {"summary", OJson::array()},
                {"content", OJson::array({part_json(b, b.text)})},
                {"status", status}};
      case AssistantBlock::Kind::kText:
        return {{"type", "message"},
                {"id", item_id(i, b)},
                {"status", status},
                {"role", "assistant"},
                {"content", OJson::array({part_json(b, b.text)})}};
      default:
        return {{"type", "function_call"},
                {"id", item_id(i, b)},
                {"call_id", fmt::format("call_{}_{}", id_, i)},
                {"name", b.call.name},
                {"arguments", b.arguments()},
                {"status", status}};
    }
  }
  OJson response_json(const std::string& status) const {
    OJson r = {{"id", "resp_" + id_},
               {"object", "response"},
               {"created_at", created_},
               {"status", status},
               {"error", nullptr},
               {"incomplete_details",
                status == "incomplete" ? OJson{{"reason", "max_output_tokens"}} : OJson(nullptr)},
               {"model", job_.model}};
    for (const auto& [k, v] : job_.echo.items()) r[k] = v;
    OJson output = OJson::array();
    if (status != "in_progress") {
      const auto& blocks = grouper_.blocks();
      for (std::size_t i = 0; i < blocks.size(); ++i)
        output.push_back(item_json(i, blocks[i], final_item_status(i)));
    }
    r["output"] = std::move(output);
    r["previous_response_id"] = nullptr;
    r["store"] = false;
    r["text"] =
        job_.echo.contains("text") ? job_.echo["text"] : OJson{{"format", {{"type", "text"}}}};
    r["truncation"] = "disabled";
    r["usage"] = status == "in_progress"
                     ? OJson(nullptr)
                     : OJson{{"input_tokens", prompt_tokens_},
                             {"input_tokens_details", {{"cached_tokens", cached_tokens_}}},
                             {"output_tokens", completion_tokens_},
                             {"output_tokens_details", {{"reasoning_tokens", reasoning_.count()}}},
                             {"total_tokens", prompt_tokens_ + completion_tokens_}};
    return r;
  }

  const GenerationJob& job_;
  ReasoningCounter reasoning_;  // usage's reasoning_tokens, from the token ids
  std::string id_;
  int64_t created_;
  AssistantStreamParser parser_;
  BlockGrouper grouper_;
  std::vector<std::string> frames_;
  int64_t sequence_ = 0;
  FinishReason reason_ = FinishReason::kNone;
  int64_t incomplete_item_ = -1;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
};

class ResponsesApi final : public GenerationApi {
 public:
  const char* endpoint() const override { return "/v1/responses"; }
  std::optional<ApiError> parse(const OJson& body, const ServedModel& model, const Tokenizer& tok,
                                GenerationJob& job) const override {
    return parse_responses_request(body, model, tok, job);
  }
  std::unique_ptr<ResponseWriter> writer(const GenerationJob& job, const Tokenizer& tok,
                                         const std::string& id, int64_t created) const override {
    return std::make_unique<ResponsesWriter>(job, tok, id, created);
  }
  std::string error_body(const ApiError& e) const override { return dsv41::error_body(e); }
};

}  // namespace

std::unique_ptr<GenerationApi> openai_responses_api() {
  return std::make_unique<ResponsesApi>();
}

}  // namespace dsv41
