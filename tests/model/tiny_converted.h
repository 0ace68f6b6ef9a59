// Test helpers: a tiny random-weight checkpoint in the official layout (make-tiny), and the same
// with its conversion (the fast path's layout).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/status.h"
#include "io/test_util.h"
#include "model/convert/converter.h"
#include "model/tiny_checkpoint.h"

namespace dsv41::testing {

// The official-layout checkpoint at `out_dir`: what the reference path and `dsv41 serve` (which
// converts it itself) take as it is.
inline Status make_tiny_official(const std::string& out_dir, uint64_t seed = 0,
                                 const std::string& preset = "tiny") {
  MakeTinyOptions mt;
  mt.out_dir = out_dir;
  mt.preset = preset;
  mt.seed = seed;
  return make_tiny_checkpoint(mt).status();
}

// The official checkpoint at `official` and its conversion at `converted`.
inline Status make_tiny_official_and_converted(const std::string& official,
                                               const std::string& converted, uint64_t seed = 0,
                                               const std::string& preset = "tiny") {
  DSV41_RETURN_IF_ERROR(make_tiny_official(official, seed, preset));
  ConvertOptions co;
  co.from = official;
  co.to = converted;
  return convert_checkpoint(co).status();
}

// Both under `dir` (`dir`/ck and `dir`/conv); returns the converted directory.
inline std::string make_tiny_converted(const TempDir& dir, uint64_t seed) {
  const std::string converted = dir.path() + "/conv";
  const Status made = make_tiny_official_and_converted(dir.path() + "/ck", converted, seed);
  EXPECT_TRUE(made.is_ok()) << made.message();
  return converted;
}

}  // namespace dsv41::testing
