// API keys, CORS, TLS, the JSON request log and serving while loading (issue 37 items 2-5, 8): the
// policy objects alone (server/access_control.h), then the in-process server (401 in each API's
// shape, open and guarded paths, preflights), then the real binary with its flags, file and
// variable through the official clients.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "core/load_progress.h"
#include "server/access_control.h"
#include "server/server_harness.h"

namespace dsv41::server_testing {
namespace {

TEST(ApiKeys, LoadedFromFlagsFileAndVariable) {
  dsv41::testing::TempDir dir;
  const std::string file = dir.file("keys");
  std::ofstream(file) << "# the team's keys\n\n  sk-file-1  \nsk-file-2\n";
  auto keys = ApiKeys::load({"sk-flag"}, file, "sk-env");
  ASSERT_TRUE(keys.is_ok()) << keys.status().message();
  EXPECT_EQ(keys->size(), 4u);
  for (const char* k : {"sk-flag", "sk-file-1", "sk-file-2", "sk-env"}) {
    EXPECT_TRUE(keys->accepts(std::string("Bearer ") + k, "")) << k;
    EXPECT_TRUE(keys->accepts("", k)) << k;
  }
  EXPECT_TRUE(keys->accepts("bearer  sk-flag ", ""));  // the scheme is case-insensitive
  for (const char* bad : {"", "Bearer", "Bearer ", "sk-flag", "Basic sk-flag", "Bearer sk-fla",
                          "Bearer sk-flagg", "Bearer # the team's keys"})
    EXPECT_FALSE(keys->accepts(bad, "")) << bad;
  EXPECT_FALSE(keys->accepts("", "sk-nope"));
  EXPECT_TRUE(keys->accepts("Bearer wrong", "sk-env"));  // either header may carry it

  auto none = ApiKeys::load({}, "", "");
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->enabled());
  EXPECT_TRUE(none->accepts("", ""));

  auto empty_flag = ApiKeys::load({"  "}, "", "");
  ASSERT_FALSE(empty_flag.is_ok());
  EXPECT_NE(empty_flag.status().message().find("--api-key"), std::string::npos);
  auto missing = ApiKeys::load({}, dir.file("absent"), "");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find(dir.file("absent")), std::string::npos);
  const std::string comments = dir.file("comments");
  std::ofstream(comments) << "# nothing\n\n";
  auto no_key = ApiKeys::load({}, comments, "");
  ASSERT_FALSE(no_key.is_ok());
  EXPECT_NE(no_key.status().message().find("holds no key"), std::string::npos);
}

TEST(ApiKeys, GuardedPaths) {
  for (const char* open : {"/health", "/", "/dashboard", "/web/chat.js", "/web/auth.js"})
    EXPECT_FALSE(path_needs_key(open, false)) << open;
  for (const char* guarded :
       {"/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
        "/beta/completions", "/tokenize", "/detokenize", "/v1/unknown", "/metrics"})
    EXPECT_TRUE(path_needs_key(guarded, false)) << guarded;
  EXPECT_FALSE(path_needs_key("/metrics", true));
  EXPECT_TRUE(path_needs_key("/v1/models", true));
}

