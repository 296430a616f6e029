// Point-to-point messages between two ranks (a pipeline's activations and gradients between
// stages), counted in the stats like every collective. Both directions are posted non-blocking
// and completed together: a rank posts what it sends and what it needs next, then waits for
// both, so two neighbours that send to each other never wait on one another, and a large
// message (rendezvous) moves while both sides are inside MPI instead of waiting for the sender
// to call MPI again after a long computation. Counts beyond int are split into chunks
// (delivered in order, MPI's non-overtaking rule).
#pragma once
#include "tshard/comm/clock.hpp"
#include "tshard/comm/mpi.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "tshard/comm/collectives.hpp"
#include "tshard/comm/stats.hpp"

namespace tshard::detail {

class PendingMessage {
 public:
  PendingMessage() = default;
  PendingMessage(PendingMessage&&) noexcept = default;
  PendingMessage& operator=(PendingMessage&& o) noexcept {
    wait();
    reqs_ = std::move(o.reqs_);
    return *this;
  }
  PendingMessage(const PendingMessage&) = delete;
  PendingMessage& operator=(const PendingMessage&) = delete;
  ~PendingMessage() { wait(); }

  template <class T>
  static PendingMessage send(MPI_Comm comm, int peer, const T* data, Index n, int tag) {
    CollectiveTimer t("send", bytes_of<T>(n), 0);
    PendingMessage m;
    post_send(m.reqs_, comm, Message<const T>{peer, data, n}, tag);
    return m;
  }
  template <class T>
  static PendingMessage receive(MPI_Comm comm, int peer, T* data, Index n, int tag) {
    CollectiveTimer t("recv", 0, bytes_of<T>(n));
    PendingMessage m;
    post_receive(m.reqs_, comm, Message<T>{peer, data, n}, tag);
    return m;
  }

  bool done() const { return reqs_.empty(); }
  // Completes the message; returns the seconds spent blocked.
  double wait() {
    if (reqs_.empty()) return 0;
    const auto t0 = Clock::now();
    {
      WatchedCall watched("point-to-point (wait)", [] { return current_operator(); });
      MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
    }
    reqs_.clear();
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    profile_wait(waited);
    return waited;
  }

 private:
  std::vector<MPI_Request> reqs_;
};

// Completes every message (all posted before any wait); returns the seconds spent blocked.
inline double wait_all(std::vector<PendingMessage*> messages) {
  const auto t0 = Clock::now();
  bool blocked = false;
  for (auto* m : messages)
    if (m && !m->done()) {
      m->wait();
      blocked = true;
    }
  return blocked ? std::chrono::duration<double>(Clock::now() - t0).count() : 0.0;
}

}  // namespace tshard::detail
