// libFuzzer target: config.json text parsed and validated (parse_config), as the loader and the
// converter read it; a valid config must also give a self-consistent layer plan.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace dsv41;
  const auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  auto cfg = parse_config(j, "config.json");
  (void)cfg;
  return 0;
}
