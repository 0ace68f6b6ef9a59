// Conversion driver: plan, resume from the journal, write data files in parallel, then the
// manifest.
#include "model/convert/converter.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/dtypes.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/sha256.h"
#include "model/config.h"
#include "model/convert/converted_layout.h"
#include "model/convert/manifest.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
constexpr std::size_t kChunk = 8u << 20;
constexpr const char* kJournal = "convert.journal";

// Buffered output of one data file: tracks the offset, hashes each tensor.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {}
  ~FileWriter() {
    if (f_) std::fclose(f_);
  }
  bool ok() const { return f_ != nullptr && !failed_; }
  uint64_t offset() const { return offset_; }
  void pad_to(uint64_t align) {
    static const char zeros[kTensorAlignment] = {};
    const uint64_t pad = (align - offset_ % align) % align;
    write_raw(zeros, pad);
  }
  void begin_tensor() { sha_ = std::make_unique<Sha256>(); }
  void write(const void* p, std::size_t n) {
    sha_->update(p, n);
    write_raw(p, n);
  }
  std::string end_tensor() { return sha_->hex(); }
  Status close() {
    if (!f_) return Status::error(path_ + ": cannot create");
    const bool flush_ok = std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
    const bool close_ok = std::fclose(f_) == 0;
    f_ = nullptr;
    if (failed_ || !flush_ok || !close_ok)
      return Status::error(path_ + ": write failed (disk full?)");
    return Status::ok();
  }

 private:
  void write_raw(const void* p, std::size_t n) {
    if (!f_ || failed_ || n == 0) return;
    if (std::fwrite(p, 1, n, f_) != n) failed_ = true;
    offset_ += n;
  }
  std::string path_;
  FILE* f_;
  bool failed_ = false;
  uint64_t offset_ = 0;
  std::unique_ptr<Sha256> sha_;
};

// -0 (sign bit only) nibbles become +0: the only value change of the conversion, and exact.
inline uint8_t canonical_fp4_byte(uint8_t b) {
  if ((b & 0x0F) == 0x08) b &= 0xF0;
  if ((b & 0xF0) == 0x80) b &= 0x0F;
  return b;
}

class Producer {
 public:
  Producer(const Checkpoint& ck, FileWriter& w) : ck_(ck), w_(w) { buf_.reserve(kChunk); }

  void run(const OutTensor& t, std::atomic<uint64_t>& done) {
    switch (t.kind) {
      case OutKind::kCopy:
        copy_rows(t.src, 0, ck_.bytes(t.src).size(), false, done);
        break;
      case OutKind::kMxfp4Canonical:
        copy_rows(t.src, 0, ck_.bytes(t.src).size(), true, done);
        break;
      case OutKind::kEngramBucket: {
        const uint64_t row = t.bytes() / static_cast<uint64_t>(t.shape[0]);
        copy_rows(t.src, static_cast<uint64_t>(t.row_begin) * row, t.bytes(), false, done);
        break;
      }
      case OutKind::kW13Weight:
      case OutKind::kW13Scale:
        interleave(t, done);
        break;
      case OutKind::kFp8ToBf16:
        dequantize(t, done);
        break;
    }
  }

 private:
  void flush(std::atomic<uint64_t>& done) {
    w_.write(buf_.data(), buf_.size());
    done.fetch_add(buf_.size());
    buf_.clear();
  }
  // Bytes [begin, begin + n) of a source tensor, in chunks, dropping source pages behind.
  void copy_rows(const std::string& src, uint64_t begin, uint64_t n, bool canonical,
                 std::atomic<uint64_t>& done) {
    auto bytes = ck_.bytes(src);
    for (uint64_t off = 0; off < n; off += kChunk) {
      const std::size_t len = static_cast<std::size_t>(std::min<uint64_t>(kChunk, n - off));
      const uint8_t* p = bytes.data() + begin + off;
      if (canonical) {
        buf_.resize(len);
        for (std::size_t i = 0; i < len; ++i) buf_[i] = canonical_fp4_byte(p[i]);
      } else {
        buf_.assign(p, p + len);
      }
      flush(done);
      ck_.release_bytes(src, p, len);
    }
  }
  void interleave(const OutTensor& t, std::atomic<uint64_t>& done) {
    auto a = ck_.bytes(t.src), b = ck_.bytes(t.src2);
    const auto rows = static_cast<std::size_t>(t.shape[0] / 2);
    const std::size_t row = a.size() / rows;
    const bool canonical = t.kind == OutKind::kW13Weight;
    for (std::size_t r = 0; r < rows; ++r) {
      for (const auto& s : {a, b}) {
        const uint8_t* p = s.data() + r * row;
        if (canonical) {
          for (std::size_t i = 0; i < row; ++i) buf_.push_back(canonical_fp4_byte(p[i]));
        } else {
          buf_.insert(buf_.end(), p, p + row);
        }
      }
      if (buf_.size() >= kChunk) flush(done);
    }
    flush(done);
    ck_.release(t.src);
    ck_.release(t.src2);
  }
  void dequantize(const OutTensor& t, std::atomic<uint64_t>& done) {
    auto w = ck_.bytes(t.src), s = ck_.bytes(t.src2);
    const auto out = static_cast<std::size_t>(t.shape[0]),
               in = static_cast<std::size_t>(t.shape[1]);
    const std::size_t sin = (in + 31) / 32;
    for (std::size_t o = 0; o < out; ++o) {
      for (std::size_t i = 0; i < in; ++i) {
        const double v = static_cast<double>(e4m3_to_float(w[o * in + i])) *
                         e8m0_to_double(s[(o / 32) * sin + i / 32]);
        const uint16_t h = float_to_bf16(static_cast<float>(v));
        buf_.push_back(static_cast<uint8_t>(h & 0xFF));
        buf_.push_back(static_cast<uint8_t>(h >> 8));
      }
      if (buf_.size() >= kChunk) flush(done);
    }
    flush(done);
    ck_.release(t.src);
  }

