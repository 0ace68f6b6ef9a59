// What the server tests share: a scripted backend (answers every request with a fixed text),
// an in-process server on a free port, the real `dsv41 serve` binary as a child process, and
// helpers to stream, run commands and drive the npm clients (tests/js).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "engine/engine.h"
#include "engine/scripted_runner.h"
#include "io/test_util.h"
#include "model/tiny_checkpoint.h"
#include "model/tiny_converted.h"
#include "server/generation_protocol.h"
#include "server/http_server.h"
#include "text/chat.h"
#include "text/json_ordered.h"
#include "text/tokenizer_file.h"

namespace dsv41::server_testing {

using namespace std::chrono_literals;

// Faults a test injects into a ScriptBackend while the server runs.
struct ScriptFaults {
  // >= 0: a step holding a sequence's (fail_after + 1)-th slice fails (the prompt is one slice,
  // each decode one more), as a model whose forward broke.
  std::atomic<int> fail_after{-1};
  // With a failed step, the model also reports itself unhealthy from then on (a rank of a split
  // model that died: every later step would fail too).
  std::atomic<bool> die_on_failure{false};
  std::atomic<bool> dead{false};
};

// Answers every request with the tokens of `script` (then EOS), counted from the last
// <｜Assistant｜> token of the sequence; before any cue it follows a fixed chain.
class ScriptBackend final : public testing::ScriptedRunner {
 public:
  // hold_file: while that file exists, a step that would give the 4th script token or a later
  // one waits (up to 60 s), so a test can look at a half-streamed answer without racing the
  // model (the browser test's Stop).
  ScriptBackend(const Tokenizer& tok, std::vector<int32_t> script, int sleep_ms,
                std::string hold_file = {}, std::shared_ptr<ScriptFaults> faults = nullptr)
      : vocab_(tok.vocab_size()),
        cue_(tok.token_id("<｜Assistant｜>")),
        eos_(tok.token_id("<｜end▁of▁sentence｜>")),
        script_(std::move(script)),
        sleep_ms_(sleep_ms),
        hold_file_(std::move(hold_file)),
        faults_(faults ? std::move(faults) : std::make_shared<ScriptFaults>()) {}
  int32_t vocab_size() const override { return vocab_; }
  int64_t max_context() const override { return 2048; }
  Status health() const override {
    return faults_->dead.load()
               ? Status::error("scripted runner: a rank stopped answering", ErrorKind::kUnavailable)
               : Status::ok();
  }
  void reset(SeqId s) override {
    since_cue_[s] = -1;
    slices_[s] = 0;
  }
  void release(SeqId s) override {
    since_cue_.erase(s);
    slices_.erase(s);
  }
  void on_step() override {
    if (sleep_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
  }
  Status forward(SeqId s, int64_t, const std::vector<int32_t>& tokens,
                 std::vector<float>& logits) override {
    const int fail_after = faults_->fail_after.load();
    if (fail_after >= 0 && slices_[s]++ >= fail_after) {
      if (faults_->die_on_failure.load()) faults_->dead = true;
      return Status::error("scripted runner: the step failed (injected)");
    }
    int64_t& since_cue = since_cue_[s];
    for (int32_t t : tokens) since_cue = t == cue_ ? 0 : (since_cue >= 0 ? since_cue + 1 : -1);
    // The token after the cue is the thinking marker of the prompt; the script starts after it.
    int32_t next = (tokens.back() * 7 + 3) % vocab_;
    if (since_cue >= 1) {
      const auto k = static_cast<std::size_t>(since_cue - 1);
      if (k >= 3 && !hold_file_.empty())
        for (int i = 0; i < 6000 && std::filesystem::exists(hold_file_); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
      next = k < script_.size() ? script_[k] : eos_;
    }
    logits.assign(static_cast<std::size_t>(vocab_), 0.f);
    logits[static_cast<std::size_t>(next)] = 30.f;
    return Status::ok();
  }

 private:
  int32_t vocab_, cue_, eos_;
  std::vector<int32_t> script_;
  int sleep_ms_;
  std::string hold_file_;
  std::shared_ptr<ScriptFaults> faults_;
  std::map<SeqId, int64_t> since_cue_;
  std::map<SeqId, int> slices_;
};

inline const char* kScriptText =
    "I should call the tool.</think>Let me check.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke "
    "name=\"get_weather\">\n"
    "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n</｜DSML｜ "
    "invoke>\n</｜DSML｜ calls>";

// An in-process server on a free port.
struct InProcess {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<HttpServer> server;
  std::thread thread;
  int port = 0;
  std::shared_ptr<ScriptFaults> faults = std::make_shared<ScriptFaults>();  // scripted backend's

  // `configure`: server options beyond the harness's own (API keys, CORS, ...).
  explicit InProcess(int sleep_ms = 0, std::size_t max_body = 64 << 10, EngineOptions eo = {},
                     std::string hold_file = {},
                     const std::function<void(ServerOptions&)>& configure = {}) {
    auto tok = Tokenizer::from_json(make_tiny_tokenizer().tokenizer_json, "tiny");
    EXPECT_TRUE(tok.is_ok());
    auto script = (*tok)->encode(kScriptText);
    auto backend =
        std::make_unique<ScriptBackend>(**tok, script, sleep_ms, std::move(hold_file), faults);
    auto e = Engine::create(std::move(backend), std::move(*tok), eo);
    EXPECT_TRUE(e.is_ok());
    engine = std::move(*e);
    start(max_body, configure);
  }
  // `configure` sets server options beyond the harness's own (--reasoning-budget, ...).
  explicit InProcess(std::unique_ptr<Engine> e,
                     const std::function<void(ServerOptions&)>& configure = {})
      : engine(std::move(e)) {
    start(64 << 10, configure);
  }
  void start(std::size_t max_body, const std::function<void(ServerOptions&)>& configure = {}) {
    ServerOptions so;
    so.port = 0;
    so.model_name = "scripted";
    so.max_body_bytes = max_body;
    so.shutdown_timeout_s = 5;
    if (configure) configure(so);
    server = std::make_unique<HttpServer>(*engine, so);
    EXPECT_TRUE(server->bind().is_ok());
    port = server->port();
    thread = std::thread([this] { server->serve(); });
  }
  ~InProcess() {
    server->shutdown();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    return c;
  }
};

// POST whose response body is handed to `receive` as it arrives (false: hang up). Returns whether
// the exchange completed.
inline bool post_streaming(httplib::Client& c, const std::string& path, const std::string& body,
                           std::function<bool(const char*, std::size_t)> receive) {
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [receive](const char* data, std::size_t n, uint64_t, uint64_t) {
    return receive(data, n);
  };
  return static_cast<bool>(c.send(req));
}

// Waits up to 30 s (a starved CI machine; an idle engine returns at once) for the engine to have
// nothing running or queued.
// /metrics polled until its text holds `needle` (for up to 30 s; what it last read either way):
// the engine records some outcomes after the response has gone out.
inline std::string metrics_once_they_hold(httplib::Client& c, const std::string& needle) {
  std::string metrics;
  for (int i = 0; i < 3000 && metrics.find(needle) == std::string::npos; ++i) {
    if (i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto m = c.Get("/metrics");
    if (!m) return metrics;
    metrics = m->body;
  }
  return metrics;
}

inline bool engine_goes_idle(const Engine& e) {
  for (int i = 0; i < 1500; ++i) {
    const EngineStats st = e.stats();
    if (st.running == 0 && st.queued == 0) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// Sends raw bytes on a fresh connection and returns whatever comes back before the server closes.
inline std::string raw_exchange(int port, const std::string& bytes) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  timeval tv{20, 0};  // a starved CI machine; still under the server's 30 s read timeout
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)!write(fd, bytes.data(), bytes.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
    out.append(buf, static_cast<std::size_t>(n));
    // Stop at the end of one complete response (the server may keep the connection open).
    const std::size_t head = out.find("\r\n\r\n");
    const std::size_t cl = out.find("Content-Length: ");
    if (head != std::string::npos && cl != std::string::npos && cl < head &&
        out.size() >= head + 4 + std::stoul(out.substr(cl + 16)))
      break;
  }
  close(fd);
  return out;
}

// Runs a command, returning its exit status and output.
inline std::pair<int, std::string> run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// `node tests/js/SCRIPT BASE_URL MODEL MODE` (the openai client's base ends in /v1, the
// Anthropic client's, anthropic_*.mjs, does not).
inline std::string node_client(int port, const std::string& model, const std::string& mode,
                               const std::string& script = "openai_client_test.mjs") {
  const std::string base =
      "http://127.0.0.1:" + std::to_string(port) + (script.rfind("anthropic", 0) == 0 ? "" : "/v1");
  return std::string("node ") + DSV41_JS_DIR + "/" + script + " " + base + " " + model + " " + mode;
}

struct ServeProcess {
  pid_t pid = -1;
  int port = 0;
  std::string log_path;

  // `extra`: further serve flags (--speculative dspark, ...).
  bool start(const std::string& model_dir, const std::string& log,
             const std::vector<std::string>& extra = {}) {
    return launch({"--model", model_dir}, log, extra, "");
  }
  // The demo model, as `serve` without --model makes it on first use (preset demo, the V4.1
  // tokenizer derived from DeepSeek-V3's), in `cache` (DSV41_CACHE) instead of the user's cache.
  bool start_demo(const std::string& cache, const std::string& log,
                  const std::vector<std::string>& extra = {}) {
    return launch({}, log, extra, cache);
  }
  // `model`: --model and its value, or nothing (the demo); `cache`: DSV41_CACHE when not empty.
  bool launch(const std::vector<std::string>& model, const std::string& log,
              const std::vector<std::string>& extra, const std::string& cache) {
    log_path = log;
    std::vector<std::string> args = {"dsv41", "serve"};
    args.insert(args.end(), model.begin(), model.end());
    for (const char* a : {"--port", "0", "--shutdown-timeout", "60"}) args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // The environment is built before fork (the child only execs): this one's, with DSV41_CACHE.
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (cache.empty() || std::string_view(*e).rfind("DSV41_CACHE=", 0) != 0) env.emplace_back(*e);
    if (!cache.empty()) env.push_back("DSV41_CACHE=" + cache);
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid = fork();
    if (pid == 0) {
      FILE* f = freopen(log.c_str(), "w", stderr);
      (void)f;
      execve(DSV41_BINARY, argv.data(), envp.data());
      _exit(127);
    }
    for (int i = 0; i < 1200; ++i) {  // up to 120 s for the listening line (the demo is made first)
      std::ifstream in(log);
      std::string line;
      while (std::getline(in, line)) {
        for (const std::string at : {"listening on http://127.0.0.1:",
                                     "listening on https://127.0.0.1:"}) {  // --ssl-certfile
          if (auto k = line.find(at); k != std::string::npos) {
            port = std::stoi(line.substr(k + at.size()));
            return true;
          }
        }
      }
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }
  int wait_exit() {
    int st = 0;
    waitpid(pid, &st, 0);
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  ~ServeProcess() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// The weather conversation the API round-trip tests send (system, a question, an assistant turn
// with reasoning, text and a tool call, the tool's result, a two-part question) as chat messages,
// the call's id and arguments as the API under test carries them; checks that `job` (parsed from
// the API's body) has the prompt the chat encoder gives them at reasoning effort 25, in thinking
// mode with tools.
inline void expect_weather_round_trip(const Tokenizer& tok, const GenerationJob& job,
                                      const std::string& call_id, OJson arguments) {
  std::vector<ChatMessage> msgs(5);
  msgs[0].role = "system";
  msgs[0].content = "Be exact.";
  msgs[1].role = "user";
  msgs[1].content = "Weather in Paris?";
  msgs[2].role = "assistant";
  msgs[2].content = "Let me check.";
  msgs[2].reasoning = "I should call the tool.";
  msgs[2].tool_calls.push_back({call_id, "get_weather", std::move(arguments)});
  msgs[3].role = "tool";
  msgs[3].tool_call_id = call_id;
  msgs[3].content = "21 C";
  msgs[4].role = "user";
  msgs[4].content = "And tomorrow?\n\nIn Lyon too.";  // parts joined as chat content parts
  attach_tools(msgs, {*parse_json_ordered(R"({"name":"get_weather","description":"Weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}}}})")});
  ChatOptions opt;
  opt.reasoning_effort = 25;
  auto expect = encode_chat(msgs, opt);
  ASSERT_TRUE(expect.is_ok());
  EXPECT_EQ(job.request.prompt, tok.encode(*expect));
  EXPECT_TRUE(job.thinking);
  EXPECT_TRUE(job.extract_tools);
  // The reasoning of the tool-call turn is in the prompt (tools present: nothing is dropped).
  EXPECT_NE(expect->find("I should call the tool."), std::string::npos);
}

// The tiny tokenizer, for writer tests.
inline std::unique_ptr<Tokenizer> tiny_tokenizer() {
  auto tok = Tokenizer::from_json(make_tiny_tokenizer().tokenizer_json, "tiny");
  EXPECT_TRUE(tok.is_ok());
  return std::move(*tok);
}

// A served model with room for any prompt, for the request parsers run without a server.
inline ServedModel parser_model() {
  ServedModel model;
  model.name = "m";
  model.max_context = 1 << 20;
  return model;
}

// The body a writer renders for the whole of `output` at once, parsed.
inline OJson whole_body(const GenerationApi& api, const GenerationJob& job, const Tokenizer& tok,
                        const RequestOutput& output) {
  auto w = api.writer(job, tok, "x", 0);
  w->add(0, output);
  return *parse_json_ordered(w->body());
}

// One body of a malformed corpus: a 4xx whose body is the API's error shape (`is_error`), with no
// JSON-library internals in its message. DSV41_SHOW_CORPUS=1 prints each answer.
inline void expect_refused(httplib::Client& c, const std::string& path, const std::string& body,
                           const std::function<bool(const std::string&)>& is_error) {
  const std::string shown = path + " " + body.substr(0, 200);
  auto r = c.Post(path, body, "application/json");
  ASSERT_TRUE(r) << "no response for " << shown;
  EXPECT_GE(r->status, 400) << shown;
  EXPECT_LT(r->status, 500) << shown << " -> " << r->body;
  EXPECT_TRUE(is_error(r->body)) << shown << " -> " << r->body.substr(0, 300);
  EXPECT_EQ(r->body.find("json.exception"), std::string::npos) << shown << " -> " << r->body;
  if (std::getenv("DSV41_SHOW_CORPUS"))
    std::printf("%d %s\n", r->status, r->body.substr(0, 160).c_str());
}

// After a corpus: the server still answers /health.
inline void expect_healthy(httplib::Client& c) {
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// A chat job whose output starts in the reasoning and may call tools (kScriptText's shape).
inline GenerationJob reasoning_tools_job() {
  GenerationJob job;
  job.chat = job.thinking = job.extract_tools = true;
  job.model = "m";
  job.echo = OJson::object();
  return job;
}

// The finished output of `text` in one piece (reason stop).
inline RequestOutput whole_output(const std::string& text) {
  RequestOutput o;
  o.text = text;
  o.finished = true;
  o.reason = FinishReason::kStop;
  o.completion_tokens = 40;
  return o;
}

// Every frame a writer streams for `text` in chunks (trial < 8: all of trial + 1 bytes; later
// trials 1-8 bytes drawn from rng), then the finish and the end frames.
inline std::vector<std::string> stream_in_chunks(ResponseWriter& w, const std::string& text,
                                                 int trial, Rng& rng) {
  std::vector<std::string> frames = w.stream_begin();
  auto add = [&](std::vector<std::string> f) { frames.insert(frames.end(), f.begin(), f.end()); };
  for (std::size_t at = 0; at < text.size();) {
    RequestOutput o;
    o.text = text.substr(at, trial < 8 ? std::size_t(trial + 1) : 1 + rng.below(8));
    at += o.text.size();
    add(w.stream_output(0, o));
  }
  RequestOutput end = whole_output("");
  add(w.stream_output(0, end));
  add(w.stream_end());
  return frames;
}

// The JSON payloads of an SSE body's `data: ` lines, in order (OpenAI's "data: [DONE]" left out).
inline std::vector<OJson> sse_payloads(const std::string& body) {
  std::vector<OJson> out;
  std::size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const std::size_t end = body.find('\n', at);
    const std::string data =
        body.substr(at + 6, end == std::string::npos ? std::string::npos : end - at - 6);
    at = end;
    if (data == "[DONE]") continue;
    auto j = parse_json_ordered(data);
    EXPECT_TRUE(j.is_ok()) << data;
    if (j.is_ok()) out.push_back(std::move(*j));
  }
  return out;
}

// Runs tests/js/SCRIPT in `mode` against a server on `port` and expects every check to pass.
inline void expect_node_client_passes(int port, const std::string& model, const std::string& mode,
                                      const std::string& script) {
  auto [code, out] = run_command(node_client(port, model, mode, script));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
}

// The real `dsv41 serve` on a fresh tiny checkpoint, driven by tests/js/SCRIPT in mode "basic";
// then SIGTERM must end it with status 0.
inline void expect_node_client_passes_on_real_binary(const std::string& script) {
  dsv41::testing::TempDir dir;
  const std::string tiny = dir.path() + "/tiny";
  ASSERT_TRUE(dsv41::testing::make_tiny_official(tiny).is_ok());
  ServeProcess p;
  ASSERT_TRUE(p.start(tiny, dir.path() + "/serve.log"));
  expect_node_client_passes(p.port, "tiny", "basic", script);
  kill(p.pid, SIGTERM);
  EXPECT_EQ(p.wait_exit(), 0);
}

}  // namespace dsv41::server_testing
