// Runs the real dsv41 binary for CLI tests: exit code, stdout, stderr, wall time.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "io/test_util.h"

namespace dsv41 {

struct CliRun {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
  double seconds = 0;
};

// `env`: optional "NAME=value ..." assignments for the command. `timeout_s` > 0: the command is
// killed after that many seconds (exit code 124), for commands that must not run on. `wrapper`: a
// command the binary runs under ("taskset -c 0").
inline CliRun run(const std::string& args, const std::string& env = "", int timeout_s = 0,
                  const std::string& wrapper = "") {
  testing::TempDir tmp;
  const std::string cmd =
      (env.empty() ? "" : "env " + env + " ") + (wrapper.empty() ? "" : wrapper + " ") +
      (timeout_s > 0 ? "timeout -k 2 " + std::to_string(timeout_s) + " " : "") +
      std::string(DSV41_BINARY) + " " + args + " >" + tmp.file("out") + " 2>" + tmp.file("err");
  const auto t0 = std::chrono::steady_clock::now();
  const int st = std::system(cmd.c_str());
  CliRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = testing::read_file(tmp.file("out"));
  r.err = testing::read_file(tmp.file("err"));
  return r;
}

}  // namespace dsv41
