// Prometheus exposition of a Histogram (text format 0.0.4).
#include "core/histogram.h"

#include <fmt/format.h>

namespace dsv41 {

void Histogram::render(const std::string& name, std::string& out, const std::string& labels) const {
  const std::string le = labels.empty() ? std::string() : labels + ",";
  const std::string own = labels.empty() ? std::string() : "{" + labels + "}";
  for (std::size_t i = 0; i < bounds_.size(); ++i)
    out += fmt::format("{}_bucket{{{}le=\"{}\"}} {}\n", name, le, bounds_[i], buckets_[i]);
  out += fmt::format("{}_bucket{{{}le=\"+Inf\"}} {}\n{}_sum{} {}\n{}_count{} {}\n", name, le,
                     count_, name, own, sum_, name, own, count_);
}

}  // namespace dsv41
