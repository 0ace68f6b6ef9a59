// The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens): a malformed corpus
// (4xx in Anthropic's error shape, never 5xx), the request -> V4.1 prompt mapping against the chat
// encoder fed the equivalent OpenAI messages (the reasoning + tool call + result round trip), the
// stream's blocks equal to the non-streamed message in every chunking of a reasoning + DSML
// output, and the official `@anthropic-ai/sdk` client on a scripted model and on the real binary.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "io/test_util.h"
#include "server/anthropic_api.h"
#include "server/generation_protocol.h"
#include "server/server_harness.h"
#include "text/chat.h"
#include "text/json_ordered.h"

namespace dsv41 {
namespace {

using namespace server_testing;

bool is_anthropic_error(const std::string& body, const char* type = nullptr) {
  auto j = parse_json_ordered(body);
  if (!j || !j->is_object() || (*j)["type"] != "error" || !(*j)["error"].is_object()) return false;
  const OJson& e = (*j)["error"];
  if (!e["type"].is_string() || !e["message"].is_string() ||
      e["message"].get<std::string>().empty())
    return false;
  return !type || e["type"] == type;
}

// A malformed Messages body; `generation_only`: bad only as a generation request (max_tokens,
// stream, a thinking budget over max_tokens), a valid count_tokens body.
struct MalformedBody {
  std::string body;
  bool generation_only = false;
};

std::vector<MalformedBody> malformed_messages() {
  const std::string m = R"("model":"scripted")", mt = R"("max_tokens":8)";
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  std::vector<MalformedBody> v = {{""},
                                  {"{"},
                                  {"[]"},
                                  {"null"},
                                  {"\"x\""},
                                  {"{\"model\":}"},
                                  {"{" + m + "}"},
                                  {"{" + m + "," + mt + "}"},
                                  {"{" + m + "," + msgs + "}", true}};
  for (const std::string f :
       std::vector<std::string>{R"("model":1)",
                                R"("model":"other")",
                                R"("max_tokens":0)",
                                R"("max_tokens":"8")",
                                R"("max_tokens":1.5)",
                                R"("max_tokens":99999999999)",
                                R"("max_tokens":100000000)",
                                R"("temperature":1.5)",
                                R"("temperature":"x")",
                                R"("top_p":0)",
                                R"("top_k":-1)",
                                R"("stream":"yes")",
                                R"("stop_sequences":"x")",
                                R"("stop_sequences":[1])",
                                R"("stop_sequences":[""])",
                                R"("system":1)",
                                R"("system":[{"type":"image"}])",
                                R"("system":[{"type":"text"}])",
                                R"("metadata":1)",
                                R"("metadata":{"user_id":1})",
                                R"("tools":{})",
                                R"("tools":[1])",
                                R"("tools":[{"name":""}])",
                                R"("tools":[{"name":"f"}])",
                                R"("tools":[{"name":"f","input_schema":1}])",
                                R"("tools":[{"type":"web_search_20250305","name":"web_search"}])",
                                R"("tools":[{"name":"f","input_schema":{},"description":1}])",
                                R"("tool_choice":"auto")",
                                R"("tool_choice":{"type":"any"})",
                                R"("tool_choice":{"type":"tool","name":"f"})",
                                R"("tool_choice":{})",
                                R"("thinking":true)",
                                R"("thinking":{"type":"on"})",
                                R"("thinking":{"type":"enabled","budget_tokens":1500.5})",
                                R"("output_config":1)",
                                R"("output_config":{"effort":"huge"})",
                                R"("output_config":{"effort":0})",
                                R"("tool_choice":{"type":"auto","disable_parallel_tool_use":1})",
                                R"("thinking":{"type":"enabled","budget_tokens":10})",
                                R"("thinking":{"type":"enabled","budget_tokens":"2000"})",
                                R"("thinking":{"type":"enabled","budget_tokens":4096})"}) {
    const bool generation_only = f.rfind(R"("max_tokens")", 0) == 0 ||
                                 f.rfind(R"("stream")", 0) == 0 ||
                                 f.find("\"budget_tokens\":4096") != std::string::npos;
    v.push_back({"{" + m + "," + mt + "," + msgs + "," + f + "}", generation_only});
  }
  for (
      const std::string mm : std::vector<std::string>{
          R"("messages":[])",
          R"("messages":{})",
          R"("messages":[1])",
          R"("messages":[{}])",
          R"("messages":[{"role":"system","content":"x"}])",
          R"("messages":[{"role":"user"}])",
          R"("messages":[{"role":"user","content":1}])",
          R"("messages":[{"role":"user","content":[1]}])",
          R"("messages":[{"role":"user","content":[]}])",  // once read back() of an empty list
          R"("messages":[{"role":"user","content":[{"text":"x"}]}])",
          R"("messages":[{"role":"user","content":[{"type":"text"}]}])",
          R"("messages":[{"role":"user","content":[{"type":"image","source":{}}]}])",
          R"("messages":[{"role":"user","content":[{"type":"document","source":{}}]}])",
          R"("messages":[{"role":"user","content":[{"type":"tool_result"}]}])",
          R"("messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":1}]}])",
          R"("messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"image"}]}]}])",
          R"("messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","is_error":"x"}]}])",
          R"("messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}])",
          R"("messages":[{"role":"user","content":[{"type":"thinking","thinking":"x"}]}])",
          R"("messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f"}]}])",
          R"("messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"","input":{}}]}])",
          R"("messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]}])",
          R"("messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"thinking"}]}])",
          R"("messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"a"}]}])",
          R"("messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"magic"}]}])"}) {
    v.push_back({"{" + m + "," + mt + "," + mm + "}"});
  }
  return v;
}

