// V4.1 chat encoding: DeepSeek's reference fixtures byte for byte, every rule of spec §11, request
// validation errors, and the Python-compatible JSON the encoder relies on.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "text/chat.h"
#include "text/json_ordered.h"

namespace dsv41 {
namespace {

const std::string kBos = "<｜begin▁of▁sentence｜>";
const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kEffort50 =
    "<｜System｜>Reasoning Effort: 50 (range 1-100, the higher the value, the more thorough the "
    "reasoning)\n\n";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

OJson J(const std::string& text) {
  auto r = parse_json_ordered(text);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? *r : OJson();
}

// Encodes a request body given as JSON text.
std::string render(const std::string& body) {
  auto req = parse_chat_request(J(body));
  EXPECT_TRUE(req.is_ok()) << req.status().message();
  if (!req.is_ok()) return "";
  auto text = encode_chat(req->messages, req->options);
  EXPECT_TRUE(text.is_ok()) << text.status().message();
  return text.is_ok() ? *text : "";
}

std::string render_error(const std::string& body) {
  auto req = parse_chat_request(J(body));
  if (!req.is_ok()) return req.status().message();
  auto text = encode_chat(req->messages, req->options);
  return text.is_ok() ? "" : text.status().message();
}

TEST(Chat, ReferenceFixturesByteForByte) {
  // Inputs and outputs of DeepSeek's V4.1 reference encoder (as published with vLLM's tests).
  for (int i : {1, 2}) {
    std::string dir = std::string(DSV41_TEST_DATA) + "/chat/reference_" + std::to_string(i);
    std::string body = read_file(dir + ".json");
    std::string expected = read_file(dir + ".expected.txt");
    EXPECT_EQ(render(body), expected) << "case " << i;
    OJson with_prompt = J(body);
    with_prompt["add_generation_prompt"] = true;
    EXPECT_EQ(render(with_prompt.dump()), expected + "<｜Assistant｜><think>") << "case " << i;
  }
}

TEST(Chat, NumericAndNamedReasoningEffort) {
  // DeepSeek's names with DeepSeek's folding (minimal, low -> low; medium, high, xhigh -> high;
  // max, ultra -> max) at the V4.1 encoder's numbers (docs/chat.md).
  const std::vector<std::pair<std::string, int>> cases = {
      {"null", 50},     {"\"minimal\"", 25}, {"\"low\"", 25},  {"\"medium\"", 50},
      {"\"high\"", 50}, {"\"xhigh\"", 50},   {"\"max\"", 100}, {"\"ultra\"", 100},
      {"1", 1},         {"42", 42},          {"100", 100}};
  for (const auto& [effort, budget] : cases) {
    std::string body = R"({"messages":[{"role":"user","content":"question"}],
        "chat_template_kwargs":{"reasoning_effort":)" +
                       effort + "}}";
    EXPECT_EQ(render(body),
              kBos + "<｜System｜>Reasoning Effort: " + std::to_string(budget) +
                  " (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
                  "<｜User｜>question<｜Assistant｜><think>")
        << effort;
  }
}

TEST(Chat, InvalidEffortIsARequestError) {
  for (const char* effort : {"\"huge\"", "\"Medium\"", "-1", "0", "101", "true", "1.5", "[]"}) {
    std::string body =
        R"({"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"reasoning_effort":)" +
        std::string(effort) + "}}";
    std::string err = render_error(body);
    EXPECT_NE(err.find("chat_template_kwargs.reasoning_effort"), std::string::npos)
        << effort << ": " << err;
  }
  EXPECT_NE(
      render_error(R"({"messages":[{"role":"user","content":"q"}],"reasoning_effort":"huge"})")
          .find("reasoning_effort"),
      std::string::npos);
}

TEST(Chat, ChatModeHasClosedThinkingPrefix) {
  for (const char* kwargs : {R"({"thinking":false})", R"({"enable_thinking":false})",
                             R"({"thinking":true,"reasoning_effort":"none"})",
                             R"({"enable_thinking":true,"reasoning_effort":"none"})"}) {
    std::string body =
        R"({"messages":[{"role":"user","content":"question"}],"chat_template_kwargs":)" +
        std::string(kwargs) + "}";
    EXPECT_EQ(render(body), kBos + "<｜User｜>question<｜Assistant｜></think>") << kwargs;
  }
}

// DeepSeek's thinking switch at the top level: it overrides chat_template_kwargs, the top-level
// effort still applies, and anything but enabled/disabled is an error naming it.
TEST(Chat, DeepSeekThinkingSwitch) {
  const std::string q = R"({"messages":[{"role":"user","content":"question"}],)";
  EXPECT_EQ(render(q + R"("thinking":{"type":"disabled"}})"),
            kBos + "<｜User｜>question<｜Assistant｜></think>");
  EXPECT_EQ(render(q + R"("thinking":{"type":"disabled"},"reasoning_effort":"max"})"),
            kBos + "<｜User｜>question<｜Assistant｜></think>");
  EXPECT_EQ(render(q + R"("thinking":{"type":"enabled"},"chat_template_kwargs":{"thinking":false},)"
                       R"("reasoning_effort":"max"})"),
            kBos +
                "<｜System｜>Reasoning Effort: 100 (range 1-100, the higher the value, the more "
                "thorough the reasoning)\n\n<｜User｜>question<｜Assistant｜><think>");
  EXPECT_EQ(render(q + R"("thinking":{"type":"enabled"},"reasoning_effort":"none"})"),
            kBos + "<｜User｜>question<｜Assistant｜></think>");
  for (const char* bad :
       {R"("thinking":true)", R"("thinking":{"type":"on"})", R"("thinking":{})"}) {
    const std::string err = render_error(q + bad + "}");
    EXPECT_EQ(err.rfind("thinking", 0), 0u) << bad << ": " << err;
  }
}

// DeepSeek's chat prefix completion: a final assistant message with prefix: true is continued
// (its reasoning_content, alone, as the open thinking); prefix anywhere else is an error naming it.
TEST(Chat, PrefixContinuesTheLastAssistantMessage) {
  auto parse = [](const std::string& body) { return parse_chat_request(J(body)); };
  auto req = parse(R"({"messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":"def f(","prefix":true}],"thinking":{"type":"disabled"}})");
  ASSERT_TRUE(req.is_ok()) << req.status().message();
  EXPECT_TRUE(req->options.continue_final_message);
  EXPECT_EQ(*encode_chat(req->messages, req->options),
            kBos + "<｜User｜>q<｜Assistant｜></think>def f(");
  EXPECT_FALSE(generation_starts_in_reasoning(req->messages, req->options));
  req = parse(R"({"messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":"","reasoning_content":"First,","prefix":true}]})");
  ASSERT_TRUE(req.is_ok()) << req.status().message();
  const std::string open = *encode_chat(req->messages, req->options);
  EXPECT_EQ(open.substr(open.size() - std::string("<｜Assistant｜><think>First,").size()),
            "<｜Assistant｜><think>First,");
  EXPECT_TRUE(generation_starts_in_reasoning(req->messages, req->options));
  req = parse(R"({"messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":"Yes","reasoning_content":"First,","prefix":true}]})");
  ASSERT_TRUE(req.is_ok());
  EXPECT_NE(encode_chat(req->messages, req->options)->find("<think>First,</think>Yes"),
            std::string::npos);
  EXPECT_FALSE(generation_starts_in_reasoning(req->messages, req->options));
  EXPECT_EQ(render_error(R"({"messages":[{"role":"assistant","content":"a","prefix":true},
      {"role":"user","content":"q"}]})")
                .rfind("messages[0].prefix", 0),
            0u);
  EXPECT_EQ(render_error(R"({"messages":[{"role":"user","content":"q","prefix":true}]})")
                .rfind("messages[0].prefix", 0),
            0u);
  EXPECT_EQ(render_error(R"({"messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":"a","prefix":"yes"}]})")
                .rfind("messages[1].prefix", 0),
            0u);
}

