// The OpenAI Responses API (POST /v1/responses, stateless): a malformed corpus (4xx in OpenAI's
// error shape, never 5xx), the input items -> V4.1 prompt mapping against the chat encoder fed the
// equivalent chat messages (reasoning + function call + output round trip), the stream's events
// rebuilding the non-streamed response in every chunking of a reasoning + DSML output, and the
// official `openai` client's responses.create / responses.stream on a scripted model and on the
// real binary.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/rng.h"
#include "io/test_util.h"
#include "server/anthropic_api.h"
#include "server/generation_protocol.h"
#include "server/responses_api.h"
#include "server/server_harness.h"
#include "text/chat.h"
#include "text/json_ordered.h"

namespace dsv41 {
namespace {

using namespace server_testing;

bool is_openai_error(const std::string& body) {
  auto j = parse_json_ordered(body);
  if (!j || !j->is_object() || !j->contains("error")) return false;
  const OJson& e = (*j)["error"];
  return e.is_object() && e["message"].is_string() && e.contains("type") && e.contains("param");
}

std::vector<std::string> malformed_responses() {
  const std::string m = R"("model":"scripted")", in = R"("input":"hi")";
  std::vector<std::string> v = {"", "{", "[]", "null", "{" + m + "}", "{" + in + "}"};
  for (const std::string f :
       std::vector<std::string>{R"("model":1)",
                                R"("model":"other")",
                                R"("store":true)",
                                R"("store":"no")",
                                R"("previous_response_id":"resp_1")",
                                R"("conversation":"c")",
                                R"("background":true)",
                                R"("max_output_tokens":0)",
                                R"("max_output_tokens":"5")",
                                R"("max_output_tokens":1e30)",
                                R"("max_output_tokens":100000000)",
                                R"("temperature":3)",
                                R"("top_p":0)",
                                R"("stream":1)",
                                R"("instructions":1)",
                                R"("tools":{})",
                                R"("tools":[1])",
                                R"("tools":[{"type":"web_search"}])",
                                R"("tools":[{"type":"function"}])",
                                R"("tools":[{"type":"function","name":"f","parameters":1}])",
                                R"("tools":[{"type":"function","name":"f","description":2}])",
                                R"("tool_choice":"required")",
                                R"("tool_choice":{"type":"function","name":"f"})",
                                R"("reasoning":1)",
                                R"("reasoning":{"effort":"huge"})",
                                R"("reasoning":{"effort":0})",
                                R"("reasoning":{"effort":true})",
                                R"("text":{"format":{"type":"json_schema"}})",
                                R"("text":1)",
                                R"("text":{"format":{"type":5}})",
                                R"("text":{"format":1})",
                                R"("metadata":1)",
                                R"("parallel_tool_calls":"x")"}) {
    v.push_back("{" + m + "," + in + "," + f + "}");
  }
  for (
      const std::string i : std::vector<std::string>{
          R"("input":1)",
          R"("input":[])",
          R"("input":{})",
          R"("input":[1])",
          R"("input":[{}])",
          R"("input":[{"role":"tool","content":"x"}])",
          R"("input":[{"role":"user"}])",
          R"("input":[{"role":"user","content":1}])",
          R"("input":[{"role":"user","content":[1]}])",
          R"("input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}])",
          R"("input":[{"role":"user","content":[{"type":"input_file"}]}])",
          R"("input":[{"role":"user","content":[{"type":"input_text"}]}])",
          R"("input":[{"role":"user","content":[{"type":"magic","text":"x"}]}])",
          R"("input":[{"type":"function_call","name":"f","arguments":"{}"}])",
          R"("input":[{"type":"function_call","call_id":"c","arguments":"{}"}])",
          R"("input":[{"type":"function_call","call_id":"c","name":"f","arguments":{}}])",
          R"("input":[{"type":"function_call_output","output":"x"}])",
          R"("input":[{"type":"function_call_output","call_id":"c"}])",
          R"("input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_image"}]}])",
          R"("input":[{"type":"reasoning","summary":1}])",
          R"("input":[{"type":"reasoning","summary":[{"type":"summary_text"}]}])",
          R"("input":[{"type":"item_reference","id":"msg_1"}])",
          R"("input":[{"type":"wat"}])",
          R"("input":[{"type":1}])"}) {
    v.push_back("{" + m + "," + i + "}");
  }
  return v;
}

