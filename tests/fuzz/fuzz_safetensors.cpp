// libFuzzer target: one safetensors file (header length, JSON header, data) opened and read the
// way the loader reads it; every tensor's bytes are touched so a bad offset shows under ASan.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace dsv41;
  const std::string path = fuzz::scratch_dir() + "/model.safetensors";
  fuzz::write_file(path, data, size);
  auto f = SafetensorsFile::open(path);
  if (!f) return 0;
  uint64_t sum = 0;
  for (const TensorInfo& t : f->tensors()) {
    auto bytes = f->bytes(t);
    for (std::size_t i = 0; i < bytes.size(); i += 61) sum += bytes[i];
    if (!bytes.empty()) sum += bytes.back();
    if (f->find(t.name) == nullptr) fuzz::invariant_failed("a listed tensor is not found by name");
  }
  return int(sum & 0);
}