  const Checkpoint& ck_;
  FileWriter& w_;
  std::vector<uint8_t> buf_;
};

// One journal line: a finished data file and its manifest entries.
json journal_entry(const std::string& file, uint64_t bytes,
                   const std::vector<ManifestTensor>& entries) {
  json e = {{"file", file}, {"bytes", bytes}, {"tensors", json::array()}};
  for (const auto& m : entries)
    e["tensors"].push_back({{"name", m.name},
                            {"dtype", std::string(dtype_name(m.dtype))},
                            {"shape", m.shape},
                            {"offset", m.offset},
                            {"bytes", m.bytes},
                            {"sha256", m.sha256},
                            {"layout", m.layout}});
  return e;
}

json identity_json(const SourceIdentity& id, bool bf16) {
  return {{"config_sha256", id.config_sha256},
          {"index_sha256", id.index_sha256},
          {"tokenizer_sha256", id.tokenizer_sha256},
          {"tensors", id.tensors},
          {"bytes", id.bytes},
          {"fp8", bf16 ? "bf16" : "e4m3"},
          {"converter", kConverterVersion}};
}

// Files finished by an earlier run of the same conversion: name -> its manifest entries.
std::map<std::string, std::vector<ManifestTensor>> read_journal(const fs::path& path,
                                                                const json& identity) {
  std::map<std::string, std::vector<ManifestTensor>> done;
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return done;
  json head = json::parse(line, nullptr, false);
  if (head.is_discarded() || head != identity)
    return done;  // another source or options: start over
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("file")) break;  // a torn last line: ignore it
    std::vector<ManifestTensor> entries;
    for (const auto& t : j["tensors"]) {
      ManifestTensor m;
      m.name = t["name"];
      m.dtype = *parse_dtype(t["dtype"].get<std::string>());
      m.shape = t["shape"].get<std::vector<int64_t>>();
      m.file = j["file"];
      m.offset = t["offset"];
      m.bytes = t["bytes"];
      m.sha256 = t["sha256"];
      m.layout = t["layout"];
      entries.push_back(std::move(m));
    }
    const fs::path data = path.parent_path() / j["file"].get<std::string>();
    std::error_code ec;
    if (fs::exists(data, ec) && fs::file_size(data, ec) == j["bytes"].get<uint64_t>())
      done[j["file"]] = std::move(entries);
  }
  return done;
}

}  // namespace

