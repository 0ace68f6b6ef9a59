// Rank 0's LeadRunner, the followers' loop and the split loading (parallel/distributed_runner.h).
#include "parallel/distributed_runner.h"

#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>

#include "core/log.h"
#include "io/sha256.h"

#ifndef DSV41_VERSION
#define DSV41_VERSION "0.0.0"
#endif

namespace dsv41::parallel {
namespace {

constexpr double kStartupTimeoutSeconds = 7200;

enum class Op : uint32_t {
  kOpen = 1,
  kFree,
  kTruncate,
  kStep,
  kDraft,
  kAttach,
  kFill,
  kReport,
  kReplay,
  kPrefillAttention,
  kStop
};

// Commands as plain little-endian bytes (every rank runs the same binary on the same kind of CPU:
// the fingerprint check makes sure of the version).
struct Writer {
  std::vector<uint8_t>& b;
  void raw(const void* p, std::size_t n) {
    const std::size_t at = b.size();
    b.resize(at + n);
    if (n > 0) std::memcpy(b.data() + at, p, n);
  }
  template <typename T>
  void put(T v) {
    raw(&v, sizeof(T));
  }
  void ints(const std::vector<int32_t>& v) {
    put<uint64_t>(v.size());
    raw(v.data(), v.size() * sizeof(int32_t));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    raw(s.data(), s.size());
  }
};

struct Reader {
  const std::vector<uint8_t>& b;
  std::size_t at = 0;
  template <typename T>
  T get() {
    DSV41_CHECK(at + sizeof(T) <= b.size());
    T v;
    std::memcpy(&v, b.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  void ints(std::vector<int32_t>* v) {  // into v's storage (no allocation once it is large enough)
    const auto n = get<uint64_t>();
    DSV41_CHECK(at + n * sizeof(int32_t) <= b.size());
    v->resize(n);
    if (n > 0) std::memcpy(v->data(), b.data() + at, n * sizeof(int32_t));
    at += n * sizeof(int32_t);
  }
  void raw(void* p, std::size_t n) {
    DSV41_CHECK(at + n <= b.size());
    if (n > 0) std::memcpy(p, b.data() + at, n);
    at += n;
  }
  std::string str() {
    const auto n = get<uint64_t>();
    DSV41_CHECK(at + n <= b.size());
    std::string s(reinterpret_cast<const char*>(b.data() + at), n);
    at += n;
    return s;
  }
};

// Starts command `op` in buf (cleared; its capacity is kept, so steady decode does not allocate).
Writer command(std::vector<uint8_t>* buf, Op op) {
  buf->clear();
  Writer w{*buf};
  w.put<uint32_t>(uint32_t(op));
  return w;
}

// Into b's storage. A follower needs no logits and no taps (only rank 0's are used; the head and
// the taps change no state), so it asks for none.
void decode_step(Reader* r, StepBatch* b) {
  b->slices.resize(r->get<uint64_t>());
  for (SeqSlice& s : b->slices) {
    s.seq = r->get<uint64_t>();
    s.first_pos = r->get<int64_t>();
    r->ints(&s.tokens);
    r->ints(&s.logits_rows);
    r->ints(&s.taps);
    s.full_stack = r->get<uint8_t>() != 0;
    s.images.resize(r->get<uint64_t>());
    for (SliceImage& im : s.images) {
      im.start = r->get<int32_t>();
      im.llm_w = r->get<int32_t>();
      im.llm_h = r->get<int32_t>();
      auto rows = std::make_shared<std::vector<float>>(r->get<uint64_t>());
      r->raw(rows->data(), rows->size() * sizeof(float));
      im.rows = std::move(rows);
    }
    s.logits_rows.clear();
    s.taps.clear();
  }
}

// A "Key:   N kB" line of /proc/self/status (or of `file`).
int64_t status_kb(const char* key, const char* file = "/proc/self/status") {
  std::FILE* f = std::fopen(file, "r");
  if (!f) return 0;
  char line[256];
  int64_t v = 0;
  const std::size_t n = std::strlen(key);
  while (std::fgets(line, sizeof(line), f))
    if (std::strncmp(line, key, n) == 0) v = std::atoll(line + n);
  std::fclose(f);
  return v;
}

std::vector<uint8_t> report_bytes(const RankReport& r) {
  std::vector<uint8_t> b(sizeof(RankReport));
  std::memcpy(b.data(), &r, sizeof(RankReport));
  return b;
}

// A follower's state between commands (reused: a steady decode allocates nothing here).
struct Follower {
  FastModel& m;
  std::vector<uint8_t> buf;
  StepBatch batch;
  StepOutput out;
  std::vector<int32_t> tokens;
};

// Applies one command of rank 0 to this rank's model; false on kStop. Errors a command returns are
// rank 0's errors too (the ranks hold the same state), so they are not reported twice.
bool apply_command(Follower& f) {
  FastModel& m = f.m;
  Reader r{f.buf};
  const auto op = Op(r.get<uint32_t>());
  switch (op) {
    case Op::kOpen:
      (void)m.open(r.get<uint64_t>());
      return true;
    case Op::kFree:
      m.free(r.get<uint64_t>());
      return true;
    case Op::kTruncate: {
      const auto seq = r.get<uint64_t>();
      (void)m.truncate(seq, r.get<int64_t>());
      return true;
    }
    case Op::kStep:
      decode_step(&r, &f.batch);
      (void)m.step(f.batch, &f.out);
      return true;
    case Op::kDraft: {
      std::vector<DraftQuery> q(r.get<uint64_t>());
      for (auto& d : q) {
        d.seq = r.get<uint64_t>();
        d.next = r.get<int32_t>();
      }
      std::vector<DraftResult> out;
      (void)m.draft(q, &out);
      return true;
    }
    case Op::kAttach: {
      const auto seq = r.get<uint64_t>();
      r.ints(&f.tokens);
      (void)m.attach_cached_prefix(seq, f.tokens, r.str());
      return true;
    }
    case Op::kFill: {
      const auto seq = r.get<uint64_t>();
      const auto len = r.get<int64_t>();
      (void)m.fill_random_context(seq, len, r.get<uint64_t>());
      return true;
    }
    case Op::kReport:
      (void)World::get().allgather(report_bytes(own_report(m, World::get().rank())));
      return true;
    case Op::kReplay:
      (void)m.set_decoder_replay(r.get<uint8_t>() != 0);
      return true;
    case Op::kPrefillAttention:
      m.set_prefill_attention(r.get<uint8_t>() != 0);
      return true;
    case Op::kStop:
      return false;
  }
  DSV41_CHECK_MSG(false, "unknown command from rank 0");
  return false;
}

// Follows rank 0 until it stops; the process's exit code. Inside a step a follower waits longer
// than rank 0 does, so that when a rank fails, rank 0 is the one that notices, reports (/health
// 503, the failed requests) and ends the job; a follower gives up only if rank 0 itself is gone.
int follow(FastModel& m, World& w) {
  // Rank 0 decides when the job ends: a Ctrl-C or SIGTERM that mpirun passes to every rank leaves
  // the followers serving rank 0's steps while it drains (mpirun itself ends them a few seconds
  // later: docs/parallel.md says to signal rank 0 alone for a full drain).
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  w.set_timeout(2 * w.timeout() + 30);
  Follower f{m, {}, {}, {}, {}};
  try {
    for (;;) {
      w.broadcast(&f.buf, /*wait_forever=*/true);
      if (!apply_command(f)) return 0;
    }
  } catch (const std::exception& e) {
    log::error("rank {}: {}", w.rank(), e.what());
    return 3;
  }
}

}  // namespace

Status resolve_split(const World& w, SplitOptions* s) {
  const int n = w.size();
  if (s->tp < 0 || s->ep < 0) return Status::error("--tp/--ep: must be at least 1");
  if (s->tp == 0 && s->ep == 0) {
    s->tp = 1;
    s->ep = n;
  }
  if (s->tp == 0) s->tp = 1;
  if (s->ep == 0) s->ep = 1;
  if (std::max(s->tp, s->ep) != n || n % s->tp != 0 || n % s->ep != 0)
    return Status::error("--tp " + std::to_string(s->tp) + " --ep " + std::to_string(s->ep) +
                         ": the larger must equal the number of ranks (" + std::to_string(n) +
                         (w.mpi() ? "" : "; start more than one with mpirun -np N") +
                         ") and the smaller divide it");
  return Status::ok();
}

LeadRunner::LeadRunner(std::unique_ptr<FastModel> local, World& world)
    : local_(std::move(local)), world_(world) {}

LeadRunner::~LeadRunner() {
  if (failed_.load()) return;
  command(&cmd_, Op::kStop);
  send();
}

void LeadRunner::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(why_mu_);
    if (why_.empty()) why_ = why;
  }
  world_.mark_failed();
  if (!failed_.exchange(true)) log::error("rank 0: the split model failed: {}", why);
}

Status LeadRunner::health() const {
  if (!failed_.load()) return Status::ok();
  std::lock_guard<std::mutex> lock(why_mu_);
  return Status::error("model ranks: " + why_, ErrorKind::kUnavailable);
}

bool LeadRunner::send() {
  if (failed_.load()) return false;
  try {
    world_.broadcast(&cmd_);
    return true;
  } catch (const CollectiveFailure& e) {
    fail(e.what());
    return false;
  }
}

// Rank 0's own half of a command. Any exception there (a collective that timed out, or anything
// else thrown mid-step) leaves rank 0 out of step with the others, whose collectives it may never
// join: the model is failed for good.
template <typename Fn>
auto LeadRunner::guarded(Fn&& fn, decltype(fn()) on_failure) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    fail(e.what());
    return on_failure;
  }
}

