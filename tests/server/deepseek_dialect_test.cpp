// DeepSeek's own API dialect and the request features agents rely on (issue 36): one effort table
// for the three APIs, DeepSeek's thinking switch, the reasoning cap (per request and the server's),
// usage with the cache and the reasoning, chat prefix completion and the /beta paths, FIM
// completion, vLLM's sampling and output fields, parallel_tool_calls false, and the policy that a
// documented field is honoured or refused naming it. Scripted models here; the official clients
// (tests/js/deepseek_dialect_test.mjs) on the real binary serving the demo model, and on the
// scripted servers where the demo model cannot show a case (no FIM tokens, two tool calls).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <optional>

#include "server/anthropic_api.h"
#include "server/generation_defaults.h"
#include "server/request_fields.h"
#include "server/responses_api.h"
#include "server_harness.h"

namespace dsv41 {
namespace {

using namespace server_testing;

OJson dialect_json(const std::string& text) {
  auto j = parse_json_ordered(text);
  EXPECT_TRUE(j.is_ok()) << text.substr(0, 300);
  return j.is_ok() ? *j : OJson();
}

OJson dialect_post(httplib::Client& c, const std::string& path, const std::string& body,
                   int want = 200) {
  auto r = c.Post(path, body, "application/json");
  EXPECT_TRUE(r) << path;
  if (!r) return OJson();
  EXPECT_EQ(r->status, want) << path << " " << body.substr(0, 200) << " -> " << r->body;
  return dialect_json(r->body);
}

// An engine over a scripted model answering `text` (then EOS) with tokenizer `tok`.
std::unique_ptr<Engine> dialect_engine(std::unique_ptr<Tokenizer> tok, const std::string& text) {
  auto backend = std::make_unique<ScriptBackend>(*tok, tok->encode(text), 0);
  auto e = Engine::create(std::move(backend), std::move(tok), EngineOptions{});
  EXPECT_TRUE(e.is_ok());
  return std::move(*e);
}

// The tiny tokenizer with DeepSeek's three FIM tokens added (the tiny one has none).
std::unique_ptr<Tokenizer> fim_tokenizer() {
  auto j = nlohmann::ordered_json::parse(make_tiny_tokenizer().tokenizer_json);
  int64_t next = 0;
  for (const auto& a : j["added_tokens"])
    next = std::max<int64_t>(next, a["id"].get<int64_t>() + 1);
  next = std::max<int64_t>(next, int64_t(j["model"]["vocab"].size()));
  for (const char* t : {tokens::kFimHole, tokens::kFimBegin, tokens::kFimEnd})
    j["added_tokens"].push_back({{"id", next++},
                                 {"content", t},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", false}});
  auto tok = Tokenizer::from_json(j.dump(), "tiny+fim");
  EXPECT_TRUE(tok.is_ok()) << tok.status().message();
  return std::move(*tok);
}

std::string effort_line(int n) {
  return fmt::format("Reasoning Effort: {} (range", n);
}

// Every name of DeepSeek's set (and integers 1-100) maps to the one number of docs/chat.md in all
// three APIs and in chat_template_kwargs: checked on the rendered prompts (/tokenize for chat).
TEST(DeepSeekDialect, EffortNamesMapTheSameInEveryApi) {
  const auto tok = tiny_tokenizer();
  InProcess s;
  auto c = s.client();
  std::vector<std::pair<OJson, int>> efforts;
  for (const EffortName& e : effort_names()) efforts.push_back({OJson(e.name), e.value});
  for (int n : {1, 77, 100}) efforts.push_back({OJson(n), n});
  ASSERT_EQ(efforts.size(), 10u);
  const std::map<std::string, int> expected = {{"minimal", 25}, {"low", 25},   {"medium", 50},
                                               {"high", 50},    {"xhigh", 50}, {"max", 100},
                                               {"ultra", 100}};
  for (const auto& [name, value] : expected) {
    bool found = false;
    for (const EffortName& e : effort_names()) found |= e.name == name && e.value == value;
    EXPECT_TRUE(found) << name;
  }
  const ServedModel model = parser_model();
  for (const auto& [effort, n] : efforts) {
    const std::string shown = effort.dump();
    OJson chat = {{"messages", {{{"role", "user"}, {"content", "q"}}}},
                  {"reasoning_effort", effort}};
    const OJson ids = dialect_post(c, "/tokenize", dump_safe(chat))["tokens"];
    EXPECT_NE(tok->decode(ids.get<std::vector<int32_t>>())->find(effort_line(n)), std::string::npos)
        << "chat " << shown;
    chat.erase("reasoning_effort");
    chat["chat_template_kwargs"] = {{"reasoning_effort", effort}};
    EXPECT_EQ(dialect_post(c, "/tokenize", dump_safe(chat))["tokens"], ids)
        << "chat_template_kwargs " << shown;
    GenerationJob a;
    const OJson anthropic = {{"model", "m"},
                             {"max_tokens", 10},
                             {"messages", {{{"role", "user"}, {"content", "q"}}}},
                             {"output_config", {{"effort", effort}}}};
    ASSERT_FALSE(parse_messages_request(anthropic, model, *tok, false, a).has_value()) << shown;
    EXPECT_NE(tok->decode(a.request.prompt)->find(effort_line(n)), std::string::npos)
        << "Messages " << shown;
    GenerationJob r;
    const OJson responses = {{"model", "m"}, {"input", "q"}, {"reasoning", {{"effort", effort}}}};
    ASSERT_FALSE(parse_responses_request(responses, model, *tok, r).has_value()) << shown;
    EXPECT_EQ(r.request.prompt, a.request.prompt) << "Responses " << shown;
    EXPECT_EQ(r.request.prompt, ids.get<std::vector<int32_t>>()) << shown;
  }
  // Defaults, as DeepSeek's API: thinking on at high (50), in every API.
  GenerationJob a, r;
  ASSERT_FALSE(parse_messages_request(dialect_json(R"({"model":"m","max_tokens":9,
      "messages":[{"role":"user","content":"q"}]})"),
                                      model, *tok, false, a));
  ASSERT_FALSE(
      parse_responses_request(dialect_json(R"({"model":"m","input":"q"})"), model, *tok, r));
  const OJson ids =
      dialect_post(c, "/tokenize", R"({"messages":[{"role":"user","content":"q"}]})")["tokens"];
  EXPECT_EQ(a.request.prompt, ids.get<std::vector<int32_t>>());
  EXPECT_EQ(r.request.prompt, a.request.prompt);
  EXPECT_NE(tok->decode(a.request.prompt)->find(effort_line(50)), std::string::npos);
  EXPECT_TRUE(a.thinking && r.thinking);
  // Thinking off: DeepSeek's switch (chat, Messages), Responses' none: the same chat-mode prompt.
  GenerationJob a_off, r_off;
  ASSERT_FALSE(parse_messages_request(dialect_json(R"({"model":"m","max_tokens":9,
      "messages":[{"role":"user","content":"q"}],"thinking":{"type":"disabled"}})"),
                                      model, *tok, false, a_off));
  ASSERT_FALSE(parse_responses_request(
      dialect_json(R"({"model":"m","input":"q","reasoning":{"effort":"none"}})"), model, *tok,
      r_off));
  const OJson off = dialect_post(
      c, "/tokenize",
      R"({"messages":[{"role":"user","content":"q"}],"thinking":{"type":"disabled"}})")["tokens"];
  EXPECT_EQ(a_off.request.prompt, off.get<std::vector<int32_t>>());
  EXPECT_EQ(r_off.request.prompt, a_off.request.prompt);
  EXPECT_EQ(*tok->decode(a_off.request.prompt),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>");
  EXPECT_FALSE(a_off.thinking || r_off.thinking);
}

// DeepSeek's switch through chat completions: thinking disabled answers in content, with no
// reasoning_content.
TEST(DeepSeekDialect, ThinkingDisabledAnswersInContent) {
  InProcess s;
  auto c = s.client();
  const OJson on = dialect_post(
      c, "/v1/chat/completions",
      R"({"model":"scripted","messages":[{"role":"user","content":"q"}],"max_tokens":6})");
  EXPECT_FALSE(on["choices"][0]["message"]["reasoning_content"].get<std::string>().empty());
  EXPECT_EQ(on["choices"][0]["message"]["content"], "");
  const OJson off = dialect_post(c, "/v1/chat/completions",
                                 R"({"model":"scripted","messages":[{"role":"user","content":"q"}],
      "max_tokens":6,"thinking":{"type":"disabled"}})");
  EXPECT_TRUE(off["choices"][0]["message"]["reasoning_content"].is_null()) << dump_safe(off);
  // The same six tokens of the script, now the answer.
  EXPECT_EQ(off["choices"][0]["message"]["content"],
            on["choices"][0]["message"]["reasoning_content"]);
  EXPECT_EQ(off["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);
}

// The reasoning cap on a model that never closes its reasoning: the engine ends it itself at the
// budget, counting its </think>, and the answer follows in the same request; the server's cap
// bounds every request (a request may only lower it) and every API.
TEST(DeepSeekDialect, ReasoningBudgetEndsTheReasoningAndTheAnswerFollows) {
  const std::string endless =
      "the one and two is that it was for on are as with he they at be this have from or";
  InProcess s(dialect_engine(tiny_tokenizer(), endless),
              [](ServerOptions& o) { o.reasoning_budget = 8; });
  auto c = s.client();
  const std::string q = R"({"model":"scripted","messages":[{"role":"user","content":"q"}],)";
  for (const auto& [asked, cap] :
       std::vector<std::pair<int, int>>{{5, 5}, {1, 1}, {20, 8}, {-1, 8}}) {
    const std::string budget =
        asked >= 0 ? fmt::format(R"("thinking_token_budget":{},)", asked) : std::string();
    for (bool stream : {false, true}) {
      std::string body = q + budget + R"("max_tokens":14)";
      if (stream) body += R"(,"stream":true,"stream_options":{"include_usage":true})";
      auto r = c.Post("/v1/chat/completions", body + "}", "application/json");
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      std::string reasoning, content;
      OJson usage;
      if (!stream) {
        const OJson j = dialect_json(r->body);
        reasoning = j["choices"][0]["message"]["reasoning_content"];
        content = j["choices"][0]["message"]["content"];
        usage = j["usage"];
      } else {
        std::size_t at = 0;
        while ((at = r->body.find("data: {", at)) != std::string::npos) {
          const std::size_t end = r->body.find("\n\n", at);
          const OJson j = dialect_json(r->body.substr(at + 6, end - at - 6));
          at = end;
          if (j.contains("usage") && !j["usage"].is_null()) usage = j["usage"];
          if (j["choices"].empty()) continue;
          const OJson& d = j["choices"][0]["delta"];
          if (d.contains("reasoning_content"))
            reasoning += d["reasoning_content"].get<std::string>();
          if (d.contains("content")) content += d["content"].get<std::string>();
        }
      }
      const int64_t n = usage["completion_tokens_details"]["reasoning_tokens"];
      EXPECT_EQ(n, cap) << body;  // this model would never end it
      EXPECT_EQ(int64_t(tiny_tokenizer()->encode(reasoning).size()) + 1, n) << reasoning;
      EXPECT_FALSE(content.empty()) << body;
      EXPECT_EQ(usage["completion_tokens"], 14);
    }
  }
  // Messages' budget_tokens caps too (parsed), and the server's cap applies to Messages and
  // Responses.
  GenerationJob a;
  ASSERT_FALSE(parse_messages_request(dialect_json(R"({"model":"m","max_tokens":5000,
      "messages":[{"role":"user","content":"q"}],"thinking":{"type":"enabled","budget_tokens":2048}})"),
                                      parser_model(), *tiny_tokenizer(), false, a));
  EXPECT_EQ(a.request.sampling.thinking_token_budget, 2048);
  const OJson m = dialect_post(c, "/v1/messages", R"({"model":"scripted","max_tokens":14,
      "messages":[{"role":"user","content":"q"}]})");
  ASSERT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(tiny_tokenizer()->encode(m["content"][0]["thinking"].get<std::string>()).size(), 7u);
  EXPECT_EQ(m["content"][1]["type"], "text");
  const OJson rs = dialect_post(c, "/v1/responses", R"({"model":"scripted","input":"q",
      "max_output_tokens":14})");
  EXPECT_EQ(rs["usage"]["output_tokens_details"]["reasoning_tokens"], 8);
}

// OpenAI's usage details and DeepSeek's cache fields, non-streamed and in the streamed usage
// chunk, from the engine's counts.
TEST(DeepSeekDialect, UsageShowsTheCacheAndTheReasoning) {
  const auto tok = tiny_tokenizer();
  GenerationJob job = reasoning_tools_job();
  job.request.prompt.assign(30, 5);
  auto api = openai_chat_api();
  RequestOutput done = whole_output(kScriptText);
  done.prompt_tokens = 30;
  done.cached_prompt_tokens = 16;
  const std::vector<int32_t> ids = tok->encode(kScriptText);
  for (int32_t id : ids) done.tokens.push_back({id});
  done.completion_tokens = int64_t(ids.size());
  const int64_t reasoning = int64_t(tok->encode("I should call the tool.").size()) + 1;
  const OJson body = whole_body(*api, job, *tok, done);
  EXPECT_EQ(dump_safe(body["usage"]),
            fmt::format(R"({{"prompt_tokens":30,"completion_tokens":{0},"total_tokens":{1},)"
                        R"("prompt_tokens_details":{{"cached_tokens":16}},)"
                        R"("completion_tokens_details":{{"reasoning_tokens":{2}}},)"
                        R"("prompt_cache_hit_tokens":16,"prompt_cache_miss_tokens":14}})",
                        ids.size(), 30 + ids.size(), reasoning));
  job.stream = job.include_usage = true;
  auto w = api->writer(job, *tok, "x", 0);
  w->stream_begin();
  w->stream_output(0, done);
  const std::vector<std::string> end = w->stream_end();
  ASSERT_EQ(end.size(), 2u);
  EXPECT_EQ(dialect_json(end[0].substr(6))["usage"], body["usage"]);

  // Through the server: completions too (no reasoning there).
  InProcess s;
  auto c = s.client();
  const OJson cm =
      dialect_post(c, "/v1/completions", R"({"model":"scripted","prompt":"hi","max_tokens":3})");
  EXPECT_EQ(cm["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(cm["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);
  EXPECT_EQ(cm["usage"]["prompt_cache_miss_tokens"], cm["usage"]["prompt_tokens"]);
}

// DeepSeek's chat prefix completion on its beta path: the final assistant message is continued
// (its text ends the prompt, no end of turn), as /tokenize renders it.
TEST(DeepSeekDialect, PrefixCompletionOnTheBetaPath) {
  InProcess s;
  auto c = s.client();
  const std::string msgs = R"("messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":"Let me","prefix":true}],"thinking":{"type":"disabled"})";
  const OJson r =
      dialect_post(c, "/beta/chat/completions",
                   R"({"model":"scripted","max_tokens":3,"return_token_ids":true,)" + msgs + "}");
  const OJson t = dialect_post(c, "/tokenize", "{" + msgs + "}");
  EXPECT_EQ(r["prompt_token_ids"], t["tokens"]);
  const auto tok = tiny_tokenizer();
  EXPECT_EQ(*tok->decode(t["tokens"].get<std::vector<int32_t>>()),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>Let me");
  EXPECT_EQ(r["choices"][0]["token_ids"].size(), 3u);
  EXPECT_TRUE(r["choices"][0]["message"]["reasoning_content"].is_null());
  const OJson b =
      dialect_post(c, "/beta/completions", R"({"model":"scripted","prompt":"hi","max_tokens":2})");
  EXPECT_EQ(b["object"], "text_completion");
}

// FIM: prompt and suffix around DeepSeek's FIM tokens (return_token_ids shows them), streamed or
// not; a tokenizer without them is a 400 naming the missing token.
TEST(DeepSeekDialect, FimCompletionPutsTheFimTokensAroundPromptAndSuffix) {
  auto tok = fim_tokenizer();
  std::vector<int32_t> want = {tok->token_id(tokens::kBos), tok->token_id(tokens::kFimBegin)};
  for (int32_t id : tok->encode("def f(x):\n    ")) want.push_back(id);
  want.push_back(tok->token_id(tokens::kFimHole));
  for (int32_t id : tok->encode("\n    return y")) want.push_back(id);
  want.push_back(tok->token_id(tokens::kFimEnd));
  InProcess s(dialect_engine(std::move(tok), "y = x"));
  auto c = s.client();
  const std::string body =
      R"({"model":"scripted","prompt":"def f(x):\n    ","suffix":"\n    return y","max_tokens":4,)"
      R"("return_token_ids":true)";
  const OJson r = dialect_post(c, "/beta/completions", body + "}");
  EXPECT_EQ(r["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(), want);
  EXPECT_EQ(r["usage"]["prompt_tokens"], want.size());
  auto st = c.Post("/v1/completions", body + R"(,"stream":true})", "application/json");
  ASSERT_TRUE(st);
  const std::size_t first = st->body.find("data: {");
  ASSERT_NE(first, std::string::npos);
  const OJson chunk =
      dialect_json(st->body.substr(first + 6, st->body.find("\n\n", first) - first - 6));
  EXPECT_EQ(chunk["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(), want);
  dialect_post(c, "/v1/completions",
               R"({"model":"scripted","prompt":[5,6],"suffix":"x","max_tokens":2})", 400);
  InProcess plain;  // the tiny tokenizer has no FIM tokens
  auto pc = plain.client();
  const OJson e =
      dialect_post(pc, "/v1/completions",
                   R"({"model":"scripted","prompt":"a","suffix":"b","max_tokens":2})", 400);
  EXPECT_EQ(e["error"]["param"], "suffix");
  EXPECT_NE(e["error"]["message"].get<std::string>().find(tokens::kFimBegin), std::string::npos);
  // The same 400 through the official client (FIM's success: OfficialClientsOnTheDemoModel).
  expect_node_client_passes(plain.port, "scripted", "fim-missing", "deepseek_dialect_test.mjs");
}

// vLLM's output fields: include_stop_str_in_output, skip_special_tokens, truncate_prompt_tokens,
// min_tokens, bad_words; a documented field this server does not implement is a 400 naming it,
// and its no-op value is accepted.
TEST(DeepSeekDialect, VllmOutputFieldsAreHonoured) {
  InProcess s(dialect_engine(tiny_tokenizer(), "the one<｜action｜>and two"));
  auto c = s.client();
  const std::string q =
      R"({"model":"scripted","messages":[{"role":"user","content":"q"}],"thinking":{"type":"disabled"},)";
  auto content = [&](const std::string& extra) {
    return dialect_post(c, "/v1/chat/completions",
                        q + extra + "}")["choices"][0]["message"]["content"]
        .get<std::string>();
  };
  EXPECT_EQ(content(R"("max_tokens":10)"), "the oneand two");
  EXPECT_EQ(content(R"("max_tokens":10,"skip_special_tokens":false)"),
            "the one<｜action｜>and two");
  EXPECT_EQ(content(R"("max_tokens":10,"stop":["and"])"), "the one");
  EXPECT_EQ(content(R"("max_tokens":10,"stop":["and"],"include_stop_str_in_output":true)"),
            "the oneand");
  const std::string banned = content(R"("max_tokens":10,"bad_words":["two"])");
  EXPECT_EQ(banned.find("two"), std::string::npos) << banned;
  EXPECT_EQ(banned.rfind("the oneand", 0), 0u) << banned;
  const OJson plain = dialect_post(c, "/v1/chat/completions", q + R"("max_tokens":30})");
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "stop");
  const int64_t natural = plain["usage"]["completion_tokens"];
  const OJson longer =
      dialect_post(c, "/v1/chat/completions", q + R"("max_tokens":30,"min_tokens":25})");
  EXPECT_GE(longer["usage"]["completion_tokens"].get<int64_t>(), 25);
  EXPECT_LT(natural, 25);
  const OJson whole = dialect_post(
      c, "/v1/completions",
      R"({"model":"scripted","prompt":"the one and two","max_tokens":2,"return_token_ids":true})");
  const OJson cut = dialect_post(c, "/v1/completions",
                                 R"({"model":"scripted","prompt":"the one and two","max_tokens":2,)"
                                 R"("return_token_ids":true,"truncate_prompt_tokens":2})");
  const auto all = whole["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>();
  ASSERT_GT(all.size(), 2u);
  EXPECT_EQ(cut["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(all.end() - 2, all.end()));
  EXPECT_EQ(cut["usage"]["prompt_tokens"], 2);
  for (const auto& [field, param] : std::vector<std::pair<std::string, std::string>>{
           {R"("use_beam_search":true)", "use_beam_search"},
           {R"("guided_json":{"type":"object"})", "guided_json"},
           {R"("chat_template":"x")", "chat_template"},
           {R"("min_tokens":40,"max_tokens":30)", "min_tokens"},
           {R"("add_special_tokens":true)", "add_special_tokens"},
           {R"("request_id":"")", "request_id"},
           {R"("request_id":"a b")", "request_id"},
           {R"("request_id":7)", "request_id"}}) {
    const OJson e = dialect_post(c, "/v1/chat/completions", q + field + "}", 400);
    EXPECT_EQ(e["error"]["param"], param) << field;
  }
  const OJson e = dialect_post(
      c, "/v1/completions",
      R"({"model":"scripted","prompt":"the one","max_tokens":2,"add_special_tokens":true})", 400);
  EXPECT_EQ(e["error"]["param"], "add_special_tokens");
  dialect_post(c, "/v1/chat/completions",
               q + R"("max_tokens":2,"use_beam_search":false,"length_penalty":1.0,"priority":0,)"
                   R"("add_special_tokens":false})");
  // request_id (vLLM's): the caller's id is the response's id and its X-Request-Id, streamed too.
  for (const auto& [path, body, want] : std::vector<std::array<std::string, 3>>{
           {"/v1/chat/completions", q + R"("max_tokens":2,"request_id":"job-7.a")",
            "chatcmpl-job-7.a"},
           {"/v1/completions",
            R"({"model":"scripted","prompt":"the one","max_tokens":2,"request_id":"job-7.a")",
            "cmpl-job-7.a"}}) {
    auto r = c.Post(path, body + "}", "application/json");
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("X-Request-Id"), "job-7.a") << path;
    EXPECT_EQ(dialect_json(r->body)["id"], want) << path;
    auto st = c.Post(path, body + R"(,"stream":true})", "application/json");
    ASSERT_TRUE(st) << path;
    const auto chunks = sse_payloads(st->body);
    ASSERT_FALSE(chunks.empty()) << path;
    for (const OJson& p : chunks) EXPECT_EQ(p["id"], want) << path;
  }
}

// parallel_tool_calls: false (Anthropic: tool_choice.disable_parallel_tool_use) returns the first
// of several calls only, streamed or not, in all three APIs.
TEST(DeepSeekDialect, ParallelToolCallsFalseKeepsOneCall) {
  std::vector<ChatToolCall> calls = {{"1", "get_weather", OJson{{"city", "Paris"}}},
                                     {"2", "get_weather", OJson{{"city", "Lyon"}}}};
  InProcess s(dialect_engine(tiny_tokenizer(), "\n\n" + encode_tool_calls_dsml(calls)));
  auto c = s.client();
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])";
  const std::string q = R"({"model":"scripted","messages":[{"role":"user","content":"q"}],)"
                        R"("thinking":{"type":"disabled"},"max_tokens":200,)" +
                        tools;
  EXPECT_EQ(dialect_post(c, "/v1/chat/completions", q + "}")["choices"][0]["message"]["tool_calls"]
                .size(),
            2u);
  const OJson one = dialect_post(c, "/v1/chat/completions", q + R"(,"parallel_tool_calls":false})");
  ASSERT_EQ(one["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(one["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            R"({"city": "Paris"})");
  auto st = c.Post("/v1/chat/completions", q + R"(,"parallel_tool_calls":false,"stream":true})",
                   "application/json");
  ASSERT_TRUE(st);
  // Streamed: one call opens (id, type, name), every argument piece is that call's, and they
  // concatenate to the first call's arguments; nothing of the second call goes out.
  int opened = 0;
  std::string arguments, finish;
  for (const OJson& p : sse_payloads(st->body)) {
    if (p["choices"].empty()) continue;
    const OJson& choice = p["choices"][0];
    if (choice["finish_reason"].is_string()) finish = choice["finish_reason"];
    if (!choice["delta"].contains("tool_calls")) continue;
    for (const OJson& call : choice["delta"]["tool_calls"]) {
      EXPECT_EQ(call["index"], 0) << st->body;
      opened += call.contains("id");
      arguments += call["function"].value("arguments", "");
    }
  }
  EXPECT_EQ(opened, 1) << st->body;
  EXPECT_EQ(arguments, R"({"city": "Paris"})");
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(st->body.find("Lyon"), std::string::npos) << st->body;
  const OJson r = dialect_post(c, "/v1/responses", R"({"model":"scripted","input":"q",
      "reasoning":{"effort":"none"},"parallel_tool_calls":false,"tools":[{"type":"function",
      "name":"get_weather","parameters":{"type":"object"}}]})");
  ASSERT_EQ(r["output"].size(), 1u);
  EXPECT_EQ(r["output"][0]["type"], "function_call");
  const OJson m = dialect_post(c, "/v1/messages", R"({"model":"scripted","max_tokens":200,
      "messages":[{"role":"user","content":"q"}],"thinking":{"type":"disabled"},
      "tool_choice":{"type":"auto","disable_parallel_tool_use":true},
      "tools":[{"name":"get_weather","input_schema":{"type":"object"}}]})");
  ASSERT_EQ(m["content"].size(), 1u);
  EXPECT_EQ(m["content"][0]["type"], "tool_use");
  // The official clients: two calls without the field, the first only with it (the demo model
  // writes no tool calls, so this runs on the scripted one).
  expect_node_client_passes(s.port, "scripted", "parallel", "deepseek_dialect_test.mjs");
}

// Claude Code's first system block "x-anthropic-billing-header: ..." changes on every request: it
// is left out of the prompt, so two requests that differ only there share their whole prompt.
TEST(DeepSeekDialect, BillingHeaderBlocksAreLeftOutOfThePrompt) {
  const auto tok = tiny_tokenizer();
  auto prompt = [&](const std::string& system) {
    GenerationJob job;
    const std::string body =
        R"({"model":"m","max_tokens":9,"messages":[{"role":"user","content":"q"}])" +
        (system.empty() ? std::string() : R"(,"system":)" + system) + "}";
    EXPECT_FALSE(parse_messages_request(dialect_json(body), parser_model(), *tok, false, job));
    return job.request.prompt;
  };
  const std::string bill =
      R"({"type":"text","text":"x-anthropic-billing-header: cc_version=2.1; cch=)";
  const auto plain = prompt(R"("Be exact.")");
  EXPECT_EQ(prompt("[" + bill + R"(a1"},{"type":"text","text":"Be exact."}])"), plain);
  EXPECT_EQ(prompt("[" + bill + R"(b2"},{"type":"text","text":"Be exact."}])"), plain);
  EXPECT_EQ(prompt("[" + bill + R"(c3"}])"), prompt(""));
  EXPECT_NE(prompt(R"([{"type":"text","text":"x-other: 1"},{"type":"text","text":"Be exact."}])"),
            plain);
}

// --served-model-name with several names (requests may name any, responses report the first) and
// --default-chat-template-kwargs (under the request's own kwargs; /tokenize renders the same).
TEST(DeepSeekDialect, ServedModelNamesAndDefaultChatTemplateKwargs) {
  InProcess s(dialect_engine(tiny_tokenizer(), "the one and two"), [](ServerOptions& o) {
    o.model_aliases = {"deepseek-chat", "deepseek-v4-flash"};
    o.default_chat_template_kwargs = {{"thinking", false}};
    o.reasoning_budget = 5;
  });
  auto c = s.client();
  std::string answer;
  for (const char* name : {"scripted", "deepseek-chat", "deepseek-v4-flash"}) {
    const OJson r = dialect_post(c, "/v1/chat/completions",
                                 fmt::format(R"({{"model":"{}","max_tokens":3,)"
                                             R"("messages":[{{"role":"user","content":"q"}}]}})",
                                             name));
    EXPECT_EQ(r["model"], "scripted") << name;
    // Thinking off by the server's default kwargs: the answer is content.
    const std::string content = r["choices"][0]["message"]["content"];
    EXPECT_TRUE(r["choices"][0]["message"]["reasoning_content"].is_null()) << name;
    EXPECT_FALSE(content.empty()) << name;
    if (answer.empty()) answer = content;
    EXPECT_EQ(content, answer) << name;
  }
  dialect_post(c, "/v1/chat/completions",
               R"({"model":"gpt-4","max_tokens":3,"messages":[{"role":"user","content":"q"}]})",
               404);
  auto got = c.Get("/v1/models/deepseek-chat");
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  // Every server-wide default is visible in /v1/models (issue 36 item 8).
  auto listed = c.Get("/v1/models");
  ASSERT_TRUE(listed);
  for (const OJson& m : {dialect_json(listed->body)["data"][0], dialect_json(got->body)}) {
    EXPECT_EQ(m["id"], "scripted");
    EXPECT_EQ(m["aliases"], dialect_json(R"(["deepseek-chat","deepseek-v4-flash"])"));
    EXPECT_EQ(m["default_chat_template_kwargs"], dialect_json(R"({"thinking":false})"));
    EXPECT_EQ(m["reasoning_budget"], 5);
  }
  const OJson own = dialect_post(c, "/v1/chat/completions",
                                 R"({"model":"scripted","max_tokens":3,"messages":[{"role":"user",)"
                                 R"("content":"q"}],"chat_template_kwargs":{"thinking":true}})");
  EXPECT_EQ(own["choices"][0]["message"]["reasoning_content"], answer);
  const auto tok = tiny_tokenizer();
  const OJson t = dialect_post(c, "/tokenize", R"({"messages":[{"role":"user","content":"q"}]})");
  EXPECT_EQ(*tok->decode(t["tokens"].get<std::vector<int32_t>>()),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>");
}

// --generation-config auto|none and --override-generation-config (vLLM's): the keys vLLM reads
// from generation_config.json, the override key by key, errors naming the file or the flag.
TEST(DeepSeekDialect, GenerationConfigDefaultsLoadAndOverride) {
  dsv41::testing::TempDir dir;
  const std::string file = dir.path() + "/generation_config.json";
  std::ofstream(file) << R"({"bos_token_id": 0, "do_sample": true, "temperature": 0.6,
      "top_p": 0.95, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 7,
      "transformers_version": "4.46"})";
  auto d = load_sampling_defaults(dir.path(), "auto", "");
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(d->to_json(), dialect_json(R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20,
      "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 7})"));
  auto none = load_sampling_defaults(dir.path(), "none", "");
  ASSERT_TRUE(none.is_ok());
  EXPECT_TRUE(none->empty());
  auto over = load_sampling_defaults(dir.path(), "auto", R"({"temperature": 0.2, "top_k": -1})");
  ASSERT_TRUE(over.is_ok());
  EXPECT_EQ(*over->temperature, 0.2);
  EXPECT_EQ(*over->top_k, -1);
  EXPECT_EQ(*over->top_p, 0.95);  // the file's, where the override says nothing
  auto only_over = load_sampling_defaults(dir.path(), "none", R"({"top_p": 0.5})");
  ASSERT_TRUE(only_over.is_ok());
  EXPECT_EQ(only_over->to_json(), dialect_json(R"({"top_p": 0.5})"));
  auto no_file = load_sampling_defaults(dir.path() + "/absent", "auto", "");
  ASSERT_TRUE(no_file.is_ok());
  EXPECT_TRUE(no_file->empty());
  // Malformed: the message names the file or the flag (and the key).
  auto expect_error = [](const Result<SamplingDefaults>& r, const std::string& names) {
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find(names), std::string::npos) << r.status().message();
  };
  std::ofstream(file) << "{\"temperature\": ";
  expect_error(load_sampling_defaults(dir.path(), "auto", ""), "generation_config.json");
  std::ofstream(file) << R"({"temperature": "hot"})";
  expect_error(load_sampling_defaults(dir.path(), "auto", ""), "temperature");
  std::ofstream(file) << R"({"top_p": 0})";
  expect_error(load_sampling_defaults(dir.path(), "auto", ""), "top_p");
  std::ofstream(file) << "[]";
  expect_error(load_sampling_defaults(dir.path(), "auto", ""), "generation_config.json");
  EXPECT_TRUE(load_sampling_defaults(dir.path(), "none", "").is_ok());  // none never reads it
  expect_error(load_sampling_defaults(dir.path(), "none", "{bad"), "--override-generation-config");
  expect_error(load_sampling_defaults(dir.path(), "none", R"({"temprature": 1})"), "temprature");
  expect_error(load_sampling_defaults(dir.path(), "none", R"({"max_new_tokens": 1.5})"),
               "max_new_tokens");
}

