// The image encoder `serve` hands its server (server/image_inputs.h): an image file decoded under
// the decoder's limits, planned by the model's vision_config (spec §9.1), cut into patches and
// through the model's vision tower (the fast tower on the converted layout, the reference tower
// on the official one with --path reference), one image at a time; with a cache of encoded images
// (least recently used out first) keyed by the file's bytes, so a repeated image (the next turn
// of a conversation) is not encoded again.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "engine/engine.h"
#include "server/openai_api.h"

namespace dsv41::cli {

// An empty encoder (no error) when the model has no vision_config: its server takes no images.
// cache_bytes: the encoded images' rows kept at most (0: no cache).
Result<ImageEncoder> make_image_encoder(const EngineOptions& eo, int64_t cache_bytes);

}  // namespace dsv41::cli