Status LeadRunner::open(SeqId seq) {
  command(&cmd_, Op::kOpen).put<uint64_t>(seq);
  if (!send()) return health();
  return guarded([&] { return local_->open(seq); }, health_error());
}

void LeadRunner::free(SeqId seq) {
  command(&cmd_, Op::kFree).put<uint64_t>(seq);
  send();
  // Rank 0's own state stays consistent for the engine's bookkeeping, failed or not.
  guarded(
      [&] {
        local_->free(seq);
        return 0;
      },
      0);
}

Status LeadRunner::truncate(SeqId seq, int64_t length) {
  Writer w = command(&cmd_, Op::kTruncate);
  w.put<uint64_t>(seq);
  w.put<int64_t>(length);
  if (!send()) return health();
  return guarded([&] { return local_->truncate(seq, length); }, health_error());
}

Status LeadRunner::step(const StepBatch& batch, StepOutput* out) {
  Writer w = command(&cmd_, Op::kStep);
  w.put<uint64_t>(batch.slices.size());
  for (const SeqSlice& sl : batch.slices) {
    w.put<uint64_t>(sl.seq);
    w.put<int64_t>(sl.first_pos);
    w.ints(sl.tokens);
    w.ints(sl.logits_rows);
    w.ints(sl.taps);
    w.put<uint8_t>(sl.full_stack ? 1 : 0);
    w.put<uint64_t>(sl.images.size());
    for (const SliceImage& im : sl.images) {
      w.put<int32_t>(im.start);
      w.put<int32_t>(im.llm_w);
      w.put<int32_t>(im.llm_h);
      const std::size_t n = im.rows ? im.rows->size() : 0;
      w.put<uint64_t>(n);
      if (n > 0) w.raw(im.rows->data(), n * sizeof(float));
    }
  }
  if (!send()) return health();
  Status st = guarded([&] { return local_->step(batch, out); }, health_error());
  return failed_.load() ? health() : st;
}