// The defaults are what a request's sampling starts from in every API, its own fields win, and
// /v1/models shows them; max_new_tokens is the default max_tokens.
TEST(DeepSeekDialect, GenerationConfigDefaultsApplyUnlessTheRequestSetsTheField) {
  SamplingDefaults d;
  d.temperature = 0.25;
  d.top_p = 0.5;
  d.top_k = 7;
  d.min_p = 0.1;
  d.repetition_penalty = 1.2;
  d.max_new_tokens = 3;
  ServedModel model = parser_model();
  model.sampling_defaults = d;
  const auto tok = tiny_tokenizer();
  GenerationJob chat;
  ASSERT_FALSE(parse_chat_completion_request(
      dialect_json(R"({"model":"m","messages":[{"role":"user","content":"q"}]})"), model, *tok,
      chat));
  const SamplingParams& s = chat.request.sampling;
  EXPECT_EQ(s.temperature, 0.25);
  EXPECT_EQ(s.top_p, 0.5);
  EXPECT_EQ(s.top_k, 7);
  EXPECT_EQ(s.min_p, 0.1);
  EXPECT_EQ(s.repetition_penalty, 1.2);
  GenerationJob own;
  ASSERT_FALSE(parse_chat_completion_request(
      dialect_json(R"({"model":"m","messages":[{"role":"user","content":"q"}],"temperature":0,
          "top_p":1,"top_k":-1,"min_p":0,"repetition_penalty":1})"),
      model, *tok, own));
  EXPECT_EQ(own.request.sampling.temperature, 0);
  EXPECT_EQ(own.request.sampling.top_p, 1);
  EXPECT_EQ(own.request.sampling.top_k, -1);
  EXPECT_EQ(own.request.sampling.min_p, 0);
  EXPECT_EQ(own.request.sampling.repetition_penalty, 1);
  GenerationJob msg;
  ASSERT_FALSE(parse_messages_request(
      dialect_json(R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"}]})"),
      model, *tok, false, msg));
  EXPECT_EQ(msg.request.sampling.temperature, 0.25);
  EXPECT_EQ(msg.request.sampling.top_k, 7);
  GenerationJob msg_own;
  ASSERT_FALSE(
      parse_messages_request(dialect_json(R"({"model":"m","max_tokens":5,"top_k":2,"temperature":1,
          "messages":[{"role":"user","content":"q"}]})"),
                             model, *tok, false, msg_own));
  EXPECT_EQ(msg_own.request.sampling.top_k, 2);
  EXPECT_EQ(msg_own.request.sampling.temperature, 1);

  // Through the server: /v1/models, Responses' echoed sampling, max_new_tokens as max_tokens.
  InProcess srv(dialect_engine(tiny_tokenizer(), "the one and two and three"),
                [&](ServerOptions& o) { o.sampling_defaults = d; });
  auto c = srv.client();
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(dialect_json(models->body)["data"][0]["default_sampling"], d.to_json());
  // The defaults not set here show as none.
  EXPECT_EQ(dialect_json(models->body)["data"][0]["default_chat_template_kwargs"], OJson::object());
  EXPECT_TRUE(dialect_json(models->body)["data"][0]["reasoning_budget"].is_null());
  EXPECT_EQ(dialect_json(models->body)["data"][0]["aliases"], OJson::array());
  const OJson r = dialect_post(c, "/v1/responses", R"({"model":"scripted","input":"q"})");
  EXPECT_EQ(r["temperature"], 0.25);
  EXPECT_EQ(r["top_p"], 0.5);
  const OJson r_own =
      dialect_post(c, "/v1/responses", R"({"model":"scripted","input":"q","temperature":1.5})");
  EXPECT_EQ(r_own["temperature"], 1.5);
  const OJson capped = dialect_post(
      c, "/v1/chat/completions",
      R"({"model":"scripted","messages":[{"role":"user","content":"q"}],"temperature":0})");
  EXPECT_EQ(capped["usage"]["completion_tokens"], 3);
  EXPECT_EQ(capped["choices"][0]["finish_reason"], "length");
}

