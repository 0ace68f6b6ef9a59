// Programmer-error checks: a violated invariant aborts with file:line and the failed condition.
// Input and environment errors never use these; they travel as Status (status.h).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace dsv41::detail {
[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const char* msg) {
  std::fprintf(stderr, "%s:%d: check failed: %s%s%s\n", file, line, cond, msg[0] ? " — " : "", msg);
  std::fflush(stderr);
  std::abort();
}
}  // namespace dsv41::detail

#define DSV41_CHECK(cond)                                                      \
  do {                                                                         \
    if (!(cond)) ::dsv41::detail::check_failed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define DSV41_CHECK_MSG(cond, msg)                                              \
  do {                                                                          \
    if (!(cond)) ::dsv41::detail::check_failed(__FILE__, __LINE__, #cond, msg); \
  } while (0)