Status LeadRunner::draft(const std::vector<DraftQuery>& queries, std::vector<DraftResult>* out) {
  Writer w = command(&cmd_, Op::kDraft);
  w.put<uint64_t>(queries.size());
  for (const auto& q : queries) {
    w.put<uint64_t>(q.seq);
    w.put<int32_t>(q.next);
  }
  if (!send()) return health();
  Status st = guarded([&] { return local_->draft(queries, out); }, health_error());
  return failed_.load() ? health() : st;
}

int64_t LeadRunner::attach_cached_prefix(SeqId seq, const std::vector<int32_t>& tokens,
                                         const std::string& salt) {
  Writer w = command(&cmd_, Op::kAttach);
  w.put<uint64_t>(seq);
  w.ints(tokens);
  w.str(salt);
  if (!send()) return 0;
  return guarded([&] { return local_->attach_cached_prefix(seq, tokens, salt); }, int64_t(0));
}

void LeadRunner::set_prefill_attention(bool on) {
  command(&cmd_, Op::kPrefillAttention).put<uint8_t>(on ? 1 : 0);
  if (send()) local_->set_prefill_attention(on);
}

Status LeadRunner::set_decoder_replay(bool on) {
  command(&cmd_, Op::kReplay).put<uint8_t>(on ? 1 : 0);
  if (!send()) return health();
  return guarded([&] { return local_->set_decoder_replay(on); }, health_error());
}

