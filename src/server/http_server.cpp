// Routes and request lifecycle. Generation: parse + validate (4xx with OpenAI's error JSON),
// submit, then either wait for the whole answer (its status decided at the end: 5xx on an engine
// failure) or stream SSE chunks; a client gone (a hang-up seen on the socket, a failed stream
// write) cancels the request in the engine. Every handler catches everything: a request can fail,
// the server not.
#include "server/http_server.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <random>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "core/load_progress.h"
#include "core/log.h"
#include "server/anthropic_api.h"
#include "server/generation_protocol.h"
#include "server/http_transport.h"
#include "server/image_inputs.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/structured_outputs.h"
#include "server/web_assets.h"
#include "text/byte_level.h"
#include "text/chat.h"

namespace dsv41 {

using Clock = std::chrono::steady_clock;
using Req = http::Request;
using Res = http::Response;
using Conn = http::Connection;

namespace {

// The JSON parser's messages read "invalid JSON at byte N: [json.exception.parse_error.101] parse
// error at line 1, column 2: syntax error while parsing value - ..."; a client gets the byte offset
// and what was wrong, without the library's tag and the repeated position.
std::string readable_json_error(std::string m) {
  if (const auto tag = m.find("[json.exception."); tag != std::string::npos) {
    const auto end = m.find("] ", tag);
    m.erase(tag, end == std::string::npos ? std::string::npos : end + 2 - tag);
  }
  if (const auto pos = m.find("parse error at "); pos != std::string::npos) {
    const auto colon = m.find(": ", pos);
    if (colon != std::string::npos) m.erase(pos, colon + 2 - pos);
  }
  const std::string prefix = "invalid JSON";
  return "invalid JSON body" + (m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : ": " + m);
}

constexpr std::size_t kMaxHeaderLines = 200;
constexpr std::size_t kMaxHeaderBytes = 64 * 1024;

// The page's files need no model: the chat page can load (and say the model is loading).
bool serves_without_model(const std::string& path) {
  return path == "/" || path == "/dashboard" || path.rfind("/web/", 0) == 0;
}

// The request log's records: one JSON line each on stdout, whole lines however many requests end at
// once.
void write_request_record(const OJson& rec) {
  static std::mutex mu;
  const std::string line = rec.dump(-1, ' ', false, OJson::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(mu);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

// Now as UTC ISO 8601 with milliseconds (2026-12-07T11:40:00.123Z).
std::string iso_time_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, int(ms));
}

}  // namespace

struct StreamState;  // one generation response (below)

struct HttpServer::Impl {
  // Null while the model loads (the server listens from the start; ready says when requests may
  // use it).
  Engine* engine = nullptr;
  std::atomic<bool> ready{false};
  int64_t capacity = 0;  // requests the engine can hold at once (sizes the HTTP threads)
  std::chrono::steady_clock::time_point created = std::chrono::steady_clock::now();
  ServerOptions opt;
  ServedModel model;
  Metrics metrics{opt.model_name};  // (opt is initialised before it)
  CorsPolicy cors{opt.cors};
  std::atomic<bool> draining{false};
  std::atomic<int64_t> in_flight{0};
  // The connections (http_transport.h): made by routes(), which gives it its hooks.
  std::unique_ptr<http::Transport> transport;
  uint64_t nonce = 0;
  int64_t started = 0;
  std::mutex shutdown_mu;

  Impl(Engine* e, ServerOptions o, int64_t max_requests)
      : capacity(e ? e->max_requests() : max_requests), opt(std::move(o)) {
    model.name = opt.model_name;
    model.reasoning_budget = opt.reasoning_budget;
    model.aliases = opt.model_aliases;
    model.default_chat_template_kwargs = opt.default_chat_template_kwargs;
    model.grammars = std::make_shared<GrammarCache>(64, std::size_t(256) << 20, opt.grammar);
    // One default max_tokens, which the parsers apply and /v1/models shows: --default-max-tokens
    // when given, else the generation config's max_new_tokens.
    model.sampling_defaults = opt.sampling_defaults;
    model.sampling_defaults.apply_default_max_tokens(opt.default_max_tokens);
    nonce = std::random_device{}();
    started = static_cast<int64_t>(std::time(nullptr));
    routes();
    if (e) attach(*e);
  }
  // The model is in: requests go to it from now on (with the sampling defaults read beside it,
  // when given).
  void attach(Engine& e, const std::optional<SamplingDefaults>& defaults = std::nullopt) {
    if (defaults) {
      opt.sampling_defaults = *defaults;
      model.sampling_defaults = *defaults;
      model.sampling_defaults.apply_default_max_tokens(opt.default_max_tokens);
    }
    engine = &e;
    model.max_context = e.max_context();
    model.image_token_id = e.image_token_id();
    ready.store(true, std::memory_order_release);
  }

