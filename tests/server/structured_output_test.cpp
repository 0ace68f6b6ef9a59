// Structured outputs through the OpenAI APIs (issue 32): chat completions' and completions'
// response_format (json_object, json_schema) and vLLM's structured_outputs (json, regex, choice)
// on the tiny random model at temperature 1, which writes no JSON by itself: every answer
// finishes with "stop" and validates (the C++ check of tests/engine/json_check.h, and ajv through
// tests/js/grammar_judge.mjs); streamed answers too; in thinking mode the answer after the
// reasoning is constrained; refusals are 400s naming the field and the schema keyword's path;
// compiled grammars are cached. tests/js/structured_outputs_test.mjs drives the same with the real
// `openai` client and judges with ajv.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/json_check.h"
#include "model/tiny_converted.h"
#include "server/request_fields.h"
#include "server/server_harness.h"
#include "server/structured_outputs.h"
#include "text/json_ordered.h"

namespace dsv41::structured_output_test {
namespace {

using namespace server_testing;

const char* kSchema = R"({"type":"object","properties":{
  "city":{"type":"string","maxLength":12},
  "days":{"type":"integer","minimum":1,"maximum":14},
  "unit":{"enum":["C","F"]},
  "alerts":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":2}},
  "required":["city","days","unit"],"additionalProperties":false})";

// The tiny fast model behind an in-process server (model name "scripted").
struct TinyServer {
  dsv41::testing::TempDir dir;
  std::unique_ptr<InProcess> server;
  // speculative: 3 drafts verified at every decode step.
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
  EXPECT_EQ(r->status, want) << dump_safe(body).substr(0, 300) << " -> " << r->body;
  auto j = parse_json_ordered(r->body);
  return j.is_ok() ? *j : OJson::object();
}