TEST(Anthropic, MalformedMessagesGet4xxInAnthropicsShape) {
  InProcess s;
  auto c = s.client();
  const auto corpus = malformed_messages();
  const auto is_error = [](const std::string& b) { return is_anthropic_error(b); };
  int count_refused = 0;
  for (const auto& [body, generation_only] : corpus) {
    expect_refused(c, "/v1/messages", body, is_error);
    // count_tokens reads the same body (max_tokens and stream aside): refused alike, or counted.
    if (!generation_only) {
      expect_refused(c, "/v1/messages/count_tokens", body, is_error);
      ++count_refused;
      continue;
    }
    auto n = c.Post("/v1/messages/count_tokens", body, "application/json");
    ASSERT_TRUE(n) << body;
    EXPECT_EQ(n->status, 200) << body << " -> " << n->body;
    EXPECT_NE(n->body.find("input_tokens"), std::string::npos) << n->body;
  }
  EXPECT_GE(count_refused, 60);
  // Status and type pairs.
  auto unknown =
      c.Post("/v1/messages",
             R"({"model":"other","max_tokens":4,"messages":[{"role":"user","content":"x"}]})",
             "application/json");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_TRUE(is_anthropic_error(unknown->body, "not_found_error")) << unknown->body;
  auto image = c.Post(
      "/v1/messages",
      R"({"model":"scripted","max_tokens":4,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]})",
      "application/json");
  ASSERT_TRUE(image);
  EXPECT_EQ(image->status, 400);
  // (an image block is read since issue 33: one without a source is refused naming the field)
  EXPECT_NE(image->body.find("messages[0].content[0].source"), std::string::npos) << image->body;
  auto doc = c.Post(
      "/v1/messages",
      R"({"model":"scripted","max_tokens":4,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]})",
      "application/json");
  ASSERT_TRUE(doc);
  EXPECT_EQ(doc->status, 400);
  EXPECT_NE(doc->body.find("messages[0].content[0].type"), std::string::npos) << doc->body;
  auto get = c.Get("/v1/messages");  // the pre-routing 405 speaks Anthropic on its paths too
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  EXPECT_TRUE(is_anthropic_error(get->body, "invalid_request_error")) << get->body;
  // A prompt over the context (2,048 here) is refused for generation and counted by count_tokens.
  std::string words;
  for (int i = 0; i < 3000; ++i) words += " word";
  const std::string longer =
      R"({"model":"scripted","max_tokens":4,"messages":[{"role":"user","content":")" + words +
      R"("}]})";
  auto too_long = c.Post("/v1/messages", longer, "application/json");
  ASSERT_TRUE(too_long);
  EXPECT_EQ(too_long->status, 400) << too_long->body;
  auto counted = c.Post("/v1/messages/count_tokens", longer, "application/json");
  ASSERT_TRUE(counted);
  ASSERT_EQ(counted->status, 200) << counted->body;
  EXPECT_GT((*parse_json_ordered(counted->body))["input_tokens"].get<int64_t>(), 2048);
  expect_healthy(c);
  std::printf("malformed Messages requests checked: %zu\n", corpus.size());
}