  static void send_error(Res& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(error_body(e), "application/json");
  }
  // Errors raised before a route's own handler runs, in the shape of the API the path belongs to.
  static void send_error_for(const std::string& path, Res& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(path.rfind("/v1/messages", 0) == 0 ? anthropic_error_body(e) : error_body(e),
                    "application/json");
  }
  static ApiError make_error(int status, std::string message, std::string type,
                             std::string param = {}, std::string code = {}) {
    ApiError e;
    e.status = status;
    e.message = std::move(message);
    e.type = std::move(type);
    e.param = std::move(param);
    e.code = std::move(code);
    return e;
  }

  // Parses the body as JSON (order kept); a 400 otherwise.
  static std::optional<ApiError> parse_body(const Req& req, OJson& out) {
    auto j = parse_json_ordered(req.body);
    if (!j)
      return make_error(400, readable_json_error(j.status().message()), "invalid_request_error");
    out = std::move(*j);
    if (!out.is_object())
      return make_error(400, "the request body must be a JSON object", "invalid_request_error");
    return std::nullopt;
  }

  // A route's handler; `conn` says whether the client is still there.
  using Handler = std::function<void(const Req&, Res&, const Conn& conn)>;
  // Every route with the methods it answers, for 405 + Allow on a known path.
  struct Route {
    std::string pattern;
    std::regex regex;
    std::string label;  // metrics endpoint label
    std::vector<std::string> methods;
    std::vector<Handler> handlers;  // one per method (HEAD runs GET's)
  };
  std::vector<Route> known;
  void on(const std::string& method, const std::string& pattern, const std::string& label,
          Handler handler);
  const Route* find_route(const std::string& path) const;
  std::optional<Res> before_routing(const Req& req);
  void dispatch(Req& req, Res& res, const Conn& conn);
  Res transport_error(int status, const std::string& message, const std::string& path);
  void access_log(const Req& req, const Res& res);

  void routes();
  void generation(const Req& req, Res& res, const Conn& conn, const GenerationApi& api);
  std::unique_ptr<GenerationApi> completions_api = openai_completions_api();
  std::unique_ptr<GenerationApi> chat_api = openai_chat_api();
  std::unique_ptr<GenerationApi> messages_api = anthropic_messages_api();
  std::unique_ptr<GenerationApi> responses_api = openai_responses_api();
  bool note(StreamState& st, std::size_t which, const RequestOutput& out);
  void whole_answer(Res& res, const Conn& conn, StreamState& st, const GenerationApi& api,
                    const std::string& id);
  void release(StreamState& st, const std::string& endpoint, int status);
  void tokenize(const Req& req, Res& res);
  void count_tokens(const Req& req, Res& res);
  void detokenize(const Req& req, Res& res);
};

void HttpServer::Impl::on(const std::string& method, const std::string& pattern,
                          const std::string& label, Handler handler) {
  auto it = std::find_if(known.begin(), known.end(),
                         [&](const Route& r) { return r.pattern == pattern; });
  if (it == known.end())
    it = known.insert(known.end(), Route{pattern, std::regex(pattern), label, {}, {}});
  it->methods.push_back(method);
  it->handlers.push_back(handler);
  if (method == "GET") {  // HEAD: GET's answer without its body (the transport leaves it out)
    it->methods.push_back("HEAD");
    it->handlers.push_back(std::move(handler));
  }
}

const HttpServer::Impl::Route* HttpServer::Impl::find_route(const std::string& path) const {
  for (const Route& r : known)
    if (std::regex_match(path, r.regex)) return &r;
  return nullptr;
}

// Checks made once the headers are in, before the body is read (on the transport's I/O thread:
// nothing here may block): a Content-Length that cannot be right is a 400 and one over the body
// limit a 413, at once instead of after the body deadline (the parser refuses most of these
// itself; a list of equal values, "5, 5", it takes as 5, so it is checked here); then 503 while
// draining; then 405 with Allow for a known path asked with another method. The body of such a
// request is never read, so the connection is closed after the answer. nullopt: go on routing.
std::optional<Res> HttpServer::Impl::before_routing(const Req& req) {
  Res res;
  const Route* route = find_route(req.path);
  const std::string label = route ? route->label : "unknown";
  // An allowed origin's answers carry its CORS headers, refusals included (so its page can read
  // them).
  const std::string origin = req.header("Origin");
  for (const auto& [k, v] : cors.response_headers(origin)) res.set_header(k, v);
  auto reject = [&](const ApiError& e) {
    send_error_for(req.path, res, e);
    res.set_header("Connection", "close");
    metrics.request_done(label, e.status);
    return std::optional<Res>(std::move(res));
  };
  if (req.has_header("Content-Length")) {
    const std::string v = req.header("Content-Length");
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    bool valid = !v.empty() && ec == std::errc() && end == v.data() + v.size();
    for (std::size_t k = 1; k < req.header_count("Content-Length"); ++k)
      valid = valid && req.header("Content-Length", k) == v;
    if (!valid)
      return reject(make_error(
          400, fmt::format("malformed HTTP request: Content-Length '{}' is not a byte count", v),
          "invalid_request_error"));
    if (n > opt.max_body_bytes)
      return reject(make_error(
          413,
          fmt::format("request body of {} bytes is larger than {} bytes", n, opt.max_body_bytes),
          "invalid_request_error"));
  }
  if (draining.load() && req.path != "/metrics")
    return reject(make_error(503, "the server is shutting down", "service_unavailable"));
  // CORS: a preflight is answered here (it carries no key), with the preflight's headers only.
  // Without --allowed-origins a preflight gets the 405 below.
  if (cors.enabled() && req.method == "OPTIONS" &&
      req.has_header("Access-Control-Request-Method")) {
    auto h = cors.preflight(origin, req.header("Access-Control-Request-Method"),
                            req.header("Access-Control-Request-Headers"));
    for (const auto& [k, v] : cors.response_headers(origin)) res.erase_header(k);
    res.status = h ? 200 : 400;
    if (h)
      for (const auto& [k, v] : *h) res.set_header(k, v);
    else
      res.set_content("Disallowed CORS request (origin, method or header not allowed)",
                      "text/plain");
    metrics.request_done(label, res.status);
    return res;
  }
  if (opt.api_keys.enabled() && path_needs_key(req.path, opt.metrics_public) &&
      !opt.api_keys.accepts(req.header("Authorization"), req.header("x-api-key"))) {
    const bool given = req.has_header("Authorization") || req.has_header("x-api-key");
    res.set_header("WWW-Authenticate", "Bearer");
    return reject(make_error(
        401,
        given ? "the API key is not valid"
              : "no API key given: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
        "invalid_request_error", "", "invalid_api_key"));
  }
  if (!ready.load(std::memory_order_acquire) && !serves_without_model(req.path)) {
    // Loading: probes see 503 with what is happening, clients a 503 to retry. The connection is
    // kept (a probe polls); the body of a refused request is not read, so that one is closed.
    const LoadProgress p = load_progress();
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - created).count();
    OJson progress{
        {"stage", p.stage.empty() ? std::string("loading the model") : p.stage},
        {"fraction", p.fraction < 0 ? OJson(nullptr) : OJson(std::round(p.fraction * 1000) / 1000)},
        {"seconds", std::round(waited * 10) / 10}};
    res.set_header("Retry-After", "5");
    if (req.path == "/health") {
      res.status = 503;
      // (replace: the stage names a directory, whose name need not be UTF-8)
      res.set_content(OJson{{"status", "loading"}, {"progress", std::move(progress)}}.dump(
                          -1, ' ', false, OJson::error_handler_t::replace),
                      "application/json");
      metrics.request_done("/health", 503);
      return res;
    }
    return reject(make_error(503,
                             fmt::format("the model is loading ({}); retry shortly",
                                         progress["stage"].get<std::string>()),
                             "service_unavailable"));
  }
  if (route &&
      std::find(route->methods.begin(), route->methods.end(), req.method) == route->methods.end()) {
    std::string allow;
    for (const auto& m : route->methods) allow += (allow.empty() ? "" : ", ") + m;
    res.set_header("Allow", allow);
    return reject(make_error(
        405, fmt::format("{} does not answer {} (allowed: {})", req.path, req.method, allow),
        "invalid_request_error"));
  }
  return std::nullopt;
}

