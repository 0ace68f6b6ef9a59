// Mapping a converted checkpoint's data files and indexing its tensors (see converted_weights.h).
#include "model/fast/converted_weights.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include "core/log.h"

#include "model/convert/converted_checkpoint.h"

namespace dsv41 {

Result<std::unique_ptr<ConvertedWeights>> ConvertedWeights::open(const std::string& dir,
                                                                 bool verify) {
  namespace fs = std::filesystem;
  auto ck = open_converted_checkpoint(dir, verify);
  if (!ck) return ck.status();
  std::unique_ptr<ConvertedWeights> w(new ConvertedWeights());
  w->dir_ = dir;
  w->fp8_ = ck->manifest.fp8;
  w->config_ = ck->config;
  w->payload_bytes_ = ck->payload_bytes;
  std::map<std::string, const MappedFile*> by_name;
  for (const auto& f : ck->manifest.files) {
    auto mf = MappedFile::open((fs::path(dir) / f.name).string());
    if (!mf) return mf.status();
    by_name[f.name] = mf->get();
    w->files_.push_back(*mf);
  }
  for (const auto& t : ck->manifest.tensors) {
    const MappedFile* mf = by_name.at(t.file);  // the loader checked every file is listed
    if (t.offset + t.bytes > mf->size())
      return Status::error(t.name + ": beyond the end of " + t.file);
    w->spans_[t.name] =
        WeightSpan{mf->data() + t.offset, t.bytes, t.dtype, t.shape, t.layout == "fp8_to_bf16"};
  }
  return w;
}

const WeightSpan& ConvertedWeights::get(const std::string& name) const {
  auto it = spans_.find(name);
  DSV41_CHECK_MSG(it != spans_.end(), name.c_str());
  return it->second;
}

uint64_t ConvertedWeights::warm_ranges(const std::vector<Range>& todo, std::size_t threads) {
  uint64_t total = 0;
  for (const Range& r : todo) total += r.second;
  std::atomic<std::size_t> next{0};
  std::atomic<uint64_t> done{0}, sink{0};
  auto worker = [&] {
    uint64_t local = 0;
    for (std::size_t i; (i = next.fetch_add(1)) < todo.size();) {
      const Range& s = todo[i];
      for (uint64_t off = 0; off < s.second; off += 4096) local += s.first[off];
      done.fetch_add(s.second, std::memory_order_relaxed);
    }
    sink.fetch_add(local);
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < std::max<std::size_t>(1, threads); ++t) pool.emplace_back(worker);
  double last = 0;
  for (;;) {  // progress every 2 s until the workers are through
    const bool finished = next.load() >= todo.size() && done.load() >= total;
    if (finished) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s - last >= 2.0) {
      last = s;
      log::info("loading weights: {:.2f}/{:.2f} GB resident ({:.0f} MB/s)", double(done) / 1e9,
                double(total) / 1e9, double(done) / 1e6 / s);
    }
  }
  for (auto& t : pool) t.join();
  (void)sink.load();
  return total;
}

}  // namespace dsv41
