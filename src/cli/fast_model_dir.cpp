// ensure_converted (see fast_model_dir.h).
#include "cli/fast_model_dir.h"

#include <filesystem>

#include "core/cpu_set.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "model/convert/converted_checkpoint.h"
#include "model/convert/converter.h"
#include "model/convert/manifest.h"
#include "model/fast/fast_model.h"
#include "parallel/world.h"

namespace dsv41::cli {

namespace {
Result<std::string> ensure_converted_here(const std::string& model_dir,
                                          const std::string& converted_dir);
}  // namespace

// Under mpirun, rank 0 converts first; the others then find the conversion (same host) or make
// their own (another host), never two at once into the same files.
Result<std::string> ensure_converted(const std::string& model_dir,
                                     const std::string& converted_dir) {
  return parallel::World::get().rank0_first(
      [&] { return ensure_converted_here(model_dir, converted_dir); });
}

namespace {
Result<std::string> ensure_converted_here(const std::string& model_dir,
                                          const std::string& converted_dir) {
  namespace fs = std::filesystem;
  if (is_converted_checkpoint(model_dir)) return model_dir;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec))
    return Status::error(model_dir +
                         (fs::exists(model_dir, ec) ? ": not a directory" : ": no such directory"));
  std::string to = converted_dir;
  if (to.empty()) {
    std::string base = fs::path(model_dir).lexically_normal().string();
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    to = base + ".dsv41-converted";
  }
  if (fs::exists(fs::path(to) / "manifest.json")) {
    // Only a conversion of this very checkpoint is reused (the manifest records its source).
    auto man = read_manifest(to);
    if (!man) return man.status();
    auto ck = Checkpoint::open(model_dir);
    if (!ck) return ck.status();
    auto id = source_identity(model_dir, ck->tensor_names().size(), ck->total_bytes());
    if (!id) return id.status();
    if (!(man->source == *id))
      return Status::error(to + " holds a conversion of another checkpoint than " + model_dir +
                           " (its manifest's source identity differs); remove it or name another "
                           "directory with --converted");
    log::info("{} is in the official layout; using its conversion in {}", model_dir, to);
    return to;
  }
  log::info(
      "{} is in the official layout; converting it once into {} (the fast path reads the "
      "engine layout)",
      model_dir, to);
  ConvertOptions o;
  o.from = model_dir;
  o.to = to;
  auto r = convert_checkpoint(o);
  if (!r) return r.status().with_context("converting " + model_dir + " into " + to + ": ");
  log::info("converted {} tensors ({:.2f} GB) in {:.1f} s", r->tensors, double(r->bytes) / 1e9,
            r->seconds);
  return to;
}
}  // namespace

void add_path_options(CLI::App* sub, PathArgs* a) {
  sub->add_option("--path", a->path,
                  "fast (the engine; an official-layout --model is converted once beside it) | "
                  "reference (the plain oracle, slow)")
      ->check(CLI::IsMember({"fast", "reference"}))
      ->capture_default_str();
  sub->add_option("--converted", a->converted,
                  "fast path: where an official-layout model's conversion goes (default: "
                  "DIR.dsv41-converted beside it)");
  sub->add_option("--threads", a->threads,
                  "fast path: compute threads (0: one per physical core of the CPUs the process "
                  "may use: its affinity mask, as taskset or mpirun --bind-to set it, or "
                  "--cpu-list; SMT siblings are left out)")
      ->check(CLI::Range(0, 4096));
  sub->add_option("--cpu-list", a->cpu_list,
                  "fast path: pin the process to these CPUs (\"0-3,8\"; within its affinity "
                  "mask) before its threads start; the chosen CPUs are logged at load")
      ->capture_default_str();
  sub->add_option("--kv-cache-gb", a->kv_cache_gb,
                  "fast path: KV pool size in GB (0: a quarter of available memory)")
      ->check(CLI::Range(0.0, 1e6));
  sub->add_option("--act-quant", a->act_quant,
                  "fast path: on = DeepSeek's inference numerics (E4M3 per 32 before every "
                  "FP8/FP4 linear), off = model-faithful")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->add_option(
         "--huge-pages", a->huge_pages,
         "fast path: on = copy the weights this process reads onto transparent huge pages at "
         "load (fewer TLB misses: one-token decode several times faster; the copy is "
         "anonymous memory, no longer shared with the page cache; skipped with a "
         "message when the kernel has THP off or memory is short) | off = read them "
         "through the file mapping")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->add_option("--isolation-check", a->isolation,
                  "fast path: every KV row read checks its tag (sequence, epoch, position): count "
                  "foreign reads (metrics: dsv41_kv_foreign_reads_total), mask them too, or off")
      ->check(CLI::IsMember({"count", "mask", "off"}))
      ->capture_default_str();
  sub->add_option("--prefix-cache", a->prefix_cache,
                  "fast path: keep full KV blocks of finished prompts for later requests with the "
                  "same leading tokens (and cache_salt); exact, evicted when the pool is needed")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->add_option("--speculative", a->speculative,
                  "dspark: the checkpoint's DSpark drafter proposes tokens that one step verifies "
                  "(greedy output identical, sampled output the same distribution), drafting "
                  "only while a request's measured acceptance pays for it | off")
      ->check(CLI::IsMember({"dspark", "off"}))
      ->capture_default_str();
  add_spec_probe_option(sub, &a->spec_probe);
  sub->add_option("--decoder-replay", a->decoder_replay,
                  "fast path: on = decoder replay (spec §10.3, an approximation; "
                  "docs/decoder_replay.md): a prompt chunk longer than the window + "
                  "--replay-margin tokens runs the decoder layers only on its last window + margin "
                  "tokens | off (the full stack)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  add_replay_margin_option(sub, &a->replay_margin);
  add_split_options(sub, &a->tp, &a->ep, &a->rank_timeout_s);
}

void add_spec_probe_option(CLI::App* sub, std::string* probe) {
  sub->add_option(
         "--spec-probe", *probe,
         "with speculative decoding: how a request that stopped drafting probes the drafter "
         "again: shadow = draft, decode plainly and compare the chain with the tokens "
         "that follow (the acceptance a verify would see, at the drafter's cost only) | "
         "verify = verify the probe's drafts (docs/dspark.md)")
      ->check(CLI::IsMember({"shadow", "verify"}))
      ->capture_default_str();
}

void add_replay_margin_option(CLI::App* sub, std::string* margin) {
  sub->add_option("--replay-margin", *margin,
                  "fast path, --decoder-replay on: tokens replayed beyond the window, or exact = "
                  "(decoder layers - 1) x (window - 1): a chunk's last row and every later token "
                  "are then bit for bit the full stack's (docs/decoder_replay.md)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "exact") return "";
            try {
              std::size_t used = 0;
              const long long n = std::stoll(v, &used);
              if (used == v.size() && n >= 0 && n <= (1ll << 20)) return "";
            } catch (const std::exception&) {
            }
            return "'" + v + "' is neither 'exact' nor an integer in [0, 1048576]";
          },
          "N|exact"))
      ->capture_default_str();
}