Status LeadRunner::fill_random_context(SeqId seq, int64_t length, uint64_t seed) {
  Writer w = command(&cmd_, Op::kFill);
  w.put<uint64_t>(seq);
  w.put<int64_t>(length);
  w.put<uint64_t>(seed);
  if (!send()) return health();
  return guarded([&] { return local_->fill_random_context(seq, length, seed); }, health_error());
}

RankReport own_report(const FastModel& m, int rank) {
  const FastStats st = m.stats();
  RankReport r;
  r.rank = rank;
  r.share_weight_bytes = st.share_weight_bytes;
  r.rss_bytes = status_kb("VmRSS:") * 1024;
  r.rss_file_bytes = status_kb("RssFile:") * 1024;
  r.huge_page_weight_bytes = st.huge_page_weight_bytes;
  r.anon_huge_bytes = status_kb("AnonHugePages:", "/proc/self/smaps_rollup") * 1024;
  r.kv_pool_bytes = m.pool().blocks_total() * m.pool().layout().block_bytes;
  r.collectives = st.collectives;
  r.collective_bytes = st.collective_bytes;
  r.collective_seconds = st.collective_seconds;
  return r;
}

Result<std::vector<RankReport>> LeadRunner::reports() {
  command(&cmd_, Op::kReport);
  if (!send()) return health();
  std::vector<uint8_t> all;
  try {
    all = world_.allgather(report_bytes(own_report(*local_, 0)));
  } catch (const CollectiveFailure& e) {
    fail(e.what());
    return health();
  }
  std::vector<RankReport> out(all.size() / sizeof(RankReport));
  std::memcpy(out.data(), all.data(), out.size() * sizeof(RankReport));
  return out;
}

LeadRunner* as_lead(ModelRunner* r) {
  return dynamic_cast<LeadRunner*>(r);
}

