// The process group a split forward runs in (issue 17, docs/parallel.md): one process when started
// on its own, every rank of the job when started under Open MPI's mpirun. This is the only code of
// dsv41 that talks MPI; the model sees the Collective interface (core/collective.h).
//
// Threads: MPI is initialised with MPI_THREAD_SERIALIZED. On rank 0 the engine thread drives the
// model (steps, and the collectives inside them) while the main thread initialised MPI; no two
// threads ever call MPI at once.
//
// Timeouts: nothing here waits forever on another rank except a follower waiting for rank 0's next
// command (an idle server). Every other wait gives up after timeout_s and reports which operation
// and which ranks it was waiting for, so a rank that died or hangs turns into an error, not a hang.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/collective.h"
#include "core/status.h"

namespace dsv41::parallel {

class World final : public Collective {
 public:
  // The process's world. Initialises MPI on first use when the process was started by mpirun
  // (OMPI_COMM_WORLD_SIZE set); a plain process is a world of one and never touches MPI.
  static World& get();
  // Finalises MPI if it was initialised (main() calls this before exiting; safe to call twice).
  static void finalize();
  // Ends the process now with `code`: a follower's end, or rank 0 after a rank failed. Under
  // mpirun with more than one rank and a non-zero code, aborts the job (the other ranks end too).
  [[noreturn]] static void exit_now(int code);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool mpi() const { return mpi_; }
  std::string host() const { return host_; }
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }

  void allreduce_sum(float* data, int64_t n) override;  // throws CollectiveFailure on timeout
  // Every rank's `mine` (the same size on every rank), rank-major, on every rank.
  std::vector<uint8_t> allgather(const std::vector<uint8_t>& mine);
  // Rank 0's bytes to every rank (buf holds them on rank 0; resized and filled elsewhere). The
  // size travels first. wait_forever: a follower waiting for its next command.
  void broadcast(std::vector<uint8_t>* buf, bool wait_forever = false);

 private:
  World();
  int rank_ = 0, size_ = 1;
  bool mpi_ = false;
  double timeout_s_ = 60;
  std::string host_;
};

}  // namespace dsv41::parallel
