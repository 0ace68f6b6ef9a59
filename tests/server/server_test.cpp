// HTTP server tests. In-process (HttpServer over an Engine with a scripted backend): a corpus of
// malformed requests (each must get a 4xx with OpenAI's error JSON, the server staying healthy),
// DSML tool calls and reasoning through the official `openai` npm client, client disconnect
// cancelling the engine request, metrics. Out of process (the real `dsv41 serve` binary on a tiny
// checkpoint): the `openai` client end to end, and SIGTERM finishing in-flight requests then
// exiting 0.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/rng.h"
#include "engine/engine.h"
#include "engine/scripted_runner.h"
#include "io/test_util.h"
#include "model/tiny_checkpoint.h"
#include "model/tiny_converted.h"
#include "server/generation_protocol.h"
#include "server/http_server.h"
#include "server/server_harness.h"
#include "text/json_ordered.h"
#include "text/tokenizer_file.h"

namespace dsv41 {
namespace {

using namespace std::chrono_literals;
using namespace server_testing;

bool is_error_json(const std::string& body) {
  auto j = parse_json_ordered(body);
  if (!j || !j->is_object() || !j->contains("error")) return false;
  const OJson& e = (*j)["error"];
  return e.is_object() && e.contains("message") && e["message"].is_string() && e.contains("type") &&
         e["type"].is_string() && e.contains("param") && e.contains("code");
}

struct Bad {
  std::string path;
  std::string body;
};

std::vector<Bad> malformed_corpus() {
  std::vector<Bad> v;
  const std::string C = "/v1/completions", H = "/v1/chat/completions";
  // Not JSON, or not an object.
  for (const char* b : {"", "{", "[]", "null", "1", "\"x\"", "{'model': 1}", "{\"model\":}",
                        "{\"a\":1,}", "\xff\xfe", "{\"model\":\"scripted\",\"prompt\":\"x\"",
                        "true", "{\"prompt\":\"\\ud800\"}"}) {
    v.push_back({C, b});
    v.push_back({H, b});
  }
  v.push_back({C, std::string(300, '[') + std::string(300, ']')});
  const std::string m = "\"model\":\"scripted\"";
  const std::string p = "\"prompt\":\"hi\"";
  // Completions fields.
  for (const std::string f : std::vector<std::string>{
           "\"model\":1",
           "\"model\":\"other\"",
           "\"prompt\":1",
           "\"prompt\":{}",
           "\"prompt\":[]",
           "\"prompt\":[\"a\",\"b\"]",
           "\"prompt\":[1.5]",
           "\"prompt\":[-1]",
           "\"prompt\":[99999999]",
           "\"prompt\":[[1],[2]]",
           "\"prompt\":\"\"",
           "\"max_tokens\":0",
           "\"max_tokens\":-1",
           "\"max_tokens\":\"5\"",
           "\"max_tokens\":1.5",
           "\"max_tokens\":99999999999",
           "\"temperature\":-1",
           "\"temperature\":3",
           "\"temperature\":\"hot\"",
           "\"top_p\":0",
           "\"top_p\":1.5",
           "\"top_k\":-2",
           "\"top_k\":\"a\"",
           "\"min_p\":2",
           "\"presence_penalty\":5",
           "\"frequency_penalty\":-3",
           "\"seed\":\"x\"",
           "\"seed\":1.5",
           "\"n\":129",
           "\"n\":0",
           "\"best_of\":2",
           "\"logprobs\":21",
           "\"logprobs\":-1",
           "\"logprobs\":true",
           "\"echo\":\"yes\"",
           "\"echo\":false,\"max_tokens\":0",
           "\"suffix\":\"x\"",
           "\"suffix\":5",
           "\"repetition_penalty\":0",
           "\"repetition_penalty\":\"x\"",
           "\"min_tokens\":-1",
           "\"min_tokens\":20,\"max_tokens\":10",
           "\"bad_words\":\"x\"",
           "\"bad_words\":[\"\"]",
           "\"include_stop_str_in_output\":1",
           "\"skip_special_tokens\":\"no\"",
           "\"return_token_ids\":1",
           "\"truncate_prompt_tokens\":0",
           "\"truncate_prompt_tokens\":-2",
           "\"use_beam_search\":true",
           "\"length_penalty\":0.5",
           "\"guided_json\":{}",
           "\"structured_outputs\":{\"json\":{\"not\":{}}}",
           "\"allowed_token_ids\":[1]",
           "\"priority\":3",
           "\"response_format\":{\"type\":\"xml\"}",
           "\"stream\":true,\"stream_options\":{\"continuous_usage_stats\":true}",
           "\"stop\":5",
           "\"stop\":[1]",
           "\"stop\":[\"\"]",
           "\"stop\":\"\"",
           "\"stop_token_ids\":[-1]",
           "\"stop_token_ids\":\"x\"",
           "\"stop_token_ids\":[1000000]",
           "\"logit_bias\":[]",
           "\"logit_bias\":{\"x\":1}",
           "\"logit_bias\":{\"5\":1000}",
           "\"logit_bias\":{\"99999999\":1}",
           "\"logit_bias\":{\"5\":\"a\"}",
           "\"stream\":\"yes\"",
           "\"stream_options\":{\"include_usage\":true}",
           "\"stream\":true,\"stream_options\":{\"include_usage\":\"x\"}",
           "\"stream\":true,\"stream_options\":5",
           "\"user\":5",
           "\"ignore_eos\":\"no\"",
           "\"prompt\":\"" + std::string(3000, 'x') + " " + std::string(3000, 'y') + "\""}) {
    const bool has_prompt = f.rfind("\"prompt\"", 0) == 0;
    const bool has_model = f.rfind("\"model\"", 0) == 0;
    v.push_back({C, "{" + (has_model ? f : m + "," + (has_prompt ? f : p + "," + f)) +
                        (has_model ? "," + p : "") + "}"});
  }
  v.push_back({C, "{" + m + "}"});
  v.push_back({C, "{" + p + "}"});
  // Chat fields.
  const std::string msg = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
  for (const std::string f : std::vector<std::string>{
           "\"messages\":[]", "\"messages\":{}", "\"messages\":\"hi\"", "\"messages\":[1]",
           "\"messages\":[{}]", "\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]",
           "\"messages\":[{\"role\":\"user\",\"content\":5}]", "\"messages\":[{\"role\":\"user\"}]",
           "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]",
           "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"audio\"}]}]",
           "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]",
           "\"messages\":[{\"role\":\"user\",\"content\":[5]}]",
           "\"messages\":[{\"role\":\"user\",\"content\":[]}]",  // found by the soak
           "\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{}}]}]",
           "\"messages\":[{\"role\":\"assistant\",\"tool_calls\":5}]",
           "\"messages\":[{\"role\":\"tool\"}]",
           "\"messages\":[{\"role\":\"developer\",\"content\":\"\"}]",
           "\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"reasoning\":1}]"}) {
    v.push_back({H, "{" + m + "," + f + "}"});
  }
  for (const std::string f : std::vector<std::string>{
           "\"tools\":{}",
           "\"tools\":[{\"type\":\"code\",\"function\":{\"name\":\"f\"}}]",
           "\"tools\":[{\"type\":\"function\"}]",
           "\"tools\":[{\"type\":\"function\",\"function\":{}}]",
           "\"tools\":[5]",
           "\"tool_choice\":\"required\"",
           "\"tool_choice\":{\"type\":\"function\"}",
           "\"response_format\":{\"type\":\"json_schema\"}",
           "\"response_format\":5",
           "\"logprobs\":\"yes\"",
           "\"top_logprobs\":2",
           "\"logprobs\":true,\"top_logprobs\":25",
           "\"chat_template_kwargs\":[]",
           "\"chat_template_kwargs\":{\"thinking\":\"x\"}",
           "\"chat_template_kwargs\":{\"reasoning_effort\":\"huge\"}",
           "\"chat_template_kwargs\":{\"reasoning_effort\":0}",
           "\"chat_template_kwargs\":{\"reasoning_effort\":101}",
           "\"reasoning_effort\":\"huge\"",
           "\"thinking\":{\"type\":\"on\"}",
           "\"thinking\":true",
           "\"thinking_token_budget\":-1",
           "\"messages\":[{\"role\":\"user\",\"content\":\"q\",\"prefix\":true}]",
           "\"parallel_tool_calls\":1",
           "\"chat_template\":\"{{x}}\"",
           "\"echo\":true",
           "\"continue_final_message\":true",
           "\"max_completion_tokens\":0",
           "\"max_tokens\":0",
           "\"temperature\":2.5",
           "\"n\":2,\"best_of\":1",
           "\"parallel_tool_calls\":\"x\"",
           "\"add_generation_prompt\":1",
           "\"model\":\"gpt-4\""}) {
    const bool has_model = f.rfind("\"model\"", 0) == 0;
    v.push_back({H, has_model ? "{" + f + "," + msg + "}" : "{" + m + "," + msg + "," + f + "}"});
  }
  // Other endpoints.
  v.push_back({"/tokenize", "{}"});
  v.push_back({"/tokenize", "{\"prompt\":5}"});
  v.push_back({"/tokenize", "{\"messages\":[{\"role\":\"x\"}]}"});
  v.push_back({"/tokenize", "nope"});
  v.push_back({"/detokenize", "{}"});
  v.push_back({"/detokenize", "{\"tokens\":[-1]}"});
  v.push_back({"/detokenize", "{\"tokens\":[99999999]}"});
  v.push_back({"/detokenize", "{\"tokens\":[\"a\"]}"});
  v.push_back({"/detokenize", "{\"tokens\":[18446744073709551615]}"});
  v.push_back({"/v1/nothing", "{}"});
  v.push_back({"/v2/completions", "{}"});
  // Larger than the body limit (64 KiB in this server).
  v.push_back({C, "{" + m + ",\"prompt\":\"" + std::string(100 << 10, 'a') + "\"}"});
  return v;
}

TEST(Server, MalformedCorpusGets4xxWithErrorJsonAndServerStaysHealthy) {
  InProcess s;
  auto c = s.client();
  auto corpus = malformed_corpus();
  ASSERT_GE(corpus.size(), 100u);
  int checked = 0;
  for (const Bad& b : corpus) {
    expect_refused(c, b.path, b.body, is_error_json);
    ++checked;
  }
  // GET on a POST route (405, see WrongMethodIs405WithAllow) and an unknown GET.
  for (auto [path, status] : {std::pair{"/v1/completions", 405}, {"/nowhere", 404}}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << path;
    EXPECT_TRUE(is_error_json(r->body));
  }
  // Malformed HTTP itself, over a raw socket.
  for (const char* raw :
       {"GARBAGE\r\n\r\n", "POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
        "GET / HTTP/9.9\r\n\r\n"}) {
    std::string reply = raw_exchange(s.port, raw);
    EXPECT_TRUE(reply.rfind("HTTP/1.1 4", 0) == 0) << raw << " -> " << reply.substr(0, 100);
  }
  expect_healthy(c);
  auto ok = c.Post("/v1/completions", R"({"model":"scripted","prompt":"hi","max_tokens":3})",
                   "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  std::printf("malformed requests checked: %d\n", checked);
}

TEST(Server, ParamNamedInErrors) {
  InProcess s;
  auto c = s.client();
  auto r = c.Post(
      "/v1/chat/completions",
      R"({"model":"scripted","messages":[{"role":"user","content":"x"},{"role":"robot","content":"y"}]})",
      "application/json");
  ASSERT_TRUE(r);
  auto j = parse_json_ordered(r->body);
  ASSERT_TRUE(j.is_ok());
  EXPECT_EQ((*j)["error"]["param"], "messages[1].role");
  auto t = c.Post("/v1/completions", R"({"model":"scripted","prompt":"x","top_p":7})",
                  "application/json");
  ASSERT_TRUE(t);
  EXPECT_EQ((*parse_json_ordered(t->body))["error"]["param"], "top_p");
  for (const char* salt : {"7", "\"\""}) {
    auto u = c.Post("/v1/completions",
                    std::string(R"({"model":"scripted","prompt":"x","cache_salt":)") + salt + "}",
                    "application/json");
    ASSERT_TRUE(u);
    EXPECT_EQ(u->status, 400);
    EXPECT_EQ((*parse_json_ordered(u->body))["error"]["param"], "cache_salt") << salt;
  }
  auto ok = c.Post("/v1/completions",
                   R"({"model":"scripted","prompt":"x","max_tokens":2,"cache_salt":"team-a"})",
                   "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

// The error object of a response body; {"message": "", "param": null, "code": null} when the body
// is not OpenAI's error shape.
OJson error_of(const httplib::Result& r) {
  if (r && is_error_json(r->body)) return (*parse_json_ordered(r->body))["error"];
  return OJson({{"message", ""}, {"param", nullptr}, {"code", nullptr}});
}

// Token ids arrive as unsigned JSON numbers: valid ones are accepted in every place ids go.
TEST(Server, TokenIdPromptsAndStopTokenIdsAreAccepted) {
  InProcess s;
  auto c = s.client();
  const int32_t vocab = s.engine->vocab_size();
  const std::string last = std::to_string(vocab - 1);
  for (const std::string& ids : {std::string("\"prompt\":[0]"), std::string("\"prompt\":[5,6,7]"),
                                 std::string("\"prompt\":[[5,6,7]]"), "\"prompt\":[" + last + "]",
                                 "\"prompt\":\"hi\",\"stop_token_ids\":[5," + last + "]"}) {
    auto r = c.Post("/v1/completions", "{\"model\":\"scripted\",\"max_tokens\":2," + ids + "}",
                    "application/json");
    ASSERT_TRUE(r) << ids;
    EXPECT_EQ(r->status, 200) << ids << " -> " << r->body;
  }
  auto chat = c.Post("/v1/chat/completions",
                     R"({"model":"scripted","messages":[{"role":"user","content":"x"}],)"
                     R"("max_tokens":2,"stop_token_ids":[0]})",
                     "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 200) << chat->body;
  // One past the vocabulary is still refused, naming the field.
  for (const std::string& bad :
       {"\"prompt\":[" + std::to_string(vocab) + "]",
        "\"prompt\":\"hi\",\"stop_token_ids\":[" + std::to_string(vocab) + "]"}) {
    auto r = c.Post("/v1/completions", "{\"model\":\"scripted\"," + bad + "}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad;
    EXPECT_NE(error_of(r)["message"].get<std::string>().find("outside the vocabulary"),
              std::string::npos)
        << r->body;
  }
}

// max_tokens beyond what the context leaves after the prompt: 400 naming the field (as vLLM);
// without max_tokens the answer is bounded by the context.
TEST(Server, MaxTokensBeyondTheContextIsRefused) {
  InProcess s;
  auto c = s.client();
  const int64_t n = static_cast<int64_t>(s.engine->tokenizer().encode("hi").size());
  const int64_t room = s.engine->max_context() - n;
  for (const int64_t mt : {int64_t(1000000000), room + 1}) {
    auto r = c.Post("/v1/completions",
                    R"({"model":"scripted","prompt":"hi","max_tokens":)" + std::to_string(mt) + "}",
                    "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << mt << " -> " << r->body.substr(0, 300);
    const OJson e = error_of(r);
    EXPECT_EQ(e["param"], "max_tokens") << r->body.substr(0, 300);
    EXPECT_NE(e["message"].get<std::string>().find("max_tokens"), std::string::npos)
        << r->body.substr(0, 300);
    EXPECT_NE(e["message"].get<std::string>().find(std::to_string(s.engine->max_context())),
              std::string::npos)
        << r->body.substr(0, 300);
  }
  auto chat = c.Post("/v1/chat/completions",
                     R"({"model":"scripted","messages":[{"role":"user","content":"x"}],)"
                     R"("max_completion_tokens":1000000000})",
                     "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 400) << chat->body;
  EXPECT_EQ(error_of(chat)["param"], "max_completion_tokens") << chat->body;
  // Exactly the room left is fine (the answer may use the whole context).
  auto fits = c.Post("/v1/completions",
                     R"({"model":"scripted","prompt":"hi","max_tokens":)" + std::to_string(room) +
                         R"(,"ignore_eos":true})",
                     "application/json");
  ASSERT_TRUE(fits);
  EXPECT_EQ(fits->status, 200) << fits->body.substr(0, 300);
  auto fj = parse_json_ordered(fits->body);
  ASSERT_TRUE(fj.is_ok()) << fits->body.substr(0, 300);
  EXPECT_EQ((*fj)["usage"]["completion_tokens"], room);
}

// A known path with the wrong method: 405 with Allow (unknown paths stay 404).
TEST(Server, WrongMethodIs405WithAllow) {
  InProcess s;
  auto c = s.client();
  struct Case {
    httplib::Result r;
    const char* allow;
  };
  std::vector<Case> cases;
  cases.push_back({c.Get("/v1/chat/completions"), "POST"});
  cases.push_back({c.Put("/v1/completions", "{}", "application/json"), "POST"});
  cases.push_back({c.Delete("/tokenize"), "POST"});
  cases.push_back({c.Post("/health", "{}", "application/json"), "GET, HEAD"});
  cases.push_back({c.Post("/v1/models", "{}", "application/json"), "GET, HEAD"});
  cases.push_back({c.Delete("/v1/models/scripted"), "GET, HEAD"});
  cases.push_back({c.Patch("/metrics", "{}", "application/json"), "GET, HEAD"});
  for (const Case& k : cases) {
    ASSERT_TRUE(k.r);
    EXPECT_EQ(k.r->status, 405) << k.allow << " " << k.r->body;
    EXPECT_EQ(k.r->get_header_value("Allow"), k.allow);
    EXPECT_TRUE(is_error_json(k.r->body)) << k.r->body;
  }
  auto unknown = c.Put("/nowhere", "{}", "application/json");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_TRUE(is_error_json(unknown->body));
  EXPECT_EQ(c.Get("/health")->status, 200);
}

// GET /v1/models/{id}: the served model, or 404 in OpenAI's shape.
TEST(Server, ModelsRetrieve) {
  InProcess s;
  auto c = s.client();
  auto r = c.Get("/v1/models/scripted");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = *parse_json_ordered(r->body);
  EXPECT_EQ(j["id"], "scripted");
  EXPECT_EQ(j["object"], "model");
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_EQ(j["owned_by"], "dsv41");
  auto other = c.Get("/v1/models/gpt-4");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  EXPECT_EQ(error_of(other)["code"], "model_not_found") << other->body;
  EXPECT_NE(error_of(other)["message"].get<std::string>().find("gpt-4"), std::string::npos);
}

// Parse errors say where and what in plain words, without the JSON library's internal tags.
TEST(Server, JsonParseErrorsAreReadable) {
  InProcess s;
  auto c = s.client();
  for (const char* body : {"{", "{\"model\":}", "\xff", "{\"prompt\":\"\\ud800\"}"}) {
    auto r = c.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    const std::string m = error_of(r)["message"].get<std::string>();
    EXPECT_EQ(m.rfind("invalid JSON body", 0), 0u) << m;
    EXPECT_NE(m.find("byte"), std::string::npos) << m;
    EXPECT_EQ(m.find("json.exception"), std::string::npos) << m;
    EXPECT_EQ(m.find("parse_error"), std::string::npos) << m;
  }
}

// A Content-Length that cannot be right gets an answer at once, not after the read timeout.
TEST(Server, BadContentLengthIsRefusedAtOnce) {
  InProcess s;  // 64 KiB body limit
  for (auto [length, status] : {std::pair{"-1", "400"},
                                {"-0", "400"},
                                {"+5", "400"},
                                {"1e3", "400"},
                                {"5, 5", "400"},
                                {"99999999999999999999999", "400"},
                                {"18446744073709551615", "413"},
                                {"1000000", "413"}}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string reply =
        raw_exchange(s.port, std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                         "Content-Type: application/json\r\nContent-Length: ") +
                                 length + "\r\n\r\n{}");
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(reply.rfind(std::string("HTTP/1.1 ") + status, 0), 0u)
        << length << " -> " << reply.substr(0, 200);
    EXPECT_LT(secs, 10.0) << length;  // not after the server's 30 s read timeout
    const std::size_t body = reply.find("\r\n\r\n");
    if (body != std::string::npos) EXPECT_TRUE(is_error_json(reply.substr(body + 4))) << reply;
  }
  auto h = s.client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST(Server, ToolCallsAndReasoningThroughTheOpenAiClient) {
  InProcess s;
  auto [code, out] = run_command(node_client(s.port, "scripted", "tools"));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
}

// Chat completions' stream of a reasoning + text + DSML output, in every chunking (1-8 bytes,
// markers cut anywhere): reasoning_content, content and the tool call add up to the non-streamed
// message, and the finish reason is tool_calls. The call streams as OpenAI's do: its first delta
// carries index, id, type and name, the later ones pieces of its arguments under that index.
TEST(Server, ChatStreamEqualsTheMessageInEveryChunking) {
  const auto tok = tiny_tokenizer();
  const GenerationJob job = reasoning_tools_job();
  auto api = openai_chat_api();
  const OJson msg = whole_body(*api, job, *tok, whole_output(kScriptText))["choices"][0]["message"];
  ASSERT_EQ(msg["reasoning_content"], "I should call the tool.");
  ASSERT_EQ(msg["content"], "Let me check.");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  Rng rng(8);
  for (int trial = 0; trial < 200; ++trial) {
    auto w = api->writer(job, *tok, "x", 0);
    const std::vector<std::string> frames = stream_in_chunks(*w, kScriptText, trial, rng);
    ASSERT_EQ(frames.back(), "data: [DONE]\n\n");
    std::string reasoning, content, finish;
    OJson calls = OJson::array();  // assembled: {id, type, function: {name, arguments}}
    for (std::size_t k = 0; k + 1 < frames.size(); ++k) {
      const OJson c = *parse_json_ordered(frames[k].substr(6, frames[k].size() - 8));
      const OJson& ch = c["choices"][0];
      const OJson& d = ch["delta"];
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) {
        ASSERT_EQ(d["tool_calls"].size(), 1u);
        const OJson& tc = d["tool_calls"][0];
        if (tc.contains("id")) {
          ASSERT_EQ(tc["function"]["arguments"], "") << "trial " << trial;
          calls.push_back({{"id", tc["id"]}, {"type", tc["type"]}, {"function", tc["function"]}});
          continue;
        }
        ASSERT_FALSE(calls.empty()) << "trial " << trial;
        ASSERT_EQ(tc["index"], calls.size() - 1) << "trial " << trial;
        OJson& f = calls.back()["function"];
        f["arguments"] =
            f["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
      }
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
    ASSERT_EQ(reasoning, msg["reasoning_content"]) << "trial " << trial;
    ASSERT_EQ(content, msg["content"]) << "trial " << trial;
    ASSERT_EQ(calls.size(), 1u);
    ASSERT_EQ(calls[0].dump(), msg["tool_calls"][0].dump()) << "trial " << trial;
    ASSERT_EQ(finish, "tool_calls");
  }
}

TEST(Server, TokenizeDetokenizeModelsHealthMetrics) {
  InProcess s;
  auto c = s.client();
  auto t = c.Post("/tokenize", R"({"prompt":"hello world"})", "application/json");
  ASSERT_TRUE(t);
  ASSERT_EQ(t->status, 200);
  auto tj = *parse_json_ordered(t->body);
  EXPECT_EQ(tj["count"], s.engine->tokenizer().encode("hello world").size());
  auto d = c.Post("/detokenize", OJson({{"tokens", tj["tokens"]}}).dump(), "application/json");
  ASSERT_TRUE(d);
  EXPECT_EQ((*parse_json_ordered(d->body))["prompt"], "hello world");
  auto tm =
      c.Post("/tokenize", R"({"messages":[{"role":"user","content":"hi"}]})", "application/json");
  ASSERT_TRUE(tm);
  EXPECT_EQ((*parse_json_ordered(tm->body))["tokens"][0], 0);  // BOS
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ((*parse_json_ordered(models->body))["data"][0]["id"], "scripted");
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const char* name :
       {"dsv41_requests_total{endpoint=\"/tokenize\",status=\"200\"} 2", "dsv41_queue_length 0",
        "dsv41_request_duration_seconds_bucket", "dsv41_time_to_first_token_seconds_count",
        "dsv41_generation_tokens_total", "dsv41_kv_foreign_reads_total 0", "dsv41_kv_blocks_used",
        "dsv41_num_preemptions_total 0", "dsv41_engine_step_seconds_count",
        "dsv41_engine_batch_tokens_bucket", "dsv41_engine_batch_sequences_sum",
        "dsv41_inter_token_latency_seconds_count"})
    EXPECT_NE(metrics->body.find(name), std::string::npos) << name << "\n" << metrics->body;
}

// Every generation endpoint's requests land in the end-to-end duration histogram (and only the
// requests the engine ran: a refused body is counted by status, not timed).
TEST(Server, EveryGenerationApiIsTimedInTheDurationHistogram) {
  InProcess s;
  auto c = s.client();
  const std::pair<const char*, const char*> requests[] = {
      {"/v1/completions", R"({"model":"scripted","prompt":"hi","max_tokens":3})"},
      {"/v1/chat/completions",
       R"({"model":"scripted","messages":[{"role":"user","content":"x"}],"max_tokens":3})"},
      {"/v1/messages",
       R"({"model":"scripted","max_tokens":3,"messages":[{"role":"user","content":"x"}]})"},
      {"/v1/responses", R"({"model":"scripted","input":"x","max_output_tokens":3})"}};
  for (const auto& [path, body] : requests) {
    auto r = c.Post(path, body, "application/json");
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path << " -> " << r->body;
  }
  auto refused = c.Post("/v1/messages", R"({"model":"scripted"})", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  // A response is timed when httplib is done with it, which may follow the client's read.
  std::string body;
  for (int i = 0; i < 3000; ++i) {  // up to 30 s on a starved machine
    body = c.Get("/metrics")->body;
    if (body.find("dsv41_request_duration_seconds_count 4\n") != std::string::npos) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_NE(body.find("dsv41_request_duration_seconds_count 4\n"), std::string::npos) << body;
  for (const auto& [path, unused] : requests)
    EXPECT_NE(
        body.find(fmt::format("dsv41_requests_total{{endpoint=\"{}\",status=\"200\"}} 1", path)),
        std::string::npos)
        << path << "\n"
        << body;
  EXPECT_NE(body.find(R"(dsv41_requests_total{endpoint="/v1/messages",status="400"} 1)"),
            std::string::npos)
      << body;
}

// Continuous batching through HTTP: 8 concurrent chat requests share the engine's steps (one at a
// time they would take 8x the steps of one).
TEST(Server, ConcurrentRequestsRunInTheSameSteps) {
  InProcess s(/*sleep_ms=*/10);
  const std::string body =
      R"({"model":"scripted","messages":[{"role":"user","content":"weather?"}],"max_tokens":200})";
  int64_t steps_one = 0;
  {
    auto c = s.client();
    auto r = c.Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    ASSERT_TRUE(engine_goes_idle(*s.engine));
    steps_one = s.engine->stats().steps_total;
  }
  std::vector<std::thread> clients;
  std::vector<int> status(8, 0);
  std::vector<std::string> answers(8);
  for (int i = 0; i < 8; ++i)
    clients.emplace_back([&, i] {
      auto c = s.client();
      if (auto r = c.Post("/v1/chat/completions", body, "application/json")) {
        status[std::size_t(i)] = r->status;
        answers[std::size_t(i)] = (*parse_json_ordered(r->body))["choices"][0]["message"].dump();
      }
    });
  for (auto& t : clients) t.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(status[std::size_t(i)], 200);
    EXPECT_EQ(answers[std::size_t(i)], answers[0]);  // the same script for everyone
  }
  ASSERT_TRUE(engine_goes_idle(*s.engine));
  const int64_t steps_eight = s.engine->stats().steps_total - steps_one;
  EXPECT_LT(steps_eight, 3 * steps_one) << "one request: " << steps_one << " steps";
}

// A full waiting queue answers 429 in OpenAI's error shape with Retry-After.
TEST(Server, FullQueueIs429WithRetryAfter) {
  EngineOptions eo;
  eo.max_num_seqs = 1;
  eo.max_queue = 1;
  InProcess s(/*sleep_ms=*/20, 64 << 10, eo);
  const std::string body =
      R"({"model":"scripted","prompt":"hi","max_tokens":1000,"ignore_eos":true,"stream":true})";
  std::atomic<bool> checked{false};
  auto give_up_later = [&] {  // streams until the check below is done, then hangs up (cancels)
    auto c = s.client();
    post_streaming(c, "/v1/completions", body, [&](const char*, std::size_t) { return !checked; });
  };
  auto wait_for = [&](auto pred) {
    for (int i = 0; i < 3000 && !pred(s.engine->stats()); ++i) std::this_thread::sleep_for(10ms);
    return pred(s.engine->stats());
  };
  std::thread a(give_up_later);
  ASSERT_TRUE(wait_for([](const EngineStats& st) { return st.running == 1; }));
  std::thread b(give_up_later);
  ASSERT_TRUE(wait_for([](const EngineStats& st) { return st.queued == 1; }));
  auto c = s.client();
  auto r = c.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  auto j = *parse_json_ordered(r->body);
  EXPECT_EQ(j["error"]["type"], "rate_limit_exceeded");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("queue full"), std::string::npos);
  checked = true;
  a.join();
  b.join();
  EXPECT_TRUE(engine_goes_idle(*s.engine));
}

// --max-queue 0: nothing waits. An idle server takes a request; with --max-num-seqs running, the
// next one is answered 429 with Retry-After at once. /metrics exports the limits.
TEST(Server, MaxQueueZeroRefusesBeyondTheRunningSeats) {
  EngineOptions eo;
  eo.max_num_seqs = 1;
  eo.max_queue = 0;
  InProcess s(/*sleep_ms=*/20, 64 << 10, eo);
  auto c = s.client();
  auto idle = c.Post("/v1/completions", R"({"model":"scripted","prompt":"hi","max_tokens":2})",
                     "application/json");
  ASSERT_TRUE(idle);
  EXPECT_EQ(idle->status, 200) << idle->body;
  ASSERT_TRUE(engine_goes_idle(*s.engine));
  const std::string body =
      R"({"model":"scripted","prompt":"hi","max_tokens":1000,"ignore_eos":true,"stream":true})";
  std::atomic<bool> checked{false};
  std::thread running([&] {  // streams until the check below is done, then hangs up (cancels)
    auto rc = s.client();
    post_streaming(rc, "/v1/completions", body, [&](const char*, std::size_t) { return !checked; });
  });
  for (int i = 0; i < 3000 && s.engine->stats().running != 1; ++i)
    std::this_thread::sleep_for(10ms);
  ASSERT_EQ(s.engine->stats().running, 1);
  auto r = c.Post("/v1/completions", body, "application/json");
  checked = true;
  running.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  auto j = *parse_json_ordered(r->body);
  EXPECT_EQ(j["error"]["type"], "rate_limit_exceeded");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("--max-queue 0"), std::string::npos)
      << r->body;
  ASSERT_TRUE(engine_goes_idle(*s.engine));
  const std::string m = c.Get("/metrics")->body;
  for (const char* line : {"dsv41_max_queue 0\n", "dsv41_max_num_seqs 1\n",
                           "dsv41_requests_total{endpoint=\"/v1/completions\",status=\"429\"} 1\n"})
    EXPECT_NE(m.find(line), std::string::npos) << line << m;
}

// Prometheus text format 0.0.4 as scrapers read it: every sample's family declared once by HELP
// and TYPE before its samples, names [a-zA-Z_:][a-zA-Z0-9_:]*, counters ending in _total,
// histogram samples _bucket (cumulative, +Inf = _count), _sum and _count. Returns every sample's
// value by its name and labels as written.
std::map<std::string, double> parse_prometheus(const std::string& text) {
  static const std::regex name_re("[a-zA-Z_:][a-zA-Z0-9_:]*");
  static const std::regex sample_re(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+))");
  std::map<std::string, double> samples;
  std::map<std::string, std::string> type_of;
  std::set<std::string> helped;
  std::string family, type;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# HELP ", 0) == 0) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(std::regex_match(name, name_re)) << line;
      EXPECT_TRUE(helped.insert(name).second) << "HELP twice: " << line;
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      t >> family >> type;
      EXPECT_TRUE(helped.count(family)) << "TYPE without HELP: " << line;
      EXPECT_TRUE(type_of.emplace(family, type).second) << "TYPE twice: " << line;
      EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram") << line;
      if (type == "counter") EXPECT_EQ(family.substr(family.size() - 6), "_total") << line;
      continue;
    }
    std::smatch sm;
    EXPECT_TRUE(std::regex_match(line, sm, sample_re)) << "not a sample: " << line;
    if (sm.empty()) continue;
    const std::string name = sm[1];
    bool ours = name == family;
    if (type == "histogram")
      for (const char* suffix : {"_bucket", "_sum", "_count"})
        ours = ours || name == family + suffix;
    EXPECT_TRUE(ours) << "a sample outside its family " << family << ": " << line;
    const std::string key = line.substr(0, line.rfind(' '));
    EXPECT_EQ(samples.count(key), 0u) << "sample twice: " << line;
    samples[key] = std::stod(sm[5]);
  }
  return samples;
}

// vLLM's metric names beside ours (dashboards and alerts written for vLLM read this server):
// every family present, labelled with the served model's name, its values those of the dsv41_
// families after requests that ended by length, by stop and by a client hanging up.
TEST(Server, MetricsExportVllmNamesConsistentWithOurs) {
  InProcess s(/*sleep_ms=*/5);
  auto c = s.client();
  for (int i = 0; i < 2; ++i) {
    auto r = c.Post("/v1/completions",
                    R"({"model":"scripted","prompt":"hi","max_tokens":4,"ignore_eos":true})",
                    "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
  }
  auto chat = c.Post("/v1/chat/completions",
                     R"({"model":"scripted","messages":[{"role":"user","content":"x"}]})",
                     "application/json");
  ASSERT_TRUE(chat);
  ASSERT_EQ(chat->status, 200) << chat->body;
  {
    auto hc = s.client();
    int frames = 0;
    post_streaming(hc, "/v1/completions",
                   R"({"model":"scripted","prompt":"hi","max_tokens":1000,"ignore_eos":true,)"
                   R"("stream":true})",
                   [&](const char*, std::size_t) { return ++frames < 3; });
  }
  std::map<std::string, double> m;
  for (int i = 0; i < 3000; ++i) {  // the hung-up request is counted when the server notices
    m = parse_prometheus(c.Get("/metrics")->body);
    if (m["dsv41_request_duration_seconds_count"] == 4 && s.engine->stats().running == 0) break;
    std::this_thread::sleep_for(10ms);
  }
  m = parse_prometheus(c.Get("/metrics")->body);
  const std::string l = R"({model_name="scripted",engine="0"})";
  auto v = [&](const std::string& key) {
    EXPECT_TRUE(m.count(key)) << key;
    return m[key];
  };
  EXPECT_EQ(v("vllm:num_requests_running" + l), v("dsv41_running_requests"));
  EXPECT_EQ(v("vllm:num_requests_waiting" + l), v("dsv41_queue_length"));
  EXPECT_EQ(v("vllm:kv_cache_usage_perc" + l), 0);  // the scripted model has no bounded pool
  EXPECT_EQ(v("vllm:gpu_cache_usage_perc" + l), 0);
  EXPECT_EQ(v("vllm:prompt_tokens_total" + l), v("dsv41_engine_prompt_tokens_total"));
  EXPECT_GT(v("vllm:generation_tokens_total" + l), 10);
  EXPECT_EQ(v("vllm:generation_tokens_total" + l), v("dsv41_engine_generated_tokens_total"));
  EXPECT_EQ(v("vllm:num_preemptions_total" + l), v("dsv41_num_preemptions_total"));
  EXPECT_EQ(v("vllm:prefix_cache_queries_total" + l), v("dsv41_prefix_cache_query_tokens_total"));
  EXPECT_EQ(v("vllm:prefix_cache_hits_total" + l), v("dsv41_prefix_cache_hit_tokens_total"));
  const std::string success = R"(vllm:request_success_total{model_name="scripted",engine="0",)";
  EXPECT_EQ(v(success + R"(finished_reason="length"})"), 2);
  EXPECT_EQ(v(success + R"(finished_reason="stop"})"), 1);
  EXPECT_EQ(v(success + R"(finished_reason="abort"})"), 1);
  EXPECT_EQ(v(success + R"(finished_reason="error"})"), 0);
  const std::pair<const char*, const char*> hists[] = {
      {"vllm:time_to_first_token_seconds", "dsv41_time_to_first_token_seconds"},
      {"vllm:inter_token_latency_seconds", "dsv41_inter_token_latency_seconds"},
      {"vllm:time_per_output_token_seconds", "dsv41_inter_token_latency_seconds"},
      {"vllm:e2e_request_latency_seconds", "dsv41_request_duration_seconds"}};
  for (const auto& [vllm, ours] : hists) {
    const std::string name = vllm;
    EXPECT_GT(v(name + "_count" + l), 0) << name;
    EXPECT_EQ(v(name + "_count" + l), v(std::string(ours) + "_count")) << name;
    EXPECT_NEAR(v(name + "_sum" + l), v(std::string(ours) + "_sum"), 1e-9) << name;
    EXPECT_EQ(v(name + R"(_bucket{model_name="scripted",engine="0",le="+Inf"})"),
              v(name + "_count" + l))
        << name;
  }
  EXPECT_EQ(v("vllm:e2e_request_latency_seconds_count" + l), 4);
  // vLLM's buckets: the first and last bounds of each.
  for (const char* bucket :
       {R"(vllm:time_to_first_token_seconds_bucket{model_name="scripted",engine="0",le="0.001"})",
        R"(vllm:time_to_first_token_seconds_bucket{model_name="scripted",engine="0",le="2560"})",
        R"(vllm:inter_token_latency_seconds_bucket{model_name="scripted",engine="0",le="0.01"})",
        R"(vllm:inter_token_latency_seconds_bucket{model_name="scripted",engine="0",le="80"})",
        R"(vllm:e2e_request_latency_seconds_bucket{model_name="scripted",engine="0",le="0.3"})",
        R"(vllm:e2e_request_latency_seconds_bucket{model_name="scripted",engine="0",le="7680"})"})
    EXPECT_TRUE(m.count(bucket)) << bucket;
}

// Load: 1,000 requests from 32 concurrent clients over loopback (streamed and not, completions and
// chat), every one answered 200 with its tokens; the metrics agree; nothing left running. (Seen
// failing: httplib's listen backlog of 5 dropped some of 32 simultaneous first connections.)
TEST(Server, ThousandRequestsAt32ConcurrentAllSucceed) {
  InProcess s;
  std::atomic<int> next{0}, ok{0}, bad{0};
  std::atomic<int64_t> tokens{0};
  std::vector<std::thread> clients;
  for (int w = 0; w < 32; ++w)
    clients.emplace_back([&] {
      auto c = s.client();
      for (int i; (i = next.fetch_add(1)) < 1000;) {
        const bool chat = i % 2, stream = (i / 2) % 2;
        const std::string body =
            chat ? R"({"model":"scripted","messages":[{"role":"user","content":"q)" +
                       std::to_string(i) + R"("}],"max_tokens":6,"stream":)" +
                       (stream ? "true" : "false") + "}"
                 : R"({"model":"scripted","prompt":"p)" + std::to_string(i) +
                       R"(","max_tokens":6,"ignore_eos":true,"stream":)" +
                       (stream ? "true" : "false") + "}";
        auto r =
            c.Post(chat ? "/v1/chat/completions" : "/v1/completions", body, "application/json");
        if (r && r->status == 200 && !r->body.empty()) {
          ++ok;
          if (!stream)
            tokens += (*parse_json_ordered(r->body))["usage"]["completion_tokens"].get<int64_t>();
        } else {
          ++bad;
          ADD_FAILURE() << "request " << i << (chat ? " chat" : " completion")
                        << (stream ? " streamed" : "") << ": "
                        << (r ? std::to_string(r->status) + " " + r->body
                              : "transport error " + httplib::to_string(r.error()));
        }
      }
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 1000);
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(tokens.load(), 500 * 6);  // the non-streamed half, 6 tokens each
  ASSERT_TRUE(engine_goes_idle(*s.engine));
  auto m = s.client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->body.find("status=\"5"), std::string::npos) << "a 5xx was answered";
  EXPECT_NE(m->body.find("dsv41_running_requests 0"), std::string::npos);
}

