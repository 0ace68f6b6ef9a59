// CPU lists, the affinity mask and one CPU per physical core (core/cpu_set.h), on a made-up
// sysfs topology and on this machine.
#include "core/cpu_set.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <cstdlib>
#include "core/thread_pool.h"

namespace dsv41 {
namespace {

TEST(CpuSet, ListsParseAndPrint) {
  auto l = parse_cpu_list("0-3,8,10-11,2\n");
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  EXPECT_EQ(*l, (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(format_cpu_list(*l), "0-3,8,10-11");
  EXPECT_EQ(format_cpu_list({5}), "5");
  EXPECT_EQ(format_cpu_list({}), "");
  for (const char* bad : {"", "a", "1-", "-1", "3-1", "1,,2", "99999", "0-99999", "1.5"}) {
    auto b = parse_cpu_list(bad);
    EXPECT_FALSE(b.is_ok()) << bad;
  }
  EXPECT_NE(parse_cpu_list("3-1").status().message().find("'3-1'"), std::string::npos);
}

TEST(CpuSet, OneCpuPerPhysicalCore) {
  // Four cores with two threads each, numbered as Linux does on AMD/Intel servers: CPU c and
  // c + 4 share a core.
  char tmpl[] = "/tmp/dsv41_cpus_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  for (int c = 0; c < 8; ++c) {
    const std::string d = root + "/cpu" + std::to_string(c) + "/topology";
    std::filesystem::create_directories(d);
    std::ofstream(d + "/thread_siblings_list") << (c % 4) << "," << (c % 4 + 4) << "\n";
  }
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(one_cpu_per_core(all, root), (std::vector<int>{0, 1, 2, 3}));
  // A mask holding only the second thread of a core still counts that core once.
  EXPECT_EQ(one_cpu_per_core({1, 5, 6}, root), (std::vector<int>{1, 6}));
  EXPECT_EQ(one_cpu_per_core({4, 5}, root), (std::vector<int>{4, 5}));
  // No topology files: each CPU is its own core.
  EXPECT_EQ(one_cpu_per_core({0, 1, 2}, root + "/absent"), (std::vector<int>{0, 1, 2}));
  std::filesystem::remove_all(root);
}

TEST(CpuSet, ThisProcessesMaskAndPinning) {
  const std::vector<int> mask = allowed_cpus();
  ASSERT_FALSE(mask.empty());
  EXPECT_TRUE(std::is_sorted(mask.begin(), mask.end()));
  EXPECT_GE(default_thread_count(), 1u);
  EXPECT_LE(default_thread_count(), mask.size());
  EXPECT_EQ(ThreadPool().size(), default_thread_count());  // threads 0 follows the mask
  // Pinning a thread of its own to one CPU of the mask: its mask is then that CPU, and so is a
  // thread it starts; a CPU outside the mask is refused with both lists named.
  std::thread([&] {
    ASSERT_TRUE(pin_to_cpus({mask.back()}).is_ok());
    EXPECT_EQ(allowed_cpus(), std::vector<int>{mask.back()});
    EXPECT_EQ(default_thread_count(), 1u);
    std::thread([&] { EXPECT_EQ(allowed_cpus(), std::vector<int>{mask.back()}); }).join();
    const int outside = mask.back() == 0 ? 1 : 0;
    Status st = pin_to_cpus({outside});
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("not in this process's affinity mask"), std::string::npos)
        << st.message();
  }).join();
  EXPECT_EQ(allowed_cpus(), mask);  // the test's own thread kept its mask
}

}  // namespace
}  // namespace dsv41