// The access log of everything but generation answers (release() logs those, with their token
// counts and the status the client really got).
void HttpServer::Impl::access_log(const Req& req, const Res& res) {
  if (opt.request_log == ServerOptions::RequestLog::kOff) return;
  bool generation = false;
  for (const GenerationApi* api :
       {completions_api.get(), chat_api.get(), messages_api.get(), responses_api.get()})
    generation = generation || req.path == api->endpoint();
  generation =
      generation || req.path == "/beta/completions" || req.path == "/beta/chat/completions";
  if (generation && (res.status == 200 || res.has_header("X-Request-Id"))) return;
  if (generation && opt.request_log == ServerOptions::RequestLog::kJson) {
    // Refused before it reached the engine: a record with what is known.
    write_request_record(
        OJson{{"time", iso_time_now()},
              {"id", nullptr},
              {"api", req.path},
              {"status", res.status},
              {"client", req.remote_addr + ":" + std::to_string(req.remote_port)}});
    return;
  }
  // An open dashboard scrapes /metrics every second and the page loads its files: at debug.
  const bool polled =
      res.status == 200 && (req.path == "/metrics" || req.path == "/" || req.path == "/dashboard" ||
                            req.path.rfind("/web/", 0) == 0);
  if (polled)
    log::debug("access: {} {} {}", req.method, req.path, res.status);
  else
    log::info("access: {} {} {}", req.method, req.path, res.status);
}

// Errors raised by the transport itself (malformed request, oversized body or headers, a handler's
// exception, too many connections), in the shape of the API the path belongs to.
Res HttpServer::Impl::transport_error(int status, const std::string& message,
                                      const std::string& path) {
  Res res;
  send_error_for(path, res,
                 make_error(status, message,
                            status < 500    ? "invalid_request_error"
                            : status == 503 ? "service_unavailable"
                                            : "internal_error"));
  const Route* route = path.empty() ? nullptr : find_route(path);
  metrics.request_done(path.empty() ? "?" : (route ? route->label : "unknown"), status);
  return res;
}