TEST(Responses, MalformedRequestsGet4xxInOpenAisShape) {
  InProcess s;
  auto c = s.client();
  const auto corpus = malformed_responses();
  for (const std::string& body : corpus) expect_refused(c, "/v1/responses", body, is_openai_error);
  auto store = c.Post("/v1/responses", R"({"model":"scripted","input":"x","store":true})",
                      "application/json");
  ASSERT_TRUE(store);
  EXPECT_NE(store->body.find(R"("param":"store")"), std::string::npos) << store->body;
  expect_healthy(c);
  std::printf("malformed Responses requests checked: %zu\n", corpus.size());
}

// Input items of a reasoning + function call + output conversation encode byte for byte as the
// chat encoder does for the same turns.
TEST(Responses, RoundTripEncodesAsTheChatEncoder) {
  const auto tok = tiny_tokenizer();
  const ServedModel model = parser_model();
  const OJson body = *parse_json_ordered(R"({
    "model": "m", "instructions": "Be exact.", "reasoning": {"effort": "low"},
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "input": [
      {"role": "user", "content": "Weather in Paris?"},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "I should call the tool."}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
      {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"},
                                   {"type": "input_text", "text": "In Lyon too."}]}]})");
  GenerationJob job;
  auto err = parse_responses_request(body, model, *tok, job);
  ASSERT_FALSE(err.has_value()) << err->message;
  expect_weather_round_trip(*tok, job, "call_1", OJson("{\"city\": \"Paris\"}"));
}

// The reference encoder's tool round trip (tests/data/chat/reference_1: an assistant turn with
// reasoning and a tool call, the tool's result, the final answer with reasoning), rewritten as an
// Anthropic Messages body and as Responses input items, encodes byte for byte as the reference did.
TEST(Responses, ThreeApisEncodeTheReferenceToolRoundTripByteForByte) {
  const std::string dir = std::string(DSV41_TEST_DATA) + "/chat/reference_1";
  const OJson ref = *parse_json_ordered(testing::read_file(dir + ".json"));
  const std::string expected = testing::read_file(dir + ".expected.txt");
  OJson anthropic = {{"thinking", {{"type", "enabled"}, {"budget_tokens", 8192}}}};  // effort 50
  OJson a_tools = OJson::array(), r_tools = OJson::array(), a_msgs = OJson::array(),
        items = OJson::array();
  for (const OJson& t : ref["tools"]) {
    const OJson& fn = t["function"];
    a_tools.push_back({{"name", fn["name"]},
                       {"description", fn["description"]},
                       {"input_schema", fn["parameters"]}});
    r_tools.push_back({{"type", "function"},
                       {"name", fn["name"]},
                       {"description", fn["description"]},
                       {"parameters", fn["parameters"]}});
  }
  OJson responses = {{"reasoning", {{"effort", "medium"}}}};  // effort 50
  for (const OJson& m : ref["messages"]) {
    const std::string role = m["role"];
    if (role == "system") {
      anthropic["system"] = m["content"];
      responses["instructions"] = m["content"];
    } else if (role == "user") {
      a_msgs.push_back({{"role", "user"}, {"content", m["content"]}});
      items.push_back({{"role", "user"}, {"content", m["content"]}});
    } else if (role == "tool") {
      a_msgs.push_back({{"role", "user"},
                        {"content", OJson::array({{{"type", "tool_result"},
                                                   {"tool_use_id", m["tool_call_id"]},
                                                   {"content", m["content"]}}})}});
      items.push_back({{"type", "function_call_output"},
                       {"call_id", m["tool_call_id"]},
                       {"output", m["content"]}});
    } else {
      OJson blocks = OJson::array();
      if (m.contains("reasoning")) {
        blocks.push_back({{"type", "thinking"}, {"thinking", m["reasoning"]}, {"signature", ""}});
        items.push_back(
            {{"type", "reasoning"},
             {"summary", OJson::array()},
             {"content", OJson::array({{{"type", "reasoning_text"}, {"text", m["reasoning"]}}})}});
      }
      if (m.contains("content") && !m["content"].is_null()) {
        blocks.push_back({{"type", "text"}, {"text", m["content"]}});
        items.push_back(
            {{"type", "message"},
             {"role", "assistant"},
             {"content", OJson::array({{{"type", "output_text"}, {"text", m["content"]}}})}});
      }
      for (const OJson& c : m.value("tool_calls", OJson::array())) {
        const OJson& fn = c["function"];
        blocks.push_back({{"type", "tool_use"},
                          {"id", c["id"]},
                          {"name", fn["name"]},
                          {"input", *parse_json_ordered(fn["arguments"].get<std::string>())}});
        items.push_back({{"type", "function_call"},
                         {"call_id", c["id"]},
                         {"name", fn["name"]},
                         {"arguments", fn["arguments"]}});
      }
      a_msgs.push_back({{"role", "assistant"}, {"content", blocks}});
    }
  }
  anthropic["tools"] = a_tools;
  anthropic["messages"] = a_msgs;
  responses["tools"] = r_tools;
  responses["input"] = items;
  // The fixture ends with the final answer (add_generation_prompt false), which neither API can
  // ask for: their conversations are encoded with the fixture's options.
  ChatRequest a, r;
  bool tools_a = false, tools_r = false;
  OJson echo;
  std::string choice;
  ASSERT_FALSE(messages_conversation(anthropic, 10000, false, a, tools_a).has_value());
  ASSERT_FALSE(responses_conversation(responses, r, tools_r, echo, choice).has_value());
  for (ChatRequest* c : {&a, &r}) {
    c->options.add_generation_prompt = false;
    c->options.continue_final_message = false;
    auto text = encode_chat(c->messages, c->options);
    ASSERT_TRUE(text.is_ok()) << text.status().message();
    EXPECT_EQ(*text, expected) << (c == &a ? "Anthropic Messages" : "Responses");
  }
  EXPECT_TRUE(tools_a && tools_r);
}

