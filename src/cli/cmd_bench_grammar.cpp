// `dsv41 bench grammar --model DIR [--schemas DIR]` (issue 32): the structured-output grammar on
// a model's vocabulary. Per schema: the compile time (a fresh grammar, cold: what a request with
// a new schema waits for; and the automaton's share of it) and its states, then seeded random walks
// through the grammar (each step fills the mask of allowed tokens and takes one of them uniformly),
// timing every mask: p50, p99 and the worst, first visits of a state included. One thread; JSON on
// stdout.
#include <algorithm>
#include <bit>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "core/log.h"
#include "grammar/grammar.h"
#include "io/text_file.h"
#include "text/special_tokens.h"
#include "text/tokenizer.h"

namespace dsv41::cli {
namespace {

namespace fs = std::filesystem;

// Used without --schemas: typical request shapes (an extraction record, an order with $ref'd
// items and formats, a recursive tree, a tagged union, a function call's arguments).
const std::pair<const char*, const char*> kBuiltinSchemas[] = {
    {"person",
     R"({"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0,"maximum":130},
        "email":{"type":"string","format":"email"},"tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":4},
        "address":{"type":"object","properties":{"city":{"type":"string","maxLength":30},"zip":{"type":"string","pattern":"^\\d{5}$"}},
        "required":["city","zip"],"additionalProperties":false}},"required":["name","age","address"],"additionalProperties":false})"},
    {"order",
     R"({"$defs":{"item":{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"qty":{"type":"number","minimum":0,"maximum":1000},
        "note":{"type":["string","null"],"maxLength":20},"sub":{"type":"array","items":{"$ref":"#/$defs/item"},"maxItems":2}},"required":["id","qty"],
        "additionalProperties":false}},"type":"object","properties":{"items":{"type":"array","items":{"$ref":"#/$defs/item"},"minItems":1,"maxItems":3},
        "when":{"type":"string","format":"date-time"},"status":{"enum":["open","closed"]}},"required":["items","status"],"additionalProperties":false})"},
    {"tree",
     R"({"$defs":{"node":{"type":"object","properties":{"label":{"type":"string","maxLength":16},"children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":3}},
        "required":["label"],"additionalProperties":false}},"$ref":"#/$defs/node"})"},
    {"tagged_union",
     R"({"type":"object","properties":{"shape":{"oneOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number","minimum":0,"maximum":100}},"required":["kind","r"],"additionalProperties":false},
        {"type":"object","properties":{"kind":{"const":"rect"},"w":{"type":"integer","minimum":1,"maximum":500},"h":{"type":"integer","minimum":1,"maximum":500}},"required":["kind","w","h"],"additionalProperties":false}]},
        "visible":{"type":"boolean"}},"required":["shape","visible"],"additionalProperties":false})"},
    {"tool_arguments",
     R"({"type":"object","properties":{"location":{"type":"string","maxLength":60},"unit":{"enum":["celsius","fahrenheit"]},
        "days":{"type":"integer","minimum":1,"maximum":14}},"required":["location","unit"],"additionalProperties":false})"},
};

struct GrammarBenchArgs {
  std::string model, schemas;
  int walks = 8, max_steps = 512;
  uint64_t seed = 1;
  double precompute_ms = GrammarOptions{}.precompute_ms;
};

double grammar_percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * double(v.size())))];
}

double round_3(double v) {
  return std::round(v * 1000) / 1000;
}

// The id of the k-th set bit of the mask (k < the number of set bits).
int32_t nth_allowed(const std::vector<uint64_t>& mask, uint64_t k) {
  for (std::size_t w = 0; w < mask.size(); ++w) {
    const uint64_t n = uint64_t(std::popcount(mask[w]));
    if (k >= n) {
      k -= n;
      continue;
    }
    uint64_t bits = mask[w];
    for (; k > 0; --k) bits &= bits - 1;
    return int32_t(w * 64 + uint64_t(std::countr_zero(bits)));
  }
  return -1;
}

