// Whole-file text I/O for small files (configs, indexes, tokenizer files): errors name the path.
#pragma once

#include <cstddef>
#include <string>

#include "core/status.h"

namespace dsv41 {

// Reads a file of at most `limit` bytes.
Result<std::string> read_text_file(const std::string& path, std::size_t limit = std::size_t(1)
                                                                                << 30);
// Writes (truncates) a file.
Status write_text_file(const std::string& path, const std::string& text);

}  // namespace dsv41
