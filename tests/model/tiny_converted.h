// Test helper: a tiny random-weight checkpoint (official layout, make-tiny) and its conversion
// under `dir` (`dir`/ck and `dir`/conv); returns the converted directory.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "io/test_util.h"
#include "model/convert/converter.h"
#include "model/tiny_checkpoint.h"

namespace dsv41::testing {

inline std::string make_tiny_converted(const TempDir& dir, uint64_t seed) {
  MakeTinyOptions mt;
  mt.out_dir = dir.path() + "/ck";
  mt.preset = "tiny";
  mt.seed = seed;
  EXPECT_TRUE(make_tiny_checkpoint(mt).is_ok());
  ConvertOptions co;
  co.from = mt.out_dir;
  co.to = dir.path() + "/conv";
  EXPECT_TRUE(convert_checkpoint(co).is_ok());
  return co.to;
}

}  // namespace dsv41::testing
