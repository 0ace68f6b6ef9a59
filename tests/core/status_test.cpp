// Status / Result: error propagation and context prefixes.
#include "core/status.h"

#include <gtest/gtest.h>

namespace dsv41 {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return Status::error("field 'x': must be positive, got " + std::to_string(v));
  return v;
}

Status twice(int v, int* out) {
  auto r = parse_positive(v);
  if (!r) return r.status().with_context("config.json: ");
  *out = 2 * r.value();
  return Status::ok();
}

TEST(Status, PropagatesWithContext) {
  int out = 0;
  EXPECT_TRUE(twice(3, &out).is_ok());
  EXPECT_EQ(out, 6);
  Status s = twice(-1, &out);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.message(), "config.json: field 'x': must be positive, got -1");
  EXPECT_TRUE(Status::ok().with_context("x").is_ok());
}

TEST(Status, ResultAccess) {
  Result<std::string> r = std::string("abc");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->size(), 3u);
  EXPECT_TRUE(r.status().is_ok());
  Result<std::string> e = Status::error("bad");
  EXPECT_FALSE(e.is_ok());
  EXPECT_EQ(e.status().message(), "bad");
  EXPECT_DEATH((void)e.value(), "value\\(\\) of an error Result");
}

}  // namespace
}  // namespace dsv41
