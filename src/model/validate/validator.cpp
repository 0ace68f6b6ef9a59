// Independent conversion validator. Rules re-derived here from the design (design.md §5), on
// purpose without the converter's code: expected output names from source names, and value-level
// comparison.
#include "model/validate/validator.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "core/dtypes.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/mapped_file.h"
#include "io/sha256.h"
#include "model/config.h"
#include "model/convert/manifest.h"
#include "model/engram_layout.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;

bool has_suffix(const std::string& s, const std::string& x) {
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}
std::string drop_suffix(const std::string& s, std::size_t n) {
  return s.substr(0, s.size() - n);
}

// Decoded values as float bits, tabulated once (the validator decodes every element of the model).
struct Tables {
  uint32_t e8m0[256], e4m3[256];
  float e8m0_value[256];
  Tables() {
    for (int i = 0; i < 256; ++i) {
      const float a = e8m0_to_float(static_cast<uint8_t>(i)),
                  b = e4m3_to_float(static_cast<uint8_t>(i));
      std::memcpy(&e8m0[i], &a, 4);
      std::memcpy(&e4m3[i], &b, 4);
      e8m0_value[i] = a;
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}
uint32_t float_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}
// Float bits of an FP4 value times its scale; with `canonical`, -0 counts as +0.
inline uint32_t fp4_value_bits(uint8_t nibble, float scale, bool canonical) {
  float v = e2m1_to_float(nibble) * scale;
  if (canonical && v == 0.0f) v = 0.0f;
  return float_bits(v);
}

struct Ctx {
  const Checkpoint& src;
  std::map<std::string, std::span<const uint8_t>> out;  // output tensor bytes by name
  const ModelConfig& cfg;
  std::string fp8;
  std::vector<EngramLayerLayout> engram;  // hash geometry, computed once (prime search)
};

// Compares FP4 rows of `out` (with scales `out_scale`) against rows of a source tensor; `map_row`
// gives, for an output row, the source weight/scale row (same width).
std::string compare_fp4(
    std::span<const uint8_t> out, std::span<const uint8_t> out_scale, std::size_t rows,
    const std::function<std::pair<const uint8_t*, const uint8_t*>(std::size_t)>& src_row) {
  const std::size_t row_bytes = out.size() / rows, srow = out_scale.size() / rows;
  for (std::size_t r = 0; r < rows; ++r) {
    auto [sw, ss] = src_row(r);
    const uint8_t* ow = out.data() + r * row_bytes;
    const uint8_t* os = out_scale.data() + r * srow;
    for (std::size_t i = 0; i < row_bytes * 2; ++i) {
      const uint8_t on = (ow[i / 2] >> (4 * (i % 2))) & 15, sn = (sw[i / 2] >> (4 * (i % 2))) & 15;
      // The output must hold +0 where the source held -0: compare canonical source with raw output.
      const auto& tb = tables();
      if (fp4_value_bits(on, tb.e8m0_value[os[i / 32]], false) !=
          fp4_value_bits(sn, tb.e8m0_value[ss[i / 32]], true))
        return fmt::format("value differs at row {}, element {}", r, i);
    }
  }
  return "";
}

// Drops the resident pages of the source tensors a check read, so validating a model keeps its RSS
// bounded (the page cache still serves a tensor read twice, e.g. by an Engram bucket's neighbours).
struct SourceReleaser {
  const Checkpoint& src;
  std::vector<std::string> names;
  ~SourceReleaser() {
    for (const auto& n : names) src.release(n);
  }
};

std::string check_tensor(const Ctx& c, const ManifestTensor& t, std::span<const uint8_t> bytes) {
  const std::string& n = t.name;
  SourceReleaser releaser{c.src, {}};
  auto src = [&](const std::string& name) -> std::span<const uint8_t> {
    if (!c.src.find(name)) return {};
    releaser.names.push_back(name);
    return c.src.bytes(name);
  };
  const bool expert = n.find(".ffn.experts.") != std::string::npos;
  if (expert && has_suffix(n, ".w13.weight")) {
    const std::string base = drop_suffix(n, 11);
    auto w1 = src(base + ".w1.weight"), w3 = src(base + ".w3.weight");
    auto s1 = src(base + ".w1.scale"), s3 = src(base + ".w3.scale");
    auto os = c.out.count(base + ".w13.scale") ? c.out.at(base + ".w13.scale")
                                               : std::span<const uint8_t>();
    if (w1.empty() || w3.empty() || s1.empty() || s3.empty() || os.empty())
      return "a source or scale tensor is missing";
    if (bytes.size() != w1.size() + w3.size()) return "size differs from w1 + w3";
    const std::size_t rows = static_cast<std::size_t>(t.shape[0]);
    const std::size_t wr = w1.size() / (rows / 2), sr = s1.size() / (rows / 2);
    return compare_fp4(bytes, os, rows, [&](std::size_t r) {
      const auto& w = r % 2 ? w3 : w1;
      const auto& s = r % 2 ? s3 : s1;
      return std::make_pair(w.data() + (r / 2) * wr, s.data() + (r / 2) * sr);
    });
  }
  if (expert && has_suffix(n, ".w13.scale")) {
    const std::string base = drop_suffix(n, 10);
    auto s1 = src(base + ".w1.scale"), s3 = src(base + ".w3.scale");
    if (s1.empty() || s3.empty() || bytes.size() != s1.size() + s3.size())
      return "source scales missing or sizes differ";
    const std::size_t rows = static_cast<std::size_t>(t.shape[0]), row = bytes.size() / rows;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t i = 0; i < row; ++i) {
        const uint8_t sv = (r % 2 ? s3 : s1)[(r / 2) * row + i];
        if (tables().e8m0[bytes[r * row + i]] != tables().e8m0[sv])
          return fmt::format("scale differs at row {}, column {}", r, i);
      }
    return "";
  }
  if (expert && has_suffix(n, ".w2.weight")) {
    const std::string base = drop_suffix(n, 7);
    auto w = src(n), s = src(base + ".scale");
    auto os = c.out.count(base + ".scale") ? c.out.at(base + ".scale") : std::span<const uint8_t>();
    if (w.size() != bytes.size() || s.empty() || os.empty())
      return "source/scale missing or size differs";
    const std::size_t rows = static_cast<std::size_t>(t.shape[0]), wr = w.size() / rows,
                      sr = s.size() / rows;
    return compare_fp4(bytes, os, rows, [&](std::size_t r) {
      return std::make_pair(w.data() + r * wr, s.data() + r * sr);
    });
  }
  if (n.find(".engram.embed.bucket.") != std::string::npos) {
    // name: P.engram.embed.bucket.C.(weight|scale)
    const std::size_t b = n.find(".engram.embed.bucket.");
    const std::string prefix = n.substr(0, b);
    const std::size_t cpos = b + std::strlen(".engram.embed.bucket.");
    const std::size_t column = std::stoul(n.substr(cpos, n.find('.', cpos) - cpos));
    const bool weight = has_suffix(n, ".weight");
    const int64_t layer = std::stoll(prefix.substr(prefix.find('.') + 1));
    for (const auto& lay : c.engram) {
      if (lay.layer != layer) continue;
      if (column >= lay.primes.size()) return "no such hash column";
      auto s = src(prefix + ".engram.embed." + (weight ? "weight" : "scale"));
      const std::size_t row = bytes.size() / static_cast<std::size_t>(lay.primes[column]);
      if (s.size() < (static_cast<std::size_t>(lay.offsets[column]) +
                      static_cast<std::size_t>(lay.primes[column])) *
                         row)
        return "source table too small";
      const uint8_t* sp = s.data() + static_cast<std::size_t>(lay.offsets[column]) * row;
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        const uint32_t a = weight ? tables().e4m3[bytes[i]] : tables().e8m0[bytes[i]];
        const uint32_t e = weight ? tables().e4m3[sp[i]] : tables().e8m0[sp[i]];
        if (a != e) return fmt::format("value differs at element {}", i);
      }
      return "";
    }
    return "layer has no Engram table in the config";
  }
  if (c.fp8 == "bf16" && t.dtype == DType::kBF16 && has_suffix(n, ".weight") && c.src.find(n) &&
      c.src.find(n)->info->dtype == DType::kF8_E4M3) {
    auto w = src(n), s = src(drop_suffix(n, 7) + ".scale");
    const std::size_t out = static_cast<std::size_t>(t.shape[0]),
                      in = static_cast<std::size_t>(t.shape[1]);
    if (w.size() != out * in || s.empty()) return "source weight/scale missing or size differs";
    const std::size_t sin = (in + 31) / 32;
    for (std::size_t o = 0; o < out; ++o)
      for (std::size_t i = 0; i < in; ++i) {
        const double expected = static_cast<double>(e4m3_to_float(w[o * in + i])) *
                                std::ldexp(1.0, static_cast<int>(s[(o / 32) * sin + i / 32]) - 127);
        const uint16_t h =
            static_cast<uint16_t>(bytes[2 * (o * in + i)] | (bytes[2 * (o * in + i) + 1] << 8));
        const double got = static_cast<double>(bf16_to_float(h));
        if (!(got == expected || (std::isnan(got) && std::isnan(expected))))
          return fmt::format("bf16 value {} differs from e4m3 x scale {} at [{}, {}]", got,
                             expected, o, i);
      }
    return "";
  }
  // Everything else is a byte-for-byte copy.
  auto s = src(n);
  const auto* e = c.src.find(n);
  if (!e) return "no source tensor of this name";
  if (e->info->dtype != t.dtype || e->info->shape != t.shape)
    return "dtype or shape differs from the source";
  if (s.size() != bytes.size() || std::memcmp(s.data(), bytes.data(), s.size()) != 0) {
    for (std::size_t i = 0; i < std::min(s.size(), bytes.size()); ++i)
      if (s[i] != bytes[i]) return fmt::format("byte {} differs from the source", i);
    return "size differs from the source";
  }
  return "";
}

