// The clock every time tshard reports is read from (tokens/s, profiles, traces, pipeline bubbles).
// Under SimGrid's SMPI it is the simulated clock (MPI_Wtime): the host's clock there measures how
// long the simulation took, not how long the simulated machine would; elsewhere it is the
// standard steady clock.
#pragma once
#include <chrono>

#include "tshard/comm/mpi.hpp"

namespace tshard {

#if TSHARD_SIMULATE
struct Clock {
  using rep = double;
  using period = std::ratio<1>;
  using duration = std::chrono::duration<double>;
  using time_point = std::chrono::time_point<Clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point(duration(MPI_Wtime())); }
};
#else
using Clock = std::chrono::steady_clock;
#endif

}  // namespace tshard