// Chaos on the fast path (a tiny random-weight checkpoint): 24 requests from 8 clients, each prompt
// its own random "secret", seeded sampling; some clients hang up mid-stream, some give up on a
// non-streamed answer; the KV pool holds only a few requests at once, so sequences are preempted
// and recomputed. Afterwards: no foreign KV read, no block held, preemptions happened, and every
// request that finished answered exactly what it answers alone.
TEST(Server, ChaosOnTheFastPathKeepsRequestsIsolatedAndExact) {
  testing::TempDir dir;
  const std::string conv = testing::make_tiny_converted(dir, 5);
  auto engine_with_pool = [&](double gb) {
    EngineOptions eo;
    eo.model_dir = conv;
    eo.fast.kv_cache_gb = gb;
    eo.max_num_batched_tokens = 32;
    auto e = Engine::load(eo);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    return std::move(*e);
  };
  Rng rng(17);
  std::vector<std::string> bodies;
  for (int i = 0; i < 24; ++i) {
    std::string prompt;
    for (int k = 0; k < 10 + int(rng.below(20)); ++k)
      prompt += (k ? "," : "") + std::to_string(rng.below(1000));
    bodies.push_back(R"({"model":"scripted","prompt":[)" + prompt +
                     R"(],"max_tokens":12,"ignore_eos":true,"temperature":0.8,"seed":)" +
                     std::to_string(100 + i) + R"(,"logprobs":0})");
  }
  auto answer = [](const httplib::Result& r) {
    if (!r || r->status != 200) return std::string("failed");
    return (*parse_json_ordered(r->body))["choices"][0].dump();
  };
  std::vector<std::string> solo(bodies.size());
  {
    InProcess s(engine_with_pool(0.05));
    auto c = s.client();
    for (std::size_t i = 0; i < bodies.size(); ++i)
      solo[i] = answer(c.Post("/v1/completions", bodies[i], "application/json"));
  }
  // About three requests' blocks: the tiny model holds 43 tokens in a handful of blocks.
  InProcess s(engine_with_pool(0.00025));
  std::vector<std::string> got(bodies.size());
  std::atomic<int> next{0};
  std::vector<std::thread> clients;
  for (int w = 0; w < 8; ++w)
    clients.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < int(bodies.size());) {
        const std::size_t k = std::size_t(i);
        if (i % 6 == 1) {  // streams, hangs up after two chunks
          auto c = s.client();
          std::string b = bodies[k];
          b.insert(b.size() - 1, R"(,"stream":true)");
          int chunks = 0;
          post_streaming(c, "/v1/completions", b,
                         [&](const char*, std::size_t) { return ++chunks < 2; });
          got[k] = "cancelled";
        } else if (i % 6 == 4) {  // gives up on the answer before the heartbeat
          httplib::Client c("127.0.0.1", s.port);
          c.set_read_timeout(0, 20000);
          auto r = c.Post("/v1/completions", bodies[k], "application/json");
          got[k] = r ? answer(r) : "cancelled";
        } else {
          auto c = s.client();
          got[k] = answer(c.Post("/v1/completions", bodies[k], "application/json"));
        }
      }
    });
  for (auto& t : clients) t.join();
  ASSERT_TRUE(engine_goes_idle(*s.engine));
  int finished = 0;
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    if (got[i] == "cancelled") continue;
    ++finished;
    EXPECT_EQ(got[i], solo[i]) << "request " << i;
  }
  EXPECT_GE(finished, 12);
  EngineStats st = s.engine->stats();
  for (int i = 0; i < 3000 && st.kv_blocks_used != 0; ++i) {  // up to 30 s on a starved machine
    std::this_thread::sleep_for(10ms);
    st = s.engine->stats();
  }
  EXPECT_EQ(st.kv_foreign_reads, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_GT(st.preemptions_total, 0);
  EXPECT_GT(st.kv_blocks_total, 0);
}