OJson chat_body(const OJson& extra) {
  OJson b = {{"model", "scripted"},
             {"messages", {{{"role", "user"}, {"content", "The weather, as JSON."}}}},
             {"max_tokens", 200},
             {"temperature", 1.0},
             {"chat_template_kwargs", {{"thinking", false}}}};
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

// ajv's verdicts on `docs` against `schema` (empty when node or ajv is not there).
std::vector<std::string> ajv_errors(const std::string& schema,
                                    const std::vector<std::string>& docs) {
  const std::string judge = std::string(DSV41_JS_DIR) + "/grammar_judge.mjs";
  if (run_command("cd " + std::string(DSV41_JS_DIR) + " && node -e \"import('ajv')\"").first != 0)
    return {};
  nlohmann::json cases = nlohmann::json::array();
  cases.push_back({{"schema", nlohmann::json::parse(schema)}, {"docs", docs}});
  const std::string in = "/tmp/dsv41_so_judge_" + std::to_string(getpid()) + ".json";
  std::ofstream(in) << cases.dump();
  auto [code, out] =
      run_command("cd " + std::string(DSV41_JS_DIR) + " && node " + judge + " " + in);
  std::remove(in.c_str());
  EXPECT_EQ(code, 0) << out;
  std::vector<std::string> errors;
  const auto verdict = nlohmann::json::parse(out, nullptr, false);
  if (verdict.is_discarded() || !verdict.is_array() || verdict.empty()) {
    ADD_FAILURE() << "ajv judge: " << out;
    return {"no verdict"};
  }
  for (const auto& v : verdict[0]) errors.push_back(v["valid"].get<bool>() ? "" : v["error"]);
  return errors;
}

TEST(StructuredOutputs, ChatAndCompletionsAnswersValidate) {
  TinyServer t;
  auto c = t.server->client();
  const auto schema = nlohmann::json::parse(kSchema);
  std::vector<std::string> docs;
  auto expect_valid = [&](const OJson& choice, const std::string& text, const char* what) {
    EXPECT_EQ(choice["finish_reason"], "stop") << what << ": " << text;
    EXPECT_EQ(dsv41::testing::json_text_check(schema, text), "") << what;
    docs.push_back(text);
  };
  // Chat, json_schema (strict), n = 4 at temperature 1.
  const OJson rf = {
      {"type", "json_schema"},
      {"json_schema",
       {{"name", "weather"}, {"strict", true}, {"schema", *parse_json_ordered(kSchema)}}}};
  const OJson r = post(c, "/v1/chat/completions", chat_body({{"response_format", rf}, {"n", 4}}));
  ASSERT_EQ(r["choices"].size(), 4u);
  for (const auto& ch : r["choices"])
    expect_valid(ch, ch["message"]["content"].get<std::string>(), "chat json_schema");
  std::printf("chat answer: %s\n",
              r["choices"][0]["message"]["content"].get<std::string>().c_str());
  // Streamed: the deltas put together.
  OJson sb = chat_body({{"response_format", rf}, {"stream", true}, {"seed", 3}});
  auto sr = c.Post("/v1/chat/completions", dump_safe(sb), "application/json");
  ASSERT_TRUE(sr);
  std::string streamed, finish;
  for (const OJson& p : sse_payloads(sr->body))
    for (const auto& ch : p["choices"]) {
      if (ch["delta"].contains("content") && ch["delta"]["content"].is_string())
        streamed += ch["delta"]["content"].get<std::string>();
      if (ch.contains("finish_reason") && ch["finish_reason"].is_string())
        finish = ch["finish_reason"].get<std::string>();
    }
  expect_valid(OJson{{"finish_reason", finish}}, streamed, "chat stream");
  // Completions: structured_outputs.json (the schema as an object and as its text).
  for (const OJson& so :
       {OJson{{"json", *parse_json_ordered(kSchema)}}, OJson{{"json", kSchema}}}) {
    const OJson cr = post(c, "/v1/completions",
                          {{"model", "scripted"},
                           {"prompt", "weather:"},
                           {"max_tokens", 200},
                           {"temperature", 1.0},
                           {"n", 3},
                           {"structured_outputs", so}});
    for (const auto& ch : cr["choices"])
      expect_valid(ch, ch["text"].get<std::string>(), "completions structured_outputs.json");
  }
  // Completions with response_format json_schema too.
  const OJson cr = post(c, "/v1/completions",
                        {{"model", "scripted"},
                         {"prompt", "weather:"},
                         {"max_tokens", 200},
                         {"temperature", 1.0},
                         {"response_format", rf}});
  expect_valid(cr["choices"][0], cr["choices"][0]["text"].get<std::string>(),
               "completions response_format");
  const auto verdicts = ajv_errors(kSchema, docs);
  for (std::size_t i = 0; i < verdicts.size(); ++i)
    EXPECT_EQ(verdicts[i], "") << "ajv on " << docs[i];
  std::printf("%zu documents checked, %zu judged by ajv\n", docs.size(), verdicts.size());
  // regex and choice.
  const OJson rx = post(c, "/v1/completions",
                        {{"model", "scripted"},
                         {"prompt", "code:"},
                         {"max_tokens", 30},
                         {"temperature", 1.0},
                         {"n", 3},
                         {"structured_outputs", {{"regex", "[A-Z]{3}-[0-9]{2,4}"}}}});
  for (const auto& ch : rx["choices"]) {
    const std::string s = ch["text"];
    EXPECT_EQ(ch["finish_reason"], "stop");
    EXPECT_TRUE(s.size() >= 6 && s.size() <= 8 && s[3] == '-') << s;
  }
  const OJson cc =
      post(c, "/v1/chat/completions",
           chat_body({{"n", 3}, {"structured_outputs", {{"choice", {"red", "green", "blue"}}}}}));
  for (const auto& ch : cc["choices"]) {
    const std::string s = ch["message"]["content"];
    EXPECT_EQ(ch["finish_reason"], "stop");
    EXPECT_TRUE(s == "red" || s == "green" || s == "blue") << s;
  }
  // json_object: any JSON object (finished ones parse as objects).
  const OJson jo = post(
      c, "/v1/chat/completions",
      chat_body({{"n", 3}, {"max_tokens", 400}, {"response_format", {{"type", "json_object"}}}}));
  int objects = 0;
  for (const auto& ch : jo["choices"]) {
    const std::string s = ch["message"]["content"];
    EXPECT_EQ(s.substr(0, 1), "{");
    if (ch["finish_reason"] != "stop") continue;
    const auto v = nlohmann::json::parse(s, nullptr, false);
    EXPECT_TRUE(v.is_object()) << s;
    ++objects;
  }
  EXPECT_GT(objects, 0);
}

// Through the API too: a seeded constrained answer is the same alone, among 8 concurrent
// requests (constrained by the same schema, by others, or not), and from a server verifying
// speculative drafts.
// The Responses API's text.format (flat: type, name, schema, strict): the message's output_text
// validates, the response echoes the format, refusals name text.format.*.
TEST(StructuredOutputs, ResponsesTextFormatConstrainsTheAnswer) {
  TinyServer t;
  auto c = t.server->client();
  const auto schema = nlohmann::json::parse(kSchema);
  const OJson format = {{"type", "json_schema"},
                        {"name", "weather"},
                        {"strict", true},
                        {"schema", *parse_json_ordered(kSchema)}};
  auto body = [&](const OJson& fm, int seed) {
    return OJson{{"model", "scripted"},
                 {"input", "The weather, as JSON."},
                 {"max_output_tokens", 200},
                 {"temperature", 1.0},
                 {"seed", seed},
                 {"reasoning", {{"effort", "none"}}},
                 {"text", {{"format", fm}}}};
  };
  std::vector<std::string> docs;
  for (int seed = 1; seed <= 3; ++seed) {
    const OJson r = post(c, "/v1/responses", body(format, seed));
    EXPECT_EQ(r["status"], "completed") << dump_safe(r).substr(0, 400);
    EXPECT_EQ(r["text"]["format"]["type"], "json_schema");
    EXPECT_EQ(r["text"]["format"]["name"], "weather");
    std::string text;
    for (const auto& item : r["output"])
      if (item["type"] == "message")
        for (const auto& part : item["content"])
          if (part["type"] == "output_text") text += part["text"].get<std::string>();
    EXPECT_EQ(dsv41::testing::json_text_check(schema, text), "") << text;
    docs.push_back(text);
  }
  for (const std::string& e : ajv_errors(kSchema, docs)) EXPECT_EQ(e, "");
  // json_object: some JSON object.
  const OJson jo = post(c, "/v1/responses", body({{"type", "json_object"}}, 4));
  EXPECT_EQ(jo["text"]["format"]["type"], "json_object");
  // Refusals.
  OJson bad_schema = format;
  bad_schema["schema"] = {{"type", "string"}, {"not", {{"const", "x"}}}};
  const OJson r1 = post(c, "/v1/responses", body(bad_schema, 1), 400);
  EXPECT_EQ(r1["error"]["param"], "text.format.schema") << dump_safe(r1);
  EXPECT_NE(r1["error"]["message"].get<std::string>().find("\"not\""), std::string::npos);
  const OJson r2 = post(c, "/v1/responses", body({{"type", "xml"}}, 1), 400);
  EXPECT_EQ(r2["error"]["param"], "text.format.type") << dump_safe(r2);
  const OJson r3 = post(c, "/v1/responses", body({{"type", "json_schema"}, {"name", "x"}}, 1), 400);
  EXPECT_EQ(r3["error"]["param"], "text.format.schema") << dump_safe(r3);
}

TEST(StructuredOutputs, SameAnswerAloneAmongOthersAndWithSpeculation) {
  TinyServer t;
  TinyServer spec(true);
  auto c = t.server->client();
  const OJson rf = {
      {"type", "json_schema"},
      {"json_schema", {{"name", "weather"}, {"schema", *parse_json_ordered(kSchema)}}}};
  std::vector<OJson> targets = {chat_body({{"response_format", rf}, {"seed", 5}}),
                                chat_body({{"response_format", rf}, {"temperature", 0}})};
  auto answer = [](httplib::Client& cl, const OJson& body) {
    const OJson r = post(cl, "/v1/chat/completions", body);
    return r["choices"].empty() ? std::string()
                                : r["choices"][0]["message"]["content"].get<std::string>();
  };
  std::vector<std::string> alone;
  for (const OJson& b : targets) alone.push_back(answer(c, b));
  std::vector<std::string> crowded(targets.size());
  std::vector<std::thread> th;
  for (int i = 0; i < 8; ++i) {
    OJson b = i % 3 == 0   ? chat_body({{"max_tokens", 30}})
              : i % 3 == 1 ? chat_body({{"response_format", rf}, {"seed", 100 + i}})
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
  const auto schema = nlohmann::json::parse(kSchema);
  for (std::size_t k = 0; k < targets.size(); ++k) {
    EXPECT_EQ(dsv41::testing::json_text_check(schema, alone[k]), "");
    EXPECT_EQ(crowded[k], alone[k]) << "target " << k;
    EXPECT_EQ(answer(sc, targets[k]), alone[k]) << "target " << k << " with speculation";
  }
  EXPECT_GT(spec.server->engine->stats().spec_steps, 0);
}

// Thinking mode: the reasoning is free, the answer after it follows the schema.
TEST(StructuredOutputs, ThinkingModeConstrainsTheAnswer) {
  TinyServer t;
  auto c = t.server->client();
  OJson b =
      chat_body({{"response_format",
                  {{"type", "json_schema"},
                   {"json_schema", {{"name", "w"}, {"schema", *parse_json_ordered(kSchema)}}}}},
                 {"thinking_token_budget", 5},
                 {"n", 2}});
  b.erase("chat_template_kwargs");  // thinking on (V4.1's default)
  const OJson r = post(c, "/v1/chat/completions", b);
  const auto schema = nlohmann::json::parse(kSchema);
  ASSERT_EQ(r["choices"].size(), 2u);
  for (const auto& ch : r["choices"]) {
    EXPECT_EQ(ch["finish_reason"], "stop");
    EXPECT_TRUE(ch["message"]["reasoning_content"].is_string());
    EXPECT_EQ(dsv41::testing::json_text_check(schema, ch["message"]["content"].get<std::string>()),
              "");
  }
}

TEST(StructuredOutputs, RefusalsNameTheFieldAndTheKeyword) {
  TinyServer t;
  auto c = t.server->client();
  auto refused = [&](const OJson& extra, const std::string& param, const std::string& needle) {
    const OJson e = post(c, "/v1/chat/completions", chat_body(extra), 400);
    EXPECT_EQ(e["error"]["param"], param) << dump_safe(extra);
    EXPECT_NE(e["error"]["message"].get<std::string>().find(needle), std::string::npos)
        << e["error"]["message"];
    return e;
  };
  auto schema_rf = [](const std::string& schema) {
    return OJson{{"response_format",
                  {{"type", "json_schema"},
                   {"json_schema", {{"name", "x"}, {"schema", *parse_json_ordered(schema)}}}}}};
  };
  refused(schema_rf(R"({"type":"object","properties":{"a":{"not":{"type":"string"}}}})"),
          "response_format.json_schema.schema", "\"not\" at /properties/a/not");
  refused(OJson{{"structured_outputs", {{"json", {{"type", "string"}, {"uniqueItems", true}}}}}},
          "structured_outputs.json", "uniqueItems");
  refused(OJson{{"response_format", {{"type", "xml"}}}}, "response_format.type", "xml");
  refused(OJson{{"response_format", {{"type", "json_schema"}}}}, "response_format.json_schema",
          "required");
  refused(OJson{{"structured_outputs", OJson::object()}}, "structured_outputs", "one of");
  refused(OJson{{"structured_outputs", {{"regex", "a"}, {"choice", {"b"}}}}}, "structured_outputs",
          "only one");
  refused(OJson{{"structured_outputs", {{"grammar", "root ::= \"a\""}}}},
          "structured_outputs.grammar", "not supported");
  refused(OJson{{"structured_outputs", {{"regex", "(?=a)b"}}}}, "structured_outputs.regex",
          "at character");
  refused(OJson{{"structured_outputs", {{"choice", {"a"}}}},
                {"response_format", {{"type", "json_object"}}}},
          "structured_outputs", "response_format");
  // A schema over the compile budget: refused within about a second (the default budget), the
  // server serving others meanwhile; asked again, answered from the cache at once.
  const OJson hard = {{"structured_outputs", {{"regex", "(a|b)*a(a|b){40}"}}}};
  for (int round = 0; round < 2; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    const OJson e = refused(hard, "structured_outputs.regex", "budget");
    EXPECT_EQ(e["error"]["code"], "grammar_too_complex");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, round == 0 ? 2.0 : 0.5) << "round " << round;
  }
  const OJson ok = post(c, "/v1/chat/completions",
                        chat_body({{"max_tokens", 3}, {"response_format", {{"type", "text"}}}}));
  EXPECT_EQ(ok["choices"].size(), 1u);
  expect_healthy(c);
}

// The compiled-grammar cache: the same (kind, text) compiles once and returns the same grammar;
// the least recently used entry goes first; refusals are cached too.
// serve's --grammar-max-states (ServerOptions::grammar) bounds what a schema may compile to.
TEST(StructuredOutputs, TheServersCompileBudgetIsTheFlags) {
  InProcess s(0, 64 << 10, {}, {}, [](ServerOptions& o) { o.grammar.state_budget = 40; });
  auto c = s.client();
  auto body = [](const char* schema) {
    return OJson{{"model", "scripted"},
                 {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                 {"max_tokens", 8},
                 {"chat_template_kwargs", {{"thinking", false}}},
                 {"response_format",
                  {{"type", "json_schema"},
                   {"json_schema", {{"name", "x"}, {"schema", *parse_json_ordered(schema)}}}}}};
  };
  const OJson big = post(c, "/v1/chat/completions", body(kSchema), 400);
  EXPECT_EQ(big["error"]["code"], "grammar_too_complex") << dump_safe(big);
  post(c, "/v1/chat/completions", body(R"({"type":"boolean"})"), 200);
}

TEST(StructuredOutputs, CompiledGrammarsAreCached) {
  auto tok = tiny_tokenizer();
  GrammarCache cache(2);
  using K = GrammarCache::Kind;
  auto a = cache.get(*tok, K::kRegex, "[ab]+");
  ASSERT_TRUE(a.is_ok());
  auto a2 = cache.get(*tok, K::kRegex, "[ab]+");
  ASSERT_TRUE(a2.is_ok());
  EXPECT_EQ(a->get(), a2->get());
  EXPECT_EQ(cache.compiles(), 1);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_TRUE(cache.get(*tok, K::kChoice, R"(["x","y"])").is_ok());
  EXPECT_TRUE(cache.get(*tok, K::kJsonObject, "").is_ok());  // evicts the regex (least recent)
  auto a3 = cache.get(*tok, K::kRegex, "[ab]+");
  ASSERT_TRUE(a3.is_ok());
  EXPECT_NE(a3->get(), a->get());
  EXPECT_EQ(cache.compiles(), 4);
  for (int i = 0; i < 2; ++i) {
    auto bad = cache.get(*tok, K::kJsonSchema, R"({"not":{}})");
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find("\"not\""), std::string::npos);
  }
  EXPECT_EQ(cache.compiles(), 5);
  // A byte bound: a cache of 1 byte keeps only the newest grammar.
  GrammarCache small(64, 1);
  ASSERT_TRUE(small.get(*tok, K::kRegex, "[ab]+").is_ok());
  ASSERT_TRUE(small.get(*tok, K::kRegex, "[cd]+").is_ok());
  EXPECT_EQ(small.size(), 1u);
  ASSERT_TRUE(small.get(*tok, K::kRegex, "[cd]+").is_ok());
  EXPECT_EQ(small.hits(), 1);
  // The parser reads the fields into the job's constraint (none for text).
  GenerationJob job;
  ServedModel model = parser_model();
  const OJson text_body = {
      {"model", "m"}, {"prompt", "x"}, {"response_format", {{"type", "text"}}}};
  ASSERT_FALSE(parse_completion_request(text_body, model, *tok, job).has_value());
  EXPECT_EQ(job.request.constraint, nullptr);
  GenerationJob cjob;
  const OJson chat = {{"model", "m"},
                      {"messages", {{{"role", "user"}, {"content", "q"}}}},
                      {"structured_outputs", {{"choice", {"x", "y"}}}}};
  ASSERT_FALSE(parse_chat_completion_request(chat, model, *tok, cjob).has_value());
  EXPECT_NE(cjob.request.constraint, nullptr);
  EXPECT_TRUE(cjob.thinking);
  EXPECT_TRUE(cjob.request.constraint_after_reasoning);
}

// The real `openai` client (tests/js/structured_outputs_test.mjs): json_schema with strict, its
// answers judged by ajv, streamed and not, completions with structured_outputs, a 400's fields.
TEST(StructuredOutputs, OpenAiClientAnswersValidateUnderAjv) {
  if (run_command("node --version").first != 0) GTEST_SKIP() << "node is not installed";
  TinyServer t;
  expect_node_client_passes(t.server->port, "scripted", "basic", "structured_outputs_test.mjs");
}

}  // namespace
}  // namespace dsv41::structured_output_test
