// Server-wide sampling defaults from generation_config.json and --override-generation-config
// (server/generation_defaults.h).
#include "server/generation_defaults.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace dsv41 {
namespace {

// vLLM's keys and the ranges the request fields accept (top_k -1 or 0: off).
struct Key {
  const char* name;
  double lo, hi;
  bool lo_open, integer;
};
constexpr Key kKeys[] = {
    {"temperature", 0, 2, false, false},         {"top_p", 0, 1, true, false},
    {"top_k", -1, 1 << 30, false, true},         {"min_p", 0, 1, false, false},
    {"repetition_penalty", 0, 100, true, false}, {"max_new_tokens", 1, 1 << 30, false, true},
};

}  // namespace

void SamplingDefaults::apply(SamplingParams& s) const {
  if (temperature) s.temperature = *temperature;
  if (top_p) s.top_p = *top_p;
  if (top_k) s.top_k = *top_k;
  if (min_p) s.min_p = *min_p;
  if (repetition_penalty) s.repetition_penalty = *repetition_penalty;
}

void SamplingDefaults::apply_default_max_tokens(std::optional<int> flag) {
  if (!flag) return;
  if (*flag > 0)
    max_new_tokens = *flag;
  else
    max_new_tokens.reset();
}

OJson SamplingDefaults::to_json() const {
  OJson j = OJson::object();
  if (temperature) j["temperature"] = *temperature;
  if (top_p) j["top_p"] = *top_p;
  if (top_k) j["top_k"] = *top_k;
  if (min_p) j["min_p"] = *min_p;
  if (repetition_penalty) j["repetition_penalty"] = *repetition_penalty;
  if (max_new_tokens) j["max_new_tokens"] = *max_new_tokens;
  return j;
}

Result<SamplingDefaults> sampling_defaults_from_json(const OJson& config, const std::string& where,
                                                     bool strict) {
  if (!config.is_object()) return Status::error(where + ": not a JSON object");
  SamplingDefaults d;
  for (const auto& [name, v] : config.items()) {
    const Key* key = nullptr;
    for (const Key& k : kKeys)
      if (name == k.name) key = &k;
    if (!key) {
      if (strict)
        return Status::error(fmt::format(
            "{}: unknown key \"{}\" (temperature, top_p, top_k, min_p, repetition_penalty, "
            "max_new_tokens)",
            where, name));
      continue;
    }
    if (v.is_null()) continue;  // HF writes null for unset values
    if (!v.is_number() || (key->integer && !v.is_number_integer()))
      return Status::error(fmt::format("{}: {} must be {}, not {}", where, name,
                                       key->integer ? "an integer" : "a number", v.dump()));
    const double x = v.get<double>();
    if (!(key->lo_open ? x > key->lo : x >= key->lo) || !(x <= key->hi))
      return Status::error(fmt::format("{}: {} = {} is outside {}{}, {}]", where, name, v.dump(),
                                       key->lo_open ? "(" : "[", key->lo, key->hi));
    const std::string n = name;
    if (n == "temperature") d.temperature = x;
    if (n == "top_p") d.top_p = x;
    if (n == "top_k") d.top_k = static_cast<int>(x);
    if (n == "min_p") d.min_p = x;
    if (n == "repetition_penalty") d.repetition_penalty = x;
    if (n == "max_new_tokens") d.max_new_tokens = static_cast<int>(x);
  }
  return d;
}

Result<SamplingDefaults> parse_override_generation_config(const std::string& json) {
  const std::string flag = "--override-generation-config";
  auto j = parse_json_ordered(json);
  if (!j) return Status::error(flag + ": " + j.status().message());
  return sampling_defaults_from_json(*j, flag, true);
}

Result<SamplingDefaults> load_sampling_defaults(const std::string& model_dir,
                                                const std::string& mode,
                                                const std::string& override_json) {
  SamplingDefaults d;
  if (mode != "auto" && mode != "none")
    return Status::error("--generation-config: must be auto or none, not " + mode);
  const std::filesystem::path file = std::filesystem::path(model_dir) / "generation_config.json";
  bool present = false;
  if (mode == "auto") {
    // The throwing overload would end serve with an uncaught exception on a path that cannot be
    // looked up (a directory without search permission, a symlink loop): an error naming it.
    std::error_code ec;
    present = std::filesystem::exists(file, ec);
    if (ec)
      return Status::error(file.string() + ": cannot check whether it exists: " + ec.message());
  }
  if (present) {
    std::ifstream in(file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in.good() && !in.eof()) return Status::error(file.string() + ": cannot read");
    auto j = parse_json_ordered(ss.str());
    if (!j) return Status::error(file.string() + ": " + j.status().message());
    auto r = sampling_defaults_from_json(*j, file.string(), false);
    if (!r) return r.status();
    d = *r;
  }
  if (!override_json.empty()) {
    auto r = parse_override_generation_config(override_json);
    if (!r) return r.status();
    if (r->temperature) d.temperature = r->temperature;
    if (r->top_p) d.top_p = r->top_p;
    if (r->top_k) d.top_k = r->top_k;
    if (r->min_p) d.min_p = r->min_p;
    if (r->repetition_penalty) d.repetition_penalty = r->repetition_penalty;
    if (r->max_new_tokens) d.max_new_tokens = r->max_new_tokens;
  }
  return d;
}

}  // namespace dsv41