Result<std::unique_ptr<ModelRunner>> load_split(const std::string& dir, FastOptions opt,
                                                SplitOptions split) {
  World& w = World::get();
  if (w.size() <= 1) {
    if (split.tp > 1 || split.ep > 1)
      return Status::error("--tp " + std::to_string(std::max(1, split.tp)) + " --ep " +
                           std::to_string(std::max(1, split.ep)) +
                           ": a split needs as many processes: start dsv41 under mpirun -np " +
                           std::to_string(std::max(split.tp, split.ep)));
    auto m = FastModel::load(dir, opt);
    if (!m) return m.status();
    return std::unique_ptr<ModelRunner>(std::move(*m));
  }
  w.set_timeout(split.timeout_s);
  DSV41_RETURN_IF_ERROR(resolve_split(w, &split));
  if (!w.thread_level_ok())
    return Status::error(
        "MPI: this Open MPI gives less than MPI_THREAD_SERIALIZED (the engine "
        "thread calls MPI); a split forward cannot run on it");
  // Startup exchanges wait for the slowest rank's conversion check and weight loading, which can
  // differ by minutes on a large checkpoint: they get a long timeout of their own.
  const double startup_s = std::max(split.timeout_s, kStartupTimeoutSeconds);
  // Every rank must load the same model, with the same binary and options: each publishes its
  // fingerprint and checks everyone's (all ranks reach the same verdict, so all refuse together).
  auto manifest = sha256_file((std::filesystem::path(dir) / "manifest.json").string());
  if (opt.kv_cache_bytes <= 0) opt.kv_cache_bytes = FastModel::default_kv_budget();
  const std::string mine_text =
      std::string("dsv41 ") + DSV41_VERSION + " | manifest " +
      (manifest ? manifest->substr(0, 16) : std::string("missing")) + " | tp " +
      std::to_string(split.tp) + " ep " + std::to_string(split.ep) + " dspark " +
      std::to_string(opt.dspark) + " replay " + std::to_string(opt.decoder_replay) + "/" +
      std::to_string(opt.replay_margin) + " act_quant " + std::to_string(opt.act_quant) +
      " int16 " + std::to_string(opt.mxfp4_int16) + " keys " + std::to_string(int(opt.index_keys)) +
      " prefix " + std::to_string(opt.prefix_cache) + " isolation " +
      std::to_string(int(opt.isolation)) + " rollback " + std::to_string(opt.max_rollback);
  constexpr std::size_t kPrint = 384;
  std::vector<uint8_t> mine(kPrint + 8, 0);
  std::memcpy(mine.data(), mine_text.data(), std::min(kPrint - 1, mine_text.size()));
  // The KV pool must be the same size everywhere (rank 0 schedules by its own pool): the smallest
  // budget any rank can give.
  std::memcpy(mine.data() + kPrint, &opt.kv_cache_bytes, 8);
  std::vector<uint8_t> all;
  try {
    all = w.allgather(mine, startup_s);
  } catch (const CollectiveFailure& e) {
    return Status::error(std::string("startup: ") + e.what());
  }
  for (int r = 0; r < w.size(); ++r) {
    const std::string theirs(reinterpret_cast<const char*>(all.data() + r * mine.size()));
    if (theirs != mine_text.substr(0, kPrint - 1))
      return Status::error("rank " + std::to_string(r) + " does not match rank " +
                           std::to_string(w.rank()) + " (model directory, version or options): " +
                           "it has [" + theirs + "], this rank [" + mine_text + "]");
    int64_t budget;
    std::memcpy(&budget, all.data() + r * mine.size() + kPrint, 8);
    opt.kv_cache_bytes = std::min(opt.kv_cache_bytes, budget);
  }
  opt.comm = &w;
  opt.tp_parts = split.tp;
  // Part r on rank r; ranks beyond a split of more than one part hold none of it (they add zeros
  // to its sums), and a part not split at all is computed whole by every rank.
  auto part = [&](int parts) { return parts == 1 ? 0 : (w.rank() < parts ? w.rank() : -1); };
  opt.tp_part = part(split.tp);
  opt.ep_parts = split.ep;
  opt.ep_part = part(split.ep);
  auto m = FastModel::load(dir, opt);
  // Every rank must know whether every other loaded (a rank that failed says so and all stop),
  // and all must run the same kernels: another ISA tier gives other last bits, other expert
  // choices, and rank 0's results would silently stop being one process's.
  constexpr std::size_t kIsa = 32;
  std::vector<uint8_t> ok(kIsa, 0);
  ok[0] = m ? 1 : 0;
  if (m) std::strncpy(reinterpret_cast<char*>(ok.data() + 1), (*m)->isa(), kIsa - 2);
  try {
    ok = w.allgather(ok, startup_s);
  } catch (const CollectiveFailure& e) {
    return Status::error(std::string("startup: ") + e.what());
  }
  for (int r = 0; r < w.size(); ++r)
    if (!ok[std::size_t(r) * kIsa])
      return m ? Status::error("rank " + std::to_string(r) + " could not load " + dir +
                               " (its log says why)")
               : m.status().with_context("rank " + std::to_string(w.rank()) + ": ");
  for (int r = 0; r < w.size(); ++r) {
    const std::string isa(reinterpret_cast<const char*>(ok.data() + std::size_t(r) * kIsa + 1));
    if (isa != (*m)->isa())
      return Status::error("rank " + std::to_string(r) + " runs the " + isa + " kernels and rank " +
                           std::to_string(w.rank()) + " the " + (*m)->isa() +
                           " ones: results would differ between ranks (set "
                           "DSV41_ISA to the lower tier on every rank)");
  }
  const FastStats st = (*m)->stats();
  log::info(
      "rank {} on {} (pid {}): tp part {} of {}, ep part {} of {}: {:.3f} GB of weights "
      "to read",
      w.rank(), w.host(), ::getpid(), opt.tp_part, split.tp, opt.ep_part, split.ep,
      double(st.share_weight_bytes) / 1e9);
  if (w.rank() != 0) World::exit_now(follow(**m, w));
  auto lead = std::make_unique<LeadRunner>(std::move(*m), w);
  lead->set_split(split);
  return std::unique_ptr<ModelRunner>(std::move(lead));
}

}  // namespace dsv41::parallel
