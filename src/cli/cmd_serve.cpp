// `dsv41 serve`: the OpenAI-compatible HTTP server (server/http_server.h). Without --model it
// serves the demo model (created on first run). SIGTERM/SIGINT: new requests get 503, in-flight
// requests finish (up to --shutdown-timeout), then the process exits 0.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <tuple>

#include "cli/commands.h"
#include "cli/demo_model.h"
#include "cli/fast_model_dir.h"
#include "cli/image_encoder.h"
#include "core/cpu_set.h"
#include "core/load_progress.h"
#include "core/log.h"
#include "engine/engine.h"
#include "parallel/world.h"
#include "server/generation_defaults.h"
#include "server/http_server.h"
#include "server/image_sources.h"

namespace dsv41::cli {
namespace {
// How long /health says 503 before serve exits after the model's ranks failed.
constexpr double kRankFailureGraceSeconds = 2.0;
// --max-queue's ceiling: the HTTP server starts one thread per request it may hold (running plus
// waiting) up front, so the queue bounds the threads at start-up.
constexpr int kMaxQueueLimit = 16384;
}  // namespace

void add_serve(CLI::App& app, Runner* run) {
  struct Args {
    std::string model;
    ServerOptions server;
    std::size_t max_body_mb = 8;
    double image_cache_mb = 1024;  // encoded images kept (the vision tower's rows)
    double image_url_timeout_s = 10;
    std::string local_media_path;  // --allowed-local-media-path
    double header_timeout_s = 10, body_timeout_s = 60, keep_alive_s = 5;
    int64_t stream_buffer_kb = 1024;
    int64_t max_context = 0;
    uint64_t seed = 0;
    int64_t max_num_batched_tokens = EngineOptions{}.max_num_batched_tokens;
    int max_num_seqs = EngineOptions{}.max_num_seqs;
    int max_queue = EngineOptions{}.max_queue;
    PathArgs paths;
    std::vector<std::string> names;  // --served-model-name
    std::string default_kwargs;      // --default-chat-template-kwargs (JSON)
    std::string generation_config = "auto";
    std::string override_generation_config;  // JSON
    int default_max_tokens = 0;              // --default-max-tokens, when given
    std::vector<std::string> api_keys;       // --api-key (repeatable)
    std::string api_key_file;
    std::string allowed_origins, allowed_methods, allowed_headers;  // CORS lists (JSON or a,b)
    std::string log_requests = "text";
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "serve",
      "OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (streaming, logprobs, "
      "tools), /v1/models, /tokenize, /detokenize, /health, /metrics. Without --model it creates "
      "(first "
      "run) and serves a small random-weight demo model. The fast engine runs the model (an "
      "official-layout checkpoint is converted once beside it); concurrent requests run in the "
      "same "
      "steps (continuous batching, chunked prefill, preemption by recompute when the KV cache is "
      "full).");
  sub->add_option("--model", a->model,
                  "Checkpoint directory (official or converted layout); default: the demo model");
  sub->add_option("--host", a->server.host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", a->server.port, "Port to listen on (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  sub->add_option("--api-key", a->api_keys,
                  "A key clients must send (Authorization: Bearer KEY, or x-api-key: KEY) on "
                  "every API route (not /health, nor the chat page's files; /metrics unless "
                  "--metrics-public); repeatable. Also --api-key-file and the DSV41_API_KEY "
                  "variable; with none of them every route is open");
  sub->add_option("--api-key-file", a->api_key_file,
                  "File of API keys, one a line (blank lines and lines starting with # skipped)");
  sub->add_flag("--metrics-public", a->server.metrics_public,
                "/metrics needs no key even when API keys are set (a scraper on the network)");
  sub->add_option("--allowed-origins", a->allowed_origins,
                  "CORS: origins whose pages may call the API, as a JSON list ('[\"*\"]', "
                  "'[\"https://app.example\"]') or comma-separated; default none: no "
                  "cross-origin access (the built-in page is same-origin)");
  sub->add_option("--allowed-methods", a->allowed_methods,
                  "CORS: methods a cross-origin page may use (JSON list or comma-separated; "
                  "default all)");
  sub->add_option("--allowed-headers", a->allowed_headers,
                  "CORS: request headers a cross-origin page may send (JSON list or "
                  "comma-separated; default all)");
  sub->add_flag("--allow-credentials", a->server.cors.credentials,
                "CORS: allow cookies and Authorization on cross-origin requests "
                "(Access-Control-Allow-Credentials)");
  sub->add_option("--ssl-certfile", a->server.ssl_certfile,
                  "HTTPS: the server's certificate (PEM; with --ssl-keyfile), else plain HTTP");
  sub->add_option("--ssl-keyfile", a->server.ssl_keyfile,
                  "HTTPS: the certificate's private key (PEM, unencrypted)");
  sub->add_option("--log-requests", a->log_requests,
                  "text = one `access:` log line per request | json = generation requests as one "
                  "JSON line each on stdout (id, api, status, finish_reasons, prompt_tokens, "
                  "cached_tokens, output_tokens, queue_s, ttft_s, e2e_s, client) | off")
      ->check(CLI::IsMember({"text", "json", "off"}))
      ->capture_default_str();
  sub->add_flag("--log-prompts", a->server.log_prompts,
                "With --log-requests json: each record also holds the prompt text (off by "
                "default: prompts may be private)");
  sub->add_option("--served-model-name", a->names,
                  "Model names clients may send, one or several (responses report the first; "
                  "default: the checkpoint directory's name; dsv41-demo; GET /v1/models lists the "
                  "others as \"aliases\")");
  sub->add_option("--default-chat-template-kwargs", a->default_kwargs,
                  "JSON object every chat request's chat_template_kwargs start from (its own keys "
                  "win), e.g. '{\"thinking\": false}' for clients that cannot send them; shown in "
                  "GET /v1/models (\"default_chat_template_kwargs\")");
  sub->add_option("--generation-config", a->generation_config,
                  "auto: sampling defaults from the checkpoint's generation_config.json when it "
                  "has one (vLLM's keys: temperature, top_p, top_k, min_p, repetition_penalty, "
                  "max_new_tokens as the default max_tokens); none: ignore the file. A request's "
                  "own fields always win; GET /v1/models shows the effective defaults "
                  "(\"default_sampling\")")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none"}));
  sub->add_option("--override-generation-config", a->override_generation_config,
                  "JSON object of those keys that replace the file's key by key, e.g. "
                  "'{\"temperature\": 0.6, \"top_p\": 0.95}' (applies with "
                  "--generation-config none too)");
  // Not given is not 0: only a given value wins over the generation config's max_new_tokens.
  CLI::Option* max_tokens_flag =
      sub->add_option("--default-max-tokens", a->default_max_tokens,
                      "max_tokens for chat and Responses requests that do not set it: N, or 0 for "
                      "the rest of the context (as vLLM); either wins over the generation "
                      "config's max_new_tokens. Not given: max_new_tokens when the generation "
                      "config has it, else the rest of the context")
          ->check(CLI::Range(0, 1 << 30));
  sub->add_option("--reasoning-budget", a->server.reasoning_budget,
                  "Reasoning tokens a request may generate at most before the engine ends the "
                  "reasoning itself (</think>) and the answer follows; a request's "
                  "thinking_token_budget (Messages: thinking.budget_tokens) may only lower it "
                  "(-1: no cap); shown in GET /v1/models (\"reasoning_budget\")")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 30));
  sub->add_option("--max-context", a->max_context, "Context limit in tokens (0: the model's)")
      ->capture_default_str();
  sub->add_option("--image-cache-mb", a->image_cache_mb,
                  "Images: the encoded images kept (the vision tower's rows, least recently used "
                  "out first), so a repeated image is not encoded again (0: none)")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  sub->add_flag("--allow-image-urls", a->server.image_sources.allow_urls,
                "Images: fetch image parts' http:// and https:// URLs (otherwise only data: URLs "
                "are taken). Off by default: it lets every client make the server fetch any URL "
                "the server can reach (its network, cloud metadata addresses); at most 32 MB an "
                "image, at most 5 redirects, within --image-url-timeout");
  sub->add_option("--image-url-timeout", a->image_url_timeout_s,
                  "Images: seconds one image URL's fetch may take, from the connect to the last "
                  "byte, redirects included (over it: a 400)")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  sub->add_option("--allowed-local-media-path", a->local_media_path,
                  "Images: read image parts' file:// URLs, only files inside this directory "
                  "(the path resolved, symbolic links and .. included; regular files only; at "
                  "most 32 MB). Default: none (file:// URLs refused). Clients can then read any "
                  "image under it");
  sub->add_option("--max-body-mb", a->max_body_mb, "Largest accepted request body")
      ->capture_default_str();
  sub->add_option("--max-connections", a->server.max_connections,
                  "Open connections at most, all clients together; one more is answered 503 and "
                  "closed (an open connection costs memory, not a thread)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  sub->add_option("--max-connections-per-client", a->server.max_connections_per_client,
                  "Open connections at most per client address (0: no cap; behind a proxy every "
                  "client has the proxy's address)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  sub->add_option("--header-timeout", a->header_timeout_s,
                  "Seconds a request's headers may take to arrive; slower connections are closed "
                  "(slowloris)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  sub->add_option("--body-timeout", a->body_timeout_s,
                  "Seconds a request's body may take to arrive after its headers")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  sub->add_option("--keep-alive-timeout", a->keep_alive_s,
                  "Seconds an idle keep-alive connection stays open between requests")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  sub->add_option("--stream-buffer-kb", a->stream_buffer_kb,
                  "KiB of a streamed answer that may wait for a slow reader; past it the stream "
                  "is cut and its request cancelled (logged)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(4), int64_t(1) << 22));
  sub->add_option("--grammar-time-budget-ms", a->server.grammar.time_budget_ms,
                  "Structured outputs: milliseconds a request's schema (or regex) may take to "
                  "compile; longer is a 400 grammar_too_complex, never a stalled server")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 600000.0));
  sub->add_option("--grammar-max-states", a->server.grammar.state_budget,
                  "Structured outputs: automaton states a schema may compile to (more: 400 "
                  "grammar_too_complex)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(16), int64_t(1) << 30));
  sub->add_option("--grammar-precompute-ms", a->server.grammar.precompute_ms,
                  "Structured outputs: milliseconds of a compile spent on each grammar state's "
                  "token set (the rest fill on first use: a lower value answers sooner, a higher "
                  "one keeps the slowest steps' masks cheaper)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 600000.0));
  sub->add_option("--shutdown-timeout", a->server.shutdown_timeout_s,
                  "Seconds SIGTERM waits for in-flight requests before stopping")
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "Seed for requests that do not carry one")
      ->capture_default_str();
  sub->add_option("--max-num-batched-tokens", a->max_num_batched_tokens,
                  "Tokens per engine step, all requests together (running decodes first, then "
                  "chunks of waiting prompts); larger favours throughput, smaller the latency of "
                  "running streams")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  sub->add_option("--max-num-seqs", a->max_num_seqs,
                  "Requests running in the same steps at most (the reference path: 1)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub->add_option("--max-queue", a->max_queue,
                  "Requests that may wait for a running seat (beyond --max-num-seqs running); "
                  "more are answered 429 with Retry-After (0: none wait, 429 as soon as "
                  "--max-num-seqs are running; at most 16384: every waiting request holds one of "
                  "the server's threads, all started at once)")
      ->capture_default_str()
      ->check(CLI::Range(0, kMaxQueueLimit));
  add_path_options(sub, &a->paths);
  sub->callback([a, run, max_tokens_flag] {
    if (max_tokens_flag->count() > 0) a->server.default_max_tokens = a->default_max_tokens;
    *run = [a] {
      // Signals are taken by one thread (sigwait); every thread created from here inherits the
      // mask.
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGTERM);
      sigaddset(&set, SIGINT);
      pthread_sigmask(SIG_BLOCK, &set, nullptr);
      signal(SIGPIPE, SIG_IGN);
      // Every open connection holds a descriptor: the soft limit (often 1,024) is raised to the
      // hard one, which needs no privilege.
      if (rlimit nofile{};
          getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        const rlim_t was = nofile.rlim_cur;
        nofile.rlim_cur = nofile.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &nofile) == 0)
          log::debug("serve: open-file limit raised from {} to {}", was, nofile.rlim_max);
      }

      // The flags that need no model are checked first: a typo fails before the demo model is
      // created or a checkpoint is read.
      if (!a->default_kwargs.empty()) {
        auto kw = parse_json_ordered(a->default_kwargs);
        if (!kw || !kw->is_object()) {
          log::error("serve: --default-chat-template-kwargs: not a JSON object: {}",
                     kw ? a->default_kwargs : kw.status().message());
          return kExitUsage;
        }
        a->server.default_chat_template_kwargs = std::move(*kw);
      }
      if (!a->override_generation_config.empty()) {
        if (auto o = parse_override_generation_config(a->override_generation_config); !o) {
          log::error("serve: {}", o.status().message());
          return kExitUsage;
        }
      }
      {
        const char* env = std::getenv("DSV41_API_KEY");
        auto keys = ApiKeys::load(a->api_keys, a->api_key_file, env ? env : "");
        if (!keys) {  // a key file that cannot be read or holds none is an invalid input
          log::error("serve: {}", keys.status().message());
          return keys.status().message().starts_with("--api-key-file") ? kExitInvalid : kExitUsage;
        }
        a->server.api_keys = std::move(*keys);
        if (a->server.ssl_certfile.empty() != a->server.ssl_keyfile.empty()) {
          log::error("serve: --ssl-certfile and --ssl-keyfile go together (HTTPS needs both)");
          return kExitUsage;
        }
        a->server.request_log = a->log_requests == "json"  ? ServerOptions::RequestLog::kJson
                                : a->log_requests == "off" ? ServerOptions::RequestLog::kOff
                                                           : ServerOptions::RequestLog::kText;
        if (a->server.log_prompts && a->server.request_log != ServerOptions::RequestLog::kJson) {
          log::error("serve: --log-prompts needs --log-requests json");
          return kExitUsage;
        }
        for (auto [flag, value, out] :
             {std::tuple{"--allowed-origins", &a->allowed_origins, &a->server.cors.origins},
              std::tuple{"--allowed-methods", &a->allowed_methods, &a->server.cors.methods},
              std::tuple{"--allowed-headers", &a->allowed_headers, &a->server.cors.headers}}) {
          if (value->empty()) continue;
          if (Status st = CorsPolicy::parse_list(flag, *value, out); !st.is_ok()) {
            log::error("serve: {}", st.message());
            return kExitUsage;
          }
        }
        a->server.image_sources.timeout =
            std::chrono::milliseconds(int64_t(a->image_url_timeout_s * 1000 + 0.5));
        if (!a->local_media_path.empty()) {
          auto media = canonical_media_dir(a->local_media_path);
          if (!media) {
            log::error("serve: {}", media.status().message());
            return kExitUsage;
          }
          a->server.image_sources.local_media_dir = std::move(*media);
          log::info("serve: image parts' file:// URLs are read from inside {}",
                    a->server.image_sources.local_media_dir);
        }
        if (a->server.image_sources.allow_urls)
          log::warn(
              "serve: image parts' http(s) URLs are fetched (--allow-image-urls): any client can "
              "make this server request any URL it can reach");
        if (!a->server.api_keys.enabled() && !is_loopback_host(a->server.host))
          log::warn(
              "serve: listening on {} with no API key: anyone who reaches the port can use the "
              "model (--api-key, --api-key-file or DSV41_API_KEY)",
              a->server.host);
      }
      std::string dir = a->model;
      const bool demo = dir.empty();
      if (!a->names.empty()) {
        a->server.model_name = a->names.front();
        a->server.model_aliases.assign(a->names.begin() + 1, a->names.end());
      } else {
        a->server.model_name = demo ? "dsv41-demo" : std::filesystem::path(dir).filename().string();
      }
      a->server.max_body_bytes = a->max_body_mb << 20;
      auto ms = [](double s) { return std::chrono::milliseconds(int64_t(s * 1000 + 0.5)); };
      a->server.header_timeout = ms(a->header_timeout_s);
      a->server.body_timeout = ms(a->body_timeout_s);
      a->server.keep_alive_timeout = ms(a->keep_alive_s);
      a->server.stream_buffer_bytes = std::size_t(a->stream_buffer_kb) << 10;
      // Rank 0 listens before the model is made, converted or loaded (minutes on the release): a
      // health probe sees 503 "loading" with the progress instead of a refused connection, and a
      // port in use fails at once instead of after the load. "listening on" is logged once
      // requests are served. The sampling defaults (read from the model directory) are handed over
      // with the model.
      std::unique_ptr<HttpServer> server;
      std::thread serving, signals;
      std::atomic<bool> loaded{false};
      auto stop_listening = [&] {  // a load that failed: the error's exit code, not a signal's
        if (signals.joinable()) signals.detach();  // (waiting in sigwait; the process ends)
        if (!server) return;
        server->shutdown();
        serving.join();
      };
      // SIGTERM/SIGINT: while the model loads, stop at once (nothing is in flight; a conversion
      // resumes where it stopped); once it serves, refuse new requests and let in-flight ones
      // finish (shutdown()).
      auto start_signals = [&, set] {
        signals = std::thread([&, set] {
          int sig = 0;
          sigwait(&set, &sig);
          if (!loaded.load()) {
            log::info("serve: signal {} while loading the model: stopping", sig);
            if (server) server->shutdown();
            std::fflush(nullptr);
            std::_Exit(kExitOk);
          }
          log::info("serve: signal {}: refusing new requests, finishing in-flight ones", sig);
          const int64_t left = server->shutdown();
          if (left > 0)
            log::warn("serve: {} requests still running after the shutdown timeout", left);
        });
      };
      // --cpu-list pins this thread before the listener's threads start, so they inherit it too.
      if (!a->paths.cpu_list.empty()) {
        auto cpus = parse_cpu_list(a->paths.cpu_list);
        Status pinned = cpus ? pin_to_cpus(*cpus) : cpus.status();
        if (!pinned.is_ok()) {
          log::error("serve: {}{}",
                     pinned.message().starts_with("--") ? "" : "--cpu-list: ", pinned.message());
          return kExitUsage;
        }
      }
      if (parallel::World::get().rank() == 0) {
        server = std::make_unique<HttpServer>(a->server, int64_t(a->max_num_seqs) + a->max_queue);
        if (Status st = server->bind(); !st) {
          log::error("serve: {}", st.message());
          return kExitUsage;
        }
        serving = std::thread([&] { server->serve(); });
        start_signals();
        log::info(
            "serve: accepting connections on {}:{} while the model loads (/health answers 503 "
            "\"loading\" until it is ready)",
            a->server.host, server->port());
      }
      if (demo) {
        set_load_progress("creating the demo model");
        auto d = parallel::World::get().rank0_first(ensure_demo_model);
        if (!d) {
          log::error("serve: demo model: {}", d.status().message());
          stop_listening();
          return kExitInvalid;
        }
        dir = *d;
        log::info("serve: no --model given: serving the demo model in {}", dir);
      }
      {
        auto defaults =
            load_sampling_defaults(dir, a->generation_config, a->override_generation_config);
        if (!defaults) {
          log::error("serve: {}", defaults.status().message());
          stop_listening();
          return defaults.status().message().starts_with("--") ? kExitUsage : kExitInvalid;
        }
        // What requests get and /v1/models shows: --default-max-tokens, when given, over the
        // file's max_new_tokens (HttpServer applies it too, to the same result).
        a->server.sampling_defaults = *defaults;
        a->server.sampling_defaults.apply_default_max_tokens(a->server.default_max_tokens);
        if (!a->server.sampling_defaults.empty())
          log::info("serve: sampling defaults {}",
                    python_json_dumps(a->server.sampling_defaults.to_json()));
      }
      set_load_progress("preparing " + dir);
      log::info("serve: loading {} ...", dir);
      const auto t0 = std::chrono::steady_clock::now();
      EngineOptions eo;
      if (Status st = apply_path_options(a->paths, dir, &eo); !st.is_ok()) {
        log::error("serve: {}", model_error(st));
        stop_listening();
        return kExitInvalid;
      }
      eo.seed = a->seed;
      eo.max_context = a->max_context;
      eo.max_num_batched_tokens = a->max_num_batched_tokens;
      eo.max_num_seqs = a->max_num_seqs;
      eo.max_queue = a->max_queue;
      set_load_progress("loading weights");
      auto engine = Engine::load(eo);
      if (!engine) {
        log::error("serve: {}", model_error(engine.status()));
        stop_listening();
        return kExitInvalid;
      }
      set_load_progress("");
      log::info("serve: model loaded in {:.1f} s (vocab {}, context {} tokens)",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                (*engine)->vocab_size(), (*engine)->max_context());
      if (parallel::World::get().size() > 1) {
        const char* rec = std::getenv("OMPI_MCA_orte_enable_recovery");
        if (!rec || std::string(rec) != "1")
          log::warn(
              "serve: mpirun was started without --enable-recovery: if a rank dies, mpirun ends "
              "rank 0 at once (clients see their connections close) instead of rank 0 failing "
              "the requests and answering 503 on /health (docs/parallel.md)");
      }
      // Images: the model's vision tower behind the server's encoder (none: no vision_config).
      auto images = make_image_encoder(eo, int64_t(a->image_cache_mb * 1048576.0));
      if (!images) {
        log::error("serve: the vision tower: {}", images.status().message());
        stop_listening();
        return kExitInvalid;
      }
      if (!server) {  // (a follower rank never gets here: it follows rank 0 inside the load)
        server = std::make_unique<HttpServer>(**engine, a->server);
        server->set_image_encoder(*images);
        if (Status st = server->bind(); !st) {
          log::error("serve: {}", st.message());
          return kExitUsage;
        }
        serving = std::thread([&] { server->serve(); });
      } else {
        server->set_image_encoder(*images);
        server->attach(**engine, a->server.sampling_defaults);
      }
      loaded = true;
      if (!signals.joinable()) start_signals();
      HttpServer& srv = *server;
      const char* scheme = a->server.ssl_certfile.empty() ? "http" : "https";
      log::info("serve: listening on {}://{}:{} (model \"{}\")", scheme, a->server.host, srv.port(),
                a->server.model_name);
      // A browser reaches a server listening on every interface through loopback.
      const std::string browse = a->server.host == "0.0.0.0" || a->server.host == "::"
                                     ? std::string("127.0.0.1")
                                     : a->server.host;
      log::info("serve: chat page {}://{}:{}/  dashboard {}://{}:{}/dashboard", scheme, browse,
                srv.port(), scheme, browse, srv.port());
      // A split model (mpirun) whose other ranks died or hang: the failed step has failed its
      // requests and /health answers 503; after a grace period for clients and load balancers to
      // see it, the server stops and the job ends with kExitRankFailed.
      std::atomic<bool> rank_failed{false}, stopped{false};
      std::thread watch([&] {
        while (!stopped.load()) {
          if (!(*engine)->health()) {
            log::error("serve: {}; stopping in {:.0f} s", (*engine)->health().message(),
                       kRankFailureGraceSeconds);
            rank_failed = true;
            std::this_thread::sleep_for(std::chrono::duration<double>(kRankFailureGraceSeconds));
            ::kill(::getpid(), SIGTERM);
            return;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      });
      serving.join();
      // Normally serve() returns because the signal thread stopped it; if the listener failed on
      // its own, wake that thread so it can finish.
      ::kill(::getpid(), SIGTERM);
      signals.join();
      stopped = true;
      watch.join();
      if (rank_failed) {
        log::error("serve: stopped: the model's ranks failed");
        // MPI cannot end cleanly with a rank gone: abort the job with this code.
        parallel::World::exit_now(kExitRankFailed);
      }
      log::info("serve: stopped");
      return kExitOk;
    };
  });
}

}  // namespace dsv41::cli