// --default-max-tokens, when given, wins over the generation config's max_new_tokens in chat and
// Responses, 0 (no cap: the rest of the context) included; not given, max_new_tokens applies.
// /v1/models shows the default that is applied.
TEST(DeepSeekDialect, DefaultMaxTokensFlagWinsOverTheGenerationConfigAndIsShown) {
  SamplingDefaults d;
  d.temperature = 0.25;
  d.max_new_tokens = 3;
  const std::string script = "the one and two and three";
  const int64_t all = int64_t(tiny_tokenizer()->encode(script).size());
  ASSERT_GT(all, 3);
  for (const std::optional<int> flag :
       {std::optional<int>(), std::optional<int>(2), std::optional<int>(0)}) {
    const std::string label = flag ? "--default-max-tokens " + std::to_string(*flag) : "not given";
    InProcess srv(dialect_engine(tiny_tokenizer(), script), [&](ServerOptions& o) {
      o.sampling_defaults = d;
      o.default_max_tokens = flag;
    });
    auto c = srv.client();
    const int cap = !flag ? 3 : *flag;  // 0: none
    OJson shown = dialect_json(R"({"temperature": 0.25})");
    if (cap > 0) shown["max_new_tokens"] = cap;
    auto models = c.Get("/v1/models");
    ASSERT_TRUE(models);
    EXPECT_EQ(dialect_json(models->body)["data"][0]["default_sampling"], shown) << label;
    const OJson chat = dialect_post(
        c, "/v1/chat/completions",
        R"({"model":"scripted","messages":[{"role":"user","content":"q"}],"temperature":0})");
    EXPECT_GE(chat["usage"]["completion_tokens"], cap > 0 ? cap : all) << label;
    EXPECT_LE(chat["usage"]["completion_tokens"], cap > 0 ? cap : all + 1) << label;  // EOS
    EXPECT_EQ(chat["choices"][0]["finish_reason"], std::string(cap > 0 ? "length" : "stop"))
        << label;
    const OJson r = dialect_post(c, "/v1/responses", R"({"model":"scripted","input":"q"})");
    EXPECT_EQ(r["status"], std::string(cap > 0 ? "incomplete" : "completed")) << label;
    if (cap > 0) EXPECT_EQ(r["usage"]["output_tokens"], cap) << label;
  }
}

