// Which CPUs the process computes on (issue 37 item 6): the affinity mask it was started with
// (taskset, `mpirun --bind-to core|numa`: each rank its own), one CPU per physical core of it (SMT
// siblings share a core's execution units and would only contend for them), the `--cpu-list`
// syntax ("0-3,8") and pinning to such a list.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dsv41 {

// The CPUs of this thread's affinity mask, ascending (every CPU the machine reports when the mask
// cannot be read).
std::vector<int> allowed_cpus();

// The lowest CPU of each physical core among `cpus` (siblings from
// SYSFS/cpuN/topology/thread_siblings_list; a CPU whose list cannot be read counts as its own
// core), ascending.
std::vector<int> one_cpu_per_core(const std::vector<int>& cpus,
                                  const std::string& sysfs = "/sys/devices/system/cpu");

// Threads for `--threads 0`: the physical cores of the affinity mask (at least 1).
std::size_t default_thread_count();

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11} (sorted, duplicates removed); errors name the element.
Result<std::vector<int>> parse_cpu_list(std::string_view text);
// The inverse, with ranges: {0, 1, 2, 3, 8} -> "0-3,8".
std::string format_cpu_list(const std::vector<int>& cpus);

// Restricts the calling thread (and every thread it creates from now on) to `cpus`; an error names
// the CPUs the kernel refused (not in the mask the process may use, or not present).
Status pin_to_cpus(const std::vector<int>& cpus);

}  // namespace dsv41
