// `dsv41 make-tiny`: writes a random-weight checkpoint in the official layout
// (model/tiny_checkpoint.h).
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/log.h"
#include "model/tiny_checkpoint.h"

namespace dsv41::cli {

void add_make_tiny(CLI::App& app, Runner* run) {
  auto opt = std::make_shared<MakeTinyOptions>();
  CLI::App* sub = app.add_subcommand(
      "make-tiny",
      "Write a random-weight V4.1 checkpoint in the official Hugging Face layout (config.json, "
      "sharded "
      "safetensors + index, tokenizer files). Presets: tiny (unit tests, ~2 MB), tiny-top1 (tiny "
      "with top-1 routing), demo (demo server), small "
      "(long-context tests, ~250 MB), real-shape (released per-layer dimensions, ~9 GB).");
  sub->add_option("--out", opt->out_dir, "Output directory (created if missing)")->required();
  sub->add_option("--preset", opt->preset,
                  "Size preset: tiny | tiny-top1 | demo | small | real-shape")
      ->capture_default_str();
  sub->add_option("--seed", opt->seed, "Random seed; the same seed gives byte-identical files")
      ->capture_default_str();
  sub->add_option(
      "--tokenizer", opt->tokenizer_path,
      "Use this tokenizer.json (and the tokenizer_config.json beside it) instead of the generated "
      "byte-level BPE; it must define V4.1's special tokens");
  sub->add_option("--config-patch", opt->config_patch,
                  "JSON merge patch over the preset's config.json (other widths and layer plans, "
                  "for tests), e.g. '{\"text_config\": {\"hidden_size\": 96}}'");
  sub->add_flag(
      "--bigram", opt->bigram,
      "Make the target a strong bigram model (each token's embedding is the output-head row of a "
      "fixed random successor) and give the drafter's Markov head the same bigram, so the DSpark "
      "drafter predicts the target: for speculative-decoding speed tests. Layers and experts "
      "keep random weights and their full cost");
  sub->add_flag("--force", opt->force, "Overwrite a directory that already holds a checkpoint");
  sub->add_option("--threads", opt->threads, "Worker threads (0 = all cores)")
      ->capture_default_str();
  sub->callback([opt, run] {
    *run = [opt] {
      auto r = make_tiny_checkpoint(*opt);
      if (!r) {
        log::error("make-tiny: {}", r.status().message());
        return kExitInvalid;
      }
      const nlohmann::json j = {{"out", opt->out_dir}, {"preset", opt->preset},
                                {"seed", opt->seed},   {"tensors", r->tensors},
                                {"bytes", r->bytes},   {"shards", r->shards}};
      std::printf("%s\n", j.dump().c_str());
      return kExitOk;
    };
  });
}

}  // namespace dsv41::cli