// OpenAI's n on the fast path: n choices (indices 0..n-1), choice i equal to the same request
// with seed + i; usage counts the prompt once and every choice's tokens; a stream carries each
// choice's chunks under its index, one finish per choice, then one usage chunk, then [DONE].
TEST(Server, ParallelSamplesAreChoicesEachEqualToItsSeed) {
  testing::TempDir dir;
  const std::string conv = testing::make_tiny_converted(dir, 5);
  EngineOptions eo;
  eo.model_dir = conv;
  eo.fast.kv_cache_gb = 0.05;
  auto e = Engine::load(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  InProcess s(std::move(*e));
  auto c = s.client();
  auto body = [](int n, int seed, bool stream) {
    return R"({"model":"scripted","prompt":[5,9,300,41,7,77,12,600,3,18,250,1,2,3,4,5,6,7,8,9],)"
           R"("max_tokens":10,"ignore_eos":true,"temperature":0.9,"logprobs":0,"n":)" +
           std::to_string(n) + R"(,"seed":)" + std::to_string(seed) +
           (stream ? R"(,"stream":true,"stream_options":{"include_usage":true}})" : "}");
  };
  std::vector<std::string> solo;
  for (int i = 0; i < 3; ++i) {
    auto r = c.Post("/v1/completions", body(1, 40 + i, false), "application/json");
    ASSERT_TRUE(r && r->status == 200);
    solo.push_back((*parse_json_ordered(r->body))["choices"][0]["text"].get<std::string>());
  }
  EXPECT_FALSE(solo[0] == solo[1] && solo[1] == solo[2]);
  auto r = c.Post("/v1/completions", body(3, 40, false), "application/json");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
  const OJson j = *parse_json_ordered(r->body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"].get<int>(), int(i));
    EXPECT_EQ(j["choices"][i]["text"].get<std::string>(), solo[i]) << "choice " << i;
    EXPECT_EQ(j["choices"][i]["logprobs"]["tokens"].size(), 10u);
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<int>(), 20);
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), 30);

  std::string streamed;
  ASSERT_TRUE(post_streaming(c, "/v1/completions", body(3, 40, true), [&](const char* d, size_t n) {
    streamed.append(d, n);
    return true;
  }));
  std::vector<std::string> text(3);
  std::vector<int> finishes(3, 0);
  int usage_chunks = 0;
  std::size_t at = 0, done_at = streamed.find("data: [DONE]"), usage_at = 0;
  ASSERT_NE(done_at, std::string::npos);
  while ((at = streamed.find("data: {", at)) != std::string::npos) {
    const std::size_t end = streamed.find("\n\n", at);
    auto chunk = parse_json_ordered(streamed.substr(at + 6, end - at - 6));
    ASSERT_TRUE(chunk.is_ok());
    if ((*chunk)["choices"].empty()) {
      ++usage_chunks;
      usage_at = at;
      EXPECT_EQ((*chunk)["usage"]["completion_tokens"].get<int>(), 30);
      EXPECT_EQ((*chunk)["usage"]["prompt_tokens"].get<int>(), 20);
    } else {
      const OJson& ch = (*chunk)["choices"][0];
      const auto k = std::size_t(ch["index"].get<int>());
      ASSERT_LT(k, 3u);
      text[k] += ch["text"].get<std::string>();
      finishes[k] += !ch["finish_reason"].is_null();
    }
    at = end;
  }
  EXPECT_EQ(usage_chunks, 1);
  EXPECT_LT(usage_at, done_at);
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(text[k], solo[k]) << "streamed choice " << k;
    EXPECT_EQ(finishes[k], 1) << "choice " << k;
  }
  // Chat: a role preamble per choice; n beyond the limit is refused naming n.
  std::string chat;
  ASSERT_TRUE(post_streaming(
      c, "/v1/chat/completions",
      R"({"model":"scripted","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"n":2,"stream":true})",
      [&](const char* d, size_t n) {
        chat.append(d, n);
        return true;
      }));
  EXPECT_NE(chat.find(R"("index":0,"delta":{"role":"assistant")"), std::string::npos) << chat;
  EXPECT_NE(chat.find(R"("index":1,"delta":{"role":"assistant")"), std::string::npos) << chat;
  auto big = c.Post("/v1/completions", body(129, 1, false), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 400);
  EXPECT_NE(big->body.find(R"("param":"n")"), std::string::npos) << big->body;
  EXPECT_EQ(s.engine->stats().kv_foreign_reads, 0);
}

