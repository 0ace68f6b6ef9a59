// Prometheus exposition of a Histogram (text format 0.0.4).
#include "core/histogram.h"

#include <fmt/format.h>

namespace dsv41 {

void Histogram::render(const std::string& name, std::string& out) const {
  for (std::size_t i = 0; i < bounds_.size(); ++i)
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], buckets_[i]);
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name,
                     sum_, name, count_);
}

}  // namespace dsv41
