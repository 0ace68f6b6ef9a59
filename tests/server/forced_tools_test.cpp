// Forced tool calls (issue 32): tool_choice "required" / a named function in chat completions and
// Responses, Anthropic's {type: "any"} / {type: "tool", name}, on the tiny random model at
// temperature 1, which never writes a tool call by itself (checked): every answer ends with
// finish_reason "tool_calls" (stop_reason "tool_use"), names a declared tool (the forced one when
// named) and its arguments validate under that tool's schema (the C++ check of
// tests/engine/json_check.h, and ajv through tests/js/grammar_judge.mjs); streamed and not, in
// thinking mode, with parallel calls off; the same calls alone, among others and with
// speculation; the refusals (400s naming tool_choice or the schema). tests/js/
// forced_tools_test.mjs and anthropic_forced_tools_test.mjs drive the same with the real clients.
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "engine/json_check.h"
#include "grammar/grammar.h"
#include "model/tiny_converted.h"
#include "server/request_fields.h"
#include "server/server_harness.h"
#include "text/dsml_parser.h"
#include "text/json_ordered.h"
#include "text/special_tokens.h"

namespace dsv41::forced_tools_test {
namespace {

using namespace server_testing;
using json = nlohmann::json;

const char* kWeather = R"({"type":"object","properties":{
  "city":{"type":"string","maxLength":12},
  "days":{"type":"integer","minimum":1,"maximum":14},
  "unit":{"enum":["C","F"]},
  "alerts":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":2}},
  "required":["city","days"],"additionalProperties":false})";
const char* kLookup = R"({"type":"object","properties":{
  "id":{"type":"string","format":"uuid"},
  "limit":{"$ref":"#/$defs/small"},
  "exact":{"type":"boolean"}},
  "required":["id","limit"],"$defs":{"small":{"type":"integer","minimum":0,"maximum":99}}})";
const char* kPing = R"({"type":"object","properties":{}})";

std::map<std::string, json> schemas() {
  return {{"weather", json::parse(kWeather)},
          {"lookup", json::parse(kLookup)},
          {"ping", json::parse(kPing)}};
}

OJson openai_tools() {
  OJson t = OJson::array();
  for (const auto& [name, text] : std::vector<std::pair<std::string, const char*>>{
           {"weather", kWeather}, {"lookup", kLookup}, {"ping", kPing}})
    t.push_back(
        {{"type", "function"},
         {"function",
          {{"name", name}, {"description", "a tool"}, {"parameters", *parse_json_ordered(text)}}}});
  return t;
}

struct TinyServer {
  dsv41::testing::TempDir dir;
  std::unique_ptr<InProcess> server;
  explicit TinyServer(bool speculative = false) {
    EngineOptions opt;
    opt.model_dir = dsv41::testing::make_tiny_converted(dir, 3);
    opt.fast.kv_cache_gb = 0.05;
    opt.speculative = speculative;
    opt.speculative_width = speculative ? 3 : 0;
    auto e = Engine::load(opt);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    server = std::make_unique<InProcess>(std::move(*e));
  }
};

OJson post(httplib::Client& c, const std::string& path, const OJson& body, int want = 200) {
  auto r = c.Post(path, dump_safe(body), "application/json");
  EXPECT_TRUE(r) << path;
  if (!r) return OJson::object();
  EXPECT_EQ(r->status, want) << dump_safe(body).substr(0, 300) << " -> " << r->body.substr(0, 600);
  auto j = parse_json_ordered(r->body);
  return j.is_ok() ? *j : OJson::object();
}