// A request whose headers passed before_routing and whose body is in: its route's handler.
void HttpServer::Impl::dispatch(Req& req, Res& res, const Conn& conn) {
  for (const auto& [k, v] : cors.response_headers(req.header("Origin"))) res.set_header(k, v);
  for (const Route& r : known) {
    std::smatch m;
    if (!std::regex_match(req.path, m, r.regex)) continue;
    for (std::size_t k = 0; k < r.methods.size(); ++k) {
      if (r.methods[k] != req.method) continue;
      req.matches.assign(m.begin(), m.end());
      r.handlers[k](req, res, conn);
      return;
    }
    break;  // (405 is before_routing's)
  }
  send_error_for(req.path, res,
                 make_error(404, fmt::format("no route for {} {}", req.method, req.path),
                            "invalid_request_error"));
  metrics.request_done("unknown", 404);
}

void HttpServer::Impl::routes() {
  http::TransportOptions t;
  t.host = opt.host;
  t.port = opt.port;
  t.ssl_certfile = opt.ssl_certfile;
  t.ssl_keyfile = opt.ssl_keyfile;
  // Each generation request holds a worker while it runs: one for every request the engine can
  // hold at once plus a few for the other endpoints, so the engine's limits (429 beyond them),
  // not the workers, bound concurrency.
  t.workers = int(opt.threads > 0 ? opt.threads : capacity + 16);
  t.max_body_bytes = opt.max_body_bytes;
  t.max_header_bytes = kMaxHeaderBytes;
  t.max_header_lines = kMaxHeaderLines;
  t.max_connections = opt.max_connections;
  t.max_connections_per_client = opt.max_connections_per_client;
  t.header_timeout = opt.header_timeout;
  t.body_timeout = opt.body_timeout;
  t.keep_alive_timeout = opt.keep_alive_timeout;
  t.stream_buffer_bytes = opt.stream_buffer_bytes;
  http::TransportHooks hooks;
  hooks.screen = [this](const Req& req) { return before_routing(req); };
  hooks.handle = [this](Req& req, Res& res, const Conn& conn) { dispatch(req, res, conn); };
  hooks.error = [this](int status, const std::string& message, const std::string& path) {
    return transport_error(status, message, path);
  };
  hooks.log = [this](const Req& req, const Res& res) { access_log(req, res); };
  transport = std::make_unique<http::Transport>(std::move(t), std::move(hooks));

  on("GET", "/health", "/health", [this](const Req&, Res& res, const Conn&) {
    if (Status h = engine->health(); !h) {  // a split model whose ranks stopped answering
      res.status = 503;
      res.set_content(OJson{{"status", "unhealthy"}, {"error", h.message()}}.dump(),
                      "application/json");
      metrics.request_done("/health", 503);
      return;
    }
    res.set_content("{\"status\":\"ok\"}", "application/json");
    metrics.request_done("/health", 200);
  });
  on("GET", "/v1/models", "/v1/models", [this](const Req&, Res& res, const Conn&) {
    res.set_content(models_body(model, started), "application/json");
    metrics.request_done("/v1/models", 200);
  });
  on("GET", "/v1/models/(.+)", "/v1/models/{id}", [this](const Req& req, Res& res, const Conn&) {
    if (!model.serves(req.matches[1])) {
      send_error(res, model_not_found(req.matches[1], model));
      metrics.request_done("/v1/models/{id}", 404);
      return;
    }
    res.set_content(model_body(model, started), "application/json");
    metrics.request_done("/v1/models/{id}", 200);
  });
  on("GET", "/metrics", "/metrics", [this](const Req&, Res& res, const Conn&) {
    EngineStats s = engine->stats();
    const http::TransportCounters tc = transport->counters();
    res.set_content(
        metrics.render(s, in_flight.load(), {tc.open, tc.refused, tc.timed_out, tc.streams_cut},
                       model.images ? ImageFigures{model.images->encodes.load(),
                                                   model.images->cache_hits.load()}
                                    : ImageFigures{}),
        "text/plain; version=0.0.4");
  });
  // The chat page, the dashboard and their files, from the bytes built into the binary. The
  // policy header keeps the page to this server: nothing is loaded from anywhere else.
  auto page = [this](const WebAsset* a, const char* label, Res& res) {
    if (!a) {
      send_error(res, make_error(404, "no such file of the web page", "invalid_request_error"));
      metrics.request_done(label, 404);
      return;
    }
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Cache-Control", "no-cache");
    res.set_content(std::string(a->body), std::string(a->content_type));
    metrics.request_done(label, 200);
  };
  on("GET", "/", "/",
     [page](const Req&, Res& res, const Conn&) { page(find_web_asset("index.html"), "/", res); });
  on("GET", "/dashboard", "/dashboard", [page](const Req&, Res& res, const Conn&) {
    page(find_web_asset("dashboard.html"), "/dashboard", res);
  });
  on("GET", "/web/([^/]+)", "/web/{file}", [page](const Req& req, Res& res, const Conn&) {
    page(find_web_asset(req.matches[1]), "/web/{file}", res);
  });
  on("POST", "/v1/completions", "/v1/completions",
     [this](const Req& req, Res& res, const Conn& conn) {
       generation(req, res, conn, *completions_api);
     });
  on("POST", "/v1/chat/completions", "/v1/chat/completions",
     [this](const Req& req, Res& res, const Conn& conn) { generation(req, res, conn, *chat_api); });
  // DeepSeek's beta paths (chat prefix completion, FIM completion) are the same endpoints here.
  on("POST", "/beta/completions", "/v1/completions",
     [this](const Req& req, Res& res, const Conn& conn) {
       generation(req, res, conn, *completions_api);
     });
  on("POST", "/beta/chat/completions", "/v1/chat/completions",
     [this](const Req& req, Res& res, const Conn& conn) { generation(req, res, conn, *chat_api); });
  on("POST", "/v1/responses", "/v1/responses", [this](const Req& req, Res& res, const Conn& conn) {
    generation(req, res, conn, *responses_api);
  });
  on("POST", "/v1/messages", "/v1/messages", [this](const Req& req, Res& res, const Conn& conn) {
    generation(req, res, conn, *messages_api);
  });
  on("POST", "/v1/messages/count_tokens", "/v1/messages/count_tokens",
     [this](const Req& req, Res& res, const Conn&) { count_tokens(req, res); });
  on("POST", "/tokenize", "/tokenize",
     [this](const Req& req, Res& res, const Conn&) { tokenize(req, res); });
  on("POST", "/detokenize", "/detokenize",
     [this](const Req& req, Res& res, const Conn&) { detokenize(req, res); });
}

