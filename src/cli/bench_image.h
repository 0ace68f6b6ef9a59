// `bench prefill --images WxH,...`: the vision tower's time per image at the model's shape (issue
// 33), with its multiply-adds counted and its fraction of the roofline (oneDNN's bf16 matmul rate
// measured beside it, as the text points do).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace dsv41::cli {

// One JSON point per size ("640x480,1024x768"): image, plan, tower_ms, flops, gflop_per_s,
// reference_gflop_per_s, fraction_of_roofline. `model` is a converted (or official: converted
// first) checkpoint with a vision tower.
Result<nlohmann::ordered_json> bench_image_points(const std::string& model,
                                                  const std::string& converted,
                                                  const std::string& sizes, int threads);

}  // namespace dsv41::cli