// More concurrent streams than the old fixed pool of 32 HTTP threads: all 48 run at once in the
// engine (the HTTP pool is sized from the engine's limits), none waits for a thread. The requests
// are long (2000 steps of 10 ms; the context is 2048) and the clients hang up once all 48 ran
// together, so a starved machine starting the clients slowly cannot let the first ones finish
// before the last begin.
TEST(Server, FortyEightConcurrentStreamsRunTogether) {
  InProcess s(/*sleep_ms=*/10);
  std::atomic<bool> release{false};
  int64_t most = 0;
  std::vector<std::thread> clients;
  std::atomic<int> streamed{0};
  for (int i = 0; i < 48; ++i)
    clients.emplace_back([&] {
      auto c = s.client();
      bool counted = false;
      post_streaming(
          c, "/v1/completions",
          R"({"model":"scripted","prompt":"hi","max_tokens":2000,"ignore_eos":true,"stream":true})",
          [&](const char*, std::size_t) {
            if (!counted) ++streamed, counted = true;
            return !release.load();
          });
    });
  for (int i = 0; i < 3000 && most < 48; ++i) {  // up to 60 s
    most = std::max<int64_t>(most, s.engine->stats().running);
    std::this_thread::sleep_for(20ms);
  }
  release = true;
  for (auto& t : clients) t.join();
  EXPECT_EQ(streamed.load(), 48);
  EXPECT_EQ(most, 48);
  EXPECT_TRUE(engine_goes_idle(*s.engine));  // the hung-up streams are cancelled
}

