// The OpenAI-compatible HTTP server: routes, SSE streaming, request validation to OpenAI's error
// shape, access control, metrics, and graceful shutdown, over the event-driven transport of
// http_transport.h. Handler threads never touch model state: they submit to the Engine and read
// its per-request channels.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "server/access_control.h"
#include "server/generation_defaults.h"
#include "server/openai_api.h"
#include "text/json_ordered.h"

namespace dsv41 {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see HttpServer::port())
  std::string model_name = "dsv41";
  // --default-max-tokens: max_tokens of chat and Responses requests that set none, N or 0 (the
  // rest of the context), winning over sampling_defaults.max_new_tokens; unset: that, else the
  // rest of the context.
  std::optional<int> default_max_tokens;
  int reasoning_budget = -1;  // --reasoning-budget: every request's reasoning cap (-1: none)
  std::vector<std::string> model_aliases;  // --served-model-name's names after the first
  // --default-chat-template-kwargs (an object): what chat requests' chat_template_kwargs start from
  OJson default_chat_template_kwargs = OJson::object();
  SamplingDefaults sampling_defaults;  // --generation-config, --override-generation-config
  std::size_t max_body_bytes = 8u << 20;
  int shutdown_timeout_s = 30;  // how long SIGTERM waits for in-flight requests
  // Handler threads; each generation request holds one while it runs (an open connection holds
  // none). 0: one for every request the engine can hold at once plus a few for other endpoints,
  // so the engine's limits (429 beyond them), not the thread pool, bound concurrency.
  int threads = 0;
  // Connections (issue 37): open at once (503 and close beyond), per client address (0: no cap;
  // behind a proxy every client has one address), and the deadlines that free a connection:
  // its request's headers (slowloris), its body, idle between requests.
  int64_t max_connections = 10000;
  int64_t max_connections_per_client = 0;
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{60000};
  std::chrono::milliseconds keep_alive_timeout{5000};
  // A streamed answer's bytes waiting for a slow reader; past it the stream is cut (logged) so
  // that no reader holds memory or the engine.
  std::size_t stream_buffer_bytes = 1u << 20;
  ApiKeys api_keys;             // none: every route open (issue 37; access_control.h)
  bool metrics_public = false;  // --metrics-public: /metrics needs no key even with keys set
  CorsOptions cors;             // no origins: no cross-origin access
  // One log record per request: text (`access:` lines), json (a JSON line on stdout per generation
  // request: id, API, status, finish reasons, prompt / cached / output tokens, queue time, time to
  // first token, total time, client address; other requests keep their text line) or off.
  enum class RequestLog { kText, kJson, kOff } request_log = RequestLog::kText;
  bool log_prompts = false;  // json: each record also holds the prompt text (it may be private)
  // Structured outputs: the compile budgets of a request's schema (--grammar-time-budget-ms,
  // --grammar-max-states: over either, a 400 grammar_too_complex) and the token sets precomputed
  // at compile (--grammar-precompute-ms).
  GrammarOptions grammar;
  // Image parts' http(s) URLs (--allow-image-urls, --image-url-timeout) and file:// URLs
  // (--allowed-local-media-path): off by default (server/image_sources.h).
  ImageSourceOptions image_sources;
  // --ssl-certfile / --ssl-keyfile (PEM): HTTPS instead of HTTP on the same port.
  std::string ssl_certfile, ssl_keyfile;
};

class HttpServer {
 public:
  HttpServer(Engine& engine, ServerOptions options);
  // A server that listens before its model is loaded (`serve` binds at once): /health answers 503
  // {"status": "loading", "progress": ...} and every other route but the page's files 503 with
  // Retry-After, until attach(). `max_requests`: what the engine will hold at once (the HTTP
  // threads are started for it).
  HttpServer(ServerOptions options, int64_t max_requests);
  // The model is loaded: requests are served from now on, with these sampling defaults (read
  // from the model's directory, so known only now).
  void attach(Engine& engine, const SamplingDefaults& sampling_defaults);
  // Images (server/image_inputs.h): the model's encoder; before attach (requests read it once the
  // model is attached). Without one, an image part is a 400 ("this model takes no images").
  void set_image_encoder(ImageEncoder encoder);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  Status bind();  // errors name host:port
  int port() const;
  void serve();  // blocks until the server has stopped
  // Thread-safe, idempotent: new requests get 503 at once; returns after in-flight generation
  // requests finished (or the timeout passed) and the listener stopped. Returns the number still in
  // flight.
  int64_t shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41