TEST(Chat, TopLevelEffortOverridesTemplateEffort) {
  std::string body = R"({"messages":[{"role":"user","content":"q"}],"reasoning_effort":"low",
      "chat_template_kwargs":{"reasoning_effort":100}})";
  EXPECT_NE(render(body).find("Reasoning Effort: 25 "), std::string::npos);
}

TEST(Chat, TextPartsJoinWithBlankLine) {
  std::string body = R"({"messages":[{"role":"user","content":[{"type":"text","text":"first"},
      {"type":"input_text","text":"second"}]}],"chat_template_kwargs":{"thinking":false}})";
  EXPECT_EQ(render(body), kBos + "<｜User｜>first\n\nsecond<｜Assistant｜></think>");
}

TEST(Chat, MidConversationSystemGetsMarkerAndGenerationCue) {
  std::string body =
      R"({"messages":[{"role":"user","content":"question"},{"role":"system","content":"answer briefly"}],
      "chat_template_kwargs":{"thinking":false}})";
  EXPECT_EQ(render(body),
            kBos + "<｜User｜>question<｜System｜>answer briefly<｜Assistant｜></think>");
}

TEST(Chat, GenerationPromptOnlyControlsFinalTurn) {
  for (bool thinking : {false, true}) {
    for (const char* final_role : {"user", "developer", "system", "assistant"}) {
      std::string msgs = std::string(R"([{"role":"user","content":"first question"},
          {"role":"assistant","content":"first answer"},{"role":"user","content":"second question"},
          {"role":")") + final_role +
                         R"(","content":"final message"}])";
      std::string kw = std::string(R"("chat_template_kwargs":{"thinking":)") +
                       (thinking ? "true" : "false") + "}";
      std::string closed =
          render(R"({"messages":)" + msgs + "," + kw + R"(,"add_generation_prompt":false})");
      std::string opened = render(R"({"messages":)" + msgs + "," + kw + "}");
      std::string cue = std::string("<｜Assistant｜>") + (thinking ? "<think>" : "</think>");
      EXPECT_EQ(opened, closed + cue) << final_role << thinking;
      EXPECT_NE(closed.find("first answer" + kEos), std::string::npos) << final_role;
      EXPECT_NE(closed.find("<｜User｜>first question<｜Assistant｜>"), std::string::npos)
          << final_role;
    }
  }
}