TEST(Responses, StreamedEventsRebuildTheResponseInEveryChunking) {
  const auto tok = tiny_tokenizer();
  const GenerationJob job = reasoning_tools_job();
  auto api = openai_responses_api();
  const OJson response = whole_body(*api, job, *tok, whole_output(kScriptText));
  const OJson& output = response["output"];
  ASSERT_EQ(output.size(), 3u) << response.dump();
  EXPECT_EQ(output[0]["content"][0]["text"], "I should call the tool.");
  EXPECT_EQ(output[1]["content"][0]["text"], "Let me check.");
  EXPECT_EQ(output[2]["name"], "get_weather");
  EXPECT_EQ(*parse_json_ordered(output[2]["arguments"].get<std::string>()),
            *parse_json_ordered(R"({"city":"Paris","days":3})"));
  EXPECT_EQ(response["status"], "completed");
  Rng rng(6);
  for (int trial = 0; trial < 200; ++trial) {
    auto w = api->writer(job, *tok, "x", 0);
    const std::vector<std::string> frames = stream_in_chunks(*w, kScriptText, trial, rng);
    // Deltas per output index add up to the final texts; sequence numbers count up from 0.
    std::map<int, std::string> texts;
    OJson last;
    for (std::size_t k = 0; k < frames.size(); ++k) {
      const std::string& fr = frames[k];
      const std::size_t nl = fr.find('\n');
      last = *parse_json_ordered(fr.substr(nl + 7, fr.size() - nl - 9));
      ASSERT_EQ(last["type"].get<std::string>(), fr.substr(7, nl - 7));
      ASSERT_EQ(last["sequence_number"].get<std::size_t>(), k);
      const std::string type = last["type"];
      if (type == "response.output_text.delta" || type == "response.reasoning_text.delta" ||
          type == "response.function_call_arguments.delta")
        texts[last["output_index"].get<int>()] += last["delta"].get<std::string>();
    }
    ASSERT_EQ(last["type"], "response.completed");
    ASSERT_EQ(last["response"]["output"].dump(), output.dump()) << "trial " << trial;
    ASSERT_EQ(texts[0], "I should call the tool.");
    ASSERT_EQ(texts[1], "Let me check.");
    ASSERT_EQ(texts[2], output[2]["arguments"].get<std::string>());
  }
}