// State of one streamed response, shared by the content provider and its releaser.
// One choice of it per sample (OpenAI's n).
struct StreamState {
  struct Choice {
    std::optional<RequestHandle> handle;
    bool first_token = false;
    bool finished = false;
    FinishReason reason = FinishReason::kNone;
    std::string error;
    Clock::time_point last_token;
    int64_t completion_tokens = 0;
  };
  GenerationJob job;
  std::vector<Choice> choices;
  std::unique_ptr<ResponseWriter> writer;  // the API's rendering of the response
  Clock::time_point t0;
  Clock::time_point last_write = Clock::now();
  bool preamble_sent = false;
  bool first_token = false;  // of any choice (time to first token)
  bool finished = false;     // every choice finished
  bool failed = false;       // a choice failed: the response reported it, the others are cancelled
  int64_t prompt_tokens = 0, completion_tokens = 0;
  // For the request log: its id, the client's address, what the engine said of its prompt and
  // when its first token came (-1: not yet).
  std::string id, client, prompt_text;
  int64_t cached_tokens = 0;
  double queue_s = -1, ttft_s = -1;
  // The next output of any unfinished choice, waiting up to `timeout` in all; false when none
  // arrived. Choices are polled in turn (the first unfinished one is waited on), so no choice
  // starves another.
  bool next(std::size_t& which, RequestOutput& out, std::chrono::milliseconds timeout) {
    const std::size_t n = choices.size();
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t c = (poll_from + k) % n;
      if (choices[c].finished) continue;
      if (choices[c].handle->next(out, std::chrono::milliseconds(0))) {
        which = c;
        poll_from = (c + 1) % n;
        return true;
      }
    }
    for (std::size_t c = 0; c < n; ++c)
      if (!choices[c].finished) {
        // With several choices, wait briefly so that the others are looked at again soon.
        if (!choices[c].handle->next(out, n == 1 ? timeout : std::chrono::milliseconds(10)))
          return false;
        which = c;
        return true;
      }
    return false;
  }
  std::size_t poll_from = 0;
  // The first choice that failed (a bug or a broken model, never bad input): the whole response
  // reports it.
  const Choice* failure() const {
    for (const auto& c : choices)
      if (c.finished && c.reason == FinishReason::kError) return &c;
    return nullptr;
  }
};

// While the model works and nothing else is written, a stream sends an SSE comment (or the API's
// ping) every half second: a stream learns that the client went away from a failing write.
// Returns false (stop) when the write fails.
static bool heartbeat(StreamState& st, http::StreamSink& sink, const std::string& filler) {
  const auto now = Clock::now();
  if (now - st.last_write < std::chrono::milliseconds(500)) return true;
  st.last_write = now;
  return sink.write(filler);
}

