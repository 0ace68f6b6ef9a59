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

#include <atomic>
#include <cstdint>
#include <functional>
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
  // MPI gave at least MPI_THREAD_SERIALIZED (the engine thread calls MPI, not the main thread).
  bool thread_level_ok() const { return thread_ok_; }
  // Set when the split model failed (a rank died or hangs): MPI cannot finalise then (it would
  // wait for the missing rank), so the process ends through exit_now.
  void mark_failed() { failed_ = true; }
  bool failed() const { return failed_; }

  void allreduce_sum(float* data, int64_t n) override;  // throws CollectiveFailure on timeout
  // Every rank's `mine` (the same size on every rank), rank-major, on every rank.
  std::vector<uint8_t> allgather(const std::vector<uint8_t>& mine);
  // Rank 0's bytes to every rank (buf holds them on rank 0; resized and filled elsewhere). The
  // size travels first. wait_forever: a follower waiting for its next command.
  // timeout_s < 0: the world's timeout. A follower waiting for its next command waits forever.
  void broadcast(std::vector<uint8_t>* buf, bool wait_forever = false, double timeout_s = -1);
  std::vector<uint8_t> allgather(const std::vector<uint8_t>& mine, double timeout_s);

  // Runs fn on rank 0 first and on the other ranks once rank 0 is done (work that writes files the
  // others may share, like converting a checkpoint: two ranks on one host must not write the same
  // files at once). A rank 0 failure is every rank's failure. In a world of one: fn().
  Result<std::string> rank0_first(const std::function<Result<std::string>()>& fn);

 private:
  World();
  int rank_ = 0, size_ = 1;
  bool mpi_ = false;
  double timeout_s_ = 60;
  bool thread_ok_ = true;
  std::atomic<bool> failed_{false};
  std::string host_;
};

}  // namespace dsv41::parallel
