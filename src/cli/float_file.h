// Writing a float array as little-endian float32 or float64 (the LOGITS.f32 / .f64 files of
// `dsv41 logits`, design.md §4), converted in one buffer and written in one call.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsv41::cli {

template <typename T>
Status write_floats(const std::string& path, const std::vector<T>& v, bool as_f64) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return Status::error(path + ": cannot create");
  if (as_f64) {
    const std::vector<double> d(v.begin(), v.end());
    f.write(reinterpret_cast<const char*>(d.data()), std::streamsize(d.size() * sizeof(double)));
  } else {
    const std::vector<float> d(v.begin(), v.end());
    f.write(reinterpret_cast<const char*>(d.data()), std::streamsize(d.size() * sizeof(float)));
  }
  f.close();
  if (!f) return Status::error(path + ": write failed");
  return Status::ok();
}

inline bool ends_with_f64(const std::string& path) {
  return path.size() >= 4 && path.compare(path.size() - 4, 4, ".f64") == 0;
}

}  // namespace dsv41::cli
