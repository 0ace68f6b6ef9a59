// Image input through `dsv41 serve` (issue 33 item 4): a user message's image_url parts (data:
// URLs) become their images' spans on the tiny random model, which has a vision tower of its own;
// the real `openai` client end to end (tests/js/image_input_test.mjs); an image request's greedy
// answer is the same alone and among concurrent text requests (batch invariance); the errors name
// the part.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/image_inputs.h"
#include "server/server_harness.h"

namespace dsv41::server_testing {
namespace {

using Json = nlohmann::json;

const std::string kImageFile = std::string(DSV41_JS_DIR) + "/../fuzz/corpus/image/rgb.png";

std::string data_url(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string bytes = ss.str();
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out = "data:image/png;base64,";
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 |
                       uint8_t(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out += a[(v >> (6 * k)) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += a[(v >> 18) & 63];
    out += a[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? a[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

TEST(ImageInput, Base64AndDataUrls) {
  EXPECT_EQ(decode_base64("aGVsbG8="), std::optional<std::string>("hello"));
  EXPECT_EQ(decode_base64("aGVsbG8"), std::optional<std::string>("hello"));
  EXPECT_EQ(decode_base64(""), std::optional<std::string>(""));
  EXPECT_FALSE(decode_base64("aGV$bG8=").has_value());
  EXPECT_FALSE(decode_base64("a").has_value());
  auto ok = read_data_url("data:image/png;base64,aGk=", 100);
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(*ok, "hi");
  EXPECT_FALSE(read_data_url("data:image/png,hi", 100).is_ok());        // not base64
  EXPECT_FALSE(read_data_url("data:image/png;base64,aGk", 0).is_ok());  // over the limit
  auto http = read_data_url("https://example.com/a.png", 100);
  ASSERT_FALSE(http.is_ok());
  EXPECT_NE(http.status().message().find("'https:'"), std::string::npos) << http.status().message();
}

class ImageServe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new dsv41::testing::TempDir();
    ASSERT_TRUE(dsv41::testing::make_tiny_official(dir_->path() + "/tiny").is_ok());
    p_ = new ServeProcess();
    ASSERT_TRUE(p_->start(dir_->path() + "/tiny", dir_->path() + "/serve.log"));
  }
  static void TearDownTestSuite() {
    kill(p_->pid, SIGTERM);
    EXPECT_EQ(p_->wait_exit(), 0);
    delete p_;
    delete dir_;
  }
  static Json post(const Json& body, int* status = nullptr) {
    httplib::Client c("127.0.0.1", p_->port);
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return Json();
    if (status) *status = r->status;
    return Json::parse(r->body);
  }
  static Json image_request(const std::string& url, int max_tokens = 8) {
    return {{"model", "tiny"},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"logprobs", true},
            {"messages",
             {{{"role", "user"},
               {"content",
                {{{"type", "text"}, {"text", "Describe it."}},
                 {{"type", "image_url"}, {"image_url", {{"url", url}}}}}}}}}};
  }
  static dsv41::testing::TempDir* dir_;
  static ServeProcess* p_;
};
dsv41::testing::TempDir* ImageServe::dir_ = nullptr;
ServeProcess* ImageServe::p_ = nullptr;

TEST_F(ImageServe, TheOpenAiClientSendsImages) {
  // rgb.png on the tiny preset: 2 x 2 LLM tokens, a span of 8
  // (Cli.ImageEmbedWritesThePatchesAndThePlan).
  auto [code, out] = run_command(node_client(p_->port, "tiny", "basic", "image_input_test.mjs") +
                                 " " + kImageFile + " 8");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
}

TEST_F(ImageServe, TheAnthropicClientSendsImages) {
  auto [code, out] = run_command(
      node_client(p_->port, "tiny", "basic", "anthropic_image_test.mjs") + " " + kImageFile + " 8");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
}

// The Responses API's input_image parts (image_url: a data: URL): the span in the usage, errors
// naming the part.
TEST_F(ImageServe, ResponsesInputImages) {
  httplib::Client c("127.0.0.1", p_->port);
  c.set_read_timeout(120, 0);
  auto ask = [&](const Json& content, int* status) {
    Json body = {{"model", "tiny"},
                 {"max_output_tokens", 4},
                 {"temperature", 0},
                 {"input", Json::array({Json{{"role", "user"}, {"content", content}}})}};
    auto r = c.Post("/v1/responses", body.dump(), "application/json");
    EXPECT_TRUE(r);
    *status = r ? r->status : 0;
    return r ? Json::parse(r->body) : Json();
  };
  const Json text = {{"type", "input_text"}, {"text", "What is it?"}};
  int st = 0;
  const Json with =
      ask({text, {{"type", "input_image"}, {"image_url", data_url(kImageFile)}}}, &st);
  ASSERT_EQ(st, 200) << with;
  const Json plain = ask(Json::array({text}), &st);
  ASSERT_EQ(st, 200) << plain;
  EXPECT_EQ(with["usage"]["input_tokens"].get<int>() - plain["usage"]["input_tokens"].get<int>(), 8)
      << with["usage"] << plain["usage"];
  Json bad = ask(Json::array({text, {{"type", "input_image"}, {"file_id", "file-1"}}}), &st);
  EXPECT_EQ(st, 400) << bad;
  EXPECT_EQ(bad["error"]["param"], "input[0].content[1].image_url") << bad;
  bad = ask(
      Json::array({text, {{"type", "input_image"}, {"image_url", "https://example.com/a.png"}}}),
      &st);
  EXPECT_EQ(st, 400) << bad;
  EXPECT_EQ(bad["error"]["param"], "input[0].content[1].image_url") << bad;
  bad = ask(Json::array({Json{{"type", "input_image"}, {"image_url", data_url(kImageFile)}},
                         Json{{"type", "nope"}}}),
            &st);
  EXPECT_EQ(st, 400) << bad;
  EXPECT_EQ(bad["error"]["param"].get<std::string>().rfind("input[0].content[1]", 0), 0u) << bad;
}

TEST_F(ImageServe, AnImageRequestIsTheSameAloneAndAmongOthers) {
  const Json req = image_request(data_url(kImageFile));
  int status = 0;
  const Json alone = post(req, &status);
  ASSERT_EQ(status, 200) << alone;
  // The same request while six text requests of other lengths run beside it.
  std::vector<std::thread> others;
  for (int i = 0; i < 6; ++i)
    others.emplace_back([i] {
      Json b = {{"model", "tiny"},
                {"max_tokens", 24 + 4 * i},
                {"temperature", 1},
                {"messages",
                 {{{"role", "user"}, {"content", "Tell me about number " + std::to_string(i)}}}}};
      post(b);
    });
  const Json mixed = post(req, &status);
  for (auto& t : others) t.join();
  ASSERT_EQ(status, 200) << mixed;
  EXPECT_EQ(alone["choices"], mixed["choices"]);
  EXPECT_EQ(alone["usage"]["prompt_tokens"], mixed["usage"]["prompt_tokens"]);
}

TEST_F(ImageServe, BadImagePartsAreRefusedNamingThePart) {
  int status = 0;
  // A PNG cut short.
  Json r = post(image_request(data_url(kImageFile).substr(0, 60)), &status);
  EXPECT_EQ(status, 400) << r;
  EXPECT_EQ(r["error"]["param"], "messages[0].content[1].image_url") << r;
  // The placeholder typed as text, with no image.
  r = post({{"model", "tiny"},
            {"max_tokens", 2},
            {"messages", {{{"role", "user"}, {"content", "see <｜deepseek_image｜>"}}}}},
           &status);
  EXPECT_EQ(status, 400) << r;
  EXPECT_NE(r["error"]["message"].get<std::string>().find("placeholder"), std::string::npos) << r;
  // An image in an assistant message.
  r = post({{"model", "tiny"},
            {"max_tokens", 2},
            {"messages",
             {{{"role", "user"}, {"content", "hi"}},
              {{"role", "assistant"},
               {"content",
                {{{"type", "image_url"}, {"image_url", {{"url", data_url(kImageFile)}}}}}}}}}},
           &status);
  EXPECT_EQ(status, 400) << r;
  EXPECT_EQ(r["error"]["param"], "messages[1].content[0].type") << r;
  // The server lives on.
  r = post(image_request(data_url(kImageFile), 2), &status);
  EXPECT_EQ(status, 200) << r;
}

}  // namespace
}  // namespace dsv41::server_testing
