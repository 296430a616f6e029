// Failure agreement: a rank-local failure is agreed on by all ranks before anyone throws, and
// an uncaught exception ends the whole job with its message instead of leaving ranks hanging
// in a collective.
#pragma once
#include "tshard/comm/mpi.hpp"

#include <cstdio>
#include <exception>
#include <string>

#include "tshard/comm/collectives.hpp"
#include "tshard/comm/watchdog.hpp"
#include "tshard/core/error.hpp"

namespace tshard {

// True on every rank when `ok` is true on every rank of `comm` (one small all-reduce).
// Counted in the stats like every other collective.
inline bool agree(bool ok, MPI_Comm comm = MPI_COMM_WORLD) {
  std::int32_t mine = ok ? 1 : 0, all = 0;
  detail::all_reduce(comm, &mine, &all, 1, ReduceOp::Min);
  return all != 0;
}

namespace detail {

// Throws E with `message` on every rank when any rank of `comm` has ok == false.
template <class E>
void throw_unless_all(bool ok, MPI_Comm comm, const std::string& message) {
  if (!agree(ok, comm)) throw E(message + (ok ? " (on another rank)" : ""));
}

inline void terminate_with_abort() {
  std::string what = "std::terminate called";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = std::string("uncaught exception: ") + ex.what();
    } catch (...) {
      what = "uncaught exception of unknown type";
    }
  }
  abort_job(what.c_str());
}

}  // namespace detail

// Makes an uncaught exception on any rank end the job (MPI_Abort) with its message.
inline void install_terminate_handler() { std::set_terminate(detail::terminate_with_abort); }

}  // namespace tshard