// The Messages request of a reasoning + tool call + result conversation encodes byte for byte as
// the chat encoder does for the same turns given as OpenAI messages.
TEST(Anthropic, RoundTripEncodesAsTheChatEncoder) {
  const auto tok = tiny_tokenizer();
  const ServedModel model = parser_model();
  const OJson body = *parse_json_ordered(R"({
    "model": "m", "max_tokens": 5000, "system": [{"type": "text", "text": "Be exact."}],
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object",
      "properties": {"city": {"type": "string"}}}}],
    "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "I should call the tool.", "signature": ""},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]},
        {"type": "text", "text": "And tomorrow?"}, {"type": "text", "text": "In Lyon too."}]}]})");
  GenerationJob job;
  ASSERT_FALSE(parse_messages_request(body, model, *tok, false, job).has_value());
  expect_weather_round_trip(*tok, job, "toolu_1", *parse_json_ordered(R"({"city":"Paris"})"));
}

// Parses the SSE events of a Messages stream into the message they describe.
OJson assemble_stream(const std::vector<std::string>& frames, std::vector<std::string>& types) {
  OJson content = OJson::array();
  OJson stop = nullptr;
  for (const std::string& f : frames) {
    const std::size_t nl = f.find('\n');
    const std::string name = f.substr(7, nl - 7);
    const OJson data = *parse_json_ordered(f.substr(nl + 7, f.size() - nl - 9));
    EXPECT_EQ(data["type"].get<std::string>(), name);
    types.push_back(name);
    if (name == "content_block_start") {
      EXPECT_EQ(data["index"].get<std::size_t>(), content.size());
      OJson b = data["content_block"];
      if (b["type"] == "tool_use") b["input"] = "";
      content.push_back(b);
    } else if (name == "content_block_delta") {
      OJson& b = content[data["index"].get<std::size_t>()];
      const OJson& d = data["delta"];
      if (d["type"] == "thinking_delta")
        b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      if (d["type"] == "text_delta")
        b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      if (d["type"] == "input_json_delta")
        b["input"] = b["input"].get<std::string>() + d["partial_json"].get<std::string>();
    } else if (name == "message_delta") {
      stop = data["delta"]["stop_reason"];
    }
  }
  for (OJson& b : content)
    if (b["type"] == "tool_use") b["input"] = *parse_json_ordered(b["input"].get<std::string>());
  return {{"content", content}, {"stop_reason", stop}};
}

TEST(Anthropic, StreamedBlocksEqualTheMessageInEveryChunking) {
  const auto tok = tiny_tokenizer();
  const GenerationJob job = reasoning_tools_job();
  auto api = anthropic_messages_api();
  const OJson message = whole_body(*api, job, *tok, whole_output(kScriptText));
  ASSERT_EQ(message["content"].size(), 3u) << message.dump();
  EXPECT_EQ(message["content"][0]["thinking"], "I should call the tool.");
  EXPECT_EQ(message["content"][1]["text"], "Let me check.");
  EXPECT_EQ(message["content"][2]["input"]["days"], 3);
  EXPECT_EQ(message["stop_reason"], "tool_use");
  Rng rng(4);
  for (int trial = 0; trial < 200; ++trial) {  // chunks cut anywhere, markers included
    auto w = api->writer(job, *tok, "x", 0);
    std::vector<std::string> types;
    const OJson got = assemble_stream(stream_in_chunks(*w, kScriptText, trial, rng), types);
    ASSERT_EQ(got["content"].dump(), message["content"].dump()) << "trial " << trial;
    ASSERT_EQ(got["stop_reason"], "tool_use");
    ASSERT_EQ(types.front(), "message_start");
    ASSERT_EQ(types.back(), "message_stop");
  }
}

