// Shared parsing of token-id arguments and run modes for the logits/explain commands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsv41::cli {

// Integers separated by commas or whitespace; `where` names the argument in errors. With
// allow_image, the word IMG stands for an image (-1, prompt_images.h kImagePlaceholder).
Result<std::vector<int32_t>> parse_tokens(const std::string& text, const std::string& where,
                                          bool allow_image = false);
// Reads --tokens-file F (if non-empty) or uses the --tokens text.
Result<std::vector<int32_t>> load_tokens(const std::string& tokens, const std::string& tokens_file,
                                         bool allow_image = false);
// Chunk size of a mode (prefill | decode | chunked:N) over n tokens.
Result<int64_t> chunk_size(const std::string& mode, int64_t n);
// ids cut into consecutive calls of at most `chunk` tokens, the first of at least `first_min`
// (images are merged only in the first call, so it must hold every image span).
std::vector<std::vector<int32_t>> split_calls(const std::vector<int32_t>& ids, int64_t chunk,
                                              int64_t first_min = 0);

}  // namespace dsv41::cli
