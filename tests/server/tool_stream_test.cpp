// Tool-call arguments streamed as they are generated (issue 36 item 7): a scripted model writes a
// call with a long string argument (quotes, backslashes, newlines, non-ASCII) and a string="false"
// one; in chat completions, Messages and Responses the streamed argument pieces arrive in several
// events and concatenate to the whole response's arguments byte for byte. The same server then
// answers the official clients (tests/js/tool_stream_test.mjs). A call that began streaming and
// then proved malformed ends, in every API, as the whole response says, and the stream numbers the
// calls after it on from it.
#include <gtest/gtest.h>

#include "server_harness.h"

namespace dsv41 {
namespace {

using namespace server_testing;

OJson stream_args() {
  std::string text;
  for (int i = 0; i < 12; ++i)
    text += "line " + std::to_string(i) + ": \"quoted\" \\path\\ naïve 日本 👍\t<tag>\n";
  OJson args = OJson::object();
  args["path"] = "notes/a.txt";
  args["content"] = text;
  args["opts"] = OJson::parse(R"({"mode": 420, "tags": ["x", "y"], "ratio": 0.5})");
  return args;
}

std::string post_body(httplib::Client& c, const std::string& path, const std::string& body) {
  auto r = c.Post(path, body, "application/json");
  EXPECT_TRUE(r) << path;
  if (!r) return "";
  EXPECT_EQ(r->status, 200) << r->body;
  return r->body;
}

// A server whose model writes `calls` (thinking off), one token per step with a pause, so that
// the stream's outputs are not all coalesced into one. `script_tokens`: how many tokens that is.
struct ToolServer {
  std::size_t script_tokens = 0;
  InProcess s;
  explicit ToolServer(const std::vector<ChatToolCall>& calls) : s(engine(calls, script_tokens)) {}
  static std::unique_ptr<Engine> engine(const std::vector<ChatToolCall>& calls, std::size_t& n) {
    auto tok = tiny_tokenizer();
    auto script = tok->encode("\n\n" + encode_tool_calls_dsml(calls));
    n = script.size();
    auto backend = std::make_unique<ScriptBackend>(*tok, std::move(script), 1);
    auto e = Engine::create(std::move(backend), std::move(tok), EngineOptions{});
    EXPECT_TRUE(e.is_ok());
    return std::move(*e);
  }
};

// Chat completions, Messages and Responses, whose writers the tests drive directly.
std::vector<std::unique_ptr<GenerationApi>> three_apis() {
  std::vector<std::unique_ptr<GenerationApi>> apis;
  apis.push_back(openai_chat_api());
  apis.push_back(anthropic_messages_api());
  apis.push_back(openai_responses_api());
  return apis;
}

// A chat job that extracts tool calls, the model answering without thinking.
GenerationJob tools_job_thinking_off() {
  GenerationJob job = reasoning_tools_job();
  job.thinking = false;
  return job;
}

TEST(ToolStream, ArgumentsStreamInPiecesThatConcatenateToTheWholeArgumentsInEveryApi) {
  ToolServer server({{"1", "write_file", stream_args()}});
  // max_tokens 1000 (here and in the client script): room for the whole call, and with the prompt
  // (~700 tokens with the tools) within the scripted model's 2,048-token context (more is a 400).
  ASSERT_LT(server.script_tokens, 1000u);
  EXPECT_GT(server.script_tokens, 300u);  // a long argument: many steps
  auto c = server.s.client();
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"write_file","parameters":{"type":"object"}}}])";
  const std::string chat = R"({"model":"scripted","messages":[{"role":"user","content":"q"}],)"
                           R"("thinking":{"type":"disabled"},"max_tokens":1000,)" +
                           tools;
  // The whole response's arguments: the reference every stream must give byte for byte.
  OJson whole = *parse_json_ordered(post_body(c, "/v1/chat/completions", chat + "}"));
  ASSERT_EQ(whole["choices"][0]["finish_reason"], "tool_calls") << whole.dump();
  ASSERT_EQ(whole["choices"][0]["message"]["tool_calls"].size(), 1u) << whole.dump();
  const std::string args = whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"];
  EXPECT_EQ(*parse_json_ordered(args), stream_args());

  // Chat completions: the first tool-call delta carries the id and name, the rest arguments.
  std::string streamed;
  int pieces = 0;
  for (const OJson& p :
       sse_payloads(post_body(c, "/v1/chat/completions", chat + R"(,"stream":true})"))) {
    if (p["choices"].empty() || !p["choices"][0]["delta"].contains("tool_calls")) continue;
    const OJson& call = p["choices"][0]["delta"]["tool_calls"][0];
    EXPECT_EQ(call["index"], 0);
    const std::string piece = call["function"].value("arguments", "");
    streamed += piece;
    pieces += !piece.empty();
  }
  EXPECT_EQ(streamed, args);
  EXPECT_GT(pieces, 3);

  // Messages: input_json_delta pieces; their concatenation parses to the whole response's input.
  const std::string messages =
      R"({"model":"scripted","max_tokens":1000,"thinking":{"type":"disabled"},)"
      R"("messages":[{"role":"user","content":"q"}],)"
      R"("tools":[{"name":"write_file","input_schema":{"type":"object"}}])";
  OJson m = *parse_json_ordered(post_body(c, "/v1/messages", messages + "}"));
  ASSERT_EQ(m["content"].size(), 1u);
  EXPECT_EQ(m["content"][0]["input"], stream_args());
  streamed.clear();
  pieces = 0;
  for (const OJson& p :
       sse_payloads(post_body(c, "/v1/messages", messages + R"(,"stream":true})"))) {
    if (p["type"] != "content_block_delta" || p["delta"]["type"] != "input_json_delta") continue;
    streamed += p["delta"]["partial_json"].get<std::string>();
    ++pieces;
  }
  EXPECT_EQ(streamed, args);
  EXPECT_GT(pieces, 3);

  // Responses: function_call_arguments.delta pieces, then .done with the whole arguments.
  const std::string responses =
      R"({"model":"scripted","input":"q","reasoning":{"effort":"none"},)"
      R"("tools":[{"type":"function","name":"write_file","parameters":{"type":"object"}}])";
  OJson r = *parse_json_ordered(post_body(c, "/v1/responses", responses + "}"));
  EXPECT_EQ(r["output"][0]["arguments"], args);
  streamed.clear();
  pieces = 0;
  std::string done;
  for (const OJson& p :
       sse_payloads(post_body(c, "/v1/responses", responses + R"(,"stream":true})"))) {
    if (p["type"] == "response.function_call_arguments.delta") {
      streamed += p["delta"].get<std::string>();
      ++pieces;
    }
    if (p["type"] == "response.function_call_arguments.done") done = p["arguments"];
  }
  EXPECT_EQ(streamed, args);
  EXPECT_EQ(done, args);
  EXPECT_GT(pieces, 3);

  // The official clients on the same server: their stream helpers assemble the same arguments.
  expect_node_client_passes(server.s.port, "scripted", "stream", "tool_stream_test.mjs");
}

