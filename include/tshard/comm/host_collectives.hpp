// Collectives of host values (a loss, a count, a flag, a token) over a mesh, or over the ranks that
// share this rank's coordinates on every axis but the named ones (a sub-mesh line: the ranks of
// one pipeline, of one data-parallel group), and point-to-point transfers between two ranks of such
// a line. Every one is counted in comm_stats() like the collectives tshard inserts itself, and
// guarded by the watchdog. With no axis named, the whole mesh takes part.
//
//   double total = ts::all_reduce(mesh, loss);                         // every rank of the mesh
//   double line = ts::all_reduce<"stage">(mesh, part);                 // the ranks of one pipeline
//   int token = ts::broadcast<"stage">(mesh, next, mesh.size<"stage">() - 1);
//   std::vector<double> all = ts::gather(mesh, seconds);               // every rank's, on every rank
//   ts::send<"stage">(mesh, std::span<const float>(...), stage + 1);   // to a neighbour on the line
#pragma once
#include "tshard/comm/mpi.hpp"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "tshard/comm/collectives.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/comm/point_to_point.hpp"
#include "tshard/comm/stats.hpp"

namespace tshard {
namespace detail {

// The communicator of the named axes' line (the whole mesh where none is named); its ranks are the
// mixed radix of those axes' coordinates, first name major.
template <FixedString... Axes, class M>
MPI_Comm line_comm(const M& mesh) {
  if constexpr (sizeof...(Axes) == 0)
    return mesh.comm();
  else
    return mesh.template comm<Axes...>();
}

// Every rank of comm waits for every other, uncounted: a timer's common start (a counted barrier in
// every step would show in the step's cost report).
inline void synchronize(MPI_Comm comm) {
  WatchedCall watched("barrier", [] { return current_operator(); });
  MPI_Barrier(comm);
}

template <class T>
inline constexpr bool host_value_v = std::is_arithmetic_v<T> && !std::is_same_v<T, bool>;

}  // namespace detail

// The values of every rank of the line combined by `op` (a sum, max or min), on every rank.
template <FixedString... Axes, MeshType M, class T>
  requires detail::host_value_v<T>
T all_reduce(const M& mesh, T value, ReduceOp op = ReduceOp::Sum) {
  T out{};
  detail::all_reduce(detail::line_comm<Axes...>(mesh), &value, &out, 1, op);
  return out;
}
// In place, element by element.
template <FixedString... Axes, MeshType M, class T>
  requires detail::host_value_v<T>
void all_reduce(const M& mesh, std::span<T> values, ReduceOp op = ReduceOp::Sum) {
  detail::all_reduce(detail::line_comm<Axes...>(mesh), values.data(), values.data(), detail::Index(values.size()), op);
}

// The value of the line's rank `root` (its rank in the line), on every rank.
template <FixedString... Axes, MeshType M, class T>
  requires detail::host_value_v<T>
T broadcast(const M& mesh, T value, int root) {
  detail::broadcast(detail::line_comm<Axes...>(mesh), &value, 1, root);
  return value;
}
template <FixedString... Axes, MeshType M, class T>
  requires detail::host_value_v<T>
void broadcast(const M& mesh, std::span<T> values, int root) {
  detail::broadcast(detail::line_comm<Axes...>(mesh), values.data(), detail::Index(values.size()), root);
}

// Every rank's value, in line-rank order, on every rank.
template <FixedString... Axes, MeshType M, class T>
  requires detail::host_value_v<T>
std::vector<T> gather(const M& mesh, T value) {
  const MPI_Comm comm = detail::line_comm<Axes...>(mesh);
  std::vector<T> out(static_cast<std::size_t>(detail::comm_size(comm)));
  detail::all_gather(comm, &value, 1, out.data());
  return out;
}

// Every rank's values, rank after rank in line-rank order, on every rank; every rank gives as
// many.
template <FixedString... Axes, MeshType M, class T>
  requires detail::host_value_v<T>
std::vector<T> gather(const M& mesh, std::span<const T> values) {
  const MPI_Comm comm = detail::line_comm<Axes...>(mesh);
  const auto n = values.size();
  const auto counts = gather<Axes...>(mesh, std::int64_t(n));
  for (const std::int64_t c : counts)
    if (c != std::int64_t(n))
      throw ShapeError("tshard::gather: every rank must give as many values (this rank " + std::to_string(n) +
                       ", another " + std::to_string(c) + ")");
  std::vector<T> out(n * counts.size());
  detail::all_gather(comm, values.data(), detail::Index(n), out.data());
  return out;
}

// Every rank of the line waits for every other.
template <FixedString... Axes, MeshType M>
void barrier(const M& mesh) {
  const MPI_Comm comm = detail::line_comm<Axes...>(mesh);
  detail::CollectiveTimer t("barrier", 0, 0, comm);
  detail::WatchedCall watched("barrier", [] { return detail::current_operator(); });
  MPI_Barrier(comm);
}

// Point to point along the line of one axis: the ranks that share this rank's coordinates on every
// other axis, addressed by their coordinate on Axis (a pipeline's stage). Blocking; the receiver
// gives a buffer of the sent size. `tag` tells apart messages between the same pair.
template <FixedString Axis, MeshType M, class T>
  requires detail::host_value_v<T>
void send(const M& mesh, std::span<const T> values, int to, int tag = 0) {
  auto m = detail::PendingMessage::send(mesh.template comm<Axis>(), to, values.data(), detail::Index(values.size()), tag);
  m.wait();
}
template <FixedString Axis, MeshType M, class T>
  requires detail::host_value_v<T>
void receive(const M& mesh, std::span<T> values, int from, int tag = 0) {
  auto m = detail::PendingMessage::receive(mesh.template comm<Axis>(), from, values.data(), detail::Index(values.size()), tag);
  m.wait();
}

}  // namespace tshard
