// What really reached MPI, counted by a PMPI interposer linked into the accounting tests: the
// MPI functions tshard calls are defined here, count their arguments with the convention of
// tshard/comm/stats.hpp, and forward to PMPI_*.
#pragma once
#include <cstdint>

namespace pmpi {
struct Counts {
  std::uint64_t calls = 0, bytes_sent = 0, bytes_received = 0;
};
Counts& counts();
inline void reset() { counts() = Counts{}; }
}  // namespace pmpi
