// A chat-completions request body in a file (`tokenize --messages`, `logits --messages`,
// design.md §4): read by the server's own chat layer (text/chat.h: messages, tools,
// chat_template_kwargs, thinking, reasoning_effort) and encoded with the V4.1 chat format, so the
// prompt is the one the server would run for the same body; its image parts' URLs in order.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "text/tokenizer.h"

namespace dsv41::cli {

// DIR/tokenizer.json (the official and the converted layouts both hold it); errors name the path.
Result<std::unique_ptr<Tokenizer>> model_tokenizer(const std::string& dir);

struct MessagesFile {
  std::string prompt;  // the V4.1 prompt text, BOS included; an image part is its placeholder
  // The user messages' image_url parts in order, and each one's field for errors
  // ("messages[0].content[1].image_url").
  std::vector<std::string> image_urls, image_params;
};

// `path` read, parsed and encoded; errors start with the path and name the field.
Result<MessagesFile> read_messages_file(const std::string& path);

}  // namespace dsv41::cli
