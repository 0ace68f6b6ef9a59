// `dsv41 logits`: teacher-forced logits for a token sequence (design.md §4), from the reference
// forward in fp32 or fp64, in prefill, decode or chunked mode, optionally dumping every layer's
// residual stream so a divergence can be located. The prompt is given as ids (IMG standing for an
// --image) or as a chat request body (--messages: the server's chat encoding, its image parts'
// data: URLs in place of --image).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/dspark_logits.h"
#include "cli/fast_logits.h"
#include "cli/fast_model_dir.h"
#include "cli/float_file.h"
#include "cli/messages_file.h"
#include "cli/prompt_images.h"
#include "cli/token_args.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "model/fast/converted_weights.h"
#include "model/fast/fast_vision.h"
#include "model/reference/reference_model.h"
#include "server/image_inputs.h"
#include "text/special_tokens.h"

namespace dsv41::cli {
namespace {

namespace fs = std::filesystem;

struct LogitsArgs {
  std::string model, tokens, tokens_file, out, path = "reference", mode = "prefill",
                                               index_keys = "owner";
  std::string precision = "fp32", dump_dir;
  std::vector<std::string> images;  // one per IMG placeholder of the tokens
  std::string messages;             // a chat request body instead of --tokens and --image
  bool stream = false;
  bool dspark = false;
  int64_t dspark_prefill = 16;
  FastLogitsArgs fast;  // --path fast
};

double peak_rss_mb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // kilobytes on Linux
}

// --messages: the ids of the chat's V4.1 encoding (the server's: the same parser and encoder),
// each image part's placeholder as IMG, and the parts' files from their data: URLs (the server's
// reader; an http(s) or file:// URL would need the server's flags, which this command has not:
// refused naming the part). The placeholder is the tokenizer's, as the engine takes it.
Status messages_prompt(const LogitsArgs& a, std::vector<int32_t>& ids,
                       std::vector<ImageInput>& images) {
  auto file = read_messages_file(a.messages);
  if (!file) return file.status();
  auto tok = model_tokenizer(a.model);
  if (!tok) return tok.status();
  ids = (*tok)->encode(file->prompt);
  const int32_t placeholder = (*tok)->token_id(tokens::kImage);
  if (placeholder < 0 && !file->image_urls.empty())
    return Status::error(a.messages + ": " + file->image_params[0] +
                         ": the model's tokenizer has " + "no image placeholder " + tokens::kImage +
                         " (a text-only model)");
  std::size_t holes = 0;
  for (int32_t& id : ids)
    if (placeholder >= 0 && id == placeholder) id = kImagePlaceholder, ++holes;
  if (holes != file->image_urls.size())
    return Status::error(a.messages + ": messages: the text holds the image placeholder " +
                         tokens::kImage + " " + std::to_string(holes) + " time(s) for " +
                         std::to_string(file->image_urls.size()) +
                         " image part(s): a placeholder typed as text has no image to fill it");
  for (std::size_t i = 0; i < file->image_urls.size(); ++i) {
    const std::string where = a.messages + ": " + file->image_params[i];
    auto bytes = read_data_url(file->image_urls[i], kMaxImageBytes);
    if (!bytes)
      return Status::error(where + ": " + bytes.status().message() +
                           " (logits --messages reads no URLs or files: give the image as a data: "
                           "URL, or its file with --tokens ... IMG ... --image FILE)");
    images.push_back({where, {}, std::move(*bytes)});
  }
  return Status::ok();
}

template <typename T>
int run_reference(const LogitsArgs& a, const std::vector<int32_t>& ids,
                  const std::vector<ImageInput>& images, int64_t chunk) {
  ReferenceOptions opt;
  opt.index_keys =
      a.index_keys == "vendor" ? IndexKeySemantics::kVendor : IndexKeySemantics::kOwner;
  opt.streaming = a.stream;
  opt.act_quant = a.fast.act_quant == "on";
  const auto t0 = std::chrono::steady_clock::now();
  auto model = ReferenceModel<T>::load(a.model, opt);
  if (!model) {
    log::error("logits: {}", model.status().message());
    return kExitInvalid;
  }
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Images: each IMG placeholder becomes its span, the tower's rows computed in T; the spans
  // all go into the first call (DeepSeek merges images in the forward at position 0 only).
  auto prompt = expand_prompt_images<T>(a.model, ids, images);
  if (!prompt) {
    log::error("logits: {}", prompt.status().message());
    return kExitInvalid;
  }
  if (a.mode == "prefill") chunk = int64_t(prompt->ids.size());  // IMG counted one before
  int64_t first_min = 0;
  for (const auto& img : prompt->images) first_min = img.start + img.span();
  std::vector<T> logits;
  std::vector<std::vector<T>> dump;
  const auto t1 = std::chrono::steady_clock::now();
  bool first = true;
  for (const auto& part : split_calls(prompt->ids, chunk, first_min)) {
    Status st = (*model)->forward(part, first ? prompt->images : std::vector<PromptImage<T>>{},
                                  &logits, a.dump_dir.empty() ? nullptr : &dump);
    first = false;
    if (!st.is_ok()) {
      log::error("logits: --tokens: {}", st.message());
      return kExitInvalid;
    }
  }
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const bool f64 = ends_with_f64(a.out);
  if (Status st = write_floats(a.out, logits, f64); !st.is_ok()) {
    log::error("logits: --out: {}", st.message());
    return kExitInvalid;
  }
  if (!a.dump_dir.empty()) {
    std::error_code ec;
    fs::create_directories(a.dump_dir, ec);
    const bool d64 = sizeof(T) == 8;
    for (std::size_t l = 0; l < dump.size(); ++l) {
      char name[64];
      std::snprintf(name, sizeof name, "layer_%03zu.%s", l, d64 ? "f64" : "f32");
      if (Status st = write_floats((fs::path(a.dump_dir) / name).string(), dump[l], d64);
          !st.is_ok()) {
        log::error("logits: --dump-layers: {}", st.message());
        return kExitInvalid;
      }
    }
  }
  const int64_t V = (*model)->config().text.vocab_size;
  int64_t argmax = 0;
  for (int64_t v = 1; v < V; ++v)
    if (logits[logits.size() - std::size_t(V) + std::size_t(v)] >
        logits[logits.size() - std::size_t(V) + std::size_t(argmax)])
      argmax = v;
  nlohmann::ordered_json j = {{"out", a.out},
                              {"tokens", prompt->ids.size()},
                              {"vocab", V},
                              {"dtype", f64 ? "float64" : "float32"},
                              {"path", a.path},
                              {"mode", a.mode},
                              {"precision", a.precision},
                              {"index_keys", a.index_keys},
                              {"act_quant", a.fast.act_quant},
                              {"streaming", a.stream},
                              {"peak_rss_mb", peak_rss_mb()},
                              {"load_seconds", load_s},
                              {"run_seconds", run_s},
                              {"last_argmax", argmax}};
  if (!a.dump_dir.empty()) j["dump_layers"] = a.dump_dir;
  for (std::size_t i = 0; i < prompt->images.size(); ++i) {
    const ImagePlan& pl = prompt->plans[i];
    j["images"].push_back({{"span_start", prompt->images[i].start},
                           {"span", prompt->images[i].span()},
                           {"llm_w", pl.llm_w},
                           {"llm_h", pl.llm_h},
                           {"width", pl.width},
                           {"height", pl.height}});
  }
  std::printf("%s\n", j.dump().c_str());
  return kExitOk;
}

int run_logits(const LogitsArgs& a) {
  Result<std::vector<int32_t>> ids = std::vector<int32_t>();
  std::vector<ImageInput> images = image_files(a.images);
  if (!a.messages.empty()) {
    if (Status st = messages_prompt(a, *ids, images); !st) {
      log::error("logits: --messages: {}", st.message());
      return kExitInvalid;
    }
  } else {
    ids = load_tokens(a.tokens, a.tokens_file, !a.images.empty());
    if (!ids) {
      log::error("logits: {}", ids.status().message());
      return kExitUsage;
    }
  }
  if (a.path != "fast" || a.dspark) {
    if (Status st = one_process_only(a.dspark ? "logits --dspark" : "logits --path reference");
        !st) {
      log::error("logits: {}", st.message());
      return kExitUsage;
    }
  }
  if (!images.empty() && a.dspark) {
    log::error(
        "logits: images (--image, or --messages' image parts) and --dspark do not go together "
        "(the drafter never sees images)");
    return kExitUsage;
  }
  if (a.dspark) {
    if (a.mode != "prefill" || a.stream || !a.dump_dir.empty() || a.fast.companions > 0 ||
        (a.path == "fast" && a.precision != "fp32")) {
      log::error(
          "logits: --dspark runs its own schedule (prefill of --dspark-prefill tokens, then "
          "one-token decodes): no --mode, --stream, --dump-layers or --companions; --path fast "
          "computes in fp32");
      return kExitUsage;
    }
    DsparkLogitsArgs d;
    d.model = a.model;
    d.out = a.out;
    d.precision = a.precision;
    d.index_keys = a.index_keys;
    d.act_quant = a.fast.act_quant;
    d.prefill = a.dspark_prefill;
    d.path = a.path;
    d.converted = a.fast.converted_dir;
    d.threads = a.fast.threads;
    d.kv_cache_gb = a.fast.kv_cache_gb;
    return run_dspark_logits(d, ids.value());
  }
  auto chunk = chunk_size(a.mode, int64_t(ids->size()));
  if (!chunk) {
    log::error("logits: {}", chunk.status().message());
    return kExitUsage;
  }
  if (a.path == "fast") {
    if (a.precision != "fp32" || a.stream || !a.dump_dir.empty()) {
      log::error("logits: --path fast computes in fp32 and has no --stream or --dump-layers");
      return kExitUsage;
    }
    FastLogitsArgs f = a.fast;
    f.model = a.model;
    f.out = a.out;
    f.mode = a.mode;
    f.index_keys = a.index_keys;
    if (images.empty()) return run_fast_logits(f, ids.value(), chunk.value());
    // The images' rows from the fast tower (the converted layout; converted first if need be).
    auto dir = ensure_converted(a.model, a.fast.converted_dir);
    if (!dir) {
      log::error("logits: --model: {}", dir.status().message());
      return kExitInvalid;
    }
    f.model = *dir;
    auto wts = ConvertedWeights::open(*dir, false);
    if (!wts) {
      log::error("logits: --model: {}", wts.status().message());
      return kExitInvalid;
    }
    ThreadPool pool(std::size_t(a.fast.threads));
    auto tower = FastVisionTower::create(**wts, pool);
    if (!tower) {
      log::error("logits: --image: {}", tower.status().message());
      return kExitInvalid;
    }
    auto prompt = expand_prompt_images<float>(
        (*wts)->config(), ids.value(), images, [&](const PlannedImage& p) {
          return (*tower)->encode(p.patches, p.plan.vit_w, p.plan.vit_h).aligned;
        });
    if (!prompt) {
      log::error("logits: {}", prompt.status().message());
      return kExitInvalid;
    }
    std::vector<SliceImage> slices;
    for (auto& im : prompt->images)
      slices.push_back({int32_t(im.start), int32_t(im.llm_w), int32_t(im.llm_h),
                        std::make_shared<const std::vector<float>>(std::move(im.rows))});
    const int64_t n = int64_t(prompt->ids.size());
    return run_fast_logits(f, prompt->ids, a.mode == "prefill" ? n : chunk.value(), slices);
  }
  if (a.fast.companions > 0) {
    log::error("logits: --companions needs --path fast");
    return kExitUsage;
  }
  return a.precision == "fp64" ? run_reference<double>(a, ids.value(), images, chunk.value())
                               : run_reference<float>(a, ids.value(), images, chunk.value());
}

}  // namespace

