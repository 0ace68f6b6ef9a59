// Subcommand registration: each cmd_*.cpp adds its CLI11 subcommand and returns the exit code of
// its run through a callback set at parse time.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace dsv41::cli {

using Runner = std::function<int()>;

// Each registers a subcommand on `app` and stores its runner in `*run` when selected.
void add_make_tiny(CLI::App& app, Runner* run);
void add_inspect(CLI::App& app, Runner* run);
void add_logits(CLI::App& app, Runner* run);
void add_explain(CLI::App& app, Runner* run);
void add_tokenize(CLI::App& app, Runner* run);
void add_detokenize(CLI::App& app, Runner* run);
void add_derive_tokenizer(CLI::App& app, Runner* run);
void add_bench(CLI::App& app, Runner* run);
// `bench decode` and `bench prefill` under an existing `bench` (cmd_bench_model.cpp).
void add_bench_model(CLI::App* bench, Runner* run);
// `bench serve` (cmd_bench_serve.cpp).
void add_bench_serve(CLI::App* bench, Runner* run);
// `bench grammar` (cmd_bench_grammar.cpp).
void add_bench_grammar(CLI::App* bench, Runner* run);
void add_generate(CLI::App& app, Runner* run);
void add_serve(CLI::App& app, Runner* run);
void add_run_batch(CLI::App& app, Runner* run);
void add_image_embed(CLI::App& app, Runner* run);
void add_convert(CLI::App& app, Runner* run);
void add_validate(CLI::App& app, Runner* run);

// Exit codes shared by all subcommands.
inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 1;       // bad command line
inline constexpr int kExitInvalid = 2;     // the input (checkpoint, file) is invalid
inline constexpr int kExitRankFailed = 3;  // under mpirun: another rank died or stopped answering

}  // namespace dsv41::cli
