// libFuzzer target: a generation request body through each API's parser to token ids (OpenAI
// completions and chat with tools, Anthropic Messages and count_tokens, OpenAI Responses); the
// first byte picks the API. An accepted request must have a prompt that fits the context, and its
// response writer must take a reasoning + DSML answer, streamed and whole.
#include "fuzz_util.h"
#include "server/anthropic_api.h"
#include "server/generation_protocol.h"
#include "server/responses_api.h"
#include "text/json_ordered.h"

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
  (void)stream->stream_begin();
  RequestOutput out;
  out.text =
      "Let me think.</think>Answer.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ "
      "invoke>\n</｜DSML｜ calls>";
  out.finished = true;
  out.reason = FinishReason::kStop;
  for (std::size_t c = 0; c < std::size_t(std::max(1, job.n)); ++c) {
    (void)stream->stream_output(c, out);
    whole->add(c, out);
  }
  (void)stream->stream_end();
  if (!parse_json_ordered(whole->body())) fuzz::invariant_failed("a response body is not JSON");
  return 0;
}
