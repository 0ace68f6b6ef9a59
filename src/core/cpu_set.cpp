// Affinity masks, physical cores and CPU lists (cpu_set.h).
#include "core/cpu_set.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <thread>

namespace dsv41 {

std::vector<int> allowed_cpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  if (out.empty())
    for (unsigned c = 0; c < std::max(1u, std::thread::hardware_concurrency()); ++c)
      out.push_back(int(c));
  return out;
}

std::vector<int> one_cpu_per_core(const std::vector<int>& cpus, const std::string& sysfs) {
  std::vector<int> out;
  for (int c : cpus) {
    std::ifstream in(sysfs + "/cpu" + std::to_string(c) + "/topology/thread_siblings_list");
    std::string line;
    auto siblings = std::getline(in, line) ? parse_cpu_list(line)
                                           : Result<std::vector<int>>(Status::error("unread"));
    // The core's representative: its lowest sibling that is in `cpus` (c itself when none is
    // lower), so each core is counted once whichever of its siblings the mask holds.
    int first = c;
    if (siblings)
      for (int s : *siblings)
        if (s < first && std::binary_search(cpus.begin(), cpus.end(), s)) first = s;
    if (first == c) out.push_back(c);
  }
  return out;
}

std::size_t default_thread_count() {
  return std::max<std::size_t>(1, one_cpu_per_core(allowed_cpus()).size());
}

Result<std::vector<int>> parse_cpu_list(std::string_view text) {
  std::vector<int> out;
  auto number = [](std::string_view s, int& v) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc() && end == s.data() + s.size() && v >= 0 &&
           v < CPU_SETSIZE;
  };
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text.empty()) return Status::error("an empty CPU list");
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, comma - at);
    const std::size_t dash = item.find('-');
    int lo = 0, hi = 0;
    const bool ok = dash == std::string_view::npos
                        ? number(item, lo) && (hi = lo, true)
                        : number(item.substr(0, dash), lo) && number(item.substr(dash + 1), hi);
    if (!ok || hi < lo)
      return Status::error("'" + std::string(item) +
                           "' is not a CPU number or a range a-b (CPUs 0-" +
                           std::to_string(CPU_SETSIZE - 1) + ")");
    for (int c = lo; c <= hi; ++c) out.push_back(c);
    at = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

Status pin_to_cpus(const std::vector<int>& cpus) {
  const std::vector<int> allowed = allowed_cpus();
  std::vector<int> outside;
  for (int c : cpus)
    if (!std::binary_search(allowed.begin(), allowed.end(), c)) outside.push_back(c);
  if (!outside.empty())
    return Status::error("--cpu-list: CPUs " + format_cpu_list(outside) +
                         " are not in this process's affinity mask (" + format_cpu_list(allowed) +
                         ")");
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (cpus.empty() || sched_setaffinity(0, sizeof(set), &set) != 0)
    return Status::error("--cpu-list " + format_cpu_list(cpus) +
                         ": the kernel refused it (CPUs this process may use: " +
                         format_cpu_list(allowed_cpus()) + ")");
  return Status::ok();
}

}  // namespace dsv41
