// The collective watchdog, modelled on PyTorch's process-group timeout: a rank blocked inside a
// tshard collective (or a wait for its messages) longer than the timeout ends the whole job with
// a message naming the rank, the collective and the operator that called it, instead of hanging
// until the batch system's limit. Off unless TSHARD_TIMEOUT (seconds) is set in the environment
// or set_collective_timeout() is called; costs one relaxed atomic load per collective when off.
//
// A background thread checks about ten times per timeout; it never calls MPI except MPI_Abort.
#pragma once
#include "tshard/comm/mpi.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace tshard {
namespace detail {

// Ends the whole job from any rank (and any thread): the message, then MPI_Abort.
[[noreturn]] inline void abort_job(const char* why) {
  int rank = -1, up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (up && !down) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "tshard: rank %d ends the job: %s\n", rank, why);
  std::fflush(stderr);
  if (up && !down) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

class CollectiveWatch {
 public:
  static CollectiveWatch& instance() {
    static CollectiveWatch w;
    return w;
  }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // Seconds; 0 or less turns the watchdog off.
  void set_timeout(double seconds) {
#if TSHARD_SIMULATE
    // Simulated ranks share one process and one host clock, and a thread of ours cannot call
    // into the simulator: a job that hangs there is ended by the simulator's own deadlock check.
    (void)seconds;
#else
    std::unique_lock<std::mutex> lock(mutex_);
    timeout_ = seconds;
    enabled_.store(seconds > 0, std::memory_order_relaxed);
    if (seconds > 0 && !thread_.joinable()) {
      stop_ = false;
      thread_ = std::thread([this] { watch(); });
    }
    cv_.notify_all();
#endif
  }
  double timeout() const { return timeout_; }

  // Brackets a call that may block; nested calls keep the outermost's start.
  void enter(const char* kind, std::string op) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (depth_++ == 0) {
      kind_ = kind;
      op_ = std::move(op);
      since_ = std::chrono::steady_clock::now();
    }
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (depth_ > 0) --depth_;
  }

  // Ends the thread (before MPI_Finalize).
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      enabled_.store(false, std::memory_order_relaxed);
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  ~CollectiveWatch() { stop(); }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      const double period = timeout_ > 0 ? std::min(1.0, std::max(0.01, timeout_ / 10)) : 1.0;
      cv_.wait_for(lock, std::chrono::duration<double>(period));
      if (stop_ || timeout_ <= 0 || depth_ == 0) continue;
      const double blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
      if (blocked < timeout_) continue;
      char why[512];
      std::snprintf(why, sizeof why,
                    "blocked %.0f s in %s called by operator '%s' (timeout %.0f s, TSHARD_TIMEOUT): another rank "
                    "never entered it (it failed, left main or took another path)",
                    blocked, kind_, op_.c_str(), timeout_);
      lock.unlock();
      abort_job(why);
    }
  }

  CollectiveWatch() {
    if (const char* s = std::getenv("TSHARD_TIMEOUT")) set_timeout(std::atof(s));
  }

  std::atomic<bool> enabled_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::thread thread_;
  bool stop_ = false;
  double timeout_ = 0;
  int depth_ = 0;
  const char* kind_ = "";
  std::string op_;
  std::chrono::steady_clock::time_point since_{};
};

// RAII: a call that may block on other ranks, watched while the watchdog is on.
class WatchedCall {
 public:
  template <class OperatorName>
  WatchedCall(const char* kind, OperatorName&& op_name) {
    auto& w = CollectiveWatch::instance();
    if (!w.enabled()) return;
    w.enter(kind, op_name());
    on_ = true;
  }
  ~WatchedCall() {
    if (on_) CollectiveWatch::instance().leave();
  }
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  bool on_ = false;
};

}  // namespace detail

// The watchdog's timeout in seconds (0 turns it off); TSHARD_TIMEOUT sets it at start.
inline void set_collective_timeout(double seconds) { detail::CollectiveWatch::instance().set_timeout(seconds); }
inline double collective_timeout() { return detail::CollectiveWatch::instance().timeout(); }

}  // namespace tshard