TEST(Cors, ListsPolicyAndPreflights) {
  std::vector<std::string> v;
  ASSERT_TRUE(
      CorsPolicy::parse_list("--allowed-origins", R"(["https://a.example", "*"])", &v).is_ok());
  EXPECT_EQ(v, (std::vector<std::string>{"https://a.example", "*"}));
  ASSERT_TRUE(CorsPolicy::parse_list("--allowed-methods", "GET, POST", &v).is_ok());
  EXPECT_EQ(v, (std::vector<std::string>{"GET", "POST"}));
  for (const char* bad : {"[1]", "[\"\"]", "[\"a\"", "a,,b", ""}) {
    Status st = CorsPolicy::parse_list("--allowed-headers", bad, &v);
    EXPECT_FALSE(st.is_ok()) << bad;
    EXPECT_NE(st.message().find("--allowed-headers"), std::string::npos) << st.message();
  }
  EXPECT_FALSE(CorsPolicy().enabled());
  EXPECT_TRUE(CorsPolicy().response_headers("https://a.example").empty());

  CorsOptions o;
  o.origins = {"https://a.example"};
  o.methods = {"GET", "POST"};
  o.headers = {"Content-Type", "Authorization"};
  const CorsPolicy p(o);
  EXPECT_TRUE(p.response_headers("https://b.example").empty());
  EXPECT_TRUE(p.response_headers("").empty());
  auto h = p.response_headers("https://a.example");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0], (std::pair<std::string, std::string>{"Access-Control-Allow-Origin",
                                                       "https://a.example"}));
  EXPECT_EQ(h[1].first, "Vary");
  auto pre = p.preflight("https://a.example", "POST", "content-type, authorization");
  ASSERT_TRUE(pre.has_value());
  auto find = [&](const std::string& name) {
    for (const auto& [k, val] : *pre)
      if (k == name) return val;
    return std::string("(absent)");
  };
  EXPECT_EQ(find("Access-Control-Allow-Methods"), "GET, POST");
  EXPECT_EQ(find("Access-Control-Allow-Headers"), "Content-Type, Authorization");
  EXPECT_EQ(find("Access-Control-Allow-Credentials"), "(absent)");
  EXPECT_FALSE(p.preflight("https://a.example", "DELETE", "").has_value());
  EXPECT_FALSE(p.preflight("https://a.example", "POST", "x-secret").has_value());
  EXPECT_FALSE(p.preflight("https://b.example", "POST", "").has_value());

  CorsOptions any;
  any.origins = {"*"};
  EXPECT_EQ(CorsPolicy(any).response_headers("https://z.example")[0].second, "*");
  any.credentials = true;  // a browser refuses "*" with credentials: the origin itself
  auto ch = CorsPolicy(any).response_headers("https://z.example");
  ASSERT_EQ(ch.size(), 3u);
  EXPECT_EQ(ch[0].second, "https://z.example");
  EXPECT_EQ(ch[1],
            (std::pair<std::string, std::string>{"Access-Control-Allow-Credentials", "true"}));

  for (const char* lo : {"127.0.0.1", "127.1.2.3", "localhost", "::1"})
    EXPECT_TRUE(is_loopback_host(lo)) << lo;
  for (const char* net : {"0.0.0.0", "::", "192.168.1.5", "127.0.0.1.example.com", "example.com"})
    EXPECT_FALSE(is_loopback_host(net)) << net;
}