// A call that began streaming and then proves malformed (text after its parameter): the stream
// cannot take back what went out, so it closes the call where it is and goes on as the whole
// response does (the text as content; finish_reason "stop", stop_reason end_turn; Responses' item
// incomplete). The whole response is the same whatever the chunking of the engine's output.
TEST(ToolStream, ACallThatProvesMalformedAfterItBeganEndsAsTheWholeResponseSays) {
  const std::string text =
      "Let me check.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"w\">\n<｜DSML｜ parameter "
      "name=\"a\" string=\"true\">abc</｜DSML｜ parameter>\noops</｜DSML｜ invoke>\n</｜DSML｜ "
      "calls>";
  const std::string begun_args = R"({"a": "abc")";
  const auto tok = tiny_tokenizer();
  const GenerationJob job = tools_job_thinking_off();
  for (const auto& api : three_apis()) {
    const std::string name = api->endpoint();
    const OJson whole = whole_body(*api, job, *tok, whole_output(text));
    std::string content;  // the whole response's text
    if (name == "/v1/chat/completions") {
      const OJson& choice = whole["choices"][0];
      EXPECT_FALSE(choice["message"].contains("tool_calls")) << whole.dump();
      EXPECT_EQ(choice["finish_reason"], "stop");
      content = choice["message"]["content"];
    } else if (name == "/v1/messages") {
      ASSERT_EQ(whole["content"].size(), 1u) << whole.dump();
      EXPECT_EQ(whole["stop_reason"], "end_turn");
      content = whole["content"][0]["text"];
    } else {
      ASSERT_EQ(whole["output"].size(), 1u) << whole.dump();
      EXPECT_EQ(whole["output"][0]["type"], "message");
      EXPECT_EQ(whole["status"], "completed");
      content = whole["output"][0]["content"][0]["text"];
    }
    EXPECT_TRUE(content.starts_with("Let me check.")) << content;
    EXPECT_NE(content.find("oops"), std::string::npos) << content;
    Rng rng(36);
    for (int trial = 0; trial < 40; ++trial) {
      const std::string label = name + " trial " + std::to_string(trial);
      // The whole response from the output in chunks: the same body.
      auto w = api->writer(job, *tok, "x", 0);
      for (std::size_t at = 0; at < text.size();) {
        RequestOutput o;
        o.text = text.substr(at, trial < 8 ? std::size_t(trial + 1) : 1 + rng.below(8));
        at += o.text.size();
        w->add(0, o);
      }
      w->add(0, whole_output(""));
      EXPECT_EQ(*parse_json_ordered(w->body()), whole) << label;
      // The stream: the call began (its pieces up to the malformed text went out), then the
      // content and the end are the whole response's.
      auto s = api->writer(job, *tok, "x", 0);
      std::string body;
      for (const std::string& f : stream_in_chunks(*s, text, trial, rng)) body += f;
      int begun = 0;
      std::string args, streamed, end;
      for (const OJson& p : sse_payloads(body)) {
        if (name == "/v1/chat/completions") {
          if (p["choices"].empty()) continue;
          const OJson& c = p["choices"][0];
          if (c["finish_reason"].is_string()) end = c["finish_reason"];
          streamed += c["delta"].value("content", "");
          if (!c["delta"].contains("tool_calls")) continue;
          begun += c["delta"]["tool_calls"][0].contains("id");
          args += c["delta"]["tool_calls"][0]["function"].value("arguments", "");
        } else if (name == "/v1/messages") {
          if (p["type"] == "content_block_start") begun += p["content_block"]["type"] == "tool_use";
          if (p["type"] == "content_block_delta" && p["delta"]["type"] == "input_json_delta")
            args += p["delta"]["partial_json"].get<std::string>();
          if (p["type"] == "content_block_delta" && p["delta"]["type"] == "text_delta")
            streamed += p["delta"]["text"].get<std::string>();
          if (p["type"] == "message_delta") end = p["delta"]["stop_reason"];
        } else {
          if (p["type"] == "response.output_item.added")
            begun += p["item"]["type"] == "function_call";
          if (p["type"] == "response.function_call_arguments.delta")
            args += p["delta"].get<std::string>();
          if (p["type"] == "response.output_text.delta") streamed += p["delta"].get<std::string>();
          if (p["type"] == "response.output_item.done" && p["item"]["type"] == "function_call") {
            EXPECT_EQ(p["item"]["status"], "incomplete") << label;
            EXPECT_EQ(p["item"]["arguments"], begun_args) << label;
          }
          if (p["type"] == "response.completed") end = p["response"]["status"];
        }
      }
      EXPECT_EQ(begun, 1) << label << "\n" << body;
      EXPECT_EQ(args, begun_args) << label;
      EXPECT_EQ(streamed, content) << label;
      EXPECT_EQ(end, name == "/v1/chat/completions" ? "stop"
                     : name == "/v1/messages"       ? "end_turn"
                                                    : "completed")
          << label;
    }
  }
}