// A checkpoint directory whose generation_config.json cannot be looked up (a symlink loop on the
// way; root sees through permissions) is an error naming the path, not an exception.
TEST(DeepSeekDialect, GenerationConfigThatCannotBeLookedUpIsAnErrorNamingThePath) {
  dsv41::testing::TempDir dir;
  const std::string loop = dir.path() + "/loop";
  std::filesystem::create_directory_symlink(loop, loop);
  Result<SamplingDefaults> r = Status::error("not run");
  EXPECT_NO_THROW(r = load_sampling_defaults(loop, "auto", ""));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find(loop + "/generation_config.json"), std::string::npos)
      << r.status().message();
  EXPECT_TRUE(load_sampling_defaults(loop, "none", "").is_ok());  // none never looks
}

// repetition_penalty on the real binary with the checkpoint's DSpark drafter: greedy output with
// the penalty is the same with speculation on and off, and differs from the output without it.
// A bias makes token 500 the argmax everywhere, so without the penalty greedy repeats it and with
// it the token comes once.
TEST(DeepSeekDialect, RepetitionPenaltySameWithSpeculationOnAndOffOnTheRealBinary) {
  dsv41::testing::TempDir dir;
  const std::string tiny = dir.path() + "/tiny";
  ASSERT_TRUE(dsv41::testing::make_tiny_official(tiny).is_ok());
  const std::string base =
      R"({"model":"tiny","prompt":"hello world","max_tokens":12,"temperature":0,)"
      R"("ignore_eos":true,"return_token_ids":true)";
  const std::vector<std::string> bodies = {
      base + "}", base + R"(,"repetition_penalty":1.3})", base + R"(,"logit_bias":{"500":30}})",
      base + R"(,"logit_bias":{"500":30},"repetition_penalty":100})"};
  std::vector<std::vector<OJson>> ids(2);
  int64_t drafted = 0;
  for (int spec = 0; spec < 2; ++spec) {
    ServeProcess p;
    std::vector<std::string> extra;
    if (spec) extra = {"--speculative", "dspark"};
    ASSERT_TRUE(p.start(tiny, dir.path() + "/serve" + std::to_string(spec) + ".log", extra));
    httplib::Client c("127.0.0.1", p.port);
    c.set_read_timeout(60, 0);
    for (const std::string& b : bodies)
      ids[spec].push_back(dialect_post(c, "/v1/completions", b)["choices"][0]["token_ids"]);
    if (spec) {
      const std::string m = metrics_once_they_hold(c, "dsv41_spec_draft_tokens_total");
      const std::size_t at = m.find("\ndsv41_spec_draft_tokens_total ");
      ASSERT_NE(at, std::string::npos) << m;
      drafted = std::stoll(m.substr(at + 31));
    }
    kill(p.pid, SIGTERM);
    EXPECT_EQ(p.wait_exit(), 0);
  }
  EXPECT_GT(drafted, 0);  // the verify steps ran
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    EXPECT_EQ(ids[0][i].size(), 12u) << bodies[i];
    EXPECT_EQ(ids[0][i], ids[1][i]) << bodies[i];
  }
  auto count = [](const OJson& a) { return std::count(a.begin(), a.end(), OJson(500)); };
  EXPECT_EQ(count(ids[0][2]), 12);
  EXPECT_EQ(count(ids[0][3]), 1);
  EXPECT_NE(ids[0][2], ids[0][3]);
}

