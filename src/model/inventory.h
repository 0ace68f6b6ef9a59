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
  bool ok() const { return problems() == 0; }
  std::size_t problems() const {
    return missing.size() + extra.size() + wrong_shape.size() + wrong_dtype.size();
  }
  std::string summary(std::size_t max_per_kind = 20) const;
};

InventoryReport check_inventory(const std::vector<ExpectedTensor>& expected,
                                const Checkpoint& ckpt);

// When one config.json value is wrong, hundreds of shapes disagree; this names the value. For each
// config field that sets one dimension of a tensor directly (hidden_size: embed.weight's columns,
// ...), where the checkpoint's dimension differs, the inventory is checked again with the field set
// to the checkpoint's value; the field is named when that removes most of `rep`'s problems:
// "text_config.hidden_size = 288 in config.json, but embed.weight has 256 columns (...)".
std::vector<std::string> config_contradictions(const ModelConfig& c,
                                               const std::vector<ExpectedTensor>& expected,
                                               const Checkpoint& ckpt, const InventoryReport& rep);

struct InventoryTotals {
  std::size_t tensors = 0;
  uint64_t bytes = 0;
  std::map<std::string, std::size_t> per_dtype;  // dtype name -> tensor count
};
InventoryTotals inventory_totals(const std::vector<ExpectedTensor>& tensors);

}  // namespace dsv41
