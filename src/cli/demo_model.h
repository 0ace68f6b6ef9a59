// The demo model of `dsv41 serve`/`generate` without --model: a random-weight V4.1 checkpoint (demo
// preset) with the V4.1-style real tokenizer, created on first use in the cache directory.
#pragma once

#include <string>

#include "core/status.h"

namespace dsv41::cli {

// ${DSV41_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dsv41}
std::string cache_dir();
// Returns the demo checkpoint directory, creating it first when missing (atomically: built in a
// temporary directory and renamed, so an interrupted run never leaves a half-written model).
Result<std::string> ensure_demo_model();

}  // namespace dsv41::cli