// reasoning_tokens counts the sampled token ids through the `</think>` token (with tools: through
// the `｜DSML｜` token of a tool call opened inside the reasoning), whatever the text says: a
// reasoning that spells "</think>" in plain characters does not end the count.
TEST(Responses, ReasoningTokensAreCountedFromTheTokenIds) {
  const auto tok = tiny_tokenizer();
  auto api = openai_responses_api();
  const int32_t think_end = tok->token_id("</think>"), dsml = tok->token_id("｜DSML｜");
  ASSERT_GE(think_end, 0);
  ASSERT_GE(dsml, 0);
  // The reasoning tokens of `text` generated as `ids` (sent in `chunk`-token outputs).
  auto reasoning_tokens = [&](const GenerationJob& job, const std::string& text,
                              const std::vector<int32_t>& ids, std::size_t chunk) {
    auto w = api->writer(job, *tok, "x", 0);
    for (std::size_t at = 0; at < ids.size(); at += chunk) {
      RequestOutput o;
      for (std::size_t k = at; k < std::min(ids.size(), at + chunk); ++k)
        o.tokens.push_back(OutputToken{ids[k]});
      if (at == 0) o.text = text;
      w->add(0, o);
    }
    RequestOutput end = whole_output("");
    end.completion_tokens = int64_t(ids.size());
    w->add(0, end);
    return (*parse_json_ordered(w->body()))["usage"]["output_tokens_details"]["reasoning_tokens"]
        .get<int64_t>();
  };
  GenerationJob job = reasoning_tools_job();
  job.extract_tools = false;
  const std::string text = "I should call the tool.</think>Let me check.";
  const std::vector<int32_t> ids = tok->encode(text);
  const auto end_at = std::find(ids.begin(), ids.end(), think_end);
  ASSERT_NE(end_at, ids.end());
  const int64_t through_end = (end_at - ids.begin()) + 1;
  ASSERT_LT(through_end, int64_t(ids.size()));
  for (std::size_t chunk : {1u, 3u, 100u})
    EXPECT_EQ(reasoning_tokens(job, text, ids, chunk), through_end) << "chunk " << chunk;
  // "</think>" spelled in plain characters: still reasoning to the end of these tokens.
  std::vector<int32_t> spelled;
  for (char ch : std::string("I said </think> then")) {
    const std::vector<int32_t> one = tok->encode(std::string(1, ch));
    spelled.insert(spelled.end(), one.begin(), one.end());
  }
  ASSERT_EQ(std::find(spelled.begin(), spelled.end(), think_end), spelled.end());
  EXPECT_EQ(reasoning_tokens(job, "I said", spelled, 2), int64_t(spelled.size()));
  // With tools, a tool call opened inside the reasoning ends it at its DSML token.
  job.extract_tools = true;
  const std::string call = "Checking<｜DSML｜ calls>";
  const std::vector<int32_t> call_ids = tok->encode(call);
  const auto dsml_at = std::find(call_ids.begin(), call_ids.end(), dsml);
  ASSERT_NE(dsml_at, call_ids.end());
  EXPECT_EQ(reasoning_tokens(job, call, call_ids, 1), (dsml_at - call_ids.begin()) + 1);
  job.extract_tools = false;  // without tools a DSML token is reasoning like any other
  EXPECT_EQ(reasoning_tokens(job, call, call_ids, 1), int64_t(call_ids.size()));
}

TEST(Responses, ScriptedToolCallsAndReasoningThroughTheOpenAiClient) {
  InProcess s;
  expect_node_client_passes(s.port, "scripted", "tools", "openai_responses_test.mjs");
}

TEST(Responses, OpenAiClientEndToEndOnTheRealBinary) {
  expect_node_client_passes_on_real_binary("openai_responses_test.mjs");
}

}  // namespace
}  // namespace dsv41
