// OpenAI request/response shapes for /v1/completions and /v1/chat/completions: validation of every
// field into a GenerationJob (4xx ApiError naming the parameter otherwise), and the JSON of
// responses and stream chunks built from engine output. No HTTP here; http_server.cpp moves the
// bytes.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/generation_defaults.h"
#include "server/image_sources.h"
#include "server/reasoning_count.h"
#include "text/dsml_parser.h"
#include "text/json_ordered.h"

namespace dsv41 {

// OpenAI's error shape {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};
std::string error_body(const ApiError& e);

class GrammarCache;  // server/structured_outputs.h

// An image file's bytes -> its span and the aligner's rows (server/image_inputs.h).
struct EncodedImage {
  int32_t llm_w = 0, llm_h = 0;                    // the span's grid of LLM tokens
  std::shared_ptr<const std::vector<float>> rows;  // the aligner's rows, [llm_h * llm_w, hidden]
  uint64_t key = 0;     // of the decoded pixels: the prefix cache's key for the span (SliceImage)
  bool cached = false;  // taken from the encoder's cache of encoded images, not encoded now
};
using ImageEncoder = std::function<Result<EncodedImage>(std::string_view file)>;
// The model's image encoder and what it did (/metrics: dsv41_image_encodes_total,
// dsv41_image_cache_hits_total).
struct ImageSupport {
  ImageEncoder encode;
  ImageSourceOptions sources;  // which URLs besides data: are read, and their limits
  std::atomic<int64_t> encodes{0}, cache_hits{0};
};

struct ServedModel {
  std::string name;
  int64_t max_context = 0;
  // --reasoning-budget: the cap on every request's reasoning tokens (-1: none); a request's own
  // budget may only lower it.
  int reasoning_budget = -1;
  // --served-model-name's further names: requests may name any of them (`name`, the first, is
  // what responses report).
  std::vector<std::string> aliases;
  // --default-chat-template-kwargs: chat_template_kwargs every chat request starts from (its own
  // keys win).
  OJson default_chat_template_kwargs = OJson::object();
  // --generation-config / --override-generation-config: what a request's sampling starts from
  // (its own fields win); shown in /v1/models as "default_sampling". Its max_new_tokens is
  // --default-max-tokens when that was given (HttpServer sets it).
  SamplingDefaults sampling_defaults;
  // max_tokens of chat and Responses requests that set none: max_new_tokens, else the rest of
  // the context (the engine stops there), as vLLM. Completions: OpenAI's 16.
  int default_max_tokens() const {
    return sampling_defaults.max_new_tokens.value_or(std::numeric_limits<int32_t>::max());
  }
  // Structured outputs: the compiled grammars of recent requests (response_format,
  // structured_outputs), shared by every copy of this model's description.
  std::shared_ptr<GrammarCache> grammars = make_grammar_cache();
  static std::shared_ptr<GrammarCache> make_grammar_cache();
  // Images (server/image_inputs.h): the model's encoder (null: it takes no images) and the id of
  // its image token.
  std::shared_ptr<ImageSupport> images;
  int32_t image_token_id = -1;
  bool serves(const std::string& asked) const {
    return asked == name || std::find(aliases.begin(), aliases.end(), asked) != aliases.end();
  }
};

// A chat body with --default-chat-template-kwargs under its own chat_template_kwargs (the body
// itself when there are none, or its kwargs are not an object: the parser refuses those).
OJson with_default_kwargs(const OJson& body, const ServedModel& model);

struct GenerationJob {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool thinking = false;       // chat: the prompt ended with <think>
  bool extract_tools = false;  // chat: tools declared and tool_choice != "none"
  bool want_logprobs = false;  // chat: logprobs=true; completions: logprobs given
  int n = 1;                   // samples of the prompt (choices 0..n-1)
  std::string model;
  std::string max_tokens_param;  // the field that set max_tokens; empty: the default applies
  GenerationRequest request;     // prompt ids + sampling
  OJson echo;  // request fields an API repeats in its response (Responses: instructions, tools...)
  // Completions' echo=true (vLLM's rules): the returned text starts with the prompt (`prompt_text`:
  // the prompt string, or token ids decoded) and with logprobs, the logprobs cover the prompt
  // tokens first. score_only: max_tokens 0 (scoring a text): the engine runs max_tokens 1 for the
  // prompt's logprobs and the token it samples is dropped (finish_reason "length", 0 completion
  // tokens).
  bool echo_prompt = false;
  bool score_only = false;
  std::string prompt_text;
  // vLLM's return_token_ids: the prompt's and each choice's generated token ids in the response.
  bool return_token_ids = false;
  // parallel_tool_calls: false (Anthropic: disable_parallel_tool_use): at most one tool call is
  // returned; later ones are dropped.
  bool single_tool_call = false;
  // vLLM's request_id (completions, chat): the response's id is "cmpl-"/"chatcmpl-" + it and the
  // X-Request-Id header is it, so a caller's own id finds the request in its logs. Empty: the
  // server makes one.
  std::string request_id;
};

// The reasoning cap of a request (every API): its own budget (`asked`, -1: none) lowered to the
// server's --reasoning-budget; set only when the generation starts inside the reasoning.
void apply_reasoning_budget(const ServedModel& model, int64_t asked, GenerationJob& job);

// Parse and validate; on success fills `job` (prompt tokenized with the engine's tokenizer).
std::optional<ApiError> parse_completion_request(const OJson& body, const ServedModel& model,
                                                 const Tokenizer& tok, GenerationJob& job);
std::optional<ApiError> parse_chat_completion_request(const OJson& body, const ServedModel& model,
                                                      const Tokenizer& tok, GenerationJob& job);

class ResponseBuilder;
// The non-stream response of every choice of a job (usage: the prompt once, completions summed).
std::string build_response(const std::vector<ResponseBuilder*>& choices);

// Accumulates one choice's engine output into an OpenAI response (non-stream) or chunks (stream).
// A job with n samples has one builder per choice (`index`), all with the job's response id.
class ResponseBuilder {
 public:
  ResponseBuilder(const GenerationJob& job, const Tokenizer& tok, std::string id, int64_t created,
                  int index = 0);