// The real binary on an official-layout checkpoint with a generation_config.json: serve reads it
// (other keys skipped), --override-generation-config replaces key by key, /v1/models shows the
// result, max_new_tokens is the default max_tokens of a chat request, and the conversion serve
// makes copies the file beside the converted weights.
TEST(DeepSeekDialect, GenerationConfigOnTheRealBinary) {
  dsv41::testing::TempDir dir;
  const std::string tiny = dir.path() + "/tiny";
  ASSERT_TRUE(dsv41::testing::make_tiny_official(tiny).is_ok());
  const std::string config = R"({"bos_token_id": 0, "do_sample": true, "temperature": 0.6,
      "top_p": 0.95, "max_new_tokens": 5})";
  std::ofstream(tiny + "/generation_config.json") << config;
  ServeProcess p;
  ASSERT_TRUE(p.start(tiny, dir.path() + "/serve.log",
                      {"--override-generation-config", R"({"top_p": 0.5, "top_k": 20})"}));
  httplib::Client c("127.0.0.1", p.port);
  c.set_read_timeout(60, 0);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(dialect_json(models->body)["data"][0]["default_sampling"],
            dialect_json(R"({"temperature": 0.6, "top_p": 0.5, "top_k": 20, "max_new_tokens": 5})"))
      << models->body;
  const OJson r = dialect_post(c, "/v1/chat/completions",
                               R"({"model":"tiny","messages":[{"role":"user","content":"q"}],)"
                               R"("ignore_eos":true,"chat_template_kwargs":{"thinking":false}})");
  EXPECT_EQ(r["usage"]["completion_tokens"], 5);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  kill(p.pid, SIGTERM);
  EXPECT_EQ(p.wait_exit(), 0);
  std::ifstream copied(tiny + ".dsv41-converted/generation_config.json");
  ASSERT_TRUE(copied.good());
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(copied), {}), config);
  // An explicit --default-max-tokens 0 (no cap) wins over the file's max_new_tokens, and
  // /v1/models shows no default max_tokens.
  ServeProcess uncapped;
  ASSERT_TRUE(uncapped.start(tiny, dir.path() + "/serve0.log", {"--default-max-tokens", "0"}));
  httplib::Client c0("127.0.0.1", uncapped.port);
  c0.set_read_timeout(60, 0);
  auto models0 = c0.Get("/v1/models");
  ASSERT_TRUE(models0);
  EXPECT_EQ(dialect_json(models0->body)["data"][0]["default_sampling"],
            dialect_json(R"({"temperature": 0.6, "top_p": 0.95})"))
      << models0->body;
  kill(uncapped.pid, SIGTERM);
  EXPECT_EQ(uncapped.wait_exit(), 0);
}

