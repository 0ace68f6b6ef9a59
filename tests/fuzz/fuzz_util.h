// What the fuzz targets share: a scratch file or directory per process (in /dev/shm when it
// exists, so a file-reading parser costs no disk), the tiny tokenizer, and a hard failure that
// libFuzzer reports as a crash with the input saved.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "text/tokenizer.h"
#include "text/tokenizer_file.h"

namespace dsv41::fuzz {

// A directory of this process's own, created once.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string d = base + "/dsv41_fuzz_" + std::to_string(getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write_file(const std::string& path, const uint8_t* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
}

inline const Tokenizer& tiny_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::from_json(make_tiny_tokenizer().tokenizer_json, "tiny");
    if (!t) std::abort();
    return std::move(*t);
  }();
  return *tok;
}

// An invariant the code promises is broken: crash so that libFuzzer keeps the input.
[[noreturn]] inline void invariant_failed(const char* what) {
  std::fprintf(stderr, "fuzz invariant failed: %s\n", what);
  std::abort();
}

}  // namespace dsv41::fuzz
