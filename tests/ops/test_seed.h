// The ops tests' random seed: fresh each run (so many runs cover many inputs), fixed by
// DSV41_TEST_SEED to replay a failure; every failure message prints it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>

namespace dsv41::ops {

inline uint64_t fresh_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("DSV41_TEST_SEED");
    return env != nullptr && *env != '\0' ? std::strtoull(env, nullptr, 10)
                                          : uint64_t(std::random_device{}());
  }();
  return seed;
}

}  // namespace dsv41::ops