// The in-process server with two keys and one allowed origin.
TEST(AccessControl, KeysGuardTheApiInEachApisShape) {
  auto configure = [](bool metrics_public) {
    return [metrics_public](ServerOptions& so) {
      auto keys = ApiKeys::load({"sk-a", "sk-b"}, "", "");
      ASSERT_TRUE(keys.is_ok());
      so.api_keys = std::move(*keys);
      so.metrics_public = metrics_public;
      so.cors.origins = {"https://app.example"};
    };
  };
  InProcess s(0, 64 << 10, EngineOptions{}, "", configure(false));
  auto c = s.client();
  const std::string chat =
      R"({"model":"scripted","max_tokens":3,"messages":[{"role":"user","content":"hi"}]})";
  auto r = c.Post("/v1/chat/completions", chat, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
  auto j = nlohmann::json::parse(r->body);
  EXPECT_EQ(j["error"]["code"], "invalid_api_key");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("no API key"), std::string::npos);

  auto m = c.Post("/v1/messages", httplib::Headers{{"x-api-key", "sk-c"}},
                  R"({"model":"scripted","max_tokens":3,"messages":[]})", "application/json");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 401);
  auto mj = nlohmann::json::parse(m->body);
  EXPECT_EQ(mj["type"], "error");
  EXPECT_EQ(mj["error"]["type"], "authentication_error");
  EXPECT_NE(mj["error"]["message"].get<std::string>().find("not valid"), std::string::npos);

  for (const auto& h : {httplib::Headers{{"Authorization", "Bearer sk-b"}},
                        httplib::Headers{{"x-api-key", "sk-a"}}}) {
    auto ok = c.Post("/v1/chat/completions", h, chat, "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
    auto tk = c.Post("/tokenize", h, R"({"prompt":"hi"})", "application/json");
    ASSERT_TRUE(tk);
    EXPECT_EQ(tk->status, 200) << tk->body;
  }
  for (const char* open : {"/health", "/", "/dashboard", "/web/auth.js"}) {
    auto o = c.Get(open);
    ASSERT_TRUE(o) << open;
    EXPECT_EQ(o->status, 200) << open;
  }
  for (const char* guarded : {"/metrics", "/v1/models", "/v1/nothing"}) {
    auto g = c.Get(guarded);
    ASSERT_TRUE(g) << guarded;
    EXPECT_EQ(g->status, 401) << guarded;
  }
  // The page loads auth.js before its own script.
  auto index = c.Get("/");
  ASSERT_TRUE(index);
  EXPECT_LT(index->body.find("/web/auth.js"), index->body.find("/web/chat.js"));

  // CORS: the allowed origin's preflight (no key needed), its answers (a 401 included, so a page
  // can read it), another origin's refused preflight and answers without CORS headers.
  auto pre = c.Options("/v1/chat/completions",
                       httplib::Headers{{"Origin", "https://app.example"},
                                        {"Access-Control-Request-Method", "POST"},
                                        {"Access-Control-Request-Headers", "authorization"}});
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 200);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "authorization");
  auto bad = c.Options("/v1/chat/completions",
                       httplib::Headers{{"Origin", "https://evil.example"},
                                        {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_FALSE(bad->has_header("Access-Control-Allow-Origin"));
  auto cross = c.Get("/v1/models", httplib::Headers{{"Origin", "https://app.example"}});
  ASSERT_TRUE(cross);
  EXPECT_EQ(cross->status, 401);
  EXPECT_EQ(cross->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  auto other = c.Get("/health", httplib::Headers{{"Origin", "https://evil.example"}});
  ASSERT_TRUE(other);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));

  InProcess pub(0, 64 << 10, EngineOptions{}, "", configure(true));
  auto pm = pub.client().Get("/metrics");
  ASSERT_TRUE(pm);
  EXPECT_EQ(pm->status, 200);
  auto pv = pub.client().Get("/v1/models");
  ASSERT_TRUE(pv);
  EXPECT_EQ(pv->status, 401);
}

TEST(AccessControl, NoOriginsMeansNoCrossOriginAccess) {
  InProcess s;
  auto c = s.client();
  auto pre = c.Options("/v1/chat/completions",
                       httplib::Headers{{"Origin", "https://app.example"},
                                        {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 405);
  EXPECT_FALSE(pre->has_header("Access-Control-Allow-Origin"));
  auto r = c.Get("/v1/models", httplib::Headers{{"Origin", "https://app.example"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);  // no keys: open
  EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
}

// The binary: a key from each source, the official clients, the warning on a network address.
TEST(AccessControl, OfficialClientsWithKeysOnTheRealBinary) {
  dsv41::testing::TempDir dir;
  const std::string tiny = dir.path() + "/tiny";
  ASSERT_TRUE(dsv41::testing::make_tiny_official(tiny).is_ok());
  std::ofstream(dir.file("keys")) << "sk-from-file\n";
  ServeProcess p;
  {
    setenv("DSV41_API_KEY", "sk-from-env", 1);  // for this child only, whatever happens
    struct Unset {
      ~Unset() { unsetenv("DSV41_API_KEY"); }
    } unset;
    ASSERT_TRUE(p.start(tiny, dir.path() + "/serve.log",
                        {"--api-key", "sk-from-flag", "--api-key-file", dir.file("keys")}));
  }
  for (const char* key : {"sk-from-flag", "sk-from-file", "sk-from-env"}) {
    auto [code, out] = run_command(std::string("node ") + DSV41_JS_DIR + "/api_key_test.mjs " +
                                   "http://127.0.0.1:" + std::to_string(p.port) + " tiny " + key);
    EXPECT_EQ(code, 0) << key << "\n" << out;
    EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
  }
  // The open-file limit was raised to the hard one (each connection holds a descriptor).
  {
    std::ifstream lim("/proc/" + std::to_string(p.pid) + "/limits");
    std::string line, soft, hard;
    while (std::getline(lim, line))
      if (line.rfind("Max open files", 0) == 0) {
        std::istringstream(line.substr(14)) >> soft >> hard;
        break;
      }
    EXPECT_FALSE(soft.empty());
    EXPECT_EQ(soft, hard) << "soft " << soft << ", hard " << hard;
  }
  kill(p.pid, SIGTERM);
  EXPECT_EQ(p.wait_exit(), 0);
  std::ifstream log(p.log_path);
  const std::string said(std::istreambuf_iterator<char>(log), {});
  EXPECT_EQ(said.find("with no API key"), std::string::npos) << said;

  // No key on an address other machines reach: a warning (given before the model loads, so a
  // missing model shows it at once); a bad key file: exit 2 naming it.
  auto [wcode, wout] = run_command(std::string(DSV41_BINARY) + " serve --model " +
                                   dir.file("absent") + " --host 0.0.0.0 --port 0 2>&1");
  EXPECT_NE(wcode, 0) << wout;
  EXPECT_NE(wout.find("listening on 0.0.0.0 with no API key"), std::string::npos) << wout;
  auto [code, out] = run_command(std::string(DSV41_BINARY) + " serve --model " + tiny +
                                 " --port 0 --api-key-file " + dir.file("absent") + " 2>&1");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--api-key-file: cannot read " + dir.file("absent")), std::string::npos)
      << out;
}

// --log-requests json: one JSON line on stdout per generation request, with its figures; the
// prompt only with --log-prompts; a request refused before the engine gets a record too.
TEST(RequestLog, JsonLinesWithTheRequestsFigures) {
  for (const bool prompts : {false, true}) {
    ::testing::internal::CaptureStdout();
    std::string ids[2];
    {
      InProcess s(0, 64 << 10, EngineOptions{}, "", [prompts](ServerOptions& so) {
        so.request_log = ServerOptions::RequestLog::kJson;
        so.log_prompts = prompts;
      });
      auto c = s.client();
      auto a = c.Post(
          "/v1/chat/completions",
          R"({"model":"scripted","max_tokens":3,"messages":[{"role":"user","content":"secret words"}]})",
          "application/json");
      ASSERT_TRUE(a);
      ASSERT_EQ(a->status, 200);
      ids[0] = a->get_header_value("X-Request-Id");
      auto b = c.Post("/v1/completions",
                      R"({"model":"scripted","prompt":"hi","max_tokens":2,"stream":true})",
                      "application/json");
      ASSERT_TRUE(b);
      ids[1] = b->get_header_value("X-Request-Id");
      auto bad = c.Post("/v1/completions", R"({"model":"scripted","prompt":"hi","max_tokens":-1})",
                        "application/json");
      ASSERT_TRUE(bad);
      EXPECT_EQ(bad->status, 400);
      auto h = c.Get("/health");  // not a generation request: no record
      ASSERT_TRUE(h);
    }
    const std::string out = ::testing::internal::GetCapturedStdout();
    std::vector<nlohmann::json> recs;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) recs.push_back(nlohmann::json::parse(line));
    ASSERT_EQ(recs.size(), 3u) << out;
    int seen = 0;
    for (const auto& r : recs) {
      EXPECT_TRUE(r["time"].get<std::string>().ends_with("Z")) << r;
      EXPECT_TRUE(r["client"].get<std::string>().starts_with("127.0.0.1:")) << r;
      if (r["status"] == 400) {
        EXPECT_TRUE(r["id"].is_null()) << r;
        EXPECT_EQ(r["api"], "/v1/completions");
        continue;
      }
      ++seen;
      const bool chat = r["api"] == "/v1/chat/completions";
      EXPECT_EQ(r["id"], ids[chat ? 0 : 1]) << r;
      EXPECT_EQ(r["status"], 200);
      EXPECT_EQ(r["finish_reasons"], nlohmann::json::array({"length"})) << r;
      EXPECT_GT(r["prompt_tokens"].get<int>(), 0);
      EXPECT_EQ(r["cached_tokens"], 0);
      EXPECT_EQ(r["output_tokens"], chat ? 3 : 2);
      EXPECT_GE(r["queue_s"].get<double>(), 0.0) << r;
      EXPECT_GE(r["ttft_s"].get<double>(), r["queue_s"].get<double>()) << r;
      EXPECT_GE(r["e2e_s"].get<double>(), r["ttft_s"].get<double>()) << r;
      EXPECT_EQ(r.contains("prompt"), prompts) << r;
      if (prompts && chat)
        EXPECT_NE(r["prompt"].get<std::string>().find("secret words"), std::string::npos) << r;
    }
    EXPECT_EQ(seen, 2);
    if (!prompts) EXPECT_EQ(out.find("secret words"), std::string::npos);
  }
}

// A server that listens before its model is in: 503 "loading" with the progress on /health, 503
// with Retry-After (each API's error shape) on the API, the page's files served; then attach():
// 200, and the sampling defaults handed over with the model.
TEST(Loading, ServerAnswers503UntilTheModelIsAttached) {
  InProcess backing;  // its engine is attached below
  ServerOptions so;
  so.port = 0;
  so.model_name = "scripted";
  HttpServer server(so, 8);
  ASSERT_TRUE(server.bind().is_ok());
  std::thread serving([&] { server.serve(); });
  httplib::Client c("127.0.0.1", server.port());
  set_load_progress("loading weights: resident", 0.25);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  auto hj = nlohmann::json::parse(h->body);
  EXPECT_EQ(hj["status"], "loading");
  EXPECT_EQ(hj["progress"]["stage"], "loading weights: resident");
  EXPECT_EQ(hj["progress"]["fraction"], 0.25);
  EXPECT_GE(hj["progress"]["seconds"].get<double>(), 0.0);
  for (const char* path : {"/v1/models", "/metrics"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 503) << path;
    EXPECT_EQ(r->get_header_value("Retry-After"), "5") << path;
  }
  auto chat =
      c.Post("/v1/chat/completions", R"({"model":"scripted","messages":[]})", "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 503);
  EXPECT_NE(nlohmann::json::parse(chat->body)["error"]["message"].get<std::string>().find(
                "the model is loading (loading weights: resident)"),
            std::string::npos)
      << chat->body;
  auto msg = c.Post("/v1/messages", R"({"model":"scripted","messages":[]})", "application/json");
  ASSERT_TRUE(msg);
  EXPECT_EQ(nlohmann::json::parse(msg->body)["error"]["type"], "overloaded_error") << msg->body;
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  set_load_progress("");

  SamplingDefaults defaults;
  defaults.temperature = 0.5;
  server.attach(*backing.engine, defaults);
  auto ok = c.Get("/health");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(nlohmann::json::parse(models->body)["data"][0]["default_sampling"]["temperature"], 0.5)
      << models->body;
  auto answer = c.Post("/v1/completions", R"({"model":"scripted","prompt":"hi","max_tokens":2})",
                       "application/json");
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 200) << answer->body;
  server.shutdown();
  serving.join();
}

// The binary on a fresh cache (it makes the demo model first, seconds of work): /health answers
// 503 "loading" within a second of the start, never refuses a connection, then 200.
TEST(Loading, TheBinaryAnswersWhileItMakesAndLoadsTheModel) {
  dsv41::testing::TempDir dir;
  auto [code, out] =
      run_command(std::string("python3 ") + DSV41_JS_DIR + "/../server/health_while_loading.py " +
                  DSV41_BINARY + " " + dir.path() + "/cache");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
}

// --ssl-certfile / --ssl-keyfile: HTTPS with a self-signed certificate made here, through the
// official clients (its CA given to node), with an API key too; plain HTTP gets no answer; a key
// that is not the certificate's is refused at start naming both files.
TEST(Tls, OfficialClientsOverHttpsWithASelfSignedCertificate) {
  dsv41::testing::TempDir dir;
  const std::string cert = dir.file("cert.pem"), key = dir.file("key.pem");
  auto [made, made_log] = run_command(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost -addext "
      "subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " +
      key + " -out " + cert + " 2>&1");
  ASSERT_EQ(made, 0) << made_log;
  const std::string tiny = dir.path() + "/tiny";
  ASSERT_TRUE(dsv41::testing::make_tiny_official(tiny).is_ok());
  ServeProcess p;
  ASSERT_TRUE(p.start(tiny, dir.path() + "/serve.log",
                      {"--ssl-certfile", cert, "--ssl-keyfile", key, "--api-key", "sk-tls"}));
  auto [code, out] =
      run_command("NODE_EXTRA_CA_CERTS=" + cert + " node " + DSV41_JS_DIR +
                  "/api_key_test.mjs https://127.0.0.1:" + std::to_string(p.port) + " tiny sk-tls");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
  httplib::Client plain("127.0.0.1", p.port);
  plain.set_read_timeout(5, 0);
  auto r = plain.Get("/health");
  EXPECT_FALSE(r && r->status == 200);  // a TLS port does not speak plain HTTP
  kill(p.pid, SIGTERM);
  EXPECT_EQ(p.wait_exit(), 0);

  auto [bad, bad_log] =
      run_command(std::string(DSV41_BINARY) + " serve --model " + tiny +
                  " --port 0 --ssl-certfile " + cert + " --ssl-keyfile " + cert + " 2>&1");
  EXPECT_NE(bad, 0) << bad_log;
  EXPECT_NE(bad_log.find("--ssl-certfile " + cert + " / --ssl-keyfile " + cert), std::string::npos)
      << bad_log;
  auto [half, half_log] = run_command(std::string(DSV41_BINARY) + " serve --model " + tiny +
                                      " --port 0 --ssl-certfile " + cert + " 2>&1");
  EXPECT_EQ(half, 1) << half_log;
  EXPECT_NE(half_log.find("go together"), std::string::npos) << half_log;
}

// Raw HTTP on a fresh connection: sends `head`, then up to `chunks` chunks of `chunk` bytes of a
// chunked body while the server reads; returns what the server answered (its status line first)
// and how many chunks went out before it answered or closed.
std::pair<std::string, int> raw_exchange(int port, const std::string& head, int chunks,
                                         std::size_t chunk) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  auto send_all = [&](const std::string& d) {
    return ::send(fd, d.data(), d.size(), MSG_NOSIGNAL) == ssize_t(d.size());
  };
  send_all(head);
  int sent = 0;
  const std::string piece = fmt::format("{:x}\r\n", chunk) + std::string(chunk, 'x') + "\r\n";
  for (; sent < chunks; ++sent) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0 || !send_all(piece)) break;  // answered (or closed) meanwhile
  }
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, std::size_t(n));
  ::close(fd);
  return {got, sent};
}

