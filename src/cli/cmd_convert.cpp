// `dsv41 convert` (official -> engine layout, model/convert/converter.h) and `dsv41 validate` (the
// independent check, model/validate/validator.h).
#include <nlohmann/json.hpp>

#include <algorithm>

#include "cli/commands.h"
#include "core/log.h"
#include "model/convert/converter.h"
#include "model/validate/validator.h"

namespace dsv41::cli {

void add_convert(CLI::App& app, Runner* run) {
  auto opt = std::make_shared<ConvertOptions>();
  auto fp8 = std::make_shared<std::string>("e4m3");
  CLI::App* sub = app.add_subcommand(
      "convert",
      "Convert an official checkpoint to the engine layout (docs/convert.md): experts with w1/w3 "
      "rows "
      "interleaved and -0 nibbles made +0, FP8 kept (or exact bf16), Engram tables split into hash "
      "buckets, everything else copied; manifest.json with every tensor's sha256. Streaming, "
      "multi-threaded, resumable: rerun after an interruption to finish.");
  sub->add_option("--from", opt->from, "Official checkpoint directory")->required();
  sub->add_option("--to", opt->to, "Output directory")->required();
  sub->add_option("--fp8", *fp8,
                  "FP8 linears: e4m3 (kept with their scales) or bf16 (exact, twice the bytes)")
      ->capture_default_str()
      ->check(CLI::IsMember({"e4m3", "bf16"}));
  sub->add_option("--threads", opt->threads, "Worker threads (0 = all cores)")
      ->capture_default_str();
  sub->callback([opt, fp8, run] {
    *run = [opt, fp8] {
      opt->fp8_to_bf16 = *fp8 == "bf16";
      auto r = convert_checkpoint(*opt);
      if (!r) {
        log::error("convert: {}", r.status().message());
        return kExitInvalid;
      }
      const nlohmann::json j = {{"to", opt->to},     {"tensors", r->tensors},
                                {"files", r->files}, {"files_resumed", r->files_resumed},
                                {"bytes", r->bytes}, {"seconds", r->seconds}};
      std::printf("%s\n", j.dump().c_str());
      return kExitOk;
    };
  });
}

namespace {

// Most checked tensors differ: the conversion holds another checkpoint's weights (a source of the
// same shape passes the manifest's identity check, which covers config, index, tokenizer, tensor
// count and bytes, not the weights themselves). "Most" is more than half: a damaged conversion
// (a flipped byte, a truncated file) differs in a few tensors, a foreign one in nearly all.
bool not_made_from_source(const ValidateReport& r) {
  return r.tensors_checked > 0 && 2 * r.tensors_differing > r.tensors_checked;
}

// Mismatch lines go to stderr. For a conversion of another checkpoint, one line first says so;
// then, unless `all`, kExamples mismatches and a count of the rest instead of thousands of lines
// on the release.
void print_mismatches(const ValidateReport& r, bool other_source, bool all) {
  constexpr std::size_t kExamples = 5;
  const bool brief = other_source && !all;
  if (other_source)
    std::fprintf(stderr,
                 "mismatch: the conversion was not made from --from: %zu of %zu tensors differ "
                 "(same config, index and tokenizer; other weights)\n",
                 r.tensors_differing, r.tensors_checked);
  const std::size_t shown = brief ? std::min(kExamples, r.mismatches.size()) : r.mismatches.size();
  for (std::size_t i = 0; i < shown; ++i)
    std::fprintf(stderr, "mismatch: %s\n", r.mismatches[i].c_str());
  if (shown < r.mismatches.size())
    std::fprintf(stderr, "validate: %zu more mismatches not shown (--verbose lists them all)\n",
                 r.mismatches.size() - shown);
}

}  // namespace

void add_validate(CLI::App& app, Runner* run) {
  auto opt = std::make_shared<ValidateOptions>();
  CLI::App* sub = app.add_subcommand(
      "validate",
      "Check a conversion independently of the converter: every output tensor re-derived from the "
      "source and compared as numbers (exactly), every sha256 checked. Exit 0 only with 0 "
      "mismatches.");
  sub->add_option("--from", opt->from, "Official checkpoint directory")->required();
  sub->add_option("--to", opt->to, "Converted directory")->required();
  sub->add_option("--scope", opt->scope, "all | dense | layer:N")->capture_default_str();
  auto verbose = std::make_shared<bool>(false);
  sub->add_flag("--verbose", *verbose,
                "List every mismatch even when most tensors differ (by default that case prints "
                "one line saying the conversion was not made from --from, a few examples and a "
                "count)");
  sub->callback([opt, verbose, run] {
    *run = [opt, verbose] {
      auto r = validate_conversion(*opt);
      if (!r) {
        log::error("validate: {}", r.status().message());
        return kExitInvalid;
      }
      const bool other_source = not_made_from_source(*r);
      print_mismatches(*r, other_source, *verbose);
      const nlohmann::json j = {{"to", opt->to},
                                {"scope", opt->scope},
                                {"tensors_checked", r->tensors_checked},
                                {"tensors_differing", r->tensors_differing},
                                {"not_made_from_source", other_source},
                                {"bytes_checked", r->bytes_checked},
                                {"mismatches", r->mismatches.size()},
                                {"seconds", r->seconds}};
      std::printf("%s\n", j.dump().c_str());
      return r->mismatches.empty() ? kExitOk : kExitInvalid;
    };
  });
}

}  // namespace dsv41::cli