TEST(Chat, SystemOnlyGenerationPrompt) {
  for (bool thinking : {false, true}) {
    std::string kw =
        std::string(R"("chat_template_kwargs":{"thinking":)") + (thinking ? "true" : "false") + "}";
    std::string closed = render(R"({"messages":[{"role":"system","content":"Be helpful."}],)" + kw +
                                R"(,"add_generation_prompt":false})");
    std::string opened =
        render(R"({"messages":[{"role":"system","content":"Be helpful."}],)" + kw + "}");
    EXPECT_EQ(opened, closed + "<｜Assistant｜>" + (thinking ? "<think>" : "</think>"));
    EXPECT_EQ(closed, kBos + (thinking ? kEffort50 : std::string("<｜System｜>")) + "Be helpful.");
  }
}

TEST(Chat, ContinueFinalMessage) {
  for (bool thinking : {false, true}) {
    std::string msgs =
        R"([{"role":"user","content":"first question"},{"role":"assistant","content":"first answer"},
        {"role":"user","content":"second question"},{"role":"assistant","content":"The answer is "}])";
    std::string kw =
        std::string(R"("chat_template_kwargs":{"thinking":)") + (thinking ? "true" : "false") + "}";
    std::string closed =
        render(R"({"messages":)" + msgs + "," + kw + R"(,"add_generation_prompt":false})");
    std::string cont =
        render(R"({"messages":)" + msgs + "," + kw + R"(,"continue_final_message":true})");
    EXPECT_EQ(closed, cont + kEos);
    EXPECT_TRUE(cont.ends_with("The answer is "));
    EXPECT_NE(cont.find("first answer" + kEos), std::string::npos);
  }
  // Continuing a message that so far holds only reasoning keeps the think block open.
  std::string r = render(R"({"messages":[{"role":"user","content":"Explain."},
      {"role":"assistant","content":null,"reasoning":"Let me consider "}],"continue_final_message":true})");
  EXPECT_TRUE(r.ends_with("<｜Assistant｜><think>Let me consider ")) << r;
  for (const char* msgs : {R"([{"role":"user","content":"hello"}])"}) {
    EXPECT_NE(
        render_error(R"({"messages":)" + std::string(msgs) + R"(,"continue_final_message":true})")
            .find("final assistant"),
        std::string::npos);
  }
}

TEST(Chat, EarlierReasoningDroppedWithoutTools_KeptWithTools) {
  std::string msgs =
      R"([{"role":"user","content":"a"},{"role":"assistant","reasoning":"r1","content":"c1"},
      {"role":"user","content":"b"},{"role":"assistant","reasoning":"r2","content":"c2"}])";
  std::string dropped = render(R"({"messages":)" + msgs + R"(,"add_generation_prompt":false})");
  EXPECT_EQ(dropped, kBos + kEffort50 + "<｜User｜>a<｜Assistant｜></think>c1" + kEos +
                         "<｜User｜>b<｜Assistant｜><think>r2</think>c2" + kEos);
  // With tools every turn keeps its reasoning and every cue opens thinking.
  std::string tools = R"([{"type":"function","function":{"name":"f","parameters":{}}}])";
  std::string kept = render(R"({"messages":)" + msgs + R"(,"tools":)" + tools +
                            R"(,"add_generation_prompt":false})");
  EXPECT_NE(kept.find("<｜User｜>a<｜Assistant｜><think>r1</think>c1" + kEos), std::string::npos)
      << kept;
  EXPECT_NE(kept.find("<｜User｜>b<｜Assistant｜><think>r2</think>c2" + kEos), std::string::npos)
      << kept;
  // An empty system message carries the tools when the request has none.
  EXPECT_EQ(kept.rfind(kBos + kEffort50 + "\n\n## Tools\n\n", 0), 0u) << kept.substr(0, 200);
  // drop_thinking=false keeps reasoning without tools too.
  std::string nodrop =
      render(R"({"messages":)" + msgs +
             R"(,"chat_template_kwargs":{"drop_thinking":false},"add_generation_prompt":false})");
  EXPECT_NE(nodrop.find("<think>r1</think>c1"), std::string::npos);
  // Chat mode never renders reasoning.
  std::string chat =
      render(R"({"messages":)" + msgs +
             R"(,"chat_template_kwargs":{"thinking":false},"add_generation_prompt":false})");
  EXPECT_EQ(chat, kBos + "<｜User｜>a<｜Assistant｜></think>c1" + kEos +
                      "<｜User｜>b<｜Assistant｜></think>c2" + kEos);
}