// Output names implied by the source names (this validator's own reading of design.md §5).
std::set<std::string> expected_names(const Checkpoint& src, const ModelConfig& cfg, bool bf16) {
  std::set<std::string> out;
  const auto engram = engram_layouts(cfg.text);
  for (const auto& n : src.tensor_names()) {
    const bool expert = n.find(".ffn.experts.") != std::string::npos;
    if (expert && (has_suffix(n, ".w1.weight") || has_suffix(n, ".w1.scale"))) {
      out.insert(drop_suffix(n, has_suffix(n, ".weight") ? 10 : 9) +
                 (has_suffix(n, ".weight") ? ".w13.weight" : ".w13.scale"));
    } else if (expert && (has_suffix(n, ".w3.weight") || has_suffix(n, ".w3.scale"))) {
      // folded into w13
    } else if (has_suffix(n, ".engram.embed.weight") || has_suffix(n, ".engram.embed.scale")) {
      const std::string prefix = n.substr(0, n.find(".engram.embed."));
      const int64_t layer = std::stoll(prefix.substr(prefix.find('.') + 1));
      for (const auto& lay : engram)
        if (lay.layer == layer)
          for (std::size_t c = 0; c < lay.primes.size(); ++c)
            out.insert(fmt::format("{}.engram.embed.bucket.{}.{}", prefix, c,
                                   has_suffix(n, ".weight") ? "weight" : "scale"));
    } else if (bf16 && !expert && has_suffix(n, ".scale") &&
               src.find(drop_suffix(n, 6) + ".weight") &&
               src.find(drop_suffix(n, 6) + ".weight")->info->dtype == DType::kF8_E4M3) {
      // folded into the bf16 weight
    } else {
      out.insert(n);
    }
  }
  return out;
}