Result<ConvertResult> convert_checkpoint(const ConvertOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  auto ck = Checkpoint::open(opt.from);
  if (!ck) return ck.status();
  auto cfg = load_config((fs::path(opt.from) / "config.json").string());
  if (!cfg) return cfg.status();
  auto id = source_identity(opt.from, ck->tensor_names().size(), ck->total_bytes());
  if (!id) return id.status();
  std::vector<SourceTensor> source;
  for (const auto& name : ck->tensor_names()) {
    const auto* e = ck->find(name);
    source.push_back({name, e->info->dtype, e->info->shape});
  }
  auto plan = plan_conversion(source, cfg->text, opt.fp8_to_bf16);
  if (!plan) return Status::error(opt.from + ": " + plan.status().message());

  std::error_code ec;
  fs::create_directories(opt.to, ec);
  if (ec) return Status::error(opt.to + ": cannot create: " + ec.message());
  const fs::path out(opt.to);
  fs::remove(out / "manifest.json", ec);  // whatever was there is not complete until we say so
  const json identity = identity_json(*id, opt.fp8_to_bf16);
  auto done_files = read_journal(out / kJournal, identity);
  {
    // Rewrite the journal with the surviving entries (drops a torn tail or a foreign run).
    std::ofstream j(out / kJournal, std::ios::trunc);
    j << identity.dump() << "\n";
    for (const auto& [file, entries] : done_files) {
      json e = journal_entry(file, fs::file_size(out / file), entries);
      j << e.dump() << "\n";
    }
    if (!j.good()) return Status::error((out / kJournal).string() + ": cannot write");
  }
  for (const char* small :
       {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
    if (!fs::exists(fs::path(opt.from) / small)) continue;
    fs::copy_file(fs::path(opt.from) / small, out / small, fs::copy_options::overwrite_existing,
                  ec);
    if (ec) return Status::error((out / small).string() + ": " + ec.message());
  }

  uint64_t total = 0, resumed_bytes = 0;
  for (const auto& f : *plan) {
    total += f.payload_bytes();
    if (done_files.count(f.name)) resumed_bytes += f.payload_bytes();
  }
  std::atomic<uint64_t> written{resumed_bytes};
  std::atomic<std::size_t> next{0}, files_done{done_files.size()};
  std::mutex mu;  // journal, results, progress, first error
  Status first_error;
  std::map<std::string, std::vector<ManifestTensor>> results = done_files;
  std::map<std::string, uint64_t> file_sizes;
  for (const auto& [file, entries] : done_files) file_sizes[file] = fs::file_size(out / file);
  auto last_log = std::chrono::steady_clock::now();
  if (!done_files.empty())
    log::info("convert: resuming: {} of {} files already done ({:.2f} GB)", done_files.size(),
              plan->size(), static_cast<double>(resumed_bytes) / 1e9);

  auto worker = [&] {
    for (;;) {
      const std::size_t k = next.fetch_add(1);
      if (k >= plan->size()) return;
      const OutFile& f = (*plan)[k];
      if (done_files.count(f.name)) continue;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error.is_ok()) return;
      }
      const fs::path partial = out / (f.name + ".partial");
      FileWriter w(partial.string());
      Producer prod(*ck, w);
      std::vector<ManifestTensor> entries;
      for (const OutTensor& t : f.tensors) {
        w.pad_to(kTensorAlignment);
        ManifestTensor m{t.name, t.dtype, t.shape, f.name, w.offset(), t.bytes(), "", t.layout()};
        w.begin_tensor();
        prod.run(t, written);
        m.sha256 = w.end_tensor();
        entries.push_back(std::move(m));
      }
      const uint64_t size = w.offset();
      Status st = w.close();
      if (st.is_ok()) {
        fs::rename(partial, out / f.name, ec);
        if (ec) st = Status::error((out / f.name).string() + ": " + ec.message());
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!st.is_ok()) {
        if (first_error.is_ok()) first_error = st;
        return;
      }
      json e = journal_entry(f.name, size, entries);
      std::ofstream j(out / kJournal, std::ios::app);
      j << e.dump() << "\n";
      j.flush();
      results[f.name] = std::move(entries);
      file_sizes[f.name] = size;
      const std::size_t n = ++files_done;
      const auto now = std::chrono::steady_clock::now();
      if (now - last_log > std::chrono::seconds(2) || n == plan->size()) {
        last_log = now;
        const double secs = std::chrono::duration<double>(now - t0).count();
        const double gb = static_cast<double>(written.load()) / 1e9;
        const double rate =
            static_cast<double>(written.load() - resumed_bytes) / 1e6 / std::max(secs, 1e-3);
        const double eta = rate > 0 ? static_cast<double>(total - written.load()) / 1e6 / rate : 0;
        log::info("convert: files {}/{}, {:.2f}/{:.2f} GB, {:.0f} MB/s, ETA {:.0f} s", n,
                  plan->size(), gb, static_cast<double>(total) / 1e9, rate, eta);
      }
    }
  };
  std::size_t threads =
      opt.threads ? opt.threads : std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, plan->size());
  std::vector<std::thread> pool;
  for (std::size_t i = 0; i < threads; ++i) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (!first_error.is_ok()) return first_error;

  Manifest m;
  m.fp8 = opt.fp8_to_bf16 ? "bf16" : "e4m3";
  m.source = *id;
  for (auto& [file, entries] : results)
    for (auto& e : entries) m.tensors.push_back(std::move(e));
  std::sort(m.tensors.begin(), m.tensors.end(),
            [](const ManifestTensor& a, const ManifestTensor& b) { return a.name < b.name; });
  for (const auto& [file, size] : file_sizes) m.files.push_back({file, size});
  const fs::path tmp = out / "manifest.json.tmp";
  {
    std::ofstream mf(tmp, std::ios::trunc);
    mf << manifest_to_json(m);
    mf.flush();
    if (!mf.good()) return Status::error(tmp.string() + ": cannot write");
  }
  fs::rename(tmp, out / "manifest.json", ec);
  if (ec) return Status::error((out / "manifest.json").string() + ": " + ec.message());
  fs::remove(out / kJournal, ec);

  ConvertResult r;
  r.tensors = m.tensors.size();
  r.files = m.files.size();
  r.files_resumed = done_files.size();
  r.bytes = total;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace dsv41
