// Point-to-point messages between two ranks (a pipeline's activations and gradients between
// stages), counted in the stats like every collective. A send is left in flight, so a stage never
// blocks on its successor; a receive blocks and reports how long it waited, which is the
// pipeline's idle time. Counts beyond int are split into chunks (received in order, MPI's
// non-overtaking rule).
#pragma once
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "tshard/comm/collectives.hpp"
#include "tshard/comm/stats.hpp"

namespace tshard::detail {

template <class T>
class PendingSend {
 public:
  PendingSend(MPI_Comm comm, int peer, const T* data, Index n, int tag) {
    CollectiveTimer t("send", bytes_of<T>(n), 0);
    const Index limit = collective_chunk_limit();
    for (Index off = 0; off < n; off += limit) {
      reqs_.emplace_back();
      MPI_Isend(const_cast<T*>(data) + off, int(std::min(limit, n - off)), mpi_datatype<T>(), peer, tag, comm,
                &reqs_.back());
    }
  }
  PendingSend(PendingSend&&) noexcept = default;
  PendingSend& operator=(PendingSend&&) noexcept = default;
  PendingSend(const PendingSend&) = delete;
  PendingSend& operator=(const PendingSend&) = delete;
  ~PendingSend() { wait(); }

  // Whether the send has completed (its buffer may be reused); lets MPI progress it.
  bool test() {
    if (reqs_.empty()) return true;
    int done = 0;
    MPI_Testall(int(reqs_.size()), reqs_.data(), &done, MPI_STATUSES_IGNORE);
    if (done) reqs_.clear();
    return done != 0;
  }
  // Seconds spent blocked.
  double wait() {
    if (reqs_.empty()) return 0;
    const auto t0 = std::chrono::steady_clock::now();
    MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
    reqs_.clear();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  std::vector<MPI_Request> reqs_;
};

// Receives n elements from `peer` with `tag` into data; returns the seconds spent blocked.
template <class T>
double receive(MPI_Comm comm, int peer, T* data, Index n, int tag) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    CollectiveTimer t("recv", 0, bytes_of<T>(n));
    const Index limit = collective_chunk_limit();
    std::vector<MPI_Request> reqs;
    for (Index off = 0; off < n; off += limit) {
      reqs.emplace_back();
      MPI_Irecv(data + off, int(std::min(limit, n - off)), mpi_datatype<T>(), peer, tag, comm, &reqs.back());
    }
    MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace tshard::detail