// A chat request without max_tokens runs to the end of the context (vLLM's default), finishing with
// "length"; completions keep OpenAI's 16.
TEST(Server, AbsentMaxTokensIsTheRestOfTheContextForChat) {
  InProcess s;
  auto c = s.client();
  auto r =
      c.Post("/v1/chat/completions",
             R"({"model":"scripted","messages":[{"role":"user","content":"x"}],"ignore_eos":true})",
             "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  auto j = *parse_json_ordered(r->body);
  const int64_t prompt = j["usage"]["prompt_tokens"].get<int64_t>();
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int64_t>(), 2048 - prompt);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  auto k = c.Post("/v1/completions", R"({"model":"scripted","prompt":"x","ignore_eos":true})",
                  "application/json");
  ASSERT_TRUE(k);
  EXPECT_EQ((*parse_json_ordered(k->body))["usage"]["completion_tokens"], 16);
}

TEST(Server, ClientDisconnectMidStreamCancelsTheRequest) {
  InProcess s(/*sleep_ms=*/20);
  auto c = s.client();
  int chunks = 0;
  const bool completed = post_streaming(
      c, "/v1/completions",
      R"({"model":"scripted","prompt":"hi","max_tokens":2000,"stream":true,"ignore_eos":true})",
      [&](const char*, std::size_t) { return ++chunks < 3; });  // hang up after a few chunks
  EXPECT_FALSE(completed);                                      // the client cancelled
  // 2000 tokens at 20 ms would take 40 s: the request must have been cancelled within a few steps.
  EXPECT_TRUE(engine_goes_idle(*s.engine));
  EXPECT_LT(s.engine->stats().generated_tokens_total, 500);
  // The engine cancels before the handler records the response: poll for the metric.
  const std::string metrics = metrics_once_they_hold(c, "status=\"499\"");
  EXPECT_NE(metrics.find("status=\"499\""), std::string::npos) << metrics;
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(Server, ClientGivingUpOnANonStreamedAnswerCancelsIt) {
  InProcess s(/*sleep_ms=*/20);
  // The server accepts connections (its first ones can wait while it starts its threads): the
  // 0.3 s below are the request's, not the start's.
  ASSERT_EQ(s.client().Get("/health")->status, 200);
  {
    httplib::Client c("127.0.0.1", s.port);
    c.set_read_timeout(0, 300000);  // gives up after 0.3 s
    auto r = c.Post(
        "/v1/chat/completions",
        R"({"model":"scripted","messages":[{"role":"user","content":"x"}],"max_tokens":1500,"ignore_eos":true})",
        "application/json");
    EXPECT_FALSE(r);
  }
  // 1500 tokens at 20 ms would take 30 s (2000 would not fit the 2048-token context after the
  // chat prompt): the request must have been cancelled within a few steps.
  EXPECT_TRUE(engine_goes_idle(*s.engine));
  EXPECT_LT(s.engine->stats().generated_tokens_total, 500);
  // The request did reach the engine and was cancelled there (499), not refused or never read.
  auto c = s.client();
  const std::string metrics = metrics_once_they_hold(c, "status=\"499\"");
  EXPECT_NE(metrics.find("endpoint=\"/v1/chat/completions\",status=\"499\""), std::string::npos)
      << metrics;
}

// A non-streamed request whose engine step fails gets a real 5xx with the API's error JSON as the
// whole body, for every API: the status is decided when the outcome is known, not sent early with
// keep-alive bytes (the step fails about 0.9 s in, after the 0.5 s at which those used to commit
// a 200). A model that died (a rank of a split model) makes it a 503. Streams keep their in-band
// error event. The `openai` client raises InternalServerError, not a JSON parse error.
TEST(Server, EngineFailureIsA5xxWithTheApisErrorJson) {
  InProcess s(/*sleep_ms=*/100);
  s.faults->fail_after = 8;  // the prompt's slice and 7 decodes run; the 9th slice fails
  auto c = s.client();
  const std::string chat_body =
      R"({"model":"scripted","messages":[{"role":"user","content":"x"}],"max_tokens":50)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/completions",
       R"({"model":"scripted","prompt":"hi","max_tokens":50,"ignore_eos":true})"},
      {"/v1/chat/completions", chat_body + "}"},
      {"/v1/responses", R"({"model":"scripted","input":"x","max_output_tokens":50})"},
      {"/v1/messages", chat_body + "}"}};
  auto expect_failure = [&](const std::string& path, const std::string& body, int status,
                            const std::string& openai_type, const std::string& anthropic_type) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.Post(path, body, "application/json");
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, status) << path << " -> " << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json") << path;
    ASSERT_FALSE(r->body.empty()) << path;
    EXPECT_EQ(r->body.front(), '{') << path << ": the body is the error JSON alone";
    auto j = parse_json_ordered(r->body);
    ASSERT_TRUE(j.is_ok()) << path << " -> " << r->body;
    const bool anthropic = path == "/v1/messages";
    if (anthropic) {
      EXPECT_EQ((*j)["type"], "error") << r->body;
      EXPECT_EQ((*j)["error"]["type"], anthropic_type) << r->body;
    } else {
      EXPECT_TRUE(is_error_json(r->body)) << path << " -> " << r->body;
      EXPECT_EQ((*j)["error"]["type"], openai_type) << r->body;
    }
    const std::string message = (*j)["error"]["message"].get<std::string>();
    EXPECT_EQ(message.rfind("engine error: ", 0), 0u) << message;
    EXPECT_NE(message.find("injected"), std::string::npos) << message;
    if (status == 500)  // the failure came mid-generation, not at submission
      EXPECT_GT(std::chrono::steady_clock::now() - t0, 600ms) << path;
  };
  for (const auto& [path, body] : cases)
    expect_failure(path, body, 500, "internal_error", "api_error");
  // The failures are counted as 500s (not 200s) for each endpoint.
  const std::string metrics = c.Get("/metrics")->body;
  for (const auto& [path, body] : cases)
    EXPECT_NE(metrics.find("endpoint=\"" + path + "\",status=\"500\""), std::string::npos)
        << path << "\n"
        << metrics;
  // Streamed: the status went out with the first bytes; the failure is an error event.
  auto streamed =
      c.Post("/v1/chat/completions", chat_body + R"(,"stream":true})", "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);
  EXPECT_NE(streamed->body.find("data: {\"error\":"), std::string::npos) << streamed->body;
  EXPECT_NE(streamed->body.find("engine error: "), std::string::npos) << streamed->body;
  expect_node_client_passes(s.port, "scripted", "engine-failure", "openai_client_test.mjs");
  // A model that stops answering for good: 503, and the requests after it are refused at once.
  s.faults->die_on_failure = true;
  expect_failure("/v1/messages", chat_body + "}", 503, "", "overloaded_error");
  auto after = c.Post("/v1/chat/completions", chat_body + "}", "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 503) << after->body;
  EXPECT_EQ(c.Get("/health")->status, 503);
}

// ---- the real binary -----------------------------------------------------------------------

class RealServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    ASSERT_TRUE(testing::make_tiny_official(dir_->path() + "/tiny").is_ok());
  }
  static void TearDownTestSuite() { delete dir_; }
  static testing::TempDir* dir_;
};
testing::TempDir* RealServer::dir_ = nullptr;

