// A fixed-bucket histogram (Prometheus style: cumulative buckets, sum, count) as plain copyable
// data: the engine keeps its step histograms in one, hands copies out with its stats, and the
// server renders them next to its own. Not synchronised: the owner locks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dsv41 {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), buckets_(bounds_.size()) {}
  void observe(double v) {
    for (std::size_t i = 0; i < bounds_.size(); ++i)
      if (v <= bounds_[i]) ++buckets_[i];
    ++count_;
    sum_ += v;
  }
  // Appends the _bucket/_sum/_count lines for `name`; `labels` (`k="v",...`, already escaped)
  // go on every line, before `le`.
  void render(const std::string& name, std::string& out, const std::string& labels = {}) const;
  uint64_t count() const { return count_; }

  // Bounds in seconds for latencies, and powers of two for sizes.
  static std::vector<double> seconds() {
    return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
  }
  static std::vector<double> powers_of_two(int up_to_log2) {
    std::vector<double> b;
    for (int i = 0; i <= up_to_log2; ++i) b.push_back(double(int64_t(1) << i));
    return b;
  }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> buckets_;
  uint64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace dsv41
