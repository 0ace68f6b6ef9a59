// Mapping a converted checkpoint's data files and indexing its tensors, and making a process's
// share of them resident at load, on transparent huge pages where it can (see
// converted_weights.h).
#include "model/fast/converted_weights.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "core/load_progress.h"
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

namespace {

// Runs job(i) for i in [0, n) on `threads` threads while the caller logs `what` every 2 s from
// the bytes done (job returns the bytes it did).
template <typename Job>
void run_logged(std::size_t n, std::size_t threads, uint64_t total, const char* what, Job job) {
  std::atomic<std::size_t> next{0}, finished{0};
  std::atomic<uint64_t> done{0};
  auto worker = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < n;) {
      done.fetch_add(job(i), std::memory_order_relaxed);
      finished.fetch_add(1);
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < std::max<std::size_t>(1, threads); ++t) pool.emplace_back(worker);
  double last = 0;
  while (finished.load() < n) {  // progress every 2 s until the workers are through
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    set_load_progress(std::string("loading weights: ") + what,
                      total ? double(done.load()) / double(total) : -1.0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s - last >= 2.0) {
      last = s;
      log::info("loading weights: {:.2f}/{:.2f} GB {} ({:.0f} MB/s)", double(done) / 1e9,
                double(total) / 1e9, what, double(done) / 1e6 / s);
    }
  }
  for (auto& t : pool) t.join();
}

}  // namespace

int64_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (f >> key >> kb) {
    if (key == "MemAvailable:") return kb * 1024;
    f.ignore(1 << 10, '\n');
  }
  return -1;
}

// The ranges' whole 2 MB pages, merged per file where they touch or leave less than a huge page
// between them (that gap is copied too: the same bytes), cut into pieces of at most 64 MB on
// 2 MB boundaries for the threads.
std::vector<std::pair<const MappedFile*, ConvertedWeights::Range>> ConvertedWeights::huge_pieces(
    const std::vector<Range>& ranges) const {
  constexpr uint64_t kHuge = MappedFile::kHugePage, kPiece = 32 * kHuge;
  std::vector<std::pair<const MappedFile*, Range>> in;
  for (const Range& r : ranges) {
    for (const auto& f : files_)
      if (r.second > 0 && r.first >= f->data() && r.first + r.second <= f->data() + f->size()) {
        in.push_back({f.get(), r});
        break;
      }
  }
  std::sort(in.begin(), in.end(), [](const auto& a, const auto& b) {
    return std::less<const uint8_t*>()(a.second.first, b.second.first);
  });
  std::vector<std::pair<const MappedFile*, Range>> merged;
  for (const auto& [f, r] : in) {
    if (!merged.empty() && merged.back().first == f) {
      Range& m = merged.back().second;
      const uint8_t* end = m.first + m.second;
      if (r.first <= end + kHuge) {
        m.second = std::max<uint64_t>(m.second, uint64_t(r.first + r.second - m.first));
        continue;
      }
    }
    merged.push_back({f, r});
  }
  std::vector<std::pair<const MappedFile*, Range>> pieces;
  for (const auto& [f, r] : merged) {
    const uint8_t* p = r.first;
    const uint8_t* end = r.first + r.second;
    while (p < end) {
      const auto next_cut = (uintptr_t(p) / kPiece + 1) * kPiece;  // a 2 MB multiple
      const uint8_t* q = std::min(end, reinterpret_cast<const uint8_t*>(next_cut));
      pieces.push_back({f, {p, uint64_t(q - p)}});
      p = q;
    }
  }
  return pieces;
}

ConvertedWeights::Warmed ConvertedWeights::warm(const std::vector<Range>& todo, std::size_t threads,
                                                bool huge_pages) const {
  Warmed out;
  for (const Range& r : todo) out.touched += r.second;
  const Status thp = huge_pages ? transparent_huge_pages_available() : Status::ok();
  if (!thp.is_ok()) log::info("weights stay file-mapped on 4 KB pages: {}", thp.message());
  if (huge_pages && thp.is_ok()) {
    const auto pieces = huge_pieces(todo);
    uint64_t total = 0;
    for (const auto& p : pieces) total += p.second.second;
    // MemAvailable as this process sees it: ranks of one mpirun job on the same host each see it
    // before the others copy (docs/parallel.md: --huge-pages off there when memory is tight).
    const int64_t avail = mem_available_bytes(), margin = int64_t(1) << 30;
    if (avail >= 0 && int64_t(total) + margin > avail) {
      log::warn(
          "weights stay file-mapped on 4 KB pages: copying {:.2f} GB onto huge pages would leave "
          "less than 1 GB of MemAvailable ({:.2f} GB); --huge-pages off skips the copy silently",
          double(total) / 1e9, double(avail) / 1e9);
    } else {
      std::vector<Status> errs(pieces.size(), Status::ok());
      std::vector<uint64_t> moved(pieces.size(), 0);
      run_logged(pieces.size(), threads, total, "copied onto huge pages", [&](std::size_t i) {
        const auto& [f, r] = pieces[i];
        auto n = f->make_resident_huge(r.first, r.second);
        if (!n)
          errs[i] = n.status();
        else
          moved[i] = *n;
        return r.second;
      });
      // A piece that failed maps its file again (make_resident_huge): slower, not wrong.
      std::size_t failed = 0;
      for (const Status& e : errs)
        if (!e.is_ok() && failed++ == 0)
          log::warn("weights: a range stays on 4 KB pages: {}", e.message());
      if (failed > 1) log::warn("weights: {} ranges in all stay on 4 KB pages", failed);
      for (uint64_t m : moved) out.huge += m;
    }
  }
  std::atomic<uint64_t> sink{0};
  run_logged(todo.size(), threads, out.touched, "resident", [&](std::size_t i) {
    const Range& s = todo[i];
    uint64_t local = 0;
    for (uint64_t off = 0; off < s.second; off += 4096) local += s.first[off];
    sink.fetch_add(local, std::memory_order_relaxed);
    return s.second;
  });
  return out;
}

}  // namespace dsv41
