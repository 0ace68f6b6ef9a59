// `dsv41 bench`: performance measurements printed as JSON (design.md §8): `bench tokenizer`, the
// encode/decode throughput of a model's tokenizer on a deterministic mixed-script corpus; `bench
// kernels`; `bench decode` / `bench prefill` (cmd_bench_model.cpp).
#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/log.h"
#include "core/rng.h"
#include "ops/bench/kernel_bench.h"
#include "text/tokenizer.h"

namespace dsv41::cli {
namespace {

// ~`bytes` of varied text (English, code, CJK, Cyrillic, digits, emoji) from a seeded generator, so
// the BPE word cache sees a realistic mix of repeated and new words.
std::string make_corpus(std::size_t bytes, uint64_t seed) {
  static const char* kWords[] = {
      "the",   "model", "inference", "engine", "token", "DeepSeek", "return", "int",
      "float", "while", "数据",      "模型",   "推理",  "привет",   "мир",    "😀",
      "élan",  "naïve", "x86_64",    "AVX512", "def",   "class",    "{",      "}",
      "(",     ")",     ";",         "==",     "->",    "//",       "#"};
  Rng rng(seed);
  std::string s;
  while (s.size() < bytes) {
    switch (rng.below(10)) {
      case 0:
        s += std::to_string(rng.below(100000));
        break;
      case 1:
        s += '\n';
        break;
      case 2:
        s += "  ";
        break;
      default:
        s += kWords[rng.below(std::size(kWords))];
    }
    s += rng.below(5) ? " " : "";
    if (rng.below(7) == 0) s += char('a' + rng.below(26)), s += char('a' + rng.below(26));
  }
  return s;
}

int run_bench_tokenizer(const std::string& model, std::size_t mb) {
  auto tok = Tokenizer::load(model + "/tokenizer.json");
  if (!tok) {
    log::error("bench tokenizer: {}", tok.status().message());
    return kExitInvalid;
  }
  const std::string corpus = make_corpus(mb << 20, 7);
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = (*tok)->encode(corpus);  // first pass: cold word cache
  const auto t1 = std::chrono::steady_clock::now();
  const auto again = (*tok)->encode(corpus);  // second pass: warm cache
  const auto t2 = std::chrono::steady_clock::now();
  auto text = (*tok)->decode(ids);
  const auto t3 = std::chrono::steady_clock::now();
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  const double bytes = double(corpus.size());
  nlohmann::ordered_json j = {
      {"bench", "tokenizer"},
      {"model", model},
      {"threads", 1},
      {"corpus_bytes", corpus.size()},
      {"tokens", ids.size()},
      {"encode_cold_mb_per_s", bytes / 1e6 / secs(t0, t1)},
      {"encode_warm_mb_per_s", bytes / 1e6 / secs(t1, t2)},
      {"encode_cold_tokens_per_s", double(ids.size()) / secs(t0, t1)},
      {"decode_mb_per_s", bytes / 1e6 / secs(t2, t3)},
      {"round_trip_exact", text.is_ok() && text.value() == corpus && again == ids},
  };
  std::printf("%s\n", j.dump(2).c_str());
  return kExitOk;
}

}  // namespace

void add_bench(CLI::App& app, Runner* run) {
  CLI::App* bench = app.add_subcommand("bench", "Performance measurements (JSON output).");
  bench->require_subcommand(1);
  auto model = std::make_shared<std::string>();
  auto mb = std::make_shared<std::size_t>(4);
  CLI::App* tok =
      bench->add_subcommand("tokenizer", "Tokenizer encode/decode throughput on a mixed corpus.");
  tok->add_option("--model", *model, "Directory holding tokenizer.json")->required();
  tok->add_option("--mb", *mb, "Corpus size in MiB")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  tok->callback([=] { *run = [=] { return run_bench_tokenizer(*model, *mb); }; });

  auto kopt = std::make_shared<ops::KernelBenchOptions>();
  CLI::App* kb = bench->add_subcommand(
      "kernels",
      "The kernels at the model's real shapes, JSON: decode GEMVs on all "
      "threads (time, weight GB/s, GFLOP/s, fraction of the read bandwidth "
      "measured beside each; the fast engine's entries: one token, and 2, 6 and 16 "
      "tokens through the batch-invariant kernels, with their cost over one "
      "token's), prefill GEMMs beside oneDNN's "
      "matmul (bf16 where the CPU has it, else f32) with the ratio, "
      "attention, indexer, mHC, cache packing; tier_ab: the active tier "
      "against the tier below it (one-token MXFP4 gate/up, indexer). "
      "DSV41_ISA forces a lower tier for A/B runs.");
  kb->add_option("--threads", kopt->threads, "Threads (0 = all cores)")->capture_default_str();
  kb->add_option("--probe-mb", kopt->probe_mb, "Read-probe buffer (MiB)")
      ->check(CLI::Range(16, 65536))
      ->capture_default_str();
  kb->add_option("--set-mb", kopt->min_set_mb,
                 "Each kernel cycles through this many MiB of weight copies")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  kb->add_option("--reps", kopt->reps, "Best of this many runs")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  kb->add_flag("--quick", kopt->quick, "Small shapes only (smoke test)");
  kb->callback([=] {
    *run = [=] {
      std::printf("%s\n", ops::run_kernel_bench(*kopt).c_str());
      return kExitOk;
    };
  });
  add_bench_model(bench, run);
  add_bench_serve(bench, run);
  add_bench_grammar(bench, run);
}

}  // namespace dsv41::cli
