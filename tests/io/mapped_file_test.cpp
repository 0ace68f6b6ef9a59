// MappedFile: the 2 MB-aligned mapping and the in-place huge-page copies of its ranges
// (make_resident_huge): the bytes stay the same, the interior becomes anonymous memory, the edges
// stay file-mapped, and a file that changed since it was mapped is refused with its path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "io/mapped_file.h"
#include "io/test_util.h"

namespace dsv41 {
namespace {

constexpr std::size_t kHuge = MappedFile::kHugePage;

std::string pattern(std::size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    s[i] = char(x >> 24);
  }
  return s;
}

// The smaps fields of the mapping that holds `p` (kB), e.g. "Anonymous:"; -1 when not found.
int64_t smaps_kb(const void* p, const std::string& field) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    const std::string head = line.substr(0, line.find(' '));
    if (!head.empty() && head.back() == ':') {  // a field of the current mapping
      if (in && head == field) return std::atoll(line.c_str() + head.size());
      continue;
    }
    unsigned long lo = 0, hi = 0;  // "lo-hi perms offset dev inode path": a new mapping
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2)
      in = uintptr_t(p) >= lo && uintptr_t(p) < hi;
  }
  return -1;
}

TEST(MappedFile, LargeFilesMapOnAHugePageBoundary) {
  testing::TempDir d;
  const std::string bytes = pattern(kHuge + 12345, 1);
  testing::write_file(d.file("a.bin"), bytes);
  auto f = MappedFile::open(d.file("a.bin"));
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_EQ(uintptr_t((*f)->data()) % kHuge, 0u);
  ASSERT_EQ((*f)->size(), bytes.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*f)->data()), bytes.size()), bytes);
}

TEST(MappedFile, HugePageCopyKeepsTheBytesAndMovesOnlyWholeHugePages) {
  testing::TempDir d;
  const std::size_t n = 3 * kHuge + 777;
  const std::string bytes = pattern(n, 7);
  testing::write_file(d.file("w.bin"), bytes);
  auto f = MappedFile::open(d.file("w.bin"));
  ASSERT_TRUE(f) << f.status().message();
  const uint8_t* base = (*f)->data();
  // A range from inside the first huge page to inside the last: only pages 1 and 2 are whole.
  auto moved = (*f)->make_resident_huge(base + 100, n - 200);
  ASSERT_TRUE(moved) << moved.status().message();
  EXPECT_EQ(*moved, 2 * kHuge);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(base), n), bytes);
  // The interior is anonymous memory now (its own mapping, every byte of it), the edges are not.
  EXPECT_EQ(smaps_kb(base + kHuge, "Anonymous:"), int64_t(2 * kHuge / 1024));
  EXPECT_EQ(smaps_kb(base, "Anonymous:"), 0);
  EXPECT_EQ(smaps_kb(base + 3 * kHuge, "Anonymous:"), 0);
  // A range without a whole huge page moves nothing.
  auto none = (*f)->make_resident_huge(base + 10, kHuge);
  ASSERT_TRUE(none);
  EXPECT_EQ(*none, 0u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(base), n), bytes);
  // Dropping pages of a file whose pages were copied would drop the copy: a programmer error.
  EXPECT_DEATH((*f)->release(base + kHuge, kHuge), "make_resident_huge");
}

TEST(MappedFile, HugePageCopyRefusesAFileReplacedSinceItWasMapped) {
  testing::TempDir d;
  const std::string bytes = pattern(2 * kHuge, 3);
  testing::write_file(d.file("w.bin"), bytes);
  auto f = MappedFile::open(d.file("w.bin"));
  ASSERT_TRUE(f);
  // Replaced by another file of the same size (a new inode): the copy would not be the mapping's.
  testing::write_file(d.file("w2.bin"), pattern(2 * kHuge, 4));
  ASSERT_EQ(std::rename(d.file("w2.bin").c_str(), d.file("w.bin").c_str()), 0);
  auto moved = (*f)->make_resident_huge((*f)->data(), (*f)->size());
  ASSERT_FALSE(moved);
  EXPECT_NE(moved.status().message().find(d.file("w.bin")), std::string::npos);
  EXPECT_NE(moved.status().message().find("changed"), std::string::npos);
  // The mapping still shows the file it was made from.
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*f)->data()), bytes.size()), bytes);
}

}  // namespace
}  // namespace dsv41