int64_t replay_margin_value(const std::string& margin) {
  return margin == "exact" ? FastOptions::kReplayMarginExact : std::stoll(margin);
}

void add_split_options(CLI::App* sub, int* tp, int* ep, double* timeout_s) {
  sub->add_option("--tp", *tp,
                  "fast path under mpirun: split attention (whole output groups of heads) over "
                  "this many ranks (default 1; docs/parallel.md)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--ep", *ep,
                  "fast path under mpirun: split the routed experts over this many ranks "
                  "(default: every rank); the larger of --tp/--ep is the number of ranks")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--rank-timeout", *timeout_s,
                  "fast path under mpirun: seconds a rank waits for the others inside a step "
                  "before the model is declared failed (/health 503, serve exits 3)")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
}

Status one_process_only(const std::string& what) {
  const int n = parallel::World::get().size();
  if (n <= 1) return Status::ok();
  return Status::error(what + " runs in one process, not split over " + std::to_string(n) +
                       " mpirun ranks (the split forward is the fast path's: docs/parallel.md)");
}

Status apply_path_options(const PathArgs& a, const std::string& model_dir, EngineOptions* eo) {
  if (a.path == "reference") DSV41_RETURN_IF_ERROR(one_process_only("--path reference"));
  eo->path = a.path;
  eo->model_dir = model_dir;
  eo->speculative = a.speculative == "dspark";
  eo->speculative_shadow_probes = a.spec_probe == "shadow";
  if (a.path == "reference") {
    if (is_converted_checkpoint(model_dir))
      return Status::error(
          model_dir + " is a converted checkpoint; --path reference reads the official layout");
    return Status::ok();
  }
  auto dir = ensure_converted(model_dir, a.converted);
  if (!dir) return dir.status();
  eo->model_dir = *dir;
  eo->fast.threads = a.threads;
  if (!a.cpu_list.empty()) {
    auto cpus = parse_cpu_list(a.cpu_list);
    if (!cpus) return Status::error("--cpu-list: " + cpus.status().message());
    eo->fast.cpus = *cpus;
  }
  eo->fast.kv_cache_gb = a.kv_cache_gb;
  eo->fast.act_quant = a.act_quant == "on";
  eo->fast.huge_pages = a.huge_pages == "on";
  eo->fast.isolation = a.isolation;
  eo->fast.prefix_cache = a.prefix_cache == "on";
  eo->fast.decoder_replay = a.decoder_replay == "on";
  eo->fast.replay_margin = replay_margin_value(a.replay_margin);
  eo->fast.tp = a.tp;
  eo->fast.ep = a.ep;
  eo->fast.rank_timeout_s = a.rank_timeout_s;
  return Status::ok();
}

std::string model_error(const Status& st) {
  return st.message().starts_with("--") ? st.message() : "--model: " + st.message();
}

}  // namespace dsv41::cli