TEST(Chat, DeveloperMessagesBeforeLastUserDroppedInThinkingMode) {
  std::string msgs =
      R"([{"role":"developer","content":"dev rules"},{"role":"user","content":"q"}])";
  EXPECT_EQ(render(R"({"messages":)" + msgs + "}"),
            kBos + kEffort50 + "<｜User｜>q<｜Assistant｜><think>");
  EXPECT_EQ(render(R"({"messages":)" + msgs + R"(,"chat_template_kwargs":{"thinking":false}})"),
            kBos + "<｜User｜>dev rules<｜User｜>q<｜Assistant｜></think>");
  EXPECT_NE(render_error(R"({"messages":[{"role":"developer","content":""}]})")
                .find("messages[0].content"),
            std::string::npos);
}

TEST(Chat, ToolResultsMergeIntoUserTurnsInCallOrder) {
  std::string body = R"({"messages":[
      {"role":"user","content":"go"},
      {"role":"assistant","tool_calls":[
        {"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}},
        {"id":"b","type":"function","function":{"name":"g","arguments":{"y":"two","z":[1.5,true,null]}}}]},
      {"role":"tool","tool_call_id":"b","content":"B"},
      {"role":"tool","tool_call_id":"a","content":[{"type":"text","text":"A1"},{"type":"text","text":"A2"}]},
      {"role":"user","content":"thanks"}],
    "chat_template_kwargs":{"thinking":false}})";
  std::string expected =
      kBos +
      "<｜User｜>go<｜Assistant｜></think>\n\n<｜DSML｜ calls>\n"
      "<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"x\" string=\"false\">1</｜DSML｜ "
      "parameter>\n"
      "</｜DSML｜ invoke>\n"
      "<｜DSML｜ invoke name=\"g\">\n<｜DSML｜ parameter name=\"y\" string=\"true\">two</｜DSML｜ "
      "parameter>\n"
      "<｜DSML｜ parameter name=\"z\" string=\"false\">[1.5, true, null]</｜DSML｜ parameter>\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>" +
      kEos +
      "<｜User｜><tool_result>A1\n\nA2</tool_result>\n\n<tool_result>B</"
      "tool_result>\n\nthanks<｜Assistant｜></think>";
  EXPECT_EQ(render(body), expected);
}

TEST(Chat, ToolMessageWithoutPrecedingUserStartsAUserTurn) {
  std::string body =
      R"({"messages":[{"role":"system","content":"s"},{"role":"tool","tool_call_id":"x","content":"r"}],
      "chat_template_kwargs":{"thinking":false}})";
  EXPECT_EQ(render(body),
            kBos + "<｜System｜>s<｜User｜><tool_result>r</tool_result><｜Assistant｜></think>");
}