// Usage in Anthropic's accounting: input_tokens + cache_creation_input_tokens +
// cache_read_input_tokens = the prompt; the prefix cache's hits are the cache reads, creation is 0
// (docs/server.md). The stream says it in message_start (sent with the first output, which carries
// the engine's cache count) and again, cumulatively, in message_delta.
TEST(Anthropic, UsageSplitsThePromptIntoComputedAndCachedTokens) {
  const auto tok = tiny_tokenizer();
  GenerationJob job = reasoning_tools_job();
  job.request.prompt.assign(30, 5);
  auto api = anthropic_messages_api();
  RequestOutput done = whole_output(kScriptText);
  done.prompt_tokens = 30;
  done.cached_prompt_tokens = 16;
  const OJson message = whole_body(*api, job, *tok, done);
  EXPECT_EQ(message["usage"].dump(),
            R"({"input_tokens":14,"cache_creation_input_tokens":0,"cache_read_input_tokens":16,)"
            R"("output_tokens":40})");
  auto w = api->writer(job, *tok, "x", 0);
  EXPECT_TRUE(w->stream_begin().empty());  // message_start waits for the first output
  RequestOutput first;
  first.text = "I should";
  first.tokens.resize(2);
  first.cached_prompt_tokens = 16;
  const std::vector<std::string> opening = w->stream_output(0, first);
  ASSERT_FALSE(opening.empty());
  ASSERT_EQ(opening[0].rfind("event: message_start\n", 0), 0u) << opening[0];
  const OJson start = *parse_json_ordered(opening[0].substr(opening[0].find("data: ") + 6));
  EXPECT_EQ(start["message"]["usage"].dump(),
            R"({"input_tokens":14,"cache_creation_input_tokens":0,"cache_read_input_tokens":16,)"
            R"("output_tokens":0})");
  RequestOutput rest = whole_output(" call the tool.</think>Hi");
  rest.prompt_tokens = 30;
  rest.cached_prompt_tokens = 16;
  for (const std::string& f : w->stream_output(0, rest))
    EXPECT_EQ(f.find("message_start"), std::string::npos) << "message_start twice: " << f;
  const std::vector<std::string> end = w->stream_end();
  ASSERT_EQ(end[0].rfind("event: message_delta\n", 0), 0u) << end[0];
  const OJson delta = *parse_json_ordered(end[0].substr(end[0].find("data: ") + 6));
  EXPECT_EQ(delta["usage"], message["usage"]);

  // Through the server (the scripted model has no prefix cache): the prompt is all input tokens,
  // count_tokens's number, streamed or not.
  InProcess s;
  auto c = s.client();
  const std::string body =
      R"({"model":"scripted","max_tokens":8,"messages":[{"role":"user","content":"hi"}])";
  auto count = c.Post("/v1/messages/count_tokens", body + "}", "application/json");
  auto whole = c.Post("/v1/messages", body + "}", "application/json");
  auto streamed = c.Post("/v1/messages", body + R"(,"stream":true})", "application/json");
  ASSERT_TRUE(count && whole && streamed);
  const OJson usage = (*parse_json_ordered(whole->body))["usage"];
  EXPECT_EQ(usage["input_tokens"], (*parse_json_ordered(count->body))["input_tokens"]);
  EXPECT_EQ(usage["cache_read_input_tokens"], 0);
  EXPECT_EQ(usage["cache_creation_input_tokens"], 0);
  EXPECT_EQ(usage["output_tokens"], 8);
  std::string sse = streamed->body;
  const std::string ping = "event: ping\ndata: {\"type\":\"ping\"}\n\n";
  while (sse.rfind(ping, 0) == 0) sse.erase(0, ping.size());  // heartbeats of a slow machine
  ASSERT_EQ(sse.rfind("event: message_start\n", 0), 0u) << sse.substr(0, 200);
  const std::size_t at = sse.find("event: message_delta\n");
  ASSERT_NE(at, std::string::npos) << sse;
  const std::size_t data = sse.find("data: ", at) + 6;
  const OJson final_delta = *parse_json_ordered(sse.substr(data, sse.find('\n', data) - data));
  EXPECT_EQ(final_delta["usage"], usage);
}

TEST(Anthropic, ScriptedToolCallsAndReasoningThroughTheAnthropicClient) {
  InProcess s;
  expect_node_client_passes(s.port, "scripted", "tools", "anthropic_client_test.mjs");
}

TEST(Anthropic, AnthropicClientEndToEndOnTheRealBinary) {
  expect_node_client_passes_on_real_binary("anthropic_client_test.mjs");
}

}  // namespace
}  // namespace dsv41
