// The process group over Open MPI (parallel/world.h).
#include "parallel/world.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/check.h"
#include "core/log.h"

#if DSV41_HAVE_MPI
#include <mpi.h>
#endif

namespace dsv41::parallel {
namespace {

bool g_initialised = false;

#if DSV41_HAVE_MPI
// Waits for a non-blocking MPI operation. Inside a step (idle == false) it spins, yielding: the
// other ranks are at most one layer's work behind and this rank has nothing else to do, so a sleep
// would only add its wake-up latency to every one of a step's collectives (two per layer). A
// follower waiting for rank 0's next command (idle == true) spins 1 ms, then polls every 50 us so
// an idle server does not burn its cores. Gives up after timeout_s (< 0: never) with
// CollectiveFailure.
void wait_for(MPI_Request* req, double timeout_s, const char* what, int rank, bool idle = false) {
  const auto t0 = std::chrono::steady_clock::now();
  int done = 0;
  for (;;) {
    if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      throw CollectiveFailure(std::string(what) + ": MPI reported an error on rank " +
                              std::to_string(rank));
    if (done) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (timeout_s >= 0 && s > timeout_s)
      throw CollectiveFailure(std::string(what) + ": no answer from the other ranks after " +
                              std::to_string(int(timeout_s)) + " s (a rank died or hangs)");
    if (idle && s > 1e-3)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    else
      std::this_thread::yield();
  }
}
#endif

}  // namespace

World::World() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  host_ = name;
#if DSV41_HAVE_MPI
  const char* env = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!env) env = std::getenv("PMI_SIZE");
  if (!env) return;  // a plain process: a world of one, MPI never touched
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  g_initialised = true;
  mpi_ = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  thread_ok_ = provided >= MPI_THREAD_SERIALIZED;
#endif
}

World& World::get() {
  static World w;
  return w;
}

void World::finalize() {
#if DSV41_HAVE_MPI
  if (g_initialised) {
    g_initialised = false;
    MPI_Finalize();
  }
#endif
}

void World::exit_now(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
#if DSV41_HAVE_MPI
  if (g_initialised && code != 0 && get().size() > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  if (code == 0) finalize();
  std::_Exit(code);
}

void World::allreduce_sum(float* data, int64_t n) {
  if (size_ <= 1) return;
#if DSV41_HAVE_MPI
  // Large payloads go in pieces of at most 2^30 elements (MPI counts are int).
  for (int64_t off = 0; off < n; off += int64_t(1) << 30) {
    const int cnt = int(std::min<int64_t>(n - off, int64_t(1) << 30));
    MPI_Request req;
    if (MPI_Iallreduce(MPI_IN_PLACE, data + off, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req) !=
        MPI_SUCCESS)
      throw CollectiveFailure("allreduce: MPI refused it on rank " + std::to_string(rank_));
    wait_for(&req, timeout_s_, "allreduce", rank_);
  }
#else
  (void)data;
  (void)n;
#endif
}

std::vector<uint8_t> World::allgather(const std::vector<uint8_t>& mine) {
  return allgather(mine, timeout_s_);
}

std::vector<uint8_t> World::allgather(const std::vector<uint8_t>& mine, double timeout_s) {
  std::vector<uint8_t> all(mine.size() * std::size_t(size_));
  if (size_ <= 1) return mine;
#if DSV41_HAVE_MPI
  MPI_Request req;
  if (MPI_Iallgather(mine.data(), int(mine.size()), MPI_BYTE, all.data(), int(mine.size()),
                     MPI_BYTE, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    throw CollectiveFailure("allgather: MPI refused it on rank " + std::to_string(rank_));
  wait_for(&req, timeout_s, "allgather", rank_);
#endif
  return all;
}

void World::broadcast(std::vector<uint8_t>* buf, bool wait_forever, double timeout_s) {
  if (timeout_s < 0) timeout_s = timeout_s_;
  if (size_ <= 1) return;
#if DSV41_HAVE_MPI
  uint64_t n = rank_ == 0 ? buf->size() : 0;
  MPI_Request req;
  if (MPI_Ibcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    throw CollectiveFailure("broadcast: MPI refused it on rank " + std::to_string(rank_));
  wait_for(&req, wait_forever ? -1.0 : timeout_s, "broadcast", rank_, wait_forever);
  if (rank_ != 0) buf->resize(n);
  for (uint64_t off = 0; off < n; off += uint64_t(1) << 30) {
    const int cnt = int(std::min<uint64_t>(n - off, uint64_t(1) << 30));
    if (MPI_Ibcast(buf->data() + off, cnt, MPI_BYTE, 0, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
      throw CollectiveFailure("broadcast: MPI refused it on rank " + std::to_string(rank_));
    wait_for(&req, timeout_s, "broadcast", rank_);
  }
#else
  (void)buf;
  (void)wait_forever;
  (void)timeout_s;
#endif
}

Result<std::string> World::rank0_first(const std::function<Result<std::string>()>& fn) {
  if (size_ <= 1) return fn();
  constexpr double kWait = 7200;  // a conversion of the released checkpoint takes a while
  std::vector<uint8_t> ok(1, 0);
  Result<std::string> r = Status::error("not run");
  if (rank_ == 0) {
    r = fn();
    ok[0] = r ? 1 : 0;
  }
  try {
    broadcast(&ok, false, kWait);
  } catch (const CollectiveFailure& e) {
    return Status::error(std::string("waiting for rank 0: ") + e.what());
  }
  if (rank_ == 0) return r;
  if (!ok[0]) return Status::error("rank 0 could not prepare the model (its log says why)");
  return fn();
}

}  // namespace dsv41::parallel
