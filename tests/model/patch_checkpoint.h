// Test helper: overwrite one tensor's bytes in a test's own copy of a checkpoint (its shard file
// edited in place), to make a model whose behaviour a test can predict.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace dsv41::testing {

inline void patch_tensor(const std::string& dir, const std::string& name,
                         const std::function<void(std::vector<uint8_t>*)>& edit) {
  std::string path;
  uint64_t offset = 0;
  std::vector<uint8_t> bytes;
  {
    auto ck = Checkpoint::open(dir);
    ASSERT_TRUE(ck.is_ok()) << ck.status().message();
    const Checkpoint::Entry* e = ck->find(name);
    ASSERT_NE(e, nullptr) << name;
    const SafetensorsFile& f = ck->shards()[e->shard];
    path = f.path();
    offset = 8 + f.header_size() + e->info->begin;
    const auto b = ck->bytes(name);
    bytes.assign(b.begin(), b.end());
  }
  edit(&bytes);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(std::streamoff(offset));
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  ASSERT_TRUE(bool(f)) << path;
}

}  // namespace dsv41::testing