// Called once per submitted generation request when it is over: answered (`status` as the client
// got it, 499 when it went away first) or abandoned; cancels what still runs.
void HttpServer::Impl::release(StreamState& st, const std::string& endpoint, int status) {
  if (!st.finished) {
    for (auto& c : st.choices)
      if (!c.finished) c.handle->cancel();
    if (!st.failed) log::info("serve: client went away; request cancelled");
  }
  in_flight.fetch_sub(1);
  // Every choice ends here once: finished as the engine said, or cancelled with its client.
  for (const auto& c : st.choices)
    metrics.sequence_finished(c.finished ? c.reason : FinishReason::kCancelled);
  const double secs = std::chrono::duration<double>(Clock::now() - st.t0).count();
  metrics.generation_done(endpoint, status, secs);
  if (opt.request_log == ServerOptions::RequestLog::kText)
    log::info("access: POST {} {} prompt_tokens={} completion_tokens={} {:.3f}s", endpoint, status,
              st.prompt_tokens, st.completion_tokens, secs);
  if (opt.request_log != ServerOptions::RequestLog::kJson) return;
  OJson reasons = OJson::array();
  for (const auto& c : st.choices)
    reasons.push_back(c.finished ? finish_reason_name(c.reason) : std::string("cancelled"));
  auto seconds = [](double v) { return v < 0 ? OJson(nullptr) : OJson(std::round(v * 1e6) / 1e6); };
  OJson rec{{"time", iso_time_now()},
            {"id", st.id},
            {"api", endpoint},
            {"status", status},
            {"finish_reasons", std::move(reasons)},
            {"prompt_tokens", st.prompt_tokens},
            {"cached_tokens", st.cached_tokens},
            {"output_tokens", st.completion_tokens},
            {"queue_s", seconds(st.queue_s)},
            {"ttft_s", seconds(st.ttft_s)},
            {"e2e_s", seconds(secs)},
            {"client", st.client}};
  if (opt.log_prompts) rec["prompt"] = st.prompt_text;
  write_request_record(rec);
}

// Metrics and the choice's state for one output; returns true when every choice has finished.
bool HttpServer::Impl::note(StreamState& st, std::size_t which, const RequestOutput& out) {
  StreamState::Choice& ch = st.choices[which];
  const auto now = Clock::now();
  if (out.queue_seconds >= 0 && st.queue_s < 0) st.queue_s = out.queue_seconds;
  st.cached_tokens = std::max(st.cached_tokens, out.cached_prompt_tokens);
  if (!out.tokens.empty()) {
    if (!st.first_token) {
      st.first_token = true;
      st.ttft_s = std::chrono::duration<double>(now - st.t0).count();
      metrics.first_token(st.ttft_s);
    }
    if (!ch.first_token) {
      ch.first_token = true;
      if (out.tokens.size() > 1)
        metrics.inter_token(0, int64_t(out.tokens.size()) - 1);  // arrived together
    } else {
      metrics.inter_token(std::chrono::duration<double>(now - ch.last_token).count(),
                          int64_t(out.tokens.size()));
    }
    ch.last_token = now;
  }
  if (out.finished) {
    ch.finished = true;
    ch.reason = out.reason;
    ch.error = out.error;
    ch.completion_tokens = out.completion_tokens;
    st.prompt_tokens = out.prompt_tokens;
    st.completion_tokens += out.completion_tokens;
    st.finished = std::all_of(st.choices.begin(), st.choices.end(),
                              [](const StreamState::Choice& c) { return c.finished; });
    if (st.finished) metrics.tokens(st.prompt_tokens, st.completion_tokens);
  }
  st.failed = st.failed || (out.finished && out.reason == FinishReason::kError);
  return st.finished;
}

// A non-streamed answer: waits for the whole of it in the handler, so that nothing, not even the
// status line, is written before the outcome is known. An engine failure is then a real 5xx with
// the API's error body (503 when the model is unhealthy, e.g. a rank of a split model died; 500
// otherwise), which clients raise as an API error and load balancers count as a failure; it used to
// be a 200 whose body of keep-alive spaces ended in an error JSON. A client that hangs up meanwhile
// is seen by polling the connection's socket (no byte is written), and its request is cancelled.
void HttpServer::Impl::whole_answer(Res& res, const Conn& conn, StreamState& st,
                                    const GenerationApi& api, const std::string& id) {
  int status = 500;  // an exception (the exception handler's answer) unless set below
  struct Release {   // whatever happens, the request is released
    Impl* impl;
    StreamState& st;
    const GenerationApi& api;
    int& status;
    ~Release() { impl->release(st, api.endpoint(), status); }
  } guard{this, st, api, status};
  auto last_check = Clock::now();
  while (!st.finished && !st.failed) {
    RequestOutput out;
    std::size_t which = 0;
    if (st.next(which, out, std::chrono::milliseconds(100))) {
      note(st, which, out);
      st.writer->add(which, out);
    }
    if (Clock::now() - last_check >= std::chrono::milliseconds(100)) {
      last_check = Clock::now();
      if (conn.gone()) {
        status = 499;  // the guard cancels the request
        return;
      }
    }
  }
  if (const StreamState::Choice* bad = st.failure()) {
    log::error("serve: {}: engine error: {}", id, bad->error);
    const bool unhealthy = !engine->health();
    status = unhealthy ? 503 : 500;
    res.status = status;
    res.set_content(
        api.error_body(make_error(status, "engine error: " + bad->error,
                                  unhealthy ? "service_unavailable" : "internal_error")),
        "application/json");
    return;
  }
  res.set_content(st.writer->body(), "application/json");
  status = 200;
}

