// Shared parsing of token-id arguments and run modes for the logits/explain commands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsv41::cli {

// Integers separated by commas or whitespace; `where` names the argument in errors.
Result<std::vector<int32_t>> parse_tokens(const std::string& text, const std::string& where);
// Reads --tokens-file F (if non-empty) or uses the --tokens text.
Result<std::vector<int32_t>> load_tokens(const std::string& tokens, const std::string& tokens_file);
// Chunk size of a mode (prefill | decode | chunked:N) over n tokens.
Result<int64_t> chunk_size(const std::string& mode, int64_t n);
// ids cut into consecutive calls of at most `chunk` tokens.
std::vector<std::vector<int32_t>> split_calls(const std::vector<int32_t>& ids, int64_t chunk);

}  // namespace dsv41::cli
