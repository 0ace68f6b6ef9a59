// A chat request body in a file, parsed and encoded by the chat layer (messages_file.h).
#include "cli/messages_file.h"

#include <filesystem>

#include "io/text_file.h"
#include "text/chat.h"
#include "text/json_ordered.h"

namespace dsv41::cli {

Result<std::unique_ptr<Tokenizer>> model_tokenizer(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir) / "tokenizer.json";
  if (!std::filesystem::exists(p)) return Status::error("--model: " + p.string() + " not found");
  return Tokenizer::load(p.string());
}

Result<MessagesFile> read_messages_file(const std::string& path) {
  auto body = read_text_file(path);
  if (!body) return body.status();
  auto doc = parse_json_ordered(*body);
  if (!doc) return Status::error(path + ": " + doc.status().message());
  auto req = parse_chat_request(*doc);
  if (!req) return Status::error(path + ": " + req.status().message());
  auto prompt = encode_chat(req->messages, req->options);
  if (!prompt) return Status::error(path + ": " + prompt.status().message());
  MessagesFile out;
  out.prompt = std::move(*prompt);
  for (const ChatMessage& m : req->messages) {
    out.image_urls.insert(out.image_urls.end(), m.images.begin(), m.images.end());
    out.image_params.insert(out.image_params.end(), m.image_params.begin(), m.image_params.end());
  }
  return out;
}

}  // namespace dsv41::cli
