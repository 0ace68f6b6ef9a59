// The process-wide load progress (load_progress.h), behind a mutex.
#include "core/load_progress.h"

#include <mutex>

namespace dsv41 {
namespace {
std::mutex g_mu;
LoadProgress g_progress;
}  // namespace

void set_load_progress(std::string stage, double fraction) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_progress.stage = std::move(stage);
  g_progress.fraction = fraction;
}

LoadProgress load_progress() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_progress;
}

}  // namespace dsv41
