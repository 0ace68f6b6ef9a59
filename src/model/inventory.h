// The expected tensor inventory of a checkpoint in the official layout (spec §3.6), derived from
// the config and the layer plan, and the check of a checkpoint against it. Text model and DSpark
// stages are required; vision tensors (`vision.*`, `aligner.*`) are recognised and ignored by the
// check, but can be listed (expected_vision_tensors) so the published whole-checkpoint totals can
// be reproduced.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/dtypes.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/layer_plan.h"

namespace dsv41 {

enum class TensorRole {
  kGlobal,
  kNorm,
  kMhc,
  kAttn,
  kCompressor,
  kIndexer,
  kRouter,
  kExpert,
  kSharedExpert,
  kEngram,
  kDspark,
  kVision,
};

struct ExpectedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  TensorRole role;
  int layer = -1;  // plan index (backbone layer or num_backbone + stage), -1 for globals
  uint64_t nbytes() const;
};

std::vector<ExpectedTensor> expected_text_tensors(const ModelConfig& c, const ModelPlan& plan);
std::vector<ExpectedTensor> expected_vision_tensors(
    const ModelConfig& c);  // empty without vision_config
bool is_vision_tensor_name(const std::string& name);

struct InventoryReport {
  std::vector<std::string> missing;
  std::vector<std::string> extra;
  std::vector<std::string> wrong_shape;  // "name: expected [..], found [..]"
  std::vector<std::string> wrong_dtype;  // "name: expected X, found Y"
  std::size_t matched = 0;
  std::size_t ignored_vision = 0;
  bool ok() const {
    return missing.empty() && extra.empty() && wrong_shape.empty() && wrong_dtype.empty();
  }
  std::string summary(std::size_t max_per_kind = 20) const;
};

InventoryReport check_inventory(const std::vector<ExpectedTensor>& expected,
                                const Checkpoint& ckpt);

struct InventoryTotals {
  std::size_t tensors = 0;
  uint64_t bytes = 0;
  std::map<std::string, std::size_t> per_dtype;  // dtype name -> tensor count
};
InventoryTotals inventory_totals(const std::vector<ExpectedTensor>& tensors);

}  // namespace dsv41
