// The chat page and the dashboard (GET /, /dashboard, /web/NAME): built into the binary, served
// with a policy that keeps them to this server and nothing to fetch from elsewhere; then the whole
// page in Debian's chromium, headless (tests/js/browser_test.mjs): a streamed answer with its
// reasoning folded and a tool call, a 400 naming its parameter, stop, a 429, the dashboard's plots
// updating. Screenshots go to DSV41_ARTIFACTS_DIR/browser.
#include <gtest/gtest.h>

#include <string>

#include "server/server_harness.h"
#include "server/web_assets.h"

namespace dsv41::server_testing {
namespace {

TEST(Web, PagesAreBuiltInAndFetchNothingFromElsewhere) {
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
  // One sequence at a time and a queue of one: the page's test fills both to see a 429. 50 ms a
  // step gives the page time to click Stop before the scripted answer ends.
  EngineOptions eo;
  eo.max_num_seqs = 1;
  eo.max_queue = 1;
  InProcess s(/*sleep_ms=*/50, 64 << 10, eo);
  const std::string out = std::string(DSV41_ARTIFACTS_DIR) + "/browser";
  const std::string cmd = std::string("node ") + DSV41_JS_DIR +
                          "/browser_test.mjs http://127.0.0.1:" + std::to_string(s.port) + " " +
                          out;
  auto [code, log] = run_command(cmd);
  EXPECT_EQ(code, 0) << log;
  EXPECT_NE(log.find("all checks passed"), std::string::npos) << log;
  std::printf("screenshots in %s\n", out.c_str());
}

}  // namespace
}  // namespace dsv41::server_testing
