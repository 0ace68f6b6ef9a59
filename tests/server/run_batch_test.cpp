// `dsv41 run-batch` (issue 37 item 7) on a tiny checkpoint: 200 lines with 3 malformed ones give
// 197 answers and 3 per-line errors in the input's order, each answer the one `serve` gives for
// the same body (greedy); a run killed midway and started again completes without a duplicate and
// with the answers of a clean run; a cut last line is answered again; another input's output is
// refused.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "server/server_harness.h"

namespace dsv41::server_testing {
namespace {

using Json = nlohmann::json;

std::vector<Json> read_jsonl(const std::string& path) {
  std::vector<Json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(Json::parse(line));
  return out;
}

// 200 lines: chat and completions bodies, greedy, of a few lengths; lines 41, 97 and 150 (1-based)
// malformed (not JSON, an unsupported url, no custom_id).
std::vector<std::string> batch_lines(int max_tokens) {
  std::vector<std::string> lines;
  for (int i = 0; i < 200; ++i) {
    Json body;
    std::string url;
    if (i % 3 == 0) {
      url = "/v1/chat/completions";
      body = {{"model", "tiny"},
              {"messages", {{{"role", "user"}, {"content", "question " + std::to_string(i)}}}},
              {"max_tokens", max_tokens + i % 4},
              {"temperature", 0},
              {"chat_template_kwargs", {{"thinking", i % 2 == 0}}}};
    } else {
      url = "/v1/completions";
      body = {{"model", "tiny"},
              {"prompt", "text number " + std::to_string(i)},
              {"max_tokens", max_tokens + i % 5},
              {"temperature", 0}};
    }
    lines.push_back(Json{
        {"custom_id", "req-" + std::to_string(i)},
        {"method", "POST"},
        {"url", url},
        {"body", body}}.dump());
  }
  lines[40] = R"({"custom_id": "req-40", "method": "POST", "url": )";
  lines[96] = Json{{"custom_id", "req-96"},
                   {"method", "POST"},
                   {"url", "/v1/embeddings"},
                   {"body", {{"model", "tiny"}, {"input", "x"}}}}
                  .dump();
  lines[149] =
      Json{{"method", "POST"}, {"url", "/v1/completions"}, {"body", {{"model", "tiny"}}}}.dump();
  return lines;
}

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
}

std::string run_batch_cmd(const std::string& model, const std::string& in, const std::string& out,
                          const std::string& extra = "") {
  return std::string(DSV41_BINARY) + " run-batch --model " + model + " -i " + in + " -o " + out +
         " --threads 1 " + extra + " 2>&1";
}

TEST(RunBatch, AnswersEveryLineInOrderAsTheServerDoes) {
  dsv41::testing::TempDir dir;
  const std::string tiny = dir.path() + "/tiny";
  ASSERT_TRUE(dsv41::testing::make_tiny_official(tiny).is_ok());
  const std::vector<std::string> lines = batch_lines(4);
  write_lines(dir.file("in.jsonl"), lines);
  auto [code, log] = run_command(run_batch_cmd(tiny, dir.file("in.jsonl"), dir.file("out.jsonl")));
  ASSERT_EQ(code, 0) << log;
  EXPECT_NE(log.find("200 lines answered"), std::string::npos) << log;
  const std::vector<Json> out = read_jsonl(dir.file("out.jsonl"));
  ASSERT_EQ(out.size(), 200u);
  int answers = 0, errors = 0;
  std::set<std::string> ids;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const Json& o = out[i];
    EXPECT_TRUE(o["id"].get<std::string>().starts_with("batch_req_"));
    EXPECT_TRUE(ids.insert(o["id"].get<std::string>()).second);
    if (i == 40 || i == 96 || i == 149) {
      ++errors;
      EXPECT_TRUE(o["response"].is_null()) << o;
      const std::string msg = o["error"]["message"];
      EXPECT_NE(msg.find("line " + std::to_string(i + 1) + ":"), std::string::npos) << msg;
      if (i == 96) EXPECT_NE(msg.find("/v1/embeddings"), std::string::npos) << msg;
      if (i == 149) EXPECT_NE(msg.find("custom_id"), std::string::npos) << msg;
      EXPECT_EQ(o["custom_id"], i == 96 ? Json("req-96") : Json(nullptr)) << o;
      continue;
    }
    ++answers;
    EXPECT_EQ(o["custom_id"], "req-" + std::to_string(i));
    EXPECT_TRUE(o["error"].is_null());
    EXPECT_EQ(o["response"]["status_code"], 200) << o;
    EXPECT_FALSE(o["response"]["request_id"].get<std::string>().empty());
  }
  EXPECT_EQ(answers, 197);
  EXPECT_EQ(errors, 3);

