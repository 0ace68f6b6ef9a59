// libFuzzer target: a converted checkpoint's manifest text (parse_manifest), the first thing the
// fail-closed loader reads.
#include "fuzz_util.h"
#include "model/convert/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace dsv41;
  auto m = parse_manifest(std::string(reinterpret_cast<const char*>(data), size), "manifest.json");
  (void)m;
  return 0;
}