TEST_F(RealServer, OpenAiClientEndToEnd) {
  ServeProcess p;
  ASSERT_TRUE(p.start(dir_->path() + "/tiny", dir_->path() + "/serve1.log"));
  auto [code, out] = run_command(node_client(p.port, "tiny", "basic"));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
  kill(p.pid, SIGTERM);
  EXPECT_EQ(p.wait_exit(), 0);
}

// cpp-httplib asks for SO_REUSEPORT, with which a second server on the same port would listen too
// and take half of the connections. The second one must refuse and exit non-zero; the first one
// keeps serving. (The timeout only bounds a second server that wrongly starts.)
TEST_F(RealServer, SecondServerOnTheSamePortIsRefused) {
  ServeProcess first;
  ASSERT_TRUE(first.start(dir_->path() + "/tiny", dir_->path() + "/serve3.log"));
  auto [code, out] =
      run_command("timeout -k 2 30 " + std::string(DSV41_BINARY) + " serve --model " +
                  dir_->path() + "/tiny --port " + std::to_string(first.port));
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("address in use"), std::string::npos) << out;
  httplib::Client c("127.0.0.1", first.port);
  for (int i = 0; i < 4; ++i) {  // every connection reaches the first server
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
  }
  kill(first.pid, SIGTERM);
  EXPECT_EQ(first.wait_exit(), 0);
}

