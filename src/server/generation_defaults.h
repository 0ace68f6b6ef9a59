// Server-wide sampling defaults (vLLM's --generation-config / --override-generation-config): the
// keys vLLM reads from a checkpoint's generation_config.json (temperature, top_p, top_k, min_p,
// repetition_penalty, max_new_tokens), overridden key by key from the flag's JSON. A request's own
// fields always win: the parsers start from these values, then read the request.
#pragma once

#include <optional>
#include <string>

#include "core/status.h"
#include "engine/sampler.h"
#include "text/json_ordered.h"

namespace dsv41 {

struct SamplingDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<int> max_new_tokens;  // the max_tokens of requests that set none
  bool empty() const {
    return !temperature && !top_p && !min_p && !repetition_penalty && !top_k && !max_new_tokens;
  }
  // Sets the sampling fields given here (max_new_tokens is applied by the parsers with the other
  // max_tokens defaults).
  void apply(SamplingParams& s) const;
  // --default-max-tokens, which wins over the file and the override when it is given: N > 0 is
  // the default max_tokens, 0 none (the rest of the context); not given leaves max_new_tokens.
  void apply_default_max_tokens(std::optional<int> flag);
  // {"temperature": 0.6, ...}: the keys that are set, in vLLM's names.
  OJson to_json() const;
};

// Reads vLLM's keys from a generation config object. `where` names the file or flag in errors.
// `strict`: any other key is an error (the override flag); a checkpoint's file carries other keys
// (bos_token_id, do_sample, ...) that are not sampling defaults and are skipped.
Result<SamplingDefaults> sampling_defaults_from_json(const OJson& config, const std::string& where,
                                                     bool strict);

// --override-generation-config's JSON: an object of vLLM's keys only. Errors name the flag.
Result<SamplingDefaults> parse_override_generation_config(const std::string& json);

// The effective defaults: `mode` "auto" reads MODEL_DIR/generation_config.json when it exists,
// "none" ignores it; `override_json` (may be empty) then replaces key by key. Errors name the file
// or --override-generation-config.
Result<SamplingDefaults> load_sampling_defaults(const std::string& model_dir,
                                                const std::string& mode,
                                                const std::string& override_json);

}  // namespace dsv41
