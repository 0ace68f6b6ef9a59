// The collectives the fast forward needs when it is split over processes (design.md §2, issue 17):
// an element-wise fp32 sum over every rank. The model layer sees only this interface; the MPI
// implementation lives in parallel/ (the only code that includes <mpi.h>).
//
// Failure policy: a rank that dies or stops answering must not hang the caller. An implementation
// gives up after its timeout and throws CollectiveFailure; the code that drives the model
// (parallel/distributed_runner.cpp) turns that into a failed step and an unhealthy runner.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace dsv41 {

class CollectiveFailure : public std::runtime_error {
 public:
  explicit CollectiveFailure(const std::string& what) : std::runtime_error(what) {}
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[i] = sum over ranks of data[i], on every rank (throws CollectiveFailure). Callers that
  // need bit-identical results arrange for at most one rank to hold a non-zero value per element:
  // then the sum is exact whatever order the transport adds in.
  virtual void allreduce_sum(float* data, int64_t n) = 0;
};

}  // namespace dsv41
