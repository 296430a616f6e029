// MPI up and down for a program: initialises MPI unless it already is, finalises only what it
// initialised, and installs the terminate handler that aborts the job on an uncaught exception.
#pragma once
#include <mpi.h>

#include "tshard/comm/failure.hpp"

namespace tshard {

class Environment {
 public:
  Environment() : Environment(nullptr, nullptr) {}
  Environment(int& argc, char**& argv) : Environment(&argc, &argv) {}
  ~Environment() {
    int down = 0;
    MPI_Finalized(&down);
    if (owns_ && !down) MPI_Finalize();
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
    install_terminate_handler();
  }
  bool owns_ = false;
  int provided_ = 0;
};

}  // namespace tshard
