// libFuzzer target: a checkpoint directory's model.safetensors.index.json (the fuzz input) beside
// two small valid shards, opened as the converter and the oracle open a release.
#include "fuzz_util.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"

namespace {

// Two shards of two tensors each, written once.
void write_shards(const std::string& dir) {
  using namespace dsv41;
  for (int s = 1; s <= 2; ++s) {
    std::vector<TensorSpec> specs = {{"t" + std::to_string(2 * s - 1), DType::kF32, {2, 3}},
                                     {"t" + std::to_string(2 * s), DType::kBF16, {4}}};
    const std::string name = "model-0000" + std::to_string(s) + "-of-00002.safetensors";
    Status st = write_safetensors(dir + "/" + name, specs, [](std::size_t, std::span<uint8_t> out) {
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(i * 7);
    });
    if (!st) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace dsv41;
  static const bool ready = [] {
    write_shards(fuzz::scratch_dir());
    return true;
  }();
  (void)ready;
  fuzz::write_file(fuzz::scratch_dir() + "/model.safetensors.index.json", data, size);
  auto ck = Checkpoint::open(fuzz::scratch_dir());
  if (!ck) return 0;
  for (const auto& name : ck->tensor_names()) {
    if (!ck->find(name)) fuzz::invariant_failed("a listed tensor is not found by name");
    auto bytes = ck->bytes(name);
    if (!bytes.empty()) (void)bytes.back();
  }
  return 0;
}
