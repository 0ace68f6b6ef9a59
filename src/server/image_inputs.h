// Image parts of a request (issue 33, docs/vision.md): a part's data: URL decoded (base64, under a
// size limit) or its http(s) / file:// URL read where the server allows it (image_sources.h), the
// file handed to the model's image encoder (decoding, DeepSeek's resize plan and the vision tower,
// set by the command that loads the model: the server layer sees only this callback), and the
// prompt's image placeholders expanded into their images' spans.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "server/image_sources.h"
#include "server/openai_api.h"
#include "text/chat.h"

namespace dsv41 {

// ImageEncoder (server/openai_api.h): an image file's bytes -> its EncodedImage; errors say what is
// wrong with the file (too large, corrupt, an unsupported format). Called from request threads:
// it must be thread-safe.

// Base64 (RFC 4648 alphabet, '=' padding optional, no whitespace); nullopt when not valid.
std::optional<std::string> decode_base64(std::string_view s);

// "data:[<media type>];base64,<data>" -> the file's bytes (at most max_bytes); other URL schemes
// are refused with a message that says what is accepted.
Result<std::string> read_data_url(std::string_view url, std::size_t max_bytes);

// An image part's URL -> the file's bytes: a data: URL always; an http(s) URL only with
// o.allow_urls (--allow-image-urls); a file:// URL only under o.local_media_dir
// (--allowed-local-media-path); anything else refused with a message saying what is accepted.
Result<std::string> read_image_part(std::string_view url, const ImageSourceOptions& o);

// The job's prompt (tokenized) holds one image_token_id per image URL, in order: each becomes its
// image's span (every position image_token_id) and job.request.images gets the rows. `params`
// names each URL's request field for errors; `images` null: the model takes no images (400).
std::optional<ApiError> expand_images(const std::vector<std::string>& urls,
                                      const std::vector<std::string>& params, ImageSupport* images,
                                      int32_t image_token_id, GenerationJob& job);

// expand_images over the image parts of a chat's messages (ChatMessage::images, in order), with
// the model's encoder: what every API calls after tokenizing the chat.
std::optional<ApiError> expand_chat_images(const std::vector<ChatMessage>& messages,
                                           const ServedModel& model, GenerationJob& job);

}  // namespace dsv41