TEST(Chat, ArgumentsDoubleEncodedOrNotAnObject) {
  auto one = [](const std::string& args_json) {
    std::vector<ChatToolCall> calls(1);
    calls[0].name = "f";
    calls[0].arguments = J(args_json);
    return encode_tool_calls_dsml(calls);
  };
  // A JSON string holding a JSON string of an object decodes twice.
  EXPECT_NE(one(R"("\"{\\\"k\\\": \\\"v\\\"}\"")").find(R"(name="k" string="true">v<)"),
            std::string::npos);
  // Not an object: wrapped as {"arguments": original}.
  EXPECT_NE(one(R"("not json")").find(R"(name="arguments" string="true">not json<)"),
            std::string::npos);
  EXPECT_NE(one(R"([1, 2])").find(R"(name="arguments" string="false">[1, 2]<)"), std::string::npos);
  // Python number and text formatting, key order as sent, no ASCII escaping.
  std::string s = one(
      R"({"b": 1e-5, "a": 1E16, "c": 2.50, "d": {"é": "\"q\"\n"}, "e": -0.0, "f": 100000000000000000000})");
  EXPECT_NE(s.find(R"(name="b" string="false">1e-05<)"), std::string::npos) << s;
  EXPECT_NE(s.find(R"(name="a" string="false">1e+16<)"), std::string::npos) << s;
  EXPECT_NE(s.find(R"(name="c" string="false">2.5<)"), std::string::npos) << s;
  EXPECT_NE(s.find(R"(name="d" string="false">{"é": "\"q\"\n"}<)"), std::string::npos) << s;
  EXPECT_NE(s.find(R"(name="e" string="false">-0.0<)"), std::string::npos) << s;
  EXPECT_LT(s.find("name=\"b\""), s.find("name=\"a\""));
}

TEST(Chat, RequestValidationNamesTheParameter) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"([])", "body"},
      {R"({})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":[1]})", "messages[0]"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
      // (a user message's image_url part is read here and checked by the server: issue 33)
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
       "messages[0].content[0].image_url.url"},
      {R"({"messages":[{"role":"assistant","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})",
       "messages[0].content[0].type"},
      {R"({"messages":[{"role":"user","content":[{"type":"audio"}]}]})",
       "messages[0].content[0].type"},
      {R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})",
       "messages[0].content[0].text"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{}}]}]})",
       "messages[0].tool_calls[0].function.name"},
      {R"({"messages":[{"role":"assistant","tool_calls":{}}]})", "messages[0].tool_calls"},
      {R"({"messages":[{"role":"user","content":"x","reasoning":3}]})", "messages[0].reasoning"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", "tools"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
       "tools[0].function"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"code","function":{"name":"f"}}]})",
       "tools[0].type"},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]})",
       "chat_template_kwargs"},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"thinking":"yes"}})",
       "chat_template_kwargs.thinking"},
      {R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":1})",
       "add_generation_prompt"},
  };
  for (const auto& [body, param] : cases) {
    std::string err = render_error(body);
    EXPECT_EQ(err.rfind(param, 0), 0u) << body << " -> " << err;
  }
}

TEST(Json, OrderedParseKeepsOrderAndLastDuplicate) {
  auto v = parse_json_ordered(R"({"z":1,"a":{"y":[1,2],"b":null},"z":3})");
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(python_json_dumps(*v), R"({"z": 3, "a": {"y": [1, 2], "b": null}})");
  // Many keys: linear-time path (hash index) keeps order and duplicates semantics.
  std::string big = "{";
  for (int i = 0; i < 50000; ++i)
    big += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  big += "\"k7\":-1}";
  auto b = parse_json_ordered(big);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->size(), 50000u);
  EXPECT_EQ(b->begin().key(), "k0");
  EXPECT_EQ((*b)["k7"], -1);
}

TEST(Json, RefusesMalformedAndTooDeep) {
  for (const char* bad :
       {"", "{", "{\"a\":}", "[1,]", "{\"a\":1} x", "\"\\ud800\"", "nan", "\xff"}) {
    auto r = parse_json_ordered(bad);
    EXPECT_FALSE(r.is_ok()) << bad;
  }
  std::string deep(kMaxJsonDepth + 1, '[');
  deep += std::string(kMaxJsonDepth + 1, ']');
  auto r = parse_json_ordered(deep);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("nested"), std::string::npos);
  std::string ok(kMaxJsonDepth, '[');
  ok += std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(parse_json_ordered(ok).is_ok());
}

TEST(Json, PythonFloatRepr) {
  const std::vector<std::pair<double, std::string>> cases = {
      {1.0, "1.0"},
      {0.1, "0.1"},
      {1e-4, "0.0001"},
      {1e-5, "1e-05"},
      {1e15, "1000000000000000.0"},
      {1e16, "1e+16"},
      {1.5e16, "1.5e+16"},
      {123.456, "123.456"},
      {-2.5, "-2.5"},
      {0.0, "0.0"},
      {1.0 / 3, "0.3333333333333333"},
      {2e-308, "2e-308"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {12345678901234567.0, "1.2345678901234568e+16"}};
  for (const auto& [v, s] : cases) EXPECT_EQ(python_float_repr(v), s) << s;
  EXPECT_EQ(python_json_dumps(J(R"(["\u0001\t", "日本", 3, -4, 18446744073709551615])")),
            "[\"\\u0001\\t\", \"日本\", 3, -4, 18446744073709551615]");
}

}  // namespace
}  // namespace dsv41
