// Where the fast path's converted checkpoint comes from: a converted directory is used as it is;
// an official-layout directory is converted once (with progress) into the directory the user
// names, or by default into a cache beside it (`DIR.dsv41-converted`), and later runs reuse it.
#pragma once

#include <string>

#include "core/status.h"

namespace dsv41::cli {

// Returns the converted directory to load; says on stderr what it found and did.
Result<std::string> ensure_converted(const std::string& model_dir,
                                     const std::string& converted_dir);

}  // namespace dsv41::cli
