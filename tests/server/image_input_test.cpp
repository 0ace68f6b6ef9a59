// Image input through `dsv41 serve` (issue 33 item 4): a user message's image_url parts (data:
// URLs) become their images' spans on the tiny random model, which has a vision tower of its own;
// the real `openai` client end to end (tests/js/image_input_test.mjs); an image request's greedy
// answer is the same alone and among concurrent text requests (batch invariance); the errors name
// the part. http(s) URLs (--allow-image-urls, fetched from image_origin.h's server) and file://
// URLs (--allowed-local-media-path) answer as the data: URL of the same file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/image_inputs.h"
#include "server/image_origin.h"
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

// The next turn of a conversation about an image: the image is not encoded again (the encoder's
// cache, /metrics), its span comes from the prefix cache (cached_tokens past the span), and the
// answer is the one a server without a prefix cache gives.
TEST_F(ImageServe, AFollowUpTurnReusesTheEncodedImageAndTheCachedSpan) {
  auto counter = [&](const std::string& name) {
    httplib::Client c("127.0.0.1", p_->port);
    auto r = c.Get("/metrics");
    EXPECT_TRUE(r);
    const std::size_t at = r->body.find("\n" + name + " ");
    EXPECT_NE(at, std::string::npos) << name;
    return std::stoll(r->body.substr(at + name.size() + 2));
  };
  // A picture of its own (other tests send rgb.png): another file, so the first request encodes
  // it. The probe asks with nothing after the image: its prompt ends at most a few tokens after
  // the span, so its length bounds where the span ends.
  const std::string url = data_url(std::string(DSV41_JS_DIR) + "/../fuzz/corpus/image/palette.png");
  Json probe = image_request(url, 2);
  probe["messages"][0]["content"][0]["text"] = "A first question about this picture.";
  const int64_t enc0 = counter("dsv41_image_encodes_total");
  const int64_t hit0 = counter("dsv41_image_cache_hits_total");
  int status = 0;
  const Json p0 = post(probe, &status);
  ASSERT_EQ(status, 200) << p0;
  const int span_end_bound = p0["usage"]["prompt_tokens"].get<int>();
  EXPECT_EQ(counter("dsv41_image_encodes_total"), enc0 + 1);
  // Turn 1 goes on after the image for long enough that whole cache blocks cover the span.
  Json turn1 = probe;
  std::string more;
  for (int i = 0; i < 60; ++i) more += "and then some more words ";
  turn1["messages"][0]["content"].push_back({{"type", "text"}, {"text", more}});
  turn1["max_tokens"] = 6;
  const Json a1 = post(turn1, &status);
  ASSERT_EQ(status, 200) << a1;
  Json turn2 = turn1;
  turn2["messages"].push_back(
      {{"role", "assistant"}, {"content", a1["choices"][0]["message"]["content"]}});
  turn2["messages"].push_back({{"role", "user"}, {"content", "And what else?"}});
  const Json a2 = post(turn2, &status);
  ASSERT_EQ(status, 200) << a2;
  EXPECT_EQ(counter("dsv41_image_encodes_total"), enc0 + 1) << "encoded again";
  EXPECT_EQ(counter("dsv41_image_cache_hits_total"), hit0 + 2);
  // The span lies inside the prefix turn 2 took from the cache.
  EXPECT_GE(a2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), span_end_bound)
      << a2["usage"] << " (the probe's prompt: " << span_end_bound << " tokens)";
  // The same turn on a server that caches nothing: the same answer.
  ServeProcess cold;
  ASSERT_TRUE(cold.start(dir_->path() + "/tiny", dir_->path() + "/cold.log",
                         {"--prefix-cache", "off", "--image-cache-mb", "0"}));
  httplib::Client c("127.0.0.1", cold.port);
  c.set_read_timeout(120, 0);
  auto r = c.Post("/v1/chat/completions", turn2.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Json cold_a2 = Json::parse(r->body);
  EXPECT_EQ(cold_a2["choices"], a2["choices"]);
  EXPECT_EQ(cold_a2["usage"]["prompt_tokens"], a2["usage"]["prompt_tokens"]);
  EXPECT_EQ(cold_a2["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  kill(cold.pid, SIGTERM);
  EXPECT_EQ(cold.wait_exit(), 0);
}

// /tokenize shows an image part as its span.
TEST_F(ImageServe, TokenizeShowsTheSpan) {
  httplib::Client c("127.0.0.1", p_->port);
  Json body = image_request(data_url(kImageFile));
  auto r = c.Post("/tokenize", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Json j = Json::parse(r->body);
  ASSERT_EQ(j["images"].size(), 1u) << j;
  EXPECT_EQ(j["images"][0]["span"], 8);
  const int start = j["images"][0]["start"];
  const int id = j["tokens"][start];
  for (int i = 0; i < 8; ++i) EXPECT_EQ(j["tokens"][start + i], id);
  EXPECT_NE(j["tokens"][start + 8], id);
  int status = 0;
  const Json answered = post(image_request(data_url(kImageFile), 2), &status);
  EXPECT_EQ(answered["usage"]["prompt_tokens"], j["count"]);
}

// prompt_logprobs on a request with an image: one entry per prompt token (null for the first),
// the span's positions included (each the image token with the logprob its row gives it), and a
// repeated identical request takes no cached prefix (its rows would have no logits) and gives the
// same entries. A plain repeat of the prompt does find it cached: the refusal is the engine's.
TEST_F(ImageServe, PromptLogprobsCoverTheImageSpanAndTakeNoCachedPrefix) {
  Json req = image_request(data_url(kImageFile), 1);
  std::string more;
  for (int i = 0; i < 40; ++i) more += "with a few more words about it ";
  req["messages"][0]["content"].push_back({{"type", "text"}, {"text", more}});
  req["prompt_logprobs"] = 0;
  // The prompt's ids and span, as /tokenize shows them.
  httplib::Client c("127.0.0.1", p_->port);
  auto tr = c.Post("/tokenize", req.dump(), "application/json");
  ASSERT_TRUE(tr);
  ASSERT_EQ(tr->status, 200) << tr->body;
  const Json tj = Json::parse(tr->body);
  ASSERT_EQ(tj["images"].size(), 1u) << tj;
  const int start = tj["images"][0]["start"], span = tj["images"][0]["span"];
  EXPECT_EQ(span, 8);
  const std::vector<int> ids = tj["tokens"].get<std::vector<int>>();
  int status = 0;
  const Json first = post(req, &status);
  ASSERT_EQ(status, 200) << first;
  ASSERT_EQ(first["usage"]["prompt_tokens"].get<std::size_t>(), ids.size()) << first["usage"];
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << first["usage"];
  const Json& lp = first["prompt_logprobs"];
  ASSERT_TRUE(lp.is_array()) << first;
  ASSERT_EQ(lp.size(), ids.size());
  EXPECT_TRUE(lp[0].is_null());
  for (std::size_t i = 1; i < ids.size(); ++i) {
    // prompt_logprobs 0: the prompt token alone, with a finite logprob and its rank.
    ASSERT_EQ(lp[i].size(), 1u) << i << ": " << lp[i];
    const Json& e = lp[i].at(std::to_string(ids[i]));
    EXPECT_TRUE(e["logprob"].is_number()) << i << ": " << lp[i];
    EXPECT_LE(e["logprob"].get<double>(), 0.0) << i;
    EXPECT_GE(e["rank"].get<int>(), 1) << i;
  }
  for (int i = start; i < start + span; ++i)
    EXPECT_EQ(ids[std::size_t(i)], ids[std::size_t(start)]);
  const Json again = post(req, &status);
  ASSERT_EQ(status, 200) << again;
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << again["usage"];
  EXPECT_EQ(again["prompt_logprobs"].size(), lp.size());
  EXPECT_TRUE(again["prompt_logprobs"] == lp) << "the repeat's prompt_logprobs differ";
  Json plain = req;
  plain.erase("prompt_logprobs");
  const Json cached = post(plain, &status);
  ASSERT_EQ(status, 200) << cached;
  EXPECT_GT(cached["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), start + span)
      << cached["usage"];
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

// Without --allow-image-urls and --allowed-local-media-path, http(s) and file:// URLs are 400s
// that name the part and the flag (the chat, Responses and Anthropic APIs alike).
TEST_F(ImageServe, ImageUrlsAndLocalFilesNeedTheirFlags) {
  ImageOrigin origin;  // a URL that would answer: the refusal is the flag's, not the fetch's
  int status = 0;
  Json r = post(image_request(origin.url("/img.png")), &status);
  EXPECT_EQ(status, 400) << r;
  EXPECT_EQ(r["error"]["param"], "messages[0].content[1].image_url") << r;
  EXPECT_NE(r["error"]["message"].get<std::string>().find("--allow-image-urls"), std::string::npos)
      << r;
  r = post(image_request("file://" + kImageFile), &status);
  EXPECT_EQ(status, 400) << r;
  EXPECT_NE(r["error"]["message"].get<std::string>().find("--allowed-local-media-path"),
            std::string::npos)
      << r;
  httplib::Client c("127.0.0.1", p_->port);
  const Json msg = {{"model", "tiny"},
                    {"max_tokens", 2},
                    {"messages",
                     {{{"role", "user"},
                       {"content",
                        {{{"type", "image"},
                          {"source", {{"type", "url"}, {"url", origin.url("/img.png")}}}}}}}}}};
  auto a = c.Post("/v1/messages", msg.dump(), "application/json");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 400) << a->body;
  const Json aj = Json::parse(a->body);
  EXPECT_EQ(aj["type"], "error") << aj;
  EXPECT_EQ(aj["error"]["message"].get<std::string>().rfind("messages[0].content[0].source: ", 0),
            0u)
      << aj;
}

// A server run with --allow-image-urls (1 s per URL) and --allowed-local-media-path: an image
// fetched or read from the directory answers as its data: URL does; failures are 400s naming the
// part, and the server keeps serving.
class ImageUrlServe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    namespace fs = std::filesystem;
    dir_ = new dsv41::testing::TempDir();
    root_ = new std::string(fs::canonical(dir_->path()).string());
    ASSERT_TRUE(dsv41::testing::make_tiny_official(*root_ + "/tiny").is_ok());
    fs::create_directories(*root_ + "/media/sub");
    fs::create_directories(*root_ + "/elsewhere");
    fs::copy_file(kImageFile, *root_ + "/media/rgb.png");
    fs::copy_file(kImageFile, *root_ + "/elsewhere/rgb.png");
    fs::create_symlink(*root_ + "/elsewhere/rgb.png", *root_ + "/media/out.png");
    ASSERT_EQ(::mkfifo((*root_ + "/media/fifo.png").c_str(), 0600), 0);
    origin_ = new ImageOrigin();
    p_ = new ServeProcess();
    ASSERT_TRUE(p_->start(*root_ + "/tiny", *root_ + "/serve.log",
                          {"--allow-image-urls", "--image-url-timeout", "1",
                           "--allowed-local-media-path", *root_ + "/media"}));
  }
  static void TearDownTestSuite() {
    kill(p_->pid, SIGTERM);
    EXPECT_EQ(p_->wait_exit(), 0);
    delete p_;
    delete origin_;
    delete root_;
    delete dir_;
  }
  static Json post(const std::string& path, const Json& body, int* status) {
    httplib::Client c("127.0.0.1", p_->port);
    c.set_read_timeout(120, 0);
    auto r = c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r);
    *status = r ? r->status : 0;
    return r ? Json::parse(r->body) : Json();
  }
  static Json chat(const std::string& url, int* status) {
    return post("/v1/chat/completions", chat_body(url), status);
  }
  static Json chat_body(const std::string& url) {
    return {{"model", "tiny"},
            {"max_tokens", 6},
            {"temperature", 0},
            {"logprobs", true},
            {"messages",
             {{{"role", "user"},
               {"content",
                {{{"type", "text"}, {"text", "Describe it."}},
                 {{"type", "image_url"}, {"image_url", {{"url", url}}}}}}}}}};
  }
  static void expect_refused(const std::string& url, const std::string& why) {
    int status = 0;
    const Json r = chat(url, &status);
    EXPECT_EQ(status, 400) << url << ": " << r;
    EXPECT_EQ(r["error"]["param"], "messages[0].content[1].image_url") << r;
    EXPECT_NE(r["error"]["message"].get<std::string>().find(why), std::string::npos)
        << url << ": " << r;
  }
  static dsv41::testing::TempDir* dir_;
  static std::string* root_;
  static ImageOrigin* origin_;
  static ServeProcess* p_;
};
dsv41::testing::TempDir* ImageUrlServe::dir_ = nullptr;
std::string* ImageUrlServe::root_ = nullptr;
ImageOrigin* ImageUrlServe::origin_ = nullptr;
ServeProcess* ImageUrlServe::p_ = nullptr;

TEST_F(ImageUrlServe, AnHttpUrlAndALocalFileAnswerAsTheDataUrl) {
  int status = 0;
  const Json by_data = chat(data_url(kImageFile), &status);
  ASSERT_EQ(status, 200) << by_data;
  for (const std::string& url :
       {origin_->url("/img.png"), origin_->url("/redirect"), "file://" + *root_ + "/media/rgb.png",
        "file://" + *root_ + "/media/sub/../rgb.png"}) {
    const Json r = chat(url, &status);
    ASSERT_EQ(status, 200) << url << ": " << r;
    EXPECT_EQ(r["choices"], by_data["choices"]) << url;
    EXPECT_EQ(r["usage"]["prompt_tokens"], by_data["usage"]["prompt_tokens"]) << url;
  }
}

TEST_F(ImageUrlServe, FetchFailuresAre400sNamingThePart) {
  expect_refused(origin_->url("/missing"), "answered HTTP 404");
  expect_refused(origin_->url("/page"), "no PNG, JPEG, WebP or GIF image");
  expect_refused(origin_->url("/loop/0"), "redirects more than 5 times");
  expect_refused(origin_->url("/to-file"), "only http:// and https://");
  const auto t0 = std::chrono::steady_clock::now();
  expect_refused(origin_->url("/slow"), "--image-url-timeout");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
  // 1 GB offered: cut off past 32 MB, the origin sees the server leave.
  origin_->reset_huge();
  expect_refused(origin_->url("/huge"), "larger than 32 MB");
  EXPECT_TRUE(origin_->wait_huge_client_left());
  EXPECT_LT(origin_->huge_sent(), std::size_t(96) << 20) << "of " << ImageOrigin::kHugeBytes;
  int status = 0;
  const Json ok = chat(origin_->url("/img.png"), &status);
  EXPECT_EQ(status, 200) << ok;  // the server lives on
}

TEST_F(ImageUrlServe, LocalFilesOutsideTheDirectoryAreRefused) {
  const std::string outside = "outside the server's --allowed-local-media-path";
  expect_refused("file://" + *root_ + "/elsewhere/rgb.png", outside);
  expect_refused("file://" + *root_ + "/media/../elsewhere/rgb.png", outside);
  expect_refused("file://" + *root_ + "/media/out.png", outside);  // a link out of it
  expect_refused("file://" + *root_ + "/media/sub", "a directory, not a regular file");
  expect_refused("file://" + *root_ + "/media/fifo.png", "a FIFO, not a regular file");
  expect_refused(*root_ + "/media/rgb.png", "only data: URLs");  // a bare path is no URL
}

// Responses' input_image and Anthropic's url source take the same URLs.
TEST_F(ImageUrlServe, TheOtherApisTakeUrls) {
  const Json text = {{"type", "input_text"}, {"text", "What is it?"}};
  auto responses = [&](const std::string& url, int* status) {
    return post(
        "/v1/responses",
        {{"model", "tiny"},
         {"max_output_tokens", 4},
         {"temperature", 0},
         {"input",
          Json::array({Json{{"role", "user"},
                            {"content", {text, {{"type", "input_image"}, {"image_url", url}}}}}})}},
        status);
  };
  int status = 0;
  const Json rd = responses(data_url(kImageFile), &status);
  ASSERT_EQ(status, 200) << rd;
  const Json ru = responses(origin_->url("/img.png"), &status);
  ASSERT_EQ(status, 200) << ru;
  auto without_ids = [](Json items) {  // (each response's items have ids of their own)
    for (Json& item : items) item.erase("id");
    return items;
  };
  EXPECT_EQ(without_ids(ru["output"]), without_ids(rd["output"]));
  EXPECT_EQ(ru["usage"]["input_tokens"], rd["usage"]["input_tokens"]);
  const Json rf = responses(origin_->url("/missing"), &status);
  EXPECT_EQ(status, 400) << rf;
  EXPECT_EQ(rf["error"]["param"], "input[0].content[1].image_url") << rf;

  auto messages = [&](const Json& source, int* st) {
    return post("/v1/messages",
                {{"model", "tiny"},
                 {"max_tokens", 4},
                 {"temperature", 0},
                 {"messages",
                  {{{"role", "user"},
                    {"content",
                     {{{"type", "text"}, {"text", "What is it?"}},
                      {{"type", "image"}, {"source", source}}}}}}}},
                st);
  };
  const std::string b64 = data_url(kImageFile).substr(std::string("data:image/png;base64,").size());
  const Json ab =
      messages({{"type", "base64"}, {"media_type", "image/png"}, {"data", b64}}, &status);
  ASSERT_EQ(status, 200) << ab;
  const Json au = messages({{"type", "url"}, {"url", origin_->url("/img.png")}}, &status);
  ASSERT_EQ(status, 200) << au;
  EXPECT_EQ(au["content"], ab["content"]);
  auto total = [](const Json& u) {
    return u["input_tokens"].get<int>() + u["cache_read_input_tokens"].get<int>();
  };
  EXPECT_EQ(total(au["usage"]), total(ab["usage"])) << au["usage"] << ab["usage"];
  const Json af = messages({{"type", "url"}, {"url", origin_->url("/missing")}}, &status);
  EXPECT_EQ(status, 400) << af;
  EXPECT_EQ(af["error"]["type"], "invalid_request_error") << af;
  EXPECT_EQ(af["error"]["message"].get<std::string>().rfind("messages[0].content[1].source: ", 0),
            0u)
      << af;
}

TEST_F(ImageUrlServe, TheOpenAiClientSendsAnImageUrl) {
  auto [code, out] = run_command(node_client(p_->port, "tiny", "urls", "image_input_test.mjs") +
                                 " " + kImageFile + " 8 " + origin_->url("/img.png"));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
}

}  // namespace
}  // namespace dsv41::server_testing
