// `dsv41 run-batch -i IN.jsonl -o OUT.jsonl`: offline work in the OpenAI Batch file format (issue
// 37 item 7). Each input line {"custom_id", "method", "url", "body"} goes to the server's own route
// for `url` (chat completions, completions, Responses, Anthropic Messages) on an in-process server
// bound to loopback, from as many client threads as the engine runs sequences, so the lines share
// the engine's steps (continuous batching) and every answer is the one `serve` gives for that
// body. Output lines {"id", "custom_id", "response": {"status_code", "request_id", "body"},
// "error"} come in the input's order; a line that cannot be sent (not JSON, no custom_id, another
// method or url, a duplicate custom_id, stream) gets an "error" object instead, and the run goes
// on. Resumable: OUT holds a prefix of the answers in order (one flushed line each), so a run
// started again on the same files checks that prefix against IN and answers only the rest.
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "cli/commands.h"
#include "cli/demo_model.h"
#include "cli/fast_model_dir.h"
#include "core/log.h"
#include "engine/engine.h"
#include "server/generation_defaults.h"
#include "server/http_server.h"
#include "text/json_ordered.h"

namespace dsv41::cli {
namespace {

constexpr const char* kUrls[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses",
                                 "/v1/messages"};

// One input line, checked: what to send, or why it cannot be sent.
struct BatchLine {
  std::optional<std::string> custom_id;
  std::string url, body;  // body: the request JSON as given
  std::string error;      // not empty: the line is answered with this error
};

BatchLine check_line(const std::string& text, std::size_t number, std::set<std::string>& seen_ids) {
  BatchLine l;
  auto fail = [&](const std::string& why) {
    l.error = fmt::format("line {}: {}", number, why);
    return l;
  };
  auto j = parse_json_ordered(text);
  if (!j) return fail("not JSON: " + j.status().message());
  if (!j->is_object()) return fail("not a JSON object");
  if (j->contains("custom_id") && (*j)["custom_id"].is_string())
    l.custom_id = (*j)["custom_id"].get<std::string>();
  if (!l.custom_id) return fail("custom_id: a string is required");
  if (!seen_ids.insert(*l.custom_id).second)
    return fail("custom_id '" + *l.custom_id + "' is used by an earlier line");
  const OJson method = j->value("method", OJson("POST"));
  if (method != "POST") return fail("method: only POST is supported");
  if (!j->contains("url") || !(*j)["url"].is_string()) return fail("url: a string is required");
  l.url = (*j)["url"].get<std::string>();
  if (std::find(std::begin(kUrls), std::end(kUrls), l.url) == std::end(kUrls))
    return fail("url '" + l.url +
                "' is not supported (/v1/chat/completions, /v1/completions, /v1/responses, "
                "/v1/messages)");
  if (!j->contains("body") || !(*j)["body"].is_object()) return fail("body: an object is required");
  if ((*j)["body"].value("stream", OJson(false)) == true)
    return fail("body.stream: a batch answers whole responses, not streams");
  l.body = (*j)["body"].dump();
  return l;
}

std::string random_hex(std::mt19937_64& rng) {
  return fmt::format("{:016x}{:08x}", rng(), uint32_t(rng()));
}

// The output tokens of a 200 answer's body (chat/completions: usage.completion_tokens;
// Responses and Messages: usage.output_tokens), for the progress line.
int64_t output_tokens(const OJson& body) {
  if (!body.is_object() || !body.contains("usage") || !body["usage"].is_object()) return 0;
  const OJson& u = body["usage"];
  for (const char* k : {"completion_tokens", "output_tokens"})
    if (u.contains(k) && u[k].is_number_integer()) return u[k].get<int64_t>();
  return 0;
}

// The lines of OUT already answered (a prefix of IN in order): their number, after checking each
// names the custom_id of its input line; a last line cut by a killed run is dropped (the file is
// truncated to the last whole line).
Result<std::size_t> resume_point(const std::string& out, const std::vector<BatchLine>& lines) {
  std::error_code ec;
  if (!std::filesystem::exists(out, ec)) return std::size_t(0);
  std::ifstream in(out, std::ios::binary);
  if (!in) return Status::error("-o: cannot read " + out);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  std::size_t done = 0, good_bytes = 0, at = 0;
  while (at < text.size()) {
    const std::size_t nl = text.find('\n', at);
    if (nl == std::string::npos) break;  // a cut last line: answered again
    auto j = parse_json_ordered(std::string_view(text).substr(at, nl - at));
    if (!j || !j->is_object() || !j->contains("custom_id"))
      return Status::error(fmt::format("-o: {} line {} is not a batch output line", out, done + 1));
    if (done >= lines.size())
      return Status::error(fmt::format("-o: {} has more lines than the input", out));
    const OJson want = lines[done].custom_id ? OJson(*lines[done].custom_id) : OJson(nullptr);
    if ((*j)["custom_id"] != want)
      return Status::error(fmt::format(
          "-o: {} line {} answers custom_id {} but input line {} is {}: it is not this input's "
          "output (remove it, or name another file)",
          out, done + 1, (*j)["custom_id"].dump(), done + 1, want.dump()));
    ++done;
    at = good_bytes = nl + 1;
  }
  if (good_bytes < text.size()) std::filesystem::resize_file(out, good_bytes, ec);
  if (ec) return Status::error("-o: cannot truncate the cut last line of " + out);
  return done;
}

struct Progress {
  std::size_t total = 0, skipped = 0;
  std::atomic<std::size_t> done{0}, failed{0};
  std::atomic<int64_t> tokens{0};
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  bool tty = isatty(STDERR_FILENO) != 0;
  std::chrono::steady_clock::time_point last_print{};

