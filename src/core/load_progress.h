// What a process is doing while it loads a model, for `serve`'s /health before the model is in
// (issue 37 item 5): a stage ("converting", "loading weights: copied onto huge pages", ...) and,
// where the loader counts bytes, the fraction done. Process-wide and thread-safe: loaders write,
// the HTTP threads read.
#pragma once

#include <string>

namespace dsv41 {

struct LoadProgress {
  std::string stage;     // empty: nothing is loading
  double fraction = -1;  // 0..1 within the stage; -1: not counted
};

void set_load_progress(std::string stage, double fraction = -1);
LoadProgress load_progress();

}  // namespace dsv41