long rss_kb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}

// --max-body-mb holds for a chunked body (413 once the limit is passed, the rest never read: 64 MB
// offered, the server's memory does not grow by it) and header lines are capped (431).
TEST(Limits, ChunkedBodiesAndHeaderFloodsAreRefused) {
  InProcess s;  // bodies up to 64 KB
  // A chunked body within the limit is answered as usual (and warms the server up before its
  // memory is read).
  const std::string ok_body = R"({"model":"scripted","prompt":"hi","max_tokens":2})";
  const std::string chunked_head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n";
  for (int i = 0; i < 2; ++i) {
    auto [ok, ok_sent] =
        raw_exchange(s.port,
                     chunked_head + "Connection: close\r\n\r\n" +
                         fmt::format("{:x}\r\n", ok_body.size()) + ok_body + "\r\n0\r\n\r\n",
                     0, 0);
    EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok.substr(0, 300);
  }
  const long before = rss_kb();
  auto [answer, sent] = raw_exchange(s.port, chunked_head + "\r\n", 64, 1 << 20);
  const long grown = rss_kb() - before;
  EXPECT_EQ(answer.rfind("HTTP/1.1 413", 0), 0u) << answer.substr(0, 200);
  EXPECT_NE(answer.find("larger than 65536 bytes"), std::string::npos) << answer.substr(0, 400);
  EXPECT_LT(sent, 64) << "the server read the whole 64 MB";
  EXPECT_LT(grown, 50 * 1024) << "RSS grew by " << grown << " kB (" << sent << " MB sent)";
  std::string flood = "GET /health HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 20000; ++i) flood += fmt::format("X-Filler-{}: {}\r\n", i, i);
  auto [refused, unused] = raw_exchange(s.port, flood + "Connection: close\r\n\r\n", 0, 0);
  EXPECT_EQ(refused.rfind("HTTP/1.1 431", 0), 0u) << refused.substr(0, 300);
  // (The parser stops at the byte cap, before it could count 20,000 lines: the answer names the
  // caps.)
  EXPECT_NE(refused.find("request headers too large"), std::string::npos) << refused.substr(0, 400);
  EXPECT_NE(refused.find("at most 200 lines and 65536 bytes"), std::string::npos)
      << refused.substr(0, 400);
  auto h = s.client().Get("/health");  // the server is fine
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

}  // namespace
}  // namespace dsv41::server_testing
