// The seam between the HTTP layer and one generation API (OpenAI completions / chat / Responses,
// Anthropic Messages): the API parses a request body into a GenerationJob and renders the engine's
// output as its own response body or stream frames; http_server.cpp owns submission, polling,
// heartbeats, cancellation on disconnect, metrics and the access log, the same for every API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/openai_api.h"  // ApiError, GenerationJob, ServedModel

namespace dsv41 {

// One response being written: n choices for OpenAI's n, one otherwise.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // Stream: complete SSE frames ("event: ...\ndata: ...\n\n" or "data: ...\n\n").
  virtual std::vector<std::string> stream_begin() = 0;
  virtual std::vector<std::string> stream_output(std::size_t choice, const RequestOutput& out) = 0;
  // After every choice finished without error: the closing frames.
  virtual std::vector<std::string> stream_end() = 0;
  // A failure in the middle of a stream (an engine error): the frames that report it and close.
  virtual std::vector<std::string> stream_error(const ApiError& e) = 0;
  virtual std::string stream_heartbeat() const = 0;  // ignorable bytes the client tolerates
  // Non-stream: every output of every choice, then body() once.
  virtual void add(std::size_t choice, const RequestOutput& out) = 0;
  virtual std::string body() = 0;
};

class GenerationApi {
 public:
  virtual ~GenerationApi() = default;
  virtual const char* endpoint() const = 0;  // metrics and access-log label
  // Parses and validates `body` into `job` (prompt tokenized); the error names the parameter.
  virtual std::optional<ApiError> parse(const OJson& body, const ServedModel& model,
                                        const Tokenizer& tok, GenerationJob& job) const = 0;
  // `id` is unique per response (the API adds its prefix); `choices` = job.n.
  virtual std::unique_ptr<ResponseWriter> writer(const GenerationJob& job, const Tokenizer& tok,
                                                 const std::string& id, int64_t created) const = 0;
  virtual std::string error_body(const ApiError& e) const = 0;
};

// The APIs served (each lives with its request/response shapes).
std::unique_ptr<GenerationApi> openai_completions_api();
std::unique_ptr<GenerationApi> openai_chat_api();
std::unique_ptr<GenerationApi> anthropic_messages_api();
std::unique_ptr<GenerationApi> openai_responses_api();

}  // namespace dsv41
