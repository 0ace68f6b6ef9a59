// Shared helpers for model tests: the released config fixture and JSON editing.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace dsv41::testing {

inline nlohmann::json released_config_json() {
  std::ifstream in(std::string(DSV41_TEST_DATA) + "/v41_flash_config.json");
  std::ostringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

}  // namespace dsv41::testing