// The real binary's flags for the server-wide defaults (issue 36 item 8) reach /v1/models: the
// first --served-model-name is the id, the others are aliases a request may name; the reasoning
// cap and the default chat-template kwargs are shown.
TEST(DeepSeekDialect, ServerWideDefaultsOnTheRealBinary) {
  dsv41::testing::TempDir dir;
  const std::string tiny = dir.path() + "/tiny";
  ASSERT_TRUE(dsv41::testing::make_tiny_official(tiny).is_ok());
  ServeProcess p;
  ASSERT_TRUE(p.start(tiny, dir.path() + "/serve.log",
                      {"--served-model-name", "tiny", "deepseek-chat", "--reasoning-budget", "3",
                       "--default-chat-template-kwargs", R"({"thinking":false})"}));
  httplib::Client c("127.0.0.1", p.port);
  c.set_read_timeout(60, 0);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const OJson listed = dialect_json(models->body)["data"];
  ASSERT_EQ(listed.size(), 1u) << models->body;
  EXPECT_EQ(listed[0]["id"], "tiny");
  EXPECT_EQ(listed[0]["aliases"], dialect_json(R"(["deepseek-chat"])"));
  EXPECT_EQ(listed[0]["reasoning_budget"], 3);
  EXPECT_EQ(listed[0]["default_chat_template_kwargs"], dialect_json(R"({"thinking":false})"));
  const OJson r = dialect_post(c, "/v1/chat/completions",
                               R"({"model":"deepseek-chat","max_tokens":2,)"
                               R"("messages":[{"role":"user","content":"q"}]})");
  EXPECT_EQ(r["model"], "tiny");
  kill(p.pid, SIGTERM);
  EXPECT_EQ(p.wait_exit(), 0);
}

