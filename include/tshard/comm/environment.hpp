// MPI up and down for a program: initialises MPI unless it already is, finalises only what it
// initialised, and installs the terminate handler that aborts the job on an uncaught exception.
//
// No rank is left hanging by one that leaves early. Finalisation first agrees with every rank
// (a non-blocking barrier) within a bounded wait: a rank that returns from main, or calls exit,
// while the others still wait in a collective it will never join ends the job after the bound,
// naming itself, instead of waiting in MPI_Finalize while they wait for it. The bound is
// TSHARD_FINALIZE_TIMEOUT seconds (default 30; 0 waits forever, for programs whose ranks
// legitimately finish far apart) or Environment::set_finalize_timeout(). A rank blocked inside
// a collective is the watchdog's case (comm/watchdog.hpp, TSHARD_TIMEOUT).
#pragma once
#include "tshard/comm/mpi.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tshard/comm/failure.hpp"
#include "tshard/comm/watchdog.hpp"
#include "tshard/core/cpu_capability.hpp"
#include "tshard/core/error.hpp"
#include "tshard/core/simulated_timing.hpp"

namespace tshard {

class Environment {
 public:
  Environment() : Environment(nullptr, nullptr) {}
  Environment(int& argc, char**& argv) : Environment(&argc, &argv) {}
  ~Environment() {
    finalize();
    if (owner() == this) owner() = nullptr;
  }
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  static int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  static int world_size() {
    int s = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
  }
  // The thread support level MPI granted.
  int thread_level() const { return provided_; }

  // How long finalisation waits for the other ranks before it ends the job (seconds; 0 or
  // less: forever).
  static void set_finalize_timeout(double seconds) { finalize_timeout() = seconds; }

 private:
  Environment(int* argc, char*** argv) {
    int up = 0;
    MPI_Initialized(&up);
    if (!up) {
      MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided_);
      owns_ = true;
    } else {
      MPI_Query_thread(&provided_);
    }
#if !TSHARD_SIMULATE
    // (Simulated ranks share the process's terminate handler and exit: there an uncaught
    // exception ends the whole simulation, every rank with it, and nothing is left waiting.)
    install_terminate_handler();
#endif
    detail::skip_floating_payloads();      // (simulation's timing mode only)
    detail::CollectiveWatch::instance();  // reads TSHARD_TIMEOUT
    agree_on_cpu_capability();
    if (owns_) {
      MPI_Comm_dup(MPI_COMM_WORLD, &end_);
      if (const char* s = std::getenv("TSHARD_FINALIZE_TIMEOUT")) finalize_timeout() = std::atof(s);
      owner() = this;
#if !TSHARD_SIMULATE
      static const bool registered = [] { return std::atexit(&Environment::at_exit) == 0; }();
      (void)registered;
#endif
    }
  }

  // The kernels' level is chosen here, before any of them runs (core/cpu_capability.hpp): a
  // TSHARD_CPU_CAPABILITY that some rank cannot honour (one above its CPU's, in a job over CPUs of
  // different levels too) is a ValueError on every rank. (Uncounted, as the end's barrier is.)
  static void agree_on_cpu_capability() {
    std::string why;
    try {
      (void)cpu_capability();
    } catch (const ValueError& e) {
      why = e.what();
    }
    int mine = why.empty() ? 1 : 0, all = mine;
    if (world_size() > 1) MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all) return;
    if (why.empty()) {
      const char* forced = std::getenv("TSHARD_CPU_CAPABILITY");
      why = std::string("tshard: TSHARD_CPU_CAPABILITY=") + (forced ? forced : "") +
            " cannot be honoured on another rank (its CPU runs a lower level); this one runs " +
            to_string(detected_cpu_capability());
    }
    throw ValueError(why);
  }

  static double& finalize_timeout() {
    static double seconds = 30;
    return seconds;
  }
  static Environment*& owner() {
    static Environment* e = nullptr;
    return e;
  }
  // exit() runs no destructors of main's locals: finalise from here.
  static void at_exit() {
    if (owner()) owner()->finalize();
  }

  void finalize() {
    if (!owns_ || finalized_) return;
    finalized_ = true;
    int down = 0;
    MPI_Finalized(&down);
    if (down) return;
    wait_for_every_rank();
    detail::CollectiveWatch::instance().stop();
    MPI_Comm_free(&end_);
    MPI_Finalize();
  }

  // Every rank has reached the end, or this one ends the job after the bound.
  void wait_for_every_rank() {
    if (world_size() == 1) return;
#if TSHARD_SIMULATE
    // Bounded by the host's clock elsewhere; simulated ranks wait in simulated time, which a
    // host-clock bound does not measure, and a deadlock there is the simulator's to report.
    MPI_Barrier(end_);
#else
    MPI_Request request;
    MPI_Ibarrier(end_, &request);
    const double bound = finalize_timeout();
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (done) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (bound > 0 && waited > bound) {
        const std::string why =
            "it reached the end of the program (returned from main or called exit), but other ranks did not within " +
            std::to_string(int(bound)) +
            " s: they are most likely waiting in a collective this rank left or never called (one called on some "
            "ranks only, inside `if (mesh.rank() == 0)` say). (TSHARD_FINALIZE_TIMEOUT=0 waits forever "
            "where ranks legitimately finish far apart.)";
        detail::abort_job(why.c_str());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // leave the core to ranks still computing
    }
#endif
  }

  bool owns_ = false;
  bool finalized_ = false;
  int provided_ = 0;
  MPI_Comm end_ = MPI_COMM_NULL;
};

}  // namespace tshard
