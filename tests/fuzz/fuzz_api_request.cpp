// libFuzzer target: a generation request body through each API's parser to token ids (OpenAI
// completions and chat with tools, Anthropic Messages and count_tokens, OpenAI Responses); the
// first byte picks the API. An accepted request must have a prompt that fits the context, and its
// response writer must take a reasoning + DSML answer: streamed, as SSE events of JSON; whole, as a
// JSON body with the call when tools are declared.
#include "fuzz_util.h"
#include "server/anthropic_api.h"
#include "server/generation_protocol.h"
#include "server/responses_api.h"
#include "text/json_ordered.h"

namespace {

// Every stream frame is one SSE event (an optional `event:` line, one `data:` line, a blank line)
// whose data is JSON or OpenAI's [DONE].
void check_frames(const std::vector<std::string>& frames) {
  using dsv41::fuzz::invariant_failed;
  for (const std::string& f : frames) {
    std::size_t data = f.rfind("data: ", 0) == 0 ? 0 : std::string::npos;
    if (const std::size_t nl = f.find('\n');
        data == std::string::npos && f.rfind("event: ", 0) == 0 && nl != std::string::npos &&
        f.compare(nl + 1, 6, "data: ") == 0)
      data = nl + 1;
    if (f.size() < 8 || f.compare(f.size() - 2, 2, "\n\n") != 0 || data == std::string::npos)
      invariant_failed("a stream frame is not one SSE event");
    const std::string payload = f.substr(data + 6, f.size() - 2 - (data + 6));
    if (payload.find('\n') != std::string::npos) invariant_failed("a frame's data spans lines");
    if (payload != "[DONE]" && !dsv41::parse_json_ordered(payload))
      invariant_failed("a stream frame's data is not JSON");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace dsv41;
  if (size < 1) return 0;
  const Tokenizer& tok = fuzz::tiny_tokenizer();
  ServedModel model;
  model.name = "m";
  model.max_context = 4096;
  auto body =
      parse_json_ordered(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  if (!body) return 0;
  GenerationJob job;
  std::optional<ApiError> err;
  std::unique_ptr<GenerationApi> api;
  switch (data[0] % 5) {
    case 0:
      err = parse_completion_request(*body, model, tok, job);
      api = openai_completions_api();
      break;
    case 1:
      err = parse_chat_completion_request(*body, model, tok, job);
      api = openai_chat_api();
      break;
    case 2:
      err = parse_messages_request(*body, model, tok, false, job);
      api = anthropic_messages_api();
      break;
    case 3:
      err = parse_messages_request(*body, model, tok, true, job);
      break;
    default:
      err = parse_responses_request(*body, model, tok, job);
      api = openai_responses_api();
      break;
  }
  if (err) {
    if (err->status < 400 || err->status >= 500) fuzz::invariant_failed("a parse error is not 4xx");
    return 0;
  }
  const auto n = int64_t(job.request.prompt.size());
  if (n < 1 || n >= model.max_context) fuzz::invariant_failed("an accepted prompt does not fit");
  if (!api) return 0;
  auto stream = api->writer(job, tok, "f", 0);
  auto whole = api->writer(job, tok, "f", 0);
  check_frames(stream->stream_begin());
  RequestOutput out;
  out.text =
      "Let me think.</think>Answer.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ "
      "invoke>\n</｜DSML｜ calls>";
  out.finished = true;
  out.reason = FinishReason::kStop;
  for (std::size_t c = 0; c < std::size_t(std::max(1, job.n)); ++c) {
    check_frames(stream->stream_output(c, out));
    whole->add(c, out);
  }
  check_frames(stream->stream_end());
  const std::string answer = whole->body();
  if (!parse_json_ordered(answer)) fuzz::invariant_failed("a response body is not JSON");
  // With tools declared the DSML block is a call named f, not text.
  if (job.extract_tools && answer.find(R"("name":"f")") == std::string::npos)
    fuzz::invariant_failed("a declared tool's call is missing from the response");
  return 0;
}