OJson chat_body(const OJson& extra) {
  OJson b = {{"model", "scripted"},
             {"messages", {{{"role", "user"}, {"content", "Which tool?"}}}},
             {"max_tokens", 600},
             {"temperature", 1.0},
             {"seed", 7},
             {"tools", openai_tools()},
             {"chat_template_kwargs", {{"thinking", false}}}};
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

// Every call checked in C++ and kept for ajv: (tool name, arguments text).
struct Calls {
  std::vector<std::pair<std::string, std::string>> all;
  void check(const std::string& name, const std::string& args, const std::string& want_name = "") {
    const auto s = schemas();
    ASSERT_TRUE(s.count(name)) << "an undeclared tool: " << name;
    if (!want_name.empty()) EXPECT_EQ(name, want_name);
    EXPECT_EQ(dsv41::testing::json_text_check(s.at(name), args), "") << name << ": " << args;
    all.emplace_back(name, args);
  }
  // ajv (draft 2020-12, ajv-formats) on every call; skipped when node or ajv is not there.
  void judge() const {
    if (run_command("cd " + std::string(DSV41_JS_DIR) + " && node -e \"import('ajv')\"").first != 0)
      return;
    json cases = json::array();
    for (const auto& [name, args] : all)
      cases.push_back({{"schema", schemas().at(name)}, {"docs", {args}}});
    const std::string in = "/tmp/dsv41_forced_judge_" + std::to_string(getpid()) + ".json";
    std::ofstream(in) << cases.dump();
    auto [code, out] =
        run_command("cd " + std::string(DSV41_JS_DIR) + " && node grammar_judge.mjs " + in);
    std::remove(in.c_str());
    ASSERT_EQ(code, 0) << out;
    const json verdict = json::parse(out, nullptr, false);
    ASSERT_TRUE(verdict.is_array() && verdict.size() == all.size()) << out;
    for (std::size_t i = 0; i < all.size(); ++i)
      EXPECT_TRUE(verdict[i][0]["valid"].get<bool>())
          << all[i].first << ": " << all[i].second << ": " << verdict[i][0]["error"];
  }
};

// A chat choice's calls: finish_reason tool_calls, at least one call (exactly one if `one`).
void check_chat_choice(const OJson& ch, Calls& calls, const std::string& want, bool one = false) {
  EXPECT_EQ(ch["finish_reason"], "tool_calls") << dump_safe(ch).substr(0, 400);
  const OJson& tc = ch["message"]["tool_calls"];
  ASSERT_TRUE(tc.is_array() && !tc.empty()) << dump_safe(ch).substr(0, 400);
  if (one) EXPECT_EQ(tc.size(), 1u);
  for (const auto& c : tc)
    calls.check(c["function"]["name"].get<std::string>(),
                c["function"]["arguments"].get<std::string>(), want);
}

TEST(ForcedToolCalls, RequiredAndNamedCallsValidateInChatCompletions) {
  TinyServer t;
  auto c = t.server->client();
  Calls calls;
  // Unforced, the random model writes no call: what the forcing below changes.
  const OJson free = post(c, "/v1/chat/completions", chat_body({{"n", 3}, {"max_tokens", 60}}));
  ASSERT_EQ(free["choices"].size(), 3u);
  for (const auto& ch : free["choices"]) EXPECT_FALSE(ch["message"].contains("tool_calls"));

  const OJson req =
      post(c, "/v1/chat/completions", chat_body({{"tool_choice", "required"}, {"n", 3}}));
  ASSERT_EQ(req["choices"].size(), 3u);
  for (const auto& ch : req["choices"]) check_chat_choice(ch, calls, "");

  const OJson named =
      post(c, "/v1/chat/completions",
           chat_body({{"tool_choice", {{"type", "function"}, {"function", {{"name", "lookup"}}}}},
                      {"n", 2},
                      {"seed", 8}}));
  ASSERT_EQ(named["choices"].size(), 2u);
  for (const auto& ch : named["choices"]) check_chat_choice(ch, calls, "lookup");

  // parallel_tool_calls false: exactly one call.
  const OJson single = post(
      c, "/v1/chat/completions",
      chat_body(
          {{"tool_choice", "required"}, {"parallel_tool_calls", false}, {"n", 3}, {"seed", 9}}));
  for (const auto& ch : single["choices"]) check_chat_choice(ch, calls, "", true);

  // Streamed: the calls' deltas assemble into valid arguments.
  auto r = c.Post("/v1/chat/completions",
                  dump_safe(chat_body(
                      {{"tool_choice", {{"type", "function"}, {"function", {{"name", "weather"}}}}},
                       {"stream", true},
                       {"seed", 10}})),
                  "application/json");
  ASSERT_TRUE(r);
  std::map<int, std::pair<std::string, std::string>> streamed;
  std::string finish;
  for (const OJson& chunk : sse_payloads(r->body)) {
    for (const auto& ch : chunk["choices"]) {
      if (ch.contains("finish_reason") && ch["finish_reason"].is_string())
        finish = ch["finish_reason"].get<std::string>();
      if (!ch["delta"].contains("tool_calls")) continue;
      for (const auto& d : ch["delta"]["tool_calls"]) {
        auto& [name, args] = streamed[d["index"].get<int>()];
        if (d["function"].contains("name")) name += d["function"]["name"].get<std::string>();
        if (d["function"].contains("arguments"))
          args += d["function"]["arguments"].get<std::string>();
      }
    }
  }
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_FALSE(streamed.empty()) << r->body.substr(0, 600);
  for (const auto& [i, call] : streamed) calls.check(call.first, call.second, "weather");

  // Thinking mode: the reasoning is free, the calls after it are forced.
  OJson think = chat_body({{"tool_choice", "required"}, {"thinking_token_budget", 5}, {"n", 2}});
  think.erase("chat_template_kwargs");
  const OJson th = post(c, "/v1/chat/completions", think);
  ASSERT_EQ(th["choices"].size(), 2u);
  for (const auto& ch : th["choices"]) {
    EXPECT_TRUE(ch["message"]["reasoning_content"].is_string());
    check_chat_choice(ch, calls, "");
  }
  calls.judge();
}

TEST(ForcedToolCalls, SameCallsAloneAmongOthersAndWithSpeculation) {
  TinyServer t;
  TinyServer spec(true);
  auto c = t.server->client();
  const OJson named = {{"type", "function"}, {"function", {{"name", "weather"}}}};
  std::vector<OJson> targets = {chat_body({{"tool_choice", "required"}, {"seed", 5}}),
                                chat_body({{"tool_choice", named}, {"temperature", 0}})};
  auto answer = [](httplib::Client& cl, const OJson& body) {
    const OJson r = post(cl, "/v1/chat/completions", body);
    if (r["choices"].empty()) return std::string();
    OJson calls = r["choices"][0]["message"]["tool_calls"];
    for (auto& x : calls) x.erase("id");  // ids are fresh per response
    return dump_safe(calls);
  };
  std::vector<std::string> alone;
  for (const OJson& b : targets) alone.push_back(answer(c, b));
  std::vector<std::string> crowded(targets.size());
  std::vector<std::thread> th;
  for (int i = 0; i < 8; ++i) {
    OJson b = i % 3 == 0   ? chat_body({{"max_tokens", 30}})
              : i % 3 == 1 ? chat_body({{"tool_choice", "required"}, {"seed", 100 + i}})
                           : chat_body({{"structured_outputs", {{"regex", "[a-z ]{5,60}"}}}});
    th.emplace_back([&t, b] {
      auto cl = t.server->client();
      post(cl, "/v1/chat/completions", b);
    });
    if (i == 2 || i == 5)
      th.emplace_back([&t, &targets, &crowded, &answer, k = std::size_t(i == 2 ? 0 : 1)] {
        auto cl = t.server->client();
        crowded[k] = answer(cl, targets[k]);
      });
  }
  for (auto& x : th) x.join();
  auto sc = spec.server->client();
  for (std::size_t k = 0; k < targets.size(); ++k) {
    EXPECT_NE(alone[k].find("\"arguments\""), std::string::npos) << alone[k];
    EXPECT_EQ(crowded[k], alone[k]) << "target " << k;
    EXPECT_EQ(answer(sc, targets[k]), alone[k]) << "target " << k << " with speculation";
  }
  EXPECT_GT(spec.server->engine->stats().spec_steps, 0);
}

OJson anthropic_body(const OJson& extra) {
  OJson tools = OJson::array();
  for (const auto& t : openai_tools())
    tools.push_back({{"name", t["function"]["name"]},
                     {"description", "a tool"},
                     {"input_schema", t["function"]["parameters"]}});
  OJson b = {{"model", "scripted"}, {"max_tokens", 600},
             {"temperature", 1.0},  {"messages", {{{"role", "user"}, {"content", "Which tool?"}}}},
             {"tools", tools},      {"thinking", {{"type", "disabled"}}}};
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

OJson responses_body(const OJson& extra) {
  OJson tools = OJson::array();
  for (const auto& t : openai_tools())
    tools.push_back({{"type", "function"},
                     {"name", t["function"]["name"]},
                     {"parameters", t["function"]["parameters"]}});
  OJson b = {{"model", "scripted"}, {"max_output_tokens", 600},
             {"temperature", 1.0},  {"input", "Which tool?"},
             {"tools", tools},      {"reasoning", {{"effort", "none"}}}};
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

TEST(ForcedToolCalls, AnthropicAnyAndToolAndResponsesToolChoice) {
  TinyServer t;
  auto c = t.server->client();
  Calls calls;
  struct Case {
    OJson choice;
    std::string want;
    bool one;
  };
  const std::vector<Case> anthropic = {
      {{{"type", "any"}}, "", false},
      {{{"type", "tool"}, {"name", "lookup"}}, "lookup", false},
      {{{"type", "any"}, {"disable_parallel_tool_use", true}}, "", true},
  };
  for (const Case& k : anthropic) {
    for (int seed = 1; seed <= 2; ++seed) {
      // The Messages API has no seed: temperature 1 draws differ from run to run.
      const OJson b = anthropic_body({{"tool_choice", k.choice}});
      const OJson m = post(c, "/v1/messages", b);
      EXPECT_EQ(m["stop_reason"], "tool_use") << dump_safe(m).substr(0, 400);
      int uses = 0;
      for (const auto& block : m["content"]) {
        if (block["type"] != "tool_use") continue;
        ++uses;
        calls.check(block["name"].get<std::string>(), dump_safe(block["input"]), k.want);
      }
      EXPECT_GE(uses, 1) << dump_safe(m).substr(0, 400);
      if (k.one) EXPECT_EQ(uses, 1);
    }
  }
  // Thinking: budget_tokens closes the reasoning, then the forced call.
  OJson think = anthropic_body({{"tool_choice", {{"type", "tool"}, {"name", "weather"}}}});
  think["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  think["max_tokens"] = 1800;
  const OJson tm = post(c, "/v1/messages", think);
  EXPECT_EQ(tm["stop_reason"], "tool_use") << dump_safe(tm).substr(0, 400);
  int think_uses = 0;
  for (const auto& block : tm["content"])
    if (block["type"] == "tool_use") {
      ++think_uses;
      calls.check(block["name"].get<std::string>(), dump_safe(block["input"]), "weather");
    }
  EXPECT_GE(think_uses, 1);
  EXPECT_EQ(tm["content"][0]["type"], "thinking") << dump_safe(tm).substr(0, 400);

  const std::vector<Case> responses = {
      {OJson("required"), "", false},
      {{{"type", "function"}, {"name", "weather"}}, "weather", false},
  };
  for (const Case& k : responses) {
    const OJson r = post(c, "/v1/responses", responses_body({{"tool_choice", k.choice}}));
    int fc = 0;
    for (const auto& item : r["output"]) {
      if (item["type"] != "function_call") continue;
      ++fc;
      calls.check(item["name"].get<std::string>(), item["arguments"].get<std::string>(), k.want);
    }
    EXPECT_GE(fc, 1) << dump_safe(r).substr(0, 400);
    EXPECT_EQ(r["tool_choice"], k.choice);
  }
  calls.judge();
}

TEST(ForcedToolCalls, RefusalsNameToolChoiceAndTheSchema) {
  TinyServer t;
  auto c = t.server->client();
  const OJson nope = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  OJson e = post(c, "/v1/chat/completions", chat_body({{"tool_choice", nope}}), 400);
  EXPECT_EQ(e["error"]["param"], "tool_choice") << dump_safe(e);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("\"nope\""), std::string::npos);
  OJson no_tools = chat_body({{"tool_choice", "required"}});
  no_tools.erase("tools");
  e = post(c, "/v1/chat/completions", no_tools, 400);
  EXPECT_EQ(e["error"]["param"], "tool_choice") << dump_safe(e);
  e = post(c, "/v1/chat/completions", chat_body({{"tool_choice", "sometimes"}}), 400);
  EXPECT_EQ(e["error"]["param"], "tool_choice") << dump_safe(e);
  // A parameters schema the grammar does not support: the keyword and its path.
  OJson bad_schema = chat_body({{"tool_choice", "required"}});
  bad_schema["tools"][1]["function"]["parameters"]["properties"]["id"] = {{"not", OJson::object()}};
  e = post(c, "/v1/chat/completions", bad_schema, 400);
  EXPECT_EQ(e["error"]["param"], "tools[1].function.parameters") << dump_safe(e);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("\"not\" at /properties/id/not"),
            std::string::npos)
      << dump_safe(e);
  OJson strict = chat_body({});
  strict["tools"][0]["function"]["strict"] = "yes";
  e = post(c, "/v1/chat/completions", strict, 400);
  EXPECT_EQ(e["error"]["param"], "tools[0].function.strict") << dump_safe(e);
  e = post(c, "/v1/chat/completions",
           chat_body({{"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}}),
           400);
  EXPECT_EQ(e["error"]["param"], "tool_choice") << dump_safe(e);

  // Anthropic: its own error shape, naming tool_choice.
  e = post(c, "/v1/messages",
           anthropic_body({{"tool_choice", {{"type", "tool"}, {"name", "nope"}}}}), 400);
  EXPECT_EQ(e["type"], "error") << dump_safe(e);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("tool_choice"), std::string::npos);
  OJson a_none = anthropic_body({{"tool_choice", {{"type", "any"}}}});
  a_none.erase("tools");
  e = post(c, "/v1/messages", a_none, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("tool_choice"), std::string::npos)
      << dump_safe(e);

  // Responses.
  e = post(c, "/v1/responses",
           responses_body({{"tool_choice", {{"type", "function"}, {"name", "nope"}}}}), 400);
  EXPECT_EQ(e["error"]["param"], "tool_choice") << dump_safe(e);
  OJson r_none = responses_body({{"tool_choice", "required"}});
  r_none.erase("tools");
  e = post(c, "/v1/responses", r_none, 400);
  EXPECT_EQ(e["error"]["param"], "tool_choice") << dump_safe(e);
}

// What the grammar lets through is what the DSML parser reads back: raw string parameters
// (string="true") with '<' but never "</", a length bound, JSON parameters, the marker only as
// its added token (the private bytes of TokenVocab's placed id, never its text spelled out).
TEST(ForcedToolCalls, TheGrammarsTextIsWhatTheParserReadsBack) {
  auto tok = tiny_tokenizer();
  ServedModel model = parser_model();
  const int32_t dsml = tok->token_id(tokens::kDsml);
  ASSERT_GE(dsml, 0);
  ASSERT_TRUE(tok->is_added(dsml));
  auto vocab = model.grammars->tool_vocab(*tok);
  ASSERT_TRUE(vocab.is_ok());
  const std::string placed = (*vocab)->placed_bytes(dsml);
  ASSERT_EQ(placed.size(), 2u);
  const char* params = R"({"type":"object","properties":{"note":{"type":"string"},
    "tag":{"type":"string","maxLength":3},"n":{"type":"integer"}},"required":["note","n"]})";
  OJson tools = OJson::array();
  tools.push_back({{"type", "function"},
                   {"function", {{"name", "t"}, {"parameters", *parse_json_ordered(params)}}}});
  tools.push_back(openai_tools()[2]);  // ping, not forced here
  const OJson body = {{"model", "m"},
                      {"messages", {{{"role", "user"}, {"content", "q"}}}},
                      {"tools", tools},
                      {"tool_choice", {{"type", "function"}, {"function", {{"name", "t"}}}}},
                      {"chat_template_kwargs", {{"thinking", false}}}};
  GenerationJob job;
  ASSERT_FALSE(parse_chat_completion_request(body, model, *tok, job).has_value());
  ASSERT_NE(job.request.constraint, nullptr);
  EXPECT_FALSE(job.request.constraint_after_reasoning);
  EXPECT_TRUE(job.extract_tools);
  auto text = [](const std::string& m, const std::string& note, const std::string& tag) {
    std::string p =
        "<" + m + " parameter name=\"note\" string=\"true\">" + note + "</" + m + " parameter>\n";
    if (!tag.empty())
      p += "<" + m + " parameter name=\"tag\" string=\"true\">" + tag + "</" + m + " parameter>\n";
    p += "<" + m + " parameter name=\"n\" string=\"false\">-12</" + m + " parameter>";
    return "\n\n<" + m + " calls>\n<" + m + " invoke name=\"t\">\n" + p + "\n</" + m +
           " invoke>\n</" + m + " calls>";
  };
  auto accepted = [&](const std::string& t) {
    Matcher m(job.request.constraint);
    return m.accept_bytes(t) && m.is_complete();
  };
  EXPECT_TRUE(accepted(text(placed, "a<b <<", "xy")));
  EXPECT_TRUE(accepted(text(placed, "", "")));
  EXPECT_FALSE(accepted(text(placed, "a</b", "")));       // the closing tag could begin there
  EXPECT_FALSE(accepted(text(placed, "ok", "abcd")));     // maxLength 3
  EXPECT_FALSE(accepted(text(placed, "ok", "a<")));       // bounded: no '<'
  EXPECT_FALSE(accepted(text(tokens::kDsml, "ok", "")));  // the marker spelled by bytes
  const std::string good = text(tokens::kDsml, "a<b <<", "xy");
  const ParsedAssistant parsed = parse_assistant_text(good, false);
  ASSERT_EQ(parsed.tool_calls.size(), 1u) << good;
  EXPECT_EQ(parsed.tool_calls[0].name, "t");
  EXPECT_EQ(parsed.content, "");
  const std::string args = parsed.tool_calls[0].arguments_json();
  EXPECT_EQ(args, R"({"note": "a<b <<", "tag": "xy", "n": -12})");
  EXPECT_EQ(dsv41::testing::json_text_check(json::parse(params), args), "");
}

// The real clients: `openai` (chat completions and Responses) and `@anthropic-ai/sdk`, calls
// judged by ajv.
TEST(ForcedToolCalls, OfficialClientsGetValidForcedCalls) {
  if (run_command("node --version").first != 0) GTEST_SKIP() << "node is not installed";
  TinyServer t;
  expect_node_client_passes(t.server->port, "scripted", "basic", "forced_tools_test.mjs");
  expect_node_client_passes(t.server->port, "scripted", "basic", "anthropic_forced_tools_test.mjs");
}

}  // namespace
}  // namespace dsv41::forced_tools_test