// One schema's figures; the walks' mask times are appended to `all_us`.
nlohmann::ordered_json bench_schema(const std::string& name, const std::string& text,
                                    const std::shared_ptr<const TokenVocab>& vocab,
                                    const GrammarBenchArgs& a, std::mt19937_64& rng,
                                    std::vector<double>& all_us) {
  nlohmann::ordered_json j = {{"name", name}};
  auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return round_3(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
  };
  // The automaton alone (no token sets precomputed), then what a request waits for: the automaton
  // and the token sets precomputed within --precompute-ms.
  GrammarOptions bare;
  bare.precompute_ms = 0;
  auto t0 = std::chrono::steady_clock::now();
  auto automaton = Grammar::from_json_schema(text, vocab, bare);
  j["automaton_ms"] = ms_since(t0);
  GrammarOptions opt;
  opt.precompute_ms = a.precompute_ms;
  t0 = std::chrono::steady_clock::now();
  auto g = Grammar::from_json_schema(text, vocab, opt);
  j["compile_ms"] = ms_since(t0);
  if (!automaton || !g) {
    j["error"] = (!automaton ? automaton : g).status().message();
    return j;
  }
  j["states"] = g.value()->num_states();
  std::vector<uint64_t> mask(vocab->mask_words());
  std::vector<double> us;
  int complete = 0;
  int64_t tokens = 0;
  for (int w = 0; w < a.walks; ++w) {
    Matcher m(g.value());
    for (int step = 0; step < a.max_steps && !m.is_terminated(); ++step) {
      const auto s0 = std::chrono::steady_clock::now();
      m.fill_mask(mask);
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s0).count());
      uint64_t allowed = 0;
      for (uint64_t word : mask) allowed += uint64_t(std::popcount(word));
      if (allowed == 0) break;  // a dead state: the engine ends such a sequence
      const int32_t id = nth_allowed(mask, rng() % allowed);
      if (!m.accept_token(id)) break;
      ++tokens;
    }
    complete += m.is_terminated() || m.is_complete();
  }
  all_us.insert(all_us.end(), us.begin(), us.end());
  j["walks"] = a.walks;
  j["tokens"] = tokens;
  j["documents_complete"] = complete;
  j["mask_us_p50"] = round_3(grammar_percentile(us, 0.5));
  j["mask_us_p99"] = round_3(grammar_percentile(us, 0.99));
  j["mask_us_max"] = round_3(us.empty() ? 0 : *std::max_element(us.begin(), us.end()));
  return j;
}

// The schemas to run, by name: the *.json files of --schemas in name order, else the built-in set.
Result<std::vector<std::pair<std::string, std::string>>> load_schemas(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  if (dir.empty()) {
    for (const auto& [name, text] : kBuiltinSchemas) out.emplace_back(name, text);
    return out;
  }
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".json") files.push_back(e.path());
  if (ec) return Status::error("--schemas " + dir + ": " + ec.message());
  if (files.empty()) return Status::error("--schemas " + dir + ": no *.json files");
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    auto text = read_text_file(f.string());
    if (!text) return Status::error("--schemas: " + text.status().message());
    out.emplace_back(f.stem().string(), std::move(*text));
  }
  return out;
}

int run_bench_grammar(const GrammarBenchArgs& a) {
  // The vocabulary as the server builds it (GrammarCache): the tokenizer, EOS the end id, every
  // added token excluded.
  auto tok = Tokenizer::load(a.model + "/tokenizer.json");
  if (!tok) {
    log::error("bench grammar: --model: {}", tok.status().message());
    return kExitInvalid;
  }
  const int32_t eos = (*tok)->token_id(tokens::kEos);
  auto vocab = TokenVocab::from_tokenizer(
      **tok, eos >= 0 ? std::vector<int32_t>{eos} : std::vector<int32_t>{});
  if (!vocab) {
    log::error("bench grammar: {}", vocab.status().message());
    return kExitInvalid;
  }
  auto schemas = load_schemas(a.schemas);
  if (!schemas) {
    log::error("bench grammar: {}", schemas.status().message());
    return kExitUsage;
  }
  std::mt19937_64 rng(a.seed);
  std::vector<double> all_us;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  double worst_compile = 0;
  for (const auto& [name, text] : *schemas) {
    list.push_back(bench_schema(name, text, *vocab, a, rng, all_us));
    worst_compile = std::max(worst_compile, list.back()["compile_ms"].get<double>());
  }
  nlohmann::ordered_json j = {{"bench", "grammar"},
                              {"model", a.model},
                              {"vocab", (*vocab)->size()},
                              {"threads", 1},
                              {"schemas", std::move(list)},
                              {"compile_ms_max", worst_compile},
                              {"mask_steps", all_us.size()},
                              {"mask_us_p50", round_3(grammar_percentile(all_us, 0.5))},
                              {"mask_us_p99", round_3(grammar_percentile(all_us, 0.99))}};
  std::printf("%s\n", j.dump(2).c_str());
  return kExitOk;
}

}  // namespace

void add_bench_grammar(CLI::App* bench, Runner* run) {
  auto a = std::make_shared<GrammarBenchArgs>();
  CLI::App* sub = bench->add_subcommand(
      "grammar",
      "Structured outputs on a model's vocabulary, JSON: per JSON schema the compile time and "
      "states, and the time to fill a step's token mask (p50, p99, worst) over seeded random "
      "walks that take allowed tokens until the document closes.");
  sub->add_option("--model", a->model, "Model directory (its tokenizer.json)")->required();
  sub->add_option("--schemas", a->schemas,
                  "Directory of *.json schemas, one each (default: five built-in typical ones)");
  sub->add_option("--walks", a->walks, "Random walks per schema")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  sub->add_option("--max-steps", a->max_steps, "Tokens per walk at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--seed", a->seed, "Seed of the walks")->capture_default_str();
  sub->add_option("--precompute-ms", a->precompute_ms,
                  "Budget for computing per-state token sets at compile (the rest fill on first "
                  "use, which the mask times then show)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60000.0));
  sub->callback([a, run] { *run = [a] { return run_bench_grammar(*a); }; });
}

}  // namespace dsv41::cli