void HttpServer::Impl::generation(const Req& req, Res& res, const Conn& conn,
                                  const GenerationApi& api) {
  const std::string endpoint = api.endpoint();
  auto st = std::make_shared<StreamState>();
  st->t0 = Clock::now();
  auto fail = [&](const ApiError& e) {
    res.status = e.status;
    res.set_content(api.error_body(e), "application/json");
    metrics.request_done(endpoint, e.status);
  };
  OJson body;
  if (auto e = parse_body(req, body)) return fail(*e);
  const Tokenizer& tok = engine->tokenizer();
  if (auto err = api.parse(body, model, tok, st->job)) return fail(*err);
  auto handles = engine->submit(st->job.request, st->job.n);
  if (!handles) {
    const std::string& m = handles.status().message();
    switch (handles.status().kind()) {
      case ErrorKind::kCapacity:  // OpenAI's rate-limit shape; retry after about one step
        res.set_header("Retry-After", "1");
        return fail(make_error(429, m, "rate_limit_exceeded"));
      case ErrorKind::kUnavailable:
        return fail(make_error(503, m, "service_unavailable"));
      case ErrorKind::kInternal:
        return fail(make_error(500, m, "internal_error"));
      default:  // the message starts with the parameter at fault
        return fail(make_error(400, m, "invalid_request_error", m.substr(0, m.find(':'))));
    }
  }
  const std::string id =
      !st->job.request_id.empty()
          ? st->job.request_id
          : fmt::format("{:x}{:04x}", nonce & 0xffffffffu, handles->front().id());
  st->choices.resize(handles->size());
  for (std::size_t c = 0; c < handles->size(); ++c) st->choices[c].handle = (*handles)[c];
  st->id = id;
  st->client = req.remote_addr + ":" + std::to_string(req.remote_port);
  if (opt.request_log == ServerOptions::RequestLog::kJson && opt.log_prompts) {
    auto text = tok.decode(st->job.request.prompt);
    st->prompt_text = text ? *text : std::string();
  }
  st->writer = api.writer(st->job, tok, id, static_cast<int64_t>(std::time(nullptr)));
  in_flight.fetch_add(1);
  // The access log line of a submitted request is release()'s (with its token counts); the header
  // also tells the HTTP logger so.
  res.set_header("X-Request-Id", id);
  if (!st->job.stream) return whole_answer(res, conn, *st, api, id);

  res.set_header("Cache-Control", "no-cache");
  res.set_header("Content-Type", "text/event-stream");
  // Called by the worker until it says stop or the stream is done; writes never block (a reader
  // too slow for the transport's buffer is cut, and a failed write ends the stream).
  res.stream = [this, st](http::StreamSink& sink) {
    auto send = [&](const std::vector<std::string>& frames) {
      st->last_write = Clock::now();
      for (const std::string& f : frames)
        if (!sink.write(f)) return false;
      return true;
    };
    if (!st->preamble_sent) {
      st->preamble_sent = true;
      if (!send(st->writer->stream_begin())) return false;
    }
    RequestOutput out;
    std::size_t which = 0;
    if (!st->next(which, out, std::chrono::milliseconds(100)))
      return heartbeat(*st, sink, st->writer->stream_heartbeat());
    const bool done = note(*st, which, out);
    if (out.finished && out.reason == FinishReason::kError) {
      // The status went out with the stream's first bytes: the failure is an in-band error
      // event. One failed choice ends the response: the others are cancelled by the releaser.
      if (!send(st->writer->stream_error(
              make_error(500, "engine error: " + out.error, "internal_error"))))
        return false;
    } else {
      if (!send(st->writer->stream_output(which, out)))
        return false;  // client gone: the releaser cancels
      if (!done) return true;
      if (!send(st->writer->stream_end())) return false;  // (a failure returned above)
    }
    sink.done();
    return true;
  };
  res.stream_end = [this, st, endpoint](bool) {
    release(*st, endpoint, st->finished || st->failed ? 200 : 499);
  };
}