  // The same bodies through `serve`, one at a time: the same choices (greedy; ids and times
  // aside).
  ServeProcess p;
  ASSERT_TRUE(p.start(tiny, dir.path() + "/serve.log"));
  httplib::Client c("127.0.0.1", p.port);
  c.set_read_timeout(60, 0);
  for (std::size_t i = 0; i < lines.size(); i += 7) {
    if (!out[i]["error"].is_null()) continue;
    const Json line = Json::parse(lines[i]);
    auto r = c.Post(line["url"].get<std::string>(), line["body"].dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const Json served = Json::parse(r->body);
    EXPECT_EQ(served["choices"], out[i]["response"]["body"]["choices"]) << "line " << i + 1;
    // Token counts agree; how many prompt tokens the prefix cache held depends on which lines
    // the batch ran first (concurrently), so only their sum is compared.
    Json served_usage = served["usage"];
    Json batch_usage = out[i]["response"]["body"]["usage"];
    for (Json* u : {&served_usage, &batch_usage}) {
      ASSERT_EQ(
          (*u)["prompt_cache_hit_tokens"].get<int>() + (*u)["prompt_cache_miss_tokens"].get<int>(),
          (*u)["prompt_tokens"].get<int>())
          << *u;
      ASSERT_EQ((*u)["prompt_tokens_details"]["cached_tokens"], (*u)["prompt_cache_hit_tokens"]);
      u->erase("prompt_cache_hit_tokens");
      u->erase("prompt_cache_miss_tokens");
      u->erase("prompt_tokens_details");
    }
    EXPECT_EQ(served_usage, batch_usage) << "line " << i + 1;
  }
  kill(p.pid, SIGTERM);
  EXPECT_EQ(p.wait_exit(), 0);

  // Started again on the finished files: nothing to do, nothing added.
  auto [again, again_log] =
      run_command(run_batch_cmd(tiny, dir.file("in.jsonl"), dir.file("out.jsonl")));
  EXPECT_EQ(again, 0) << again_log;
  EXPECT_NE(again_log.find("already answers 200 of the 200 lines"), std::string::npos) << again_log;
  EXPECT_EQ(read_jsonl(dir.file("out.jsonl")).size(), 200u);
  // Another input's output is refused, naming the first line that differs.
  std::vector<std::string> other = lines;
  Json first = Json::parse(lines[0]);
  first["custom_id"] = "elsewhere";
  other[0] = first.dump();
  write_lines(dir.file("other.jsonl"), other);
  auto [refused, refused_log] =
      run_command(run_batch_cmd(tiny, dir.file("other.jsonl"), dir.file("out.jsonl")));
  EXPECT_EQ(refused, 2) << refused_log;
  EXPECT_NE(refused_log.find("line 1 answers custom_id \"req-0\" but input line 1 is "
                             "\"elsewhere\""),
            std::string::npos)
      << refused_log;
}

TEST(RunBatch, AKilledRunStartedAgainCompletesWithoutDuplicates) {
  dsv41::testing::TempDir dir;
  const std::string tiny = dir.path() + "/tiny";
  ASSERT_TRUE(dsv41::testing::make_tiny_official(tiny).is_ok());
  write_lines(dir.file("in.jsonl"), batch_lines(64));
  auto [code, log] =
      run_command(run_batch_cmd(tiny, dir.file("in.jsonl"), dir.file("clean.jsonl")));
  ASSERT_EQ(code, 0) << log;
  const std::vector<Json> clean = read_jsonl(dir.file("clean.jsonl"));
  ASSERT_EQ(clean.size(), 200u);

  // Killed (SIGKILL) once 30 lines are out, two lines in flight at a time so it is mid-work.
  const std::string out = dir.file("out.jsonl");
  const std::string killer =
      "(" + run_batch_cmd(tiny, dir.file("in.jsonl"), out, "--concurrency 2") +
      " >/dev/null & pid=$!; for i in $(seq 600); do n=$(cat " + out +
      " 2>/dev/null | wc -l); [ \"$n\" -ge 30 ] && break; sleep 0.05; done; kill -9 $pid; wait "
      "$pid; echo killed-at $(cat " +
      out + " | wc -l))";
  auto [kcode, klog] = run_command(killer);
  const std::size_t at = klog.find("killed-at ");
  ASSERT_NE(at, std::string::npos) << klog;
  const int written = std::stoi(klog.substr(at + 10));
  ASSERT_GE(written, 30) << klog;
  ASSERT_LT(written, 200) << "the run ended before it was killed: " << klog;
  // A line cut in the middle, as a kill during a write leaves it.
  { std::ofstream(out, std::ios::app) << R"({"id":"batch_req_x","custom_id":"req-)"; }

  auto [rcode, rlog] = run_command(run_batch_cmd(tiny, dir.file("in.jsonl"), out));
  ASSERT_EQ(rcode, 0) << rlog;
  EXPECT_NE(rlog.find("already answers " + std::to_string(written) + " of the 200 lines"),
            std::string::npos)
      << rlog;
  const std::vector<Json> resumed = read_jsonl(out);
  ASSERT_EQ(resumed.size(), 200u);
  std::set<std::string> ids;
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i]["custom_id"], clean[i]["custom_id"]) << i;
    if (!resumed[i]["custom_id"].is_null())
      EXPECT_TRUE(ids.insert(resumed[i]["custom_id"]).second) << "duplicate at " << i;
    if (clean[i]["error"].is_null())
      EXPECT_EQ(resumed[i]["response"]["body"]["choices"], clean[i]["response"]["body"]["choices"])
          << "line " << i + 1;
    else
      EXPECT_EQ(resumed[i]["error"], clean[i]["error"]) << "line " << i + 1;
  }
}

// The checkpoint's generation_config.json applies as in `serve`: a chat line without max_tokens
// gets its max_new_tokens.
TEST(RunBatch, TheCheckpointsSamplingDefaultsApply) {
  dsv41::testing::TempDir dir;
  const std::string tiny = dir.path() + "/tiny";
  ASSERT_TRUE(dsv41::testing::make_tiny_official(tiny).is_ok());
  std::ofstream(tiny + "/generation_config.json") << R"({"max_new_tokens": 3})";
  write_lines(dir.file("in.jsonl"), {Json{{"custom_id", "a"},
                                          {"method", "POST"},
                                          {"url", "/v1/chat/completions"},
                                          {"body",
                                           {{"model", "tiny"},
                                            {"ignore_eos", true},
                                            {"messages", {{{"role", "user"}, {"content", "hi"}}}}}}}
                                         .dump()});
  auto [code, log] = run_command(run_batch_cmd(tiny, dir.file("in.jsonl"), dir.file("out.jsonl")));
  ASSERT_EQ(code, 0) << log;
  const std::vector<Json> out = read_jsonl(dir.file("out.jsonl"));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["response"]["body"]["usage"]["completion_tokens"], 3) << out[0];
}

}  // namespace
}  // namespace dsv41::server_testing
