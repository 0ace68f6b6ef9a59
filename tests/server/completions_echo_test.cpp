// /v1/completions with echo=true, as vLLM answers it: the prompt returned before the completion
// (string and token-id prompts, n > 1), the logprobs covering the prompt first (the first prompt
// token's null), max_tokens 0 scoring the prompt alone (what evaluation harnesses send), and the
// stream sending the prompt with its first output. The scripted model (server_harness.h) gives
// one-hot logits, so every prompt logprob is known in closed form.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <string>
#include <vector>

#include "server/server_harness.h"
#include "text/byte_level.h"
#include "text/json_ordered.h"

namespace dsv41 {
namespace {

using namespace server_testing;

const std::string kPrompt = "hello world";

// The scripted model's logprob of `token` after `prev` (no <｜Assistant｜> cue in these prompts:
// the peak of 30 is at (prev * 7 + 3) mod vocab, every other logit 0).
double scripted_logprob(int32_t prev, int32_t token, int32_t vocab) {
  const int32_t peak = (prev * 7 + 3) % vocab;
  const double lse = 30.0 + std::log1p(double(vocab - 1) * std::exp(-30.0));
  return (token == peak ? 30.0 : 0.0) - lse;
}

OJson post_ok(httplib::Client& c, const std::string& body) {
  auto r = c.Post("/v1/completions", body, "application/json");
  EXPECT_TRUE(r) << body;
  if (!r) return OJson::object();
  EXPECT_EQ(r->status, 200) << body << " -> " << r->body;
  return *parse_json_ordered(r->body);
}

// The prompt's part of echoed logprobs: aligned arrays, the first token's logprob and top map
// null, each later one the scripted logprob with the most likely token and itself in its map, and
// offsets that index the returned text.
void expect_prompt_logprobs(const OJson& lp, const std::vector<int32_t>& ids, const Tokenizer& tok,
                            int32_t vocab, const std::string& text) {
  const std::size_t n = lp["tokens"].size();
  ASSERT_GE(n, ids.size());
  ASSERT_EQ(lp["token_logprobs"].size(), n);
  ASSERT_EQ(lp["top_logprobs"].size(), n);
  ASSERT_EQ(lp["text_offset"].size(), n);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  int64_t offset = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string token = utf8_lossy(tok.token_bytes(ids[i]));
    EXPECT_EQ(lp["tokens"][i], token) << i;
    EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), offset) << i;
    EXPECT_EQ(text.substr(std::size_t(offset), token.size()), token) << i;
    offset += int64_t(token.size());
    if (i == 0) continue;
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), scripted_logprob(ids[i - 1], ids[i], vocab),
                1e-3)
        << i;
    const OJson& top = lp["top_logprobs"][i];
    const int32_t peak = (ids[i - 1] * 7 + 3) % vocab;
    const std::string peak_token = utf8_lossy(tok.token_bytes(peak));
    ASSERT_TRUE(top.contains(peak_token)) << i << " " << top.dump();
    EXPECT_NEAR(top[peak_token].get<double>(), scripted_logprob(ids[i - 1], peak, vocab), 1e-3);
    EXPECT_TRUE(top.contains(token)) << i << " " << top.dump();
  }
}

