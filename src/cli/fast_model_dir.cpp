// ensure_converted (see fast_model_dir.h).
#include "cli/fast_model_dir.h"

#include <filesystem>

#include "core/log.h"
#include "model/convert/converted_checkpoint.h"
#include "model/convert/converter.h"

namespace dsv41::cli {

Result<std::string> ensure_converted(const std::string& model_dir,
                                     const std::string& converted_dir) {
  namespace fs = std::filesystem;
  if (is_converted_checkpoint(model_dir)) return model_dir;
  std::string to = converted_dir;
  if (to.empty()) {
    std::string base = fs::path(model_dir).lexically_normal().string();
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    to = base + ".dsv41-converted";
  }
  if (fs::exists(fs::path(to) / "manifest.json")) {
    log::info("{} is in the official layout; using its conversion in {}", model_dir, to);
    return to;
  }
  log::info(
      "{} is in the official layout; converting it once into {} (the fast path reads the "
      "engine layout)",
      model_dir, to);
  ConvertOptions o;
  o.from = model_dir;
  o.to = to;
  auto r = convert_checkpoint(o);
  if (!r) return r.status().with_context("converting " + model_dir + " into " + to + ": ");
  log::info("converted {} tensors ({:.2f} GB) in {:.1f} s", r->tensors, double(r->bytes) / 1e9,
            r->seconds);
  return to;
}

}  // namespace dsv41::cli