void HttpServer::Impl::tokenize(const Req& req, Res& res) {
  OJson body;
  auto fail = [&](const ApiError& e) {
    send_error(res, e);
    metrics.request_done("/tokenize", e.status);
  };
  if (auto e = parse_body(req, body)) return fail(*e);
  std::string text;
  std::vector<ChatMessage> messages;
  if (body.contains("messages")) {
    auto chat = parse_chat_request(with_default_kwargs(body, model));
    if (!chat) {
      const std::string& m = chat.status().message();
      return fail(make_error(400, m, "invalid_request_error", m.substr(0, m.find(": "))));
    }
    auto prompt = encode_chat(chat->messages, chat->options);
    if (!prompt)
      return fail(make_error(400, prompt.status().message(), "invalid_request_error", "messages"));
    text = std::move(*prompt);
    messages = std::move(chat->messages);
  } else {
    auto p = body.find("prompt");
    if (p == body.end() || !p->is_string())
      return fail(make_error(400, "prompt: required string (or send messages)",
                             "invalid_request_error", "prompt"));
    text = p->get<std::string>();
  }
  OJson out = OJson::object();
  // Image parts become their spans, as a chat request's do (the images are encoded, or found in
  // the encoder's cache); "images" lists each span's first token and length.
  GenerationJob job;
  job.request.prompt = engine->tokenizer().encode(text);
  if (auto e = expand_chat_images(messages, model, job)) return fail(*e);
  const std::vector<int32_t>& ids = job.request.prompt;
  out["count"] = ids.size();
  out["max_model_len"] = engine->max_context();
  out["tokens"] = ids;
  if (!job.request.images.empty()) {
    out["images"] = OJson::array();
    for (const SliceImage& im : job.request.images)
      out["images"].push_back({{"start", im.start}, {"span", im.span()}});
  }
  res.set_content(out.dump(), "application/json");
  metrics.request_done("/tokenize", 200);
}

// Anthropic's count_tokens: the prompt a Messages request would run, counted ({"input_tokens"}).
void HttpServer::Impl::count_tokens(const Req& req, Res& res) {
  const char* endpoint = "/v1/messages/count_tokens";
  auto fail = [&](const ApiError& e) {
    res.status = e.status;
    res.set_content(anthropic_error_body(e), "application/json");
    metrics.request_done(endpoint, e.status);
  };
  OJson body;
  if (auto e = parse_body(req, body)) return fail(*e);
  GenerationJob job;
  if (auto e = parse_messages_request(body, model, engine->tokenizer(), true, job)) return fail(*e);
  OJson out = OJson::object();
  out["input_tokens"] = job.request.prompt.size();
  res.set_content(out.dump(), "application/json");
  metrics.request_done(endpoint, 200);
}

void HttpServer::Impl::detokenize(const Req& req, Res& res) {
  OJson body;
  auto fail = [&](const ApiError& e) {
    send_error(res, e);
    metrics.request_done("/detokenize", e.status);
  };
  if (auto e = parse_body(req, body)) return fail(*e);
  auto t = body.find("tokens");
  if (t == body.end() || !t->is_array())
    return fail(
        make_error(400, "tokens: required array of token ids", "invalid_request_error", "tokens"));
  std::vector<int32_t> ids;
  const int32_t vocab = engine->vocab_size();
  for (std::size_t i = 0; i < t->size(); ++i) {
    const OJson& v = (*t)[i];
    int64_t id = -1;
    if (v.is_number_unsigned()) {
      id = v.get<uint64_t>() < static_cast<uint64_t>(vocab)
               ? static_cast<int64_t>(v.get<uint64_t>())
               : -1;
    } else if (v.is_number_integer()) {
      id = v.get<int64_t>();
    }
    if (id < 0 || id >= vocab)
      return fail(
          make_error(400, fmt::format("tokens: element {} is not a token id in [0, {})", i, vocab),
                     "invalid_request_error", "tokens"));
    ids.push_back(static_cast<int32_t>(id));
  }
  auto text = engine->tokenizer().decode(ids);
  if (!text)
    return fail(
        make_error(400, "tokens: " + text.status().message(), "invalid_request_error", "tokens"));
  OJson out = OJson::object();
  out["prompt"] = *text;
  res.set_content(out.dump(-1, ' ', false, OJson::error_handler_t::replace), "application/json");
  metrics.request_done("/detokenize", 200);
}

HttpServer::HttpServer(Engine& engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(&engine, std::move(options), 0)) {}

HttpServer::HttpServer(ServerOptions options, int64_t max_requests)
    : impl_(std::make_unique<Impl>(nullptr, std::move(options), max_requests)) {}

void HttpServer::set_image_encoder(ImageEncoder encoder) {
  if (!encoder) return;
  impl_->model.images = std::make_shared<ImageSupport>();
  impl_->model.images->encode = std::move(encoder);
  impl_->model.images->sources = impl_->opt.image_sources;
}

void HttpServer::attach(Engine& engine, const SamplingDefaults& sampling_defaults) {
  impl_->attach(engine, sampling_defaults);
}

HttpServer::~HttpServer() {
  impl_->transport->stop();
}

Status HttpServer::bind() {
  return impl_->transport->bind();
}

int HttpServer::port() const {
  return impl_->transport->port();
}

void HttpServer::serve() {
  impl_->transport->run();  // returns at once when stop() came first
}

int64_t HttpServer::shutdown() {
  std::lock_guard<std::mutex> lock(impl_->shutdown_mu);
  impl_->draining.store(true);
  const auto deadline = Clock::now() + std::chrono::seconds(impl_->opt.shutdown_timeout_s);
  while (impl_->in_flight.load() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t left = impl_->in_flight.load();
  impl_->transport->stop();
  return left;
}

}  // namespace dsv41