  // Stream: the SSE payloads (JSON texts, without "data: ") for this piece of output.
  std::vector<std::string> stream_chunks(const RequestOutput& out);
  // Stream: the first chunk of a chat stream (role), sent before any output.
  std::string stream_preamble() const;
  // Stream with include_usage: the last chunk (no choices), after every choice finished;
  // `completion_tokens` of all choices together.
  std::string stream_usage_chunk(int64_t completion_tokens, int64_t reasoning_tokens) const;
  // Non-stream: feed every output, then build() once (it consumes the logprob text offsets).
  void add(const RequestOutput& out);
  std::string build();  // this choice alone (n = 1)
  bool finished() const { return finished_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  int64_t reasoning_tokens() const { return reasoning_.count(); }

 private:
  // with_prompt (completions with echo): the prompt's entries first.
  OJson logprobs_json(const std::vector<OutputToken>& tokens, bool with_prompt = false);
  void prompt_logprob_entries(OJson& toks, OJson& tlp, OJson& top, OJson& off);
  OJson prompt_logprobs_json() const;
  friend std::string build_response(const std::vector<ResponseBuilder*>& choices);
  OJson choice_json();
  // The prompt once, `completion_tokens` and `reasoning_tokens` of every choice; the cache split.
  OJson usage_json(int64_t completion_tokens, int64_t reasoning_tokens) const;
  std::string call_id(int i) const;
  std::string finish_reason() const;
  void absorb(const RequestOutput& out, std::vector<AssistantEvent>& events);

  const GenerationJob& job_;
  const Tokenizer& tok_;
  std::string id_;
  int64_t created_;
  int index_;
  AssistantStreamParser parser_;
  // Accumulated (non-stream) state.
  std::string text_, reasoning_text_;
  std::vector<DsmlToolCall> calls_;
  OJson logprobs_ = OJson::array();  // chat: content entries; completions: built at the end
  std::vector<OutputToken> tokens_;
  std::vector<PromptLogprob> prompt_lp_;  // prompt_logprobs, as the engine published them
  int64_t text_offset_ = 0;
  std::vector<int64_t> offsets_;
  bool finished_ = false;
  FinishReason reason_ = FinishReason::kNone;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  ReasoningCounter reasoning_;
  std::vector<int32_t> token_ids_;  // return_token_ids: every generated id (non-stream)
  int tool_calls_sent_ = 0;         // stream: calls begun (their index and id)
  int tool_calls_done_ = 0;         // stream: calls complete (a begun call may abort)
  bool echoed_ = false;             // stream with echo: the prompt went out (with the first output)
  bool ids_sent_ = false;           // stream with return_token_ids: the first chunk went out
};

// GET /v1/models: the list {"object": "list", "data": [model]}; GET /v1/models/{id}: the model
// object {"id", "object": "model", "created", "owned_by", "max_model_len"}.
std::string models_body(const ServedModel& model, int64_t created);
std::string model_body(const ServedModel& model, int64_t created);
// 404 model_not_found for a request (or GET /v1/models/{id}) naming another model.
ApiError model_not_found(const std::string& asked, const ServedModel& model);

}  // namespace dsv41