  void print(bool final) {
    const auto now = std::chrono::steady_clock::now();
    if (!final &&
        now - last_print < (tty ? std::chrono::milliseconds(200) : std::chrono::seconds(10)))
      return;
    last_print = now;
    const double s = std::chrono::duration<double>(now - t0).count();
    const std::size_t d = done.load(), left = total - skipped - d;
    const double rate = s > 0 ? double(d) / s : 0;
    const double eta = rate > 0 ? double(left) / rate : 0;
    constexpr int kBar = 30;
    const double frac = total - skipped ? double(d) / double(total - skipped) : 1.0;
    const int fill = int(frac * kBar);
    const std::string line =
        fmt::format("run-batch: [{}{}] {}/{} lines, {} errors, {:.1f} tok/s, ETA {:.0f} s",
                    std::string(fill, '='), std::string(kBar - fill, ' '), skipped + d, total,
                    failed.load(), s > 0 ? double(tokens.load()) / s : 0.0, eta);
    if (tty)
      std::fprintf(stderr, "\r%s%s", line.c_str(), final ? "\n" : "");
    else
      log::info("{}", line);
  }
};

struct RunBatchArgs {
  std::string input, output, model;
  std::vector<std::string> names;
  int concurrency = 0;
  PathArgs paths;
};

// One output line: the server's answer to a line, or the line's own error.
std::string answer_line(const BatchLine& l, httplib::Client& c, std::mt19937_64& rng,
                        Progress& progress) {
  OJson out = OJson::object();
  out["id"] = "batch_req_" + random_hex(rng);
  out["custom_id"] = l.custom_id ? OJson(*l.custom_id) : OJson(nullptr);
  auto error = [&](const std::string& code, const std::string& message) {
    out["response"] = nullptr;
    out["error"] = OJson{{"code", code}, {"message", message}};
    ++progress.failed;
    return out.dump(-1, ' ', false, OJson::error_handler_t::replace);
  };
  if (!l.error.empty()) return error("invalid_request", l.error);
  // A full queue (429, --concurrency above what the engine holds) is waited out, not answered.
  auto r = c.Post(l.url, l.body, "application/json");
  for (int attempt = 0; r && r->status == 429 && attempt < 6000; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    r = c.Post(l.url, l.body, "application/json");
  }
  if (!r)
    return error("request_failed",
                 "the engine's server did not answer: " + httplib::to_string(r.error()));
  auto body = parse_json_ordered(r->body);
  OJson b = body ? std::move(*body) : OJson(r->body);
  std::string request_id = r->get_header_value("X-Request-Id");
  if (request_id.empty() && b.is_object() && b.contains("id") && b["id"].is_string())
    request_id = b["id"].get<std::string>();
  if (r->status != 200) ++progress.failed;
  progress.tokens += output_tokens(b);
  out["response"] =
      OJson{{"status_code", r->status}, {"request_id", request_id}, {"body", std::move(b)}};
  out["error"] = nullptr;
  return out.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

int run_batch_main(const RunBatchArgs& a) {
  std::ifstream in(a.input);
  if (!in) {
    log::error("run-batch: -i: cannot read {}", a.input);
    return kExitInvalid;
  }
  std::vector<BatchLine> lines;
  std::set<std::string> ids;
  std::string text;
  for (std::size_t number = 1; std::getline(in, text); ++number)
    if (text.find_first_not_of(" \t\r") != std::string::npos)  // blank lines carry no request
      lines.push_back(check_line(text, number, ids));
  auto resumed = resume_point(a.output, lines);
  if (!resumed) {
    log::error("run-batch: {}", resumed.status().message());
    return kExitInvalid;
  }
  Progress progress;
  progress.total = lines.size();
  progress.skipped = *resumed;
  if (*resumed > 0)
    log::info("run-batch: {} already answers {} of the {} lines: answering the rest", a.output,
              *resumed, lines.size());
  if (*resumed == lines.size()) return kExitOk;

  std::string dir = a.model;
  const bool demo = dir.empty();
  if (demo) {
    auto d = ensure_demo_model();
    if (!d) {
      log::error("run-batch: demo model: {}", d.status().message());
      return kExitInvalid;
    }
    dir = *d;
  }
  // The sampling defaults `serve` applies (the checkpoint's generation_config.json), so a line
  // that leaves temperature or max_tokens out is answered as the server answers it.
  auto defaults = load_sampling_defaults(dir, "auto", "");
  if (!defaults) {
    log::error("run-batch: {}", defaults.status().message());
    return kExitInvalid;
  }
  EngineOptions eo;
  if (Status st = apply_path_options(a.paths, dir, &eo); !st.is_ok()) {
    log::error("run-batch: {}", model_error(st));
    return kExitInvalid;
  }
  auto engine = Engine::load(eo);
  if (!engine) {
    log::error("run-batch: {}", model_error(engine.status()));
    return kExitInvalid;
  }
  const int concurrency = a.concurrency > 0 ? a.concurrency : eo.max_num_seqs;
  ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.model_name = !a.names.empty() ? a.names.front()
                  : demo           ? std::string("dsv41-demo")
                                   : std::filesystem::path(dir).filename().string();
  if (a.names.size() > 1) so.model_aliases.assign(a.names.begin() + 1, a.names.end());
  so.sampling_defaults = *defaults;
  so.max_body_bytes = std::size_t(1) << 30;  // the lines are the user's own file
  so.threads = concurrency + 4;
  so.request_log = ServerOptions::RequestLog::kOff;  // the progress line says what happens
  HttpServer server(**engine, so);
  if (Status st = server.bind(); !st.is_ok()) {
    log::error("run-batch: {}", st.message());
    return kExitInvalid;
  }
  std::thread serving([&] { server.serve(); });

  std::ofstream out(a.output, std::ios::app | std::ios::binary);
  if (!out) {
    log::error("run-batch: -o: cannot write {}", a.output);
    server.shutdown();
    serving.join();
    return kExitInvalid;
  }
  // Workers answer lines in any order; this thread writes them in the input's order, each line
  // flushed as soon as every line before it is out (what a resumed run relies on).
  std::vector<std::optional<std::string>> answers(lines.size());
  std::mutex mu;
  std::condition_variable ready;
  std::atomic<std::size_t> next{*resumed};
  std::vector<std::thread> workers;
  for (int w = 0; w < concurrency; ++w)
    workers.emplace_back([&, w] {
      httplib::Client c("127.0.0.1", server.port());
      c.set_read_timeout(24 * 3600, 0);
      c.set_write_timeout(600, 0);
      std::mt19937_64 rng(std::random_device{}() + uint64_t(w));
      for (std::size_t i; (i = next++) < lines.size();) {
        std::string line = answer_line(lines[i], c, rng, progress);
        std::lock_guard<std::mutex> lock(mu);
        answers[i] = std::move(line);
        ready.notify_all();
      }
    });
  bool write_failed = false;
  for (std::size_t i = *resumed; i < lines.size(); ++i) {
    std::unique_lock<std::mutex> lock(mu);
    while (!ready.wait_for(lock, std::chrono::milliseconds(250),
                           [&] { return answers[i].has_value(); }))
      progress.print(false);
    const std::string line = std::move(*answers[i]);
    answers[i].reset();
    lock.unlock();
    out << line << '\n';
    out.flush();
    write_failed = write_failed || !out;
    ++progress.done;
    progress.print(false);
  }
  for (auto& t : workers) t.join();
  server.shutdown();
  serving.join();
  progress.print(true);
  if (write_failed) {
    log::error("run-batch: -o: writing {} failed", a.output);
    return kExitInvalid;
  }
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - progress.t0).count();
  log::info(
      "run-batch: {} lines answered in {:.1f} s ({} errors, {} output tokens, {:.1f} tok/s) -> {}",
      progress.done.load(), s, progress.failed.load(), progress.tokens.load(),
      s > 0 ? double(progress.tokens.load()) / s : 0.0, a.output);
  return kExitOk;
}

}  // namespace

void add_run_batch(CLI::App& app, Runner* run) {
  auto a = std::make_shared<RunBatchArgs>();
  CLI::App* sub = app.add_subcommand(
      "run-batch",
      "Offline batch in the OpenAI Batch file format: each line of -i "
      "({\"custom_id\",\"method\":\"POST\",\"url\",\"body\"}; url /v1/chat/completions, "
      "/v1/completions, /v1/responses or /v1/messages) is answered as `serve` answers that body, "
      "all lines sharing the engine's steps; -o gets one line per input line, in the input's "
      "order ({\"id\",\"custom_id\",\"response\":{\"status_code\",\"request_id\",\"body\"},"
      "\"error\"}); a bad line gets an error and the run goes on. Started again on the same files "
      "it answers only the lines -o does not hold yet.");
  sub->add_option("-i,--input", a->input, "Input JSONL file")->required();
  sub->add_option("-o,--output", a->output, "Output JSONL file (appended to when resuming)")
      ->required();
  sub->add_option("--model", a->model, "Checkpoint directory (default: the demo model of `serve`)");
  sub->add_option("--served-model-name", a->names,
                  "Model names the lines' bodies may name (default: the checkpoint directory's "
                  "name; dsv41-demo)");
  sub->add_option("--concurrency", a->concurrency,
                  "Lines in flight at once (0: as many as the engine runs at once, 64)")
      ->check(CLI::Range(0, 4096));
  add_path_options(sub, &a->paths);
  sub->callback([a, run] { *run = [a] { return run_batch_main(*a); }; });
}

}  // namespace dsv41::cli
