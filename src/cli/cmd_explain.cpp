// `dsv41 explain`: runs the reference twice under two settings (precision, mode, index keys) with
// decision tracing on, compares the logits and prints the first fake-quant roundings, top-k sets,
// candidate pools and expert selections that differ, with each run's distance to the boundary.
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/token_args.h"
#include "core/log.h"
#include "model/reference/flip_report.h"
#include "model/reference/reference_model.h"

namespace dsv41::cli {
namespace {

struct RunSpec {
  std::string precision = "fp64", mode = "prefill", keys = "owner";
  std::string text() const { return precision + "," + mode + "," + keys; }
};

Result<RunSpec> parse_spec(const std::string& s, const std::string& where) {
  RunSpec r;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part == "fp32" || part == "fp64")
      r.precision = part;
    else if (part == "prefill" || part == "decode" || part.rfind("chunked:", 0) == 0)
      r.mode = part;
    else if (part == "owner" || part == "vendor")
      r.keys = part;
    else
      return Status::error(where + ": '" + part +
                           "' is not fp32|fp64, prefill|decode|chunked:N or owner|vendor");
  }
  return r;
}

struct RunOut {
  std::vector<double> logits;
  std::vector<TraceEvent> trace;
  int64_t vocab = 0;
};

template <typename T>
Result<RunOut> run_one(const std::string& model, const RunSpec& spec, bool act_quant,
                       const std::vector<int32_t>& ids) {
  auto chunk = chunk_size(spec.mode, int64_t(ids.size()));
  if (!chunk) return chunk.status();
  ReferenceOptions opt;
  opt.index_keys = spec.keys == "vendor" ? IndexKeySemantics::kVendor : IndexKeySemantics::kOwner;
  opt.act_quant = act_quant;
  auto m = ReferenceModel<T>::load(model, opt);
  if (!m) return m.status();
  RunOut out;
  (*m)->set_trace(&out.trace);
  std::vector<T> logits;
  for (const auto& part : split_calls(ids, *chunk)) {
    DSV41_RETURN_IF_ERROR((*m)->forward(part, &logits).with_context("--tokens: "));
  }
  out.logits.assign(logits.begin(), logits.end());
  out.vocab = (*m)->config().text.vocab_size;
  return out;
}

Result<RunOut> run_spec(const std::string& model, const RunSpec& spec, bool act_quant,
                        const std::vector<int32_t>& ids) {
  return spec.precision == "fp64" ? run_one<double>(model, spec, act_quant, ids)
                                  : run_one<float>(model, spec, act_quant, ids);
}

struct ExplainArgs {
  std::string model, tokens, tokens_file, a = "fp64,prefill,owner", b = "fp32,prefill,owner";
  std::string act_quant = "off";
  std::size_t max = 20;
};

int run_explain(const ExplainArgs& args) {
  auto ids = load_tokens(args.tokens, args.tokens_file);
  auto sa = parse_spec(args.a, "--a");
  auto sb = parse_spec(args.b, "--b");
  for (const Status* st : {&ids.status(), &sa.status(), &sb.status()})
    if (!st->is_ok()) {
      log::error("explain: {}", st->message());
      return kExitUsage;
    }
  const bool aq = args.act_quant == "on";
  auto ra = run_spec(args.model, *sa, aq, *ids);
  auto rb = ra ? run_spec(args.model, *sb, aq, *ids) : Result<RunOut>(ra.status());
  if (!ra || !rb) {
    log::error("explain: {}", (!ra ? ra.status() : rb.status()).message());
    return kExitInvalid;
  }
  const int64_t V = ra->vocab;
  double worst = 0;
  int64_t first_diff = -1, first_argmax = -1, agree = 0;
  const int64_t T = int64_t(ids->size());
  for (int64_t t = 0; t < T; ++t) {
    double num = 0, den = 0;
    int64_t am = 0, bm = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double x = ra->logits[std::size_t(t * V + v)], y = rb->logits[std::size_t(t * V + v)];
      num = std::max(num, std::fabs(x - y));
      den = std::max(den, std::fabs(x));
      if (x > ra->logits[std::size_t(t * V + am)]) am = v;
      if (y > rb->logits[std::size_t(t * V + bm)]) bm = v;
    }
    worst = std::max(worst, den > 0 ? num / den : num);
    if (num > 0 && first_diff < 0) first_diff = t;
    if (am != bm && first_argmax < 0) first_argmax = t;
    agree += am == bm;
  }
  nlohmann::ordered_json j;
  j["a"] = sa->text();
  j["b"] = sb->text();
  j["act_quant"] = args.act_quant;
  j["tokens"] = T;
  j["logits"] = {{"max_relative_error", worst},
                 {"first_differing_position", first_diff},
                 {"first_argmax_difference", first_argmax},
                 {"argmax_agreement", double(agree) / double(T)}};
  nlohmann::ordered_json divs = nlohmann::ordered_json::array();
  for (const Divergence& d : compare_traces(ra->trace, rb->trace, args.max))
    divs.push_back({{"position", d.pos},
                    {"layer", d.layer},
                    {"site", std::string(trace_site_name(d.site))},
                    {"sub", d.sub},
                    {"what", d.what},
                    {"margin_a", d.margin_a},
                    {"margin_b", d.margin_b}});
  j["decisions_compared"] = {{"a", ra->trace.size()}, {"b", rb->trace.size()}};
  j["first_divergences"] = divs;
  std::printf("%s\n", j.dump(2).c_str());
  return kExitOk;
}

}  // namespace

void add_explain(CLI::App& app, Runner* run) {
  auto a = std::make_shared<ExplainArgs>();
  CLI::App* sub = app.add_subcommand("explain",
                                     "Flip report: run the reference under two settings and list "
                                     "the first fake-quant roundings (and, with --act-quant on, "
                                     "E4M3 activation roundings), indexer "
                                     "top-k sets, candidate pools and expert selections that "
                                     "differ, with each run's distance from the "
                                     "decision boundary (JSON).");
  sub->add_option("--model", a->model, "Checkpoint directory (official layout)")->required();
  auto* tok = sub->add_option("--tokens", a->tokens, "Token ids, comma separated");
  auto* file = sub->add_option("--tokens-file", a->tokens_file, "File of token ids");
  tok->excludes(file);
  sub->add_option("--a", a->a,
                  "Run A: comma list of fp32|fp64, prefill|decode|chunked:N, owner|vendor")
      ->capture_default_str();
  sub->add_option("--b", a->b, "Run B, same form")->capture_default_str();
  sub->add_option("--act-quant", a->act_quant,
                  "Both runs: on = DeepSeek's E4M3 rounding of every FP8/FP4 linear's input (each "
                  "rounding is traced, site act-quant-e4m3), off = model-faithful")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->add_option("--max", a->max, "How many divergences to list")->capture_default_str();
  sub->callback([a, run, tok, file] {
    *run = [a, tok, file] {
      if (tok->count() == 0 && file->count() == 0) {
        log::error("explain: one of --tokens or --tokens-file is required");
        return kExitUsage;
      }
      return run_explain(*a);
    };
  });
}

}  // namespace dsv41::cli