std::string describe(const SourceIdentity& id) {
  return fmt::format("{} tensors, {} bytes, config.json sha256 {}", id.tensors, id.bytes,
                     id.config_sha256.substr(0, 12));
}

// Progress on stderr as convert prints it: every 2 s and once at the end.
class Progress {
 public:
  explicit Progress(std::chrono::steady_clock::time_point t0) : t0_(t0), last_(t0) {}
  void add_total(uint64_t bytes) {
    ++tensors_;
    bytes_ += bytes;
  }
  void done(uint64_t bytes) {
    const uint64_t b = (done_bytes_ += bytes);
    const std::size_t n = ++done_;
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (n != tensors_ && now - last_ < std::chrono::seconds(2)) return;
    last_ = now;
    const double secs = std::max(std::chrono::duration<double>(now - t0_).count(), 1e-3);
    const double rate = static_cast<double>(b) / 1e6 / secs;
    log::info("validate: tensors {}/{}, {:.2f}/{:.2f} GB, {:.0f} MB/s, ETA {:.0f} s", n, tensors_,
              static_cast<double>(b) / 1e9, static_cast<double>(bytes_) / 1e9, rate,
              rate > 0 ? static_cast<double>(bytes_ - b) / 1e6 / rate : 0.0);
  }

 private:
  std::chrono::steady_clock::time_point t0_, last_;
  std::size_t tensors_ = 0;
  uint64_t bytes_ = 0;
  std::atomic<std::size_t> done_{0};
  std::atomic<uint64_t> done_bytes_{0};
  std::mutex mu_;
};

bool in_scope(const std::string& name, const std::string& scope) {
  if (scope == "all") return true;
  if (scope == "dense")
    return name.find(".ffn.experts.") == std::string::npos &&
           name.find(".engram.embed.bucket.") == std::string::npos;
  const std::string layer = "layers." + scope.substr(6) + ".";
  return name.rfind(layer, 0) == 0;
}

}  // namespace

