// The image encoder `serve` hands its server (server/image_inputs.h): an image file decoded under
// the decoder's limits, planned by the model's vision_config (spec §9.1), cut into patches and
// through the model's vision tower (the fast tower on the converted layout, the reference tower
// on the official one with --path reference), one image at a time.
#pragma once

#include <memory>

#include "core/status.h"
#include "engine/model_loading.h"
#include "server/openai_api.h"

namespace dsv41::cli {

// Null (no error) when the model has no vision_config: its server takes no images.
Result<std::shared_ptr<const ImageEncoder>> make_image_encoder(const EngineOptions& eo);

}  // namespace dsv41::cli