TEST(ServerCompletionsEcho, TextAndLogprobsStartWithThePrompt) {
  InProcess s;
  auto c = s.client();
  const Tokenizer& tok = s.engine->tokenizer();
  const int32_t vocab = s.engine->vocab_size();
  const std::vector<int32_t> ids = tok.encode(kPrompt);
  const std::string common =
      R"({"model":"scripted","prompt":"hello world","max_tokens":3,"temperature":0,"logprobs":2)";
  const OJson plain = post_ok(c, common + "}");
  const OJson echo = post_ok(c, common + R"(,"echo":true,"n":2})");
  const OJson& gen = plain["choices"][0]["logprobs"];
  const std::string completion = plain["choices"][0]["text"].get<std::string>();
  ASSERT_EQ(echo["choices"].size(), 2u);
  for (const OJson& ch : echo["choices"]) {  // every sample echoes the prompt
    EXPECT_EQ(ch["text"], kPrompt + completion);
    const OJson& lp = ch["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), ids.size() + gen["tokens"].size());
    expect_prompt_logprobs(lp, ids, tok, vocab, ch["text"].get<std::string>());
    // Then the completion's entries, as without echo, their offsets after the prompt's bytes.
    for (std::size_t k = 0; k < gen["tokens"].size(); ++k) {
      EXPECT_EQ(lp["tokens"][ids.size() + k], gen["tokens"][k]);
      EXPECT_NEAR(lp["token_logprobs"][ids.size() + k].get<double>(),
                  gen["token_logprobs"][k].get<double>(), 1e-6);
      EXPECT_EQ(lp["text_offset"][ids.size() + k].get<int64_t>(),
                gen["text_offset"][k].get<int64_t>() + int64_t(kPrompt.size()));
    }
    EXPECT_EQ(ch["finish_reason"], plain["choices"][0]["finish_reason"]);
    // vLLM also returns the choice's prompt_logprobs (echo asks the engine for them).
    ASSERT_EQ(ch["prompt_logprobs"].size(), ids.size());
    EXPECT_TRUE(ch["prompt_logprobs"][0].is_null());
  }
  EXPECT_EQ(echo["usage"]["prompt_tokens"].get<int64_t>(), int64_t(ids.size()));
  EXPECT_EQ(echo["usage"]["completion_tokens"].get<int64_t>(),
            2 * plain["usage"]["completion_tokens"].get<int64_t>());
  // Without logprobs: the text alone.
  const OJson bare = post_ok(
      c,
      R"({"model":"scripted","prompt":"hello world","max_tokens":3,"temperature":0,"echo":true})");
  EXPECT_EQ(bare["choices"][0]["text"], kPrompt + completion);
  EXPECT_TRUE(bare["choices"][0]["logprobs"].is_null());
}

// max_tokens 0 with echo scores a text (lm-eval's loglikelihood requests): the prompt and its
// logprobs, no completion token; token-id prompts echo their ids decoded.
TEST(ServerCompletionsEcho, MaxTokensZeroScoresATokenIdPrompt) {
  InProcess s;
  auto c = s.client();
  const Tokenizer& tok = s.engine->tokenizer();
  const int32_t vocab = s.engine->vocab_size();
  const std::vector<int32_t> ids = tok.encode("the cat sat");
  ASSERT_GE(ids.size(), 3u);
  const std::string text = *tok.decode(ids);
  const OJson list = ids;
  for (const std::string& prompt : {list.dump(), "[" + list.dump() + "]"}) {
    const OJson r = post_ok(c, R"({"model":"scripted","max_tokens":0,"echo":true,"logprobs":1,)"
                               R"("prompt":)" +
                                   prompt + "}");
    const OJson& ch = r["choices"][0];
    EXPECT_EQ(ch["text"], text) << prompt;
    EXPECT_EQ(ch["finish_reason"], "length");
    EXPECT_EQ(r["usage"]["completion_tokens"].get<int64_t>(), 0);
    EXPECT_EQ(r["usage"]["prompt_tokens"].get<int64_t>(), int64_t(ids.size()));
    ASSERT_EQ(ch["logprobs"]["tokens"].size(), ids.size()) << ch.dump();
    expect_prompt_logprobs(ch["logprobs"], ids, tok, vocab, text);
  }
  // A string prompt the same way, and without logprobs the text alone.
  const OJson str = post_ok(c, R"({"model":"scripted","max_tokens":0,"echo":true,"prompt":"x y"})");
  EXPECT_EQ(str["choices"][0]["text"], "x y");
  EXPECT_TRUE(str["choices"][0]["logprobs"].is_null());
  // Without echo, max_tokens 0 is refused, naming the field.
  auto refused = c.Post("/v1/completions", R"({"model":"scripted","prompt":"x","max_tokens":0})",
                        "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_EQ((*parse_json_ordered(refused->body))["error"]["param"], "max_tokens") << refused->body;
}

// The SSE payloads of a streamed completion, [DONE] excluded.
std::vector<OJson> stream_payloads(InProcess& s, const std::string& body) {
  auto c = s.client();
  std::string raw;
  EXPECT_TRUE(post_streaming(c, "/v1/completions", body, [&](const char* d, std::size_t n) {
    raw.append(d, n);
    return true;
  }));
  std::vector<OJson> out;
  for (std::size_t at = 0; (at = raw.find("data: ", at)) != std::string::npos;) {
    const std::size_t end = raw.find("\n\n", at);
    const std::string payload = raw.substr(at + 6, end - at - 6);
    at = end;
    if (payload != "[DONE]") out.push_back(*parse_json_ordered(payload));
  }
  return out;
}

// Streamed, the prompt goes out with the first output (vLLM), its logprobs first; the chunks
// together equal the non-streamed answer.
TEST(ServerCompletionsEcho, StreamSendsThePromptFirst) {
  InProcess s;
  auto c = s.client();
  const std::string common =
      R"({"model":"scripted","prompt":"hello world","temperature":0,"logprobs":1,"echo":true,)";
  for (const char* max_tokens : {"3", "0"}) {
    const std::string body = common + R"("max_tokens":)" + max_tokens;
    const OJson whole = post_ok(c, body + "}")["choices"][0];
    const auto chunks =
        stream_payloads(s, body + R"(,"stream":true,"stream_options":{"include_usage":true}})");
    ASSERT_GE(chunks.size(), 2u);
    std::string text, finish;
    OJson lp = {{"tokens", OJson::array()},
                {"token_logprobs", OJson::array()},
                {"top_logprobs", OJson::array()},
                {"text_offset", OJson::array()}};
    for (const OJson& chunk : chunks) {
      if (chunk["choices"].empty()) {  // the usage chunk
        EXPECT_EQ(chunk["usage"]["completion_tokens"].get<int64_t>(),
                  std::string(max_tokens) == "0" ? 0 : 3);
        continue;
      }
      const OJson& ch = chunk["choices"][0];
      if (text.empty() && !ch["text"].get<std::string>().empty())
        EXPECT_EQ(ch["text"].get<std::string>().rfind(kPrompt, 0), 0u) << chunk.dump();
      text += ch["text"].get<std::string>();
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"].get<std::string>();
      if (ch["logprobs"].is_null()) continue;
      for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        for (const auto& x : ch["logprobs"][k]) lp[k].push_back(x);
    }
    EXPECT_EQ(text, whole["text"]) << max_tokens;
    EXPECT_EQ(finish, whole["finish_reason"]) << max_tokens;
    EXPECT_EQ(lp.dump(), whole["logprobs"].dump()) << max_tokens;
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  }
}

}  // namespace
}  // namespace dsv41
