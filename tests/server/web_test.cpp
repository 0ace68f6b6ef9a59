// The chat page and the dashboard (GET /, /dashboard, /web/NAME): built into the binary, served
// with a policy that keeps them to this server and nothing to fetch from elsewhere; then the whole
// page in Debian's chromium, headless (tests/js/browser_test.mjs): a streamed answer with its
// reasoning folded and a tool call, a 400 naming its parameter, stop, a 429, the dashboard's plots
// updating, and a server with an API key (the page asks for it once). Screenshots go to
// DSV41_ARTIFACTS_DIR/browser.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "model/tiny_converted.h"
#include "server/server_harness.h"
#include "server/web_assets.h"

namespace dsv41::server_testing {
namespace {

TEST(Web, PagesAreBuiltInAndFetchNothingFromElsewhere) {
  // The binary holds exactly the files of src/server/web, byte for byte (a stale or partial
  // embedding fails here).
  std::vector<std::string> on_disk;
  for (const auto& f : std::filesystem::directory_iterator(DSV41_WEB_DIR))
    on_disk.push_back(f.path().filename().string());
  std::sort(on_disk.begin(), on_disk.end());
  std::vector<std::string> embedded;
  for (const WebAsset& a : web_assets()) embedded.emplace_back(a.name);
  EXPECT_EQ(embedded, on_disk);
  for (const WebAsset& a : web_assets())
    EXPECT_TRUE(a.body ==
                dsv41::testing::read_file(std::string(DSV41_WEB_DIR) + "/" + std::string(a.name)))
        << a.name;
  ASSERT_GE(web_assets().size(), 5u);
  for (const WebAsset& a : web_assets()) {
    EXPECT_FALSE(a.body.empty()) << a.name;
    // No CDN, no remote font or script: every reference is to this server.
    EXPECT_EQ(a.body.find("http://"), std::string_view::npos) << a.name;
    EXPECT_EQ(a.body.find("https://"), std::string_view::npos) << a.name;
    EXPECT_EQ(a.body.find("//cdn"), std::string_view::npos) << a.name;
  }
  InProcess s;
  auto c = s.client();
  const std::pair<const char*, const char*> pages[] = {{"/", "text/html"},
                                                       {"/dashboard", "text/html"},
                                                       {"/web/chat.js", "text/javascript"},
                                                       {"/web/dashboard.js", "text/javascript"},
                                                       {"/web/style.css", "text/css"}};
  for (const auto& [path, type] : pages) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
    EXPECT_EQ(r->get_header_value("Content-Type").rfind(type, 0), 0u)
        << path << ": " << r->get_header_value("Content-Type");
    EXPECT_NE(r->get_header_value("Content-Security-Policy").find("default-src 'self'"),
              std::string::npos)
        << path;
    EXPECT_FALSE(r->body.empty()) << path;
  }
  auto index = c.Get("/");
  ASSERT_TRUE(index);
  EXPECT_NE(index->body.find("/web/chat.js"), std::string::npos);
  EXPECT_NE(index->body.find("/dashboard"), std::string::npos);  // the link across
  // Only embedded names are served (nothing is read from disk, so an escaping path has nowhere
  // to go; checked as a guard).
  for (const char* missing : {"/web/nothing.js", "/web/..%2Fhttp_server.cpp"}) {
    auto r = c.Get(missing);
    ASSERT_TRUE(r) << missing;
    EXPECT_EQ(r->status, 404) << missing;
  }
  auto post = c.Post("/", "{}", "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  // The dashboard's throughput reads the engine's live token counters.
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* name :
       {"dsv41_engine_generated_tokens_total ", "dsv41_engine_prompt_tokens_total "})
    EXPECT_NE(m->body.find(name), std::string::npos) << name;
}

TEST(Web, ChatPageAndDashboardInAHeadlessBrowser) {
  // The chat page on the scripted model (a known answer: reasoning, text, a tool call). One
  // sequence at a time and a queue of one: the page's test fills both to see a 429. 50 ms a step;
  // while the page's test holds `hold` (a file it creates), the answer stops after its third
  // token, so the test sees it half-streamed and clicks Stop before it ends, however slow the
  // machine.
  EngineOptions eo;
  eo.max_num_seqs = 1;
  eo.max_queue = 1;
  dsv41::testing::TempDir dir;
  const std::string hold = dir.path() + "/hold";
  InProcess chat(/*sleep_ms=*/50, 64 << 10, eo, hold);
  // The dashboard on the tiny model's fast path: a bounded KV pool and the prefix cache, so that
  // its KV, hit-rate and time-to-first-token plots have something to show.
  EngineOptions fo;
  fo.model_dir = dsv41::testing::make_tiny_converted(dir, 5);
  fo.fast.kv_cache_gb = 0.05;
  auto fast_engine = Engine::load(fo);
  ASSERT_TRUE(fast_engine.is_ok()) << fast_engine.status().message();
  InProcess fast(std::move(*fast_engine));
  // A third, scripted, with an API key: the page asks for it and keeps it (issue 37).
  InProcess keyed(0, 64 << 10, EngineOptions{}, "", [](ServerOptions& so) {
    auto keys = ApiKeys::load({"sk-page"}, "", "");
    ASSERT_TRUE(keys.is_ok());
    so.api_keys = std::move(*keys);
  });
  const std::string out = std::string(DSV41_ARTIFACTS_DIR) + "/browser";
  const std::string cmd = std::string("node ") + DSV41_JS_DIR +
                          "/browser_test.mjs http://127.0.0.1:" + std::to_string(chat.port) +
                          " http://127.0.0.1:" + std::to_string(fast.port) + " " + out + " " +
                          hold + " http://127.0.0.1:" + std::to_string(keyed.port);
  auto [code, log] = run_command(cmd);
  std::filesystem::remove(hold);  // a test that died holding the model must not stall its engine
  EXPECT_EQ(code, 0) << log;
  EXPECT_NE(log.find("all checks passed"), std::string::npos) << log;
  std::printf("%sscreenshots in %s\n", log.c_str(), out.c_str());  // the checks, one a line
}

}  // namespace
}  // namespace dsv41::server_testing