// A call after one that began streaming and then proved malformed: the aborted call keeps its
// place in the stream's numbering, so the later call's index and ids are not the whole response's
// (docs/server.md says which). Chat: the stream counts every call that began, the whole response
// the complete ones. Messages and Responses: the stream's blocks (items) are the aborted call's
// and the malformed text's own after it, where the whole response has that text in the text
// block before.
TEST(ToolStream, ACallAfterAnAbortedOneIsNumberedOnInTheStream) {
  const std::string text =
      "Let me check.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"w\">\n<｜DSML｜ parameter "
      "name=\"a\" string=\"true\">abc</｜DSML｜ parameter>\noops</｜DSML｜ invoke>\n<｜DSML｜ "
      "invoke name=\"v\">\n<｜DSML｜ parameter name=\"b\" string=\"true\">x</｜DSML｜ "
      "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  const auto tok = tiny_tokenizer();
  const GenerationJob job = tools_job_thinking_off();
  for (const auto& api : three_apis()) {
    const std::string name = api->endpoint();
    const OJson whole = whole_body(*api, job, *tok, whole_output(text));
    // The later call "v" as the whole response numbers it, and as the stream must: its index
    // (block, output item) and its ids.
    OJson whole_v, streamed_v;
    if (name == "/v1/chat/completions") {
      ASSERT_EQ(whole["choices"][0]["message"]["tool_calls"].size(), 1u) << whole.dump();
      whole_v = whole["choices"][0]["message"]["tool_calls"][0];
      EXPECT_EQ(whole_v["id"], "call_chatcmpl-x_0");
      streamed_v = {{"index", 1}, {"id", "call_chatcmpl-x_1"}};
    } else if (name == "/v1/messages") {
      ASSERT_EQ(whole["content"].size(), 2u) << whole.dump();
      whole_v = whole["content"][1];
      EXPECT_EQ(whole_v["id"], "toolu_x_1");
      streamed_v = {{"index", 3}, {"id", "toolu_x_3"}};
    } else {
      ASSERT_EQ(whole["output"].size(), 2u) << whole.dump();
      whole_v = whole["output"][1];
      EXPECT_EQ(whole_v["id"], "fc_x_1");
      EXPECT_EQ(whole_v["call_id"], "call_x_1");
      streamed_v = {{"index", 3}, {"id", "fc_x_3"}, {"call_id", "call_x_3"}};
    }
    EXPECT_EQ(whole_v.contains("function") ? whole_v["function"]["name"] : whole_v["name"], "v");
    Rng rng(36);
    for (int trial = 0; trial < 20; ++trial) {
      const std::string label = name + " trial " + std::to_string(trial);
      auto s = api->writer(job, *tok, "x", 0);
      std::string body;
      for (const std::string& f : stream_in_chunks(*s, text, trial, rng)) body += f;
      std::vector<OJson> opened;  // each call as it opened: its index and ids
      for (const OJson& p : sse_payloads(body)) {
        if (name == "/v1/chat/completions") {
          if (p["choices"].empty() || !p["choices"][0]["delta"].contains("tool_calls")) continue;
          const OJson& c = p["choices"][0]["delta"]["tool_calls"][0];
          if (c.contains("id")) opened.push_back({{"index", c["index"]}, {"id", c["id"]}});
        } else if (name == "/v1/messages") {
          if (p["type"] == "content_block_start" && p["content_block"]["type"] == "tool_use")
            opened.push_back({{"index", p["index"]}, {"id", p["content_block"]["id"]}});
        } else if (p["type"] == "response.output_item.added" &&
                   p["item"]["type"] == "function_call") {
          opened.push_back({{"index", p["output_index"]},
                            {"id", p["item"]["id"]},
                            {"call_id", p["item"]["call_id"]}});
        }
      }
      ASSERT_EQ(opened.size(), 2u) << label << "\n" << body;  // the aborted call "w", then "v"
      EXPECT_EQ(opened[1], streamed_v) << label;
    }
  }
}

}  // namespace
}  // namespace dsv41