void add_logits(CLI::App& app, Runner* run) {
  auto a = std::make_shared<LogitsArgs>();
  CLI::App* sub = app.add_subcommand(
      "logits",
      "Teacher-forced logits for a token sequence: writes little-endian float32 [T, vocab] "
      "(float64 when --out ends "
      "in .f64), row t = next-token logits after tokens[0..t]; prints one JSON summary line.");
  sub->add_option("--model", a->model,
                  "Checkpoint directory (official layout; --path fast also takes a converted one)")
      ->required();
  auto* tok = sub->add_option("--tokens", a->tokens, "Token ids, comma separated");
  auto* file = sub->add_option("--tokens-file", a->tokens_file,
                               "File of token ids (whitespace or comma separated)");
  tok->excludes(file);
  auto* msgs = sub->add_option(
      "--messages", a->messages,
      "A chat completions request body (JSON: messages, tools, chat_template_kwargs, thinking, "
      "reasoning_effort) instead of --tokens: the prompt is its V4.1 chat encoding (the server's, "
      "as tokenize --messages prints it), each image_url part (a data: URL) expanded into its "
      "image's span as --image does");
  sub->add_option("--out", a->out, "Output file (LOGITS.f32 or LOGITS.f64)")->required();
  auto* img = sub->add_option(
      "--image", a->images,
      "An image (PNG, JPEG, WebP, GIF) for each IMG among the tokens, in order "
      "(repeat the option): IMG becomes the image's span (spec 9.1: image_token_id "
      "at each of its llm_h * (llm_w + 1) + 2 positions) filled by the reference "
      "tower at --precision (--path fast: the fast tower); the first call holds every "
      "span. The JSON line lists each span's start and size");
  sub->add_option("--path", a->path, "reference | fast")
      ->check(CLI::IsMember({"reference", "fast"}))
      ->capture_default_str();
  sub->add_option("--mode", a->mode, "prefill | decode | chunked:N")->capture_default_str();
  sub->add_option("--index-keys", a->index_keys,
                  "owner (spec intent) | vendor (DeepSeek's decode quirk, spec 5.6.7)")
      ->check(CLI::IsMember({"owner", "vendor"}))
      ->capture_default_str();
  sub->add_option("--precision", a->precision, "fp32 | fp64 (arithmetic of the reference)")
      ->check(CLI::IsMember({"fp32", "fp64"}))
      ->capture_default_str();
  sub->add_flag(
      "--stream", a->stream,
      "Stream weights: drop each layer's pages after use, so at most one layer stays resident");
  sub->add_option(
      "--dump-layers", a->dump_dir,
      "Write each layer's output residual stream to DIR/layer_NNN.f32|f64 ([T, hc_mult, hidden])");
  sub->add_option("--decoder-replay", a->fast.decoder_replay,
                  "fast path: on = decoder replay (spec §10.3, an approximation): a chunk longer "
                  "than sliding_window + --replay-margin runs the layers from the split layer on "
                  "only for its last window + margin tokens; the other rows get no logits (NaN "
                  "rows in --out)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->add_option("--prefill-attention", a->fast.prefill_attention,
                  "fast path: on = a run of consecutive positions through ops' banded prefill "
                  "attention (the same bits as off, the one-query kernel per token)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  add_replay_margin_option(sub, &a->fast.replay_margin);
  sub->add_option("--act-quant", a->fast.act_quant,
                  "on = DeepSeek's inference numerics (E4M3 per 32 before every "
                  "FP8/FP4 linear), off = model-faithful as the reference")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->add_flag("--dspark", a->dspark,
                "The DSpark drafter instead (design.md 9): OUT = its logits [steps, block, vocab] "
                "after the Markov bias, OUT-stem.ids.i32 = chain ids [steps, block+1], "
                "OUT-stem.confidence.EXT = [steps, block], OUT-stem.target.EXT = the target's "
                "logits [T-1, vocab]; steps = T-1-P");
  sub->add_option("--dspark-prefill", a->dspark_prefill,
                  "--dspark: P, the tokens the target prefills before its one-token decodes "
                  "(1 <= P <= T-2)")
      ->capture_default_str();
  sub->add_option("--companions", a->fast.companions,
                  "fast path: run the sequence among N random companion sequences (the output "
                  "must equal the solo run byte for byte)")
      ->check(CLI::Range(0, 1000));
  sub->add_option("--companion-seed", a->fast.companion_seed, "Seed of the companions")
      ->capture_default_str();
  add_split_options(sub, &a->fast.tp, &a->fast.ep, &a->fast.rank_timeout_s);
  sub->add_option("--threads", a->fast.threads, "fast path: threads (0: every core)")
      ->check(CLI::Range(0, 4096));
  sub->add_option("--kv-cache-gb", a->fast.kv_cache_gb,
                  "fast path: KV pool size in GB (0: a quarter of available memory)")
      ->check(CLI::Range(0.0, 1e6));
  sub->add_option("--converted", a->fast.converted_dir,
                  "fast path, official-layout --model: where its one-time conversion goes "
                  "(default: DIR.dsv41-converted beside it)");
  msgs->excludes(tok)->excludes(file)->excludes(img);
  sub->callback([a, run, tok, file, msgs] {
    *run = [a, tok, file, msgs] {
      if (tok->count() == 0 && file->count() == 0 && msgs->count() == 0) {
        log::error("logits: one of --tokens, --tokens-file or --messages is required");
        return kExitUsage;
      }
      return run_logits(*a);
    };
  });
}

}  // namespace dsv41::cli