Result<ValidateReport> validate_conversion(const ValidateOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.scope != "all" && opt.scope != "dense" &&
      !(opt.scope.rfind("layer:", 0) == 0 && opt.scope.size() > 6 &&
        opt.scope.find_first_not_of("0123456789", 6) == std::string::npos))
    return Status::error("--scope: '" + opt.scope + "' is not all, dense or layer:N");
  auto ck = Checkpoint::open(opt.from);
  if (!ck) return ck.status();
  auto cfg = load_config((fs::path(opt.from) / "config.json").string());
  if (!cfg) return cfg.status();
  auto manifest = read_manifest(opt.to);
  if (!manifest) return manifest.status();
  ValidateReport rep;
  auto id = source_identity(opt.from, ck->tensor_names().size(), ck->total_bytes());
  if (!id) return id.status();
  if (!(*id == manifest->source)) {
    // A conversion of another checkpoint: comparing its tensors would only repeat that, once per
    // tensor.
    rep.mismatches.push_back(fmt::format(
        "manifest.json: source identity differs from --from: the conversion was made from another "
        "checkpoint ({}; --from has {}); tensors not compared",
        describe(manifest->source), describe(*id)));
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return rep;
  }

  // Names: exactly the expected set.
  const auto expected = expected_names(*ck, *cfg, manifest->fp8 == "bf16");
  std::set<std::string> present;
  for (const auto& t : manifest->tensors) present.insert(t.name);
  for (const auto& n : expected)
    if (!present.count(n) && in_scope(n, opt.scope))
      rep.mismatches.push_back(n + ": missing from the conversion");
  for (const auto& n : present)
    if (!expected.count(n) && in_scope(n, opt.scope))
      rep.mismatches.push_back(n + ": not expected from the source");

  // Data files: exact sizes, then map them.
  std::map<std::string, std::shared_ptr<MappedFile>> files;
  for (const auto& f : manifest->files) {
    const fs::path p = fs::path(opt.to) / f.name;
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec || size != f.bytes) {
      rep.mismatches.push_back(fmt::format("{}: file size {} differs from the manifest's {}",
                                           f.name, ec ? 0 : size, f.bytes));
      continue;
    }
    auto m = MappedFile::open(p.string());
    if (!m) {
      rep.mismatches.push_back(f.name + ": " + m.status().message());
      continue;
    }
    files[f.name] = std::move(*m);
  }
  Ctx ctx{*ck, {}, *cfg, manifest->fp8, engram_layouts(cfg->text)};
  for (const auto& t : manifest->tensors) {
    auto it = files.find(t.file);
    if (it == files.end() || t.offset + t.bytes > it->second->size()) continue;
    ctx.out[t.name] = std::span<const uint8_t>(it->second->data() + t.offset, t.bytes);
  }
  // Tensors are independent: check them in parallel, report in manifest order.
  std::vector<std::string> why(manifest->tensors.size());
  std::vector<char> checked(manifest->tensors.size(), 0);
  std::atomic<std::size_t> next{0};
  Progress progress(t0);
  for (const auto& t : manifest->tensors)
    if (in_scope(t.name, opt.scope)) progress.add_total(t.bytes);
  auto worker = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < manifest->tensors.size();) {
      const auto& t = manifest->tensors[i];
      if (!in_scope(t.name, opt.scope)) continue;
      auto b = ctx.out.find(t.name);
      if (b == ctx.out.end()) {
        why[i] = "its bytes are not in " + t.file;
      } else {
        checked[i] = 1;
        if (sha256_hex(b->second.data(), b->second.size()) != t.sha256) {
          why[i] = "sha256 of the bytes differs from the manifest";
        } else {
          why[i] = check_tensor(ctx, t, b->second);
        }
        files.at(t.file)->release(b->second.data(),
                                  b->second.size());  // keep RSS bounded on big outputs
      }
      progress.done(t.bytes);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned k = 0; k < std::max(1u, std::thread::hardware_concurrency()); ++k)
    pool.emplace_back(worker);
  for (auto& th : pool) th.join();
  for (std::size_t i = 0; i < why.size(); ++i) {
    if (!why[i].empty()) rep.mismatches.push_back(manifest->tensors[i].name + ": " + why[i]);
    if (checked[i]) {
      ++rep.tensors_checked;
      rep.tensors_differing += !why[i].empty();
      rep.bytes_checked += manifest->tensors[i].bytes;
    }
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace dsv41
