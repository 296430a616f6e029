// Non-blocking collectives left in flight while computation goes on (DDP's bucketed gradient
// all-reduce, ZeRO's reduce-scatter, ZeRO-3's prefetched parameter gather): start() posts the
// MPI call in chunks of the collective limit, test() lets MPI progress it, wait() completes it
// and records bytes and time under the operator that started it, with the time spent blocked
// in wait() apart.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tshard/comm/collectives.hpp"

namespace tshard::detail {

template <class T>
class PendingCollective {
 public:
  PendingCollective() = default;
  PendingCollective(const PendingCollective&) = delete;
  PendingCollective& operator=(const PendingCollective&) = delete;
  ~PendingCollective() {
    if (!reqs_.empty()) MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
  }

  // data = sum over the group of data, in place.
  void start_all_reduce(MPI_Comm comm, T* data, Index n) {
    begin("all_reduce", comm);
    blocked_ = 0;
    const int p = comm_size(comm);
    if (p == 1 || n == 0) return;
    moved_ = 2 * bytes_of<T>(n) * (p - 1) / p;
    for (Index off = 0; off < n; off += collective_chunk_limit()) {
      const Index c = std::min(collective_chunk_limit(), n - off);
      reqs_.emplace_back();
      MPI_Iallreduce(MPI_IN_PLACE, data + off, int(c), mpi_datatype<T>(), mpi_op<T>(ReduceOp::Sum), comm, &reqs_.back());
    }
  }

  // send holds p blocks of n; group rank i receives the sum of block i into recv.
  void start_reduce_scatter(MPI_Comm comm, const T* send, T* recv, Index n) {
    begin("reduce_scatter", comm);
    blocked_ = 0;
    const int p = comm_size(comm);
    if (p == 1 || n == 0) {
      if (n && send != recv) std::copy(send, send + n, recv);
      return;
    }
    moved_ = bytes_of<T>(n) * (p - 1);
    const Index limit = collective_chunk_limit();
    if (p == 2) {  // one exchange, combined when it completes (collectives.hpp: reduce_scatter_pair)
      const int me = comm_rank(comm), other = 1 - me;
      theirs_ = pooled_array<T>(std::size_t(n));
      mine_ = send + Index(me) * n;
      out_ = recv;
      count_ = n;
      for (Index off = 0; off < n; off += limit) {
        const Index c = std::min(limit, n - off);
        reqs_.emplace_back();
        MPI_Irecv(theirs_.get() + off, int(c), mpi_datatype<T>(), other, kReductionTag, comm, &reqs_.back());
        reqs_.emplace_back();
        MPI_Isend(send + Index(other) * n + off, int(c), mpi_datatype<T>(), other, kReductionTag, comm, &reqs_.back());
      }
      return;
    }
    for (Index off = 0; off < n; off += limit) {
      const Index c = std::min(limit, n - off);
      reqs_.emplace_back();
      if (c == n) {
        MPI_Ireduce_scatter_block(send, recv, int(c), mpi_datatype<T>(), mpi_op<T>(ReduceOp::Sum), comm, &reqs_.back());
      } else {  // MPI reduces intrinsic types only: the chunk of every block packed together
        packed_.push_back(packed_chunks(send, p, n, off, c));
        MPI_Ireduce_scatter_block(packed_.back().get(), recv + off, int(c), mpi_datatype<T>(), mpi_op<T>(ReduceOp::Sum), comm,
                                  &reqs_.back());
      }
    }
  }

  // recv[i*n .. (i+1)*n) = send of group rank i (send and recv kept by the caller until done).
  void start_all_gather(MPI_Comm comm, const T* send, Index n, T* recv) {
    begin("all_gather", comm);
    blocked_ = 0;
    const int p = comm_size(comm);
    if (p == 1 || n == 0) {
      if (n && send != recv) std::copy(send, send + n, recv);
      return;
    }
    moved_ = bytes_of<T>(n) * std::uint64_t(p - 1);
    const Index limit = collective_chunk_limit();
    for (Index off = 0; off < n; off += limit) {
      const Index c = std::min(limit, n - off);
      reqs_.emplace_back();
      if (c == n) {
        MPI_Iallgather(send, int(c), mpi_datatype<T>(), recv, int(c), mpi_datatype<T>(), comm, &reqs_.back());
      } else {  // chunk `off` of every rank's block; MPI keeps a freed datatype alive while in use
        StridedBlock<T> block(c, n);
        MPI_Iallgather(send + off, int(c), mpi_datatype<T>(), recv + off, 1, block.get(), comm, &reqs_.back());
      }
    }
  }

  // Lets MPI progress the collective; true once it is complete.
  // (Time spent inside counts as not hidden: MPI may do the whole transfer in here.)
  bool test() {
    if (reqs_.empty()) return true;
    const auto t0 = std::chrono::steady_clock::now();
    int done = 0;
    MPI_Testall(int(reqs_.size()), reqs_.data(), &done, MPI_STATUSES_IGNORE);
    blocked_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (done) finish(0.0);
    return done != 0;
  }

  // Completes the collective; returns the seconds spent inside MPI for it since start (in
  // test() and here): the part computation did not hide.
  double wait() {
    if (!reqs_.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      {
        WatchedCall watched("non-blocking collective (wait)", [] { return current_operator(); });
        MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
      }
      blocked_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      finish(0.0);
    }
    const double b = blocked_;
    blocked_ = 0;
    return b;
  }
  bool in_flight() const { return !reqs_.empty(); }

 private:
  void begin(const char* kind, MPI_Comm) {
    kind_ = kind;
    op_ = current_operator();
    moved_ = 0;
    start_ = std::chrono::steady_clock::now();
  }
  void finish(double) {
    reqs_.clear();
    packed_.clear();
    if (out_) {  // a pair's reduce-scatter: its own block plus the partner's
      const T* got = theirs_.get();
      for (Index i = 0; i < count_; ++i) out_[i] = mine_[i] + got[i];
      out_ = nullptr;
      theirs_.reset();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    record_collective(op_, kind_, moved_, moved_, s);
  }

  std::vector<MPI_Request> reqs_;
  std::vector<std::shared_ptr<T>> packed_;  // chunks of a reduce-scatter, packed (kept until done)
  std::shared_ptr<T> theirs_;   // a pair's reduce-scatter: the partner's share of my block
  const T* mine_ = nullptr;     // my share of it (in the caller's send buffer)
  T* out_ = nullptr;
  Index count_ = 0;
  const char* kind_ = "";
  std::string op_;
  std::uint64_t moved_ = 0;
  double blocked_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tshard::detail