// The official clients on the real binary serving the demo model, made as `serve` makes it on
// first use (the V4.1 tokenizer derived from DeepSeek-V3's, with the FIM tokens): the dialect
// (tests/js/deepseek_dialect_test.mjs, mode basic), then the same model served with the
// server-wide defaults of issue 36 item 8 (mode defaults) and `--speculative dspark` (the demo has
// a drafter): greedy output with and without repetition_penalty is the same token for token as
// without speculation, and the penalty changes it. SIGTERM ends each server with status 0.
TEST(DeepSeekDialect, OfficialClientsOnTheDemoModel) {
  dsv41::testing::TempDir dir;
  const std::string cache = dir.path() + "/cache";
  const std::string base =
      R"({"model":"dsv41-demo","prompt":"hello world","max_tokens":12,"temperature":0,)"
      R"("ignore_eos":true,"return_token_ids":true)";
  // Greedy demo output repeats no token, so a penalty above 1 changes nothing there; one below 1
  // does, and so does 100 against a bias that makes token 500 the argmax everywhere.
  const std::vector<std::string> bodies = {
      base + "}", base + R"(,"repetition_penalty":0.5})", base + R"(,"logit_bias":{"500":30}})",
      base + R"(,"logit_bias":{"500":30},"repetition_penalty":100})"};
  auto greedy = [&](int port) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    std::vector<OJson> ids;
    for (const std::string& b : bodies)
      ids.push_back(dialect_post(c, "/v1/completions", b)["choices"][0]["token_ids"]);
    return ids;
  };
  std::vector<OJson> plain;
  {
    ServeProcess p;
    ASSERT_TRUE(p.start_demo(cache, dir.path() + "/serve.log"));
    std::ifstream log(p.log_path);
    const std::string said(std::istreambuf_iterator<char>(log), {});
    EXPECT_NE(said.find("demo model: deriving the V4.1 tokenizer"), std::string::npos) << said;
    expect_node_client_passes(p.port, "dsv41-demo", "basic", "deepseek_dialect_test.mjs");
    plain = greedy(p.port);
    kill(p.pid, SIGTERM);
    EXPECT_EQ(p.wait_exit(), 0);
  }
  ServeProcess p;
  ASSERT_TRUE(p.start_demo(
      cache, dir.path() + "/serve_defaults.log",
      {"--served-model-name", "dsv41-demo", "deepseek-chat", "--reasoning-budget", "3",
       "--default-chat-template-kwargs", R"({"reasoning_effort":"max"})",
       "--override-generation-config", R"({"max_new_tokens":6})", "--speculative", "dspark"}));
  expect_node_client_passes(p.port, "dsv41-demo", "defaults", "deepseek_dialect_test.mjs");
  const std::vector<OJson> speculated = greedy(p.port);
  httplib::Client c("127.0.0.1", p.port);
  c.set_read_timeout(60, 0);
  const std::string m = metrics_once_they_hold(c, "dsv41_spec_draft_tokens_total");
  const std::size_t at = m.find("\ndsv41_spec_draft_tokens_total ");
  ASSERT_NE(at, std::string::npos) << m;
  EXPECT_GT(std::stoll(m.substr(at + 31)), 0);  // the verify steps ran
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    EXPECT_EQ(plain[i].size(), 12u) << bodies[i];
    EXPECT_EQ(plain[i], speculated[i]) << bodies[i];
  }
  EXPECT_NE(plain[0], plain[1]);
  auto count = [](const OJson& a) { return std::count(a.begin(), a.end(), OJson(500)); };
  EXPECT_EQ(count(plain[2]), 12);
  EXPECT_EQ(count(plain[3]), 1);
  kill(p.pid, SIGTERM);
  EXPECT_EQ(p.wait_exit(), 0);
}

}  // namespace
}  // namespace dsv41