TEST_F(RealServer, SigtermFinishesInFlightThenExitsZero) {
  ServeProcess p;
  ASSERT_TRUE(p.start(dir_->path() + "/tiny", dir_->path() + "/serve2.log"));
  std::mutex mu;  // the client thread appends while this one watches the size
  std::string streamed;
  std::thread client([&] {
    httplib::Client c("127.0.0.1", p.port);
    c.set_read_timeout(60, 0);
    post_streaming(
        c, "/v1/completions",
        R"({"model":"tiny","prompt":"hi","max_tokens":2000,"stream":true,"ignore_eos":true})",
        [&](const char* data, std::size_t n) {
          std::lock_guard<std::mutex> lock(mu);
          streamed.append(data, n);
          return true;
        });
  });
  auto streamed_now = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return streamed;
  };
  // Wait until the stream is flowing (up to 30 s on a starved machine), then ask the server to
  // stop.
  for (int i = 0; i < 3000 && streamed_now().size() < 200; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GE(streamed_now().size(), 200u) << "the stream never started";
  kill(p.pid, SIGTERM);
  // Once the signal is handled (its log line), draining refuses new work: /health says 503 while
  // the 2000-token stream still runs (the listener stays open until in-flight requests end).
  bool handled = false;
  for (int i = 0; i < 3000 && !handled; ++i) {
    if (i) std::this_thread::sleep_for(10ms);
    handled = testing::read_file(p.log_path).find("refusing new requests") != std::string::npos;
  }
  EXPECT_TRUE(handled) << testing::read_file(p.log_path);
  httplib::Client probe("127.0.0.1", p.port);
  auto h = probe.Get("/health");
  for (int i = 0; i < 100 && h && h->status == 200; ++i) {  // the flag follows the log line
    std::this_thread::sleep_for(10ms);
    h = probe.Get("/health");
  }
  const bool stream_ended = streamed_now().find("data: [DONE]") != std::string::npos;
  EXPECT_FALSE(stream_ended) << "the stream ended before draining could be seen";
  EXPECT_TRUE(h && h->status == 503)  // refusing new work while draining
      << (h ? std::to_string(h->status) : std::string("no answer"));
  client.join();
  EXPECT_EQ(p.wait_exit(), 0);
  EXPECT_NE(streamed.find("\"finish_reason\":\"length\""), std::string::npos)
      << streamed.substr(0, 500);
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos);
}

}  // namespace
}  // namespace dsv41
