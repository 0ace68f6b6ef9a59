// OpenAI's completions and chat completions as GenerationApis (server/generation_protocol.h): the
// request shapes of openai_api.cpp, one ResponseBuilder per choice, SSE frames "data: {...}" ended
// by "data: [DONE]".
#include "server/generation_protocol.h"

namespace dsv41 {
namespace {

std::string frame(const std::string& payload) {
  return "data: " + payload + "\n\n";
}

class OpenAiWriter final : public ResponseWriter {
 public:
  OpenAiWriter(const GenerationJob& job, const Tokenizer& tok, const std::string& id,
               int64_t created)
      : job_(job) {
    const std::string full = (job.chat ? "chatcmpl-" : "cmpl-") + id;
    for (int c = 0; c < std::max(1, job.n); ++c)
      choices_.push_back(std::make_unique<ResponseBuilder>(job, tok, full, created, c));
  }
  std::vector<std::string> stream_begin() override {
    std::vector<std::string> frames;
    if (job_.chat)
      for (auto& b : choices_) frames.push_back(frame(b->stream_preamble()));
    return frames;
  }
  std::vector<std::string> stream_output(std::size_t choice, const RequestOutput& out) override {
    std::vector<std::string> frames;
    for (const std::string& chunk : choices_[choice]->stream_chunks(out))
      frames.push_back(frame(chunk));
    // The choice's own count: a score-only echo (max_tokens 0) returns no completion tokens.
    completion_tokens_ += out.finished ? choices_[choice]->completion_tokens() : 0;
    reasoning_tokens_ += out.finished ? choices_[choice]->reasoning_tokens() : 0;
    return frames;
  }
  std::vector<std::string> stream_end() override {
    std::vector<std::string> frames;
    if (job_.include_usage)
      frames.push_back(
          frame(choices_.front()->stream_usage_chunk(completion_tokens_, reasoning_tokens_)));
    frames.push_back(frame("[DONE]"));
    return frames;
  }
  std::vector<std::string> stream_error(const ApiError& e) override {
    return {frame(error_body(e)), frame("[DONE]")};
  }
  std::string stream_heartbeat() const override { return ": keep-alive\n\n"; }
  void add(std::size_t choice, const RequestOutput& out) override { choices_[choice]->add(out); }
  std::string body() override {
    std::vector<ResponseBuilder*> all;
    for (auto& b : choices_) all.push_back(b.get());
    return build_response(all);
  }

 private:
  const GenerationJob& job_;
  std::vector<std::unique_ptr<ResponseBuilder>> choices_;
  int64_t completion_tokens_ = 0, reasoning_tokens_ = 0;
};

class OpenAiApi final : public GenerationApi {
 public:
  explicit OpenAiApi(bool chat) : chat_(chat) {}
  const char* endpoint() const override {
    return chat_ ? "/v1/chat/completions" : "/v1/completions";
  }
  std::optional<ApiError> parse(const OJson& body, const ServedModel& model, const Tokenizer& tok,
                                GenerationJob& job) const override {
    return chat_ ? parse_chat_completion_request(body, model, tok, job)
                 : parse_completion_request(body, model, tok, job);
  }
  std::unique_ptr<ResponseWriter> writer(const GenerationJob& job, const Tokenizer& tok,
                                         const std::string& id, int64_t created) const override {
    return std::make_unique<OpenAiWriter>(job, tok, id, created);
  }
  std::string error_body(const ApiError& e) const override { return dsv41::error_body(e); }

 private:
  bool chat_;
};

}  // namespace

std::unique_ptr<GenerationApi> openai_completions_api() {
  return std::make_unique<OpenAiApi>(false);
}
std::unique_ptr<GenerationApi> openai_chat_api() {
  return std::make_unique<OpenAiApi>(true);
}

}  // namespace dsv41
