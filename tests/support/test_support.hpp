// Helpers shared by the MPI tests: collective checks, serial references, mesh enumeration.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <complex>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tshard/tshard.hpp"

namespace tshard_test {

inline int world_rank() { return tshard::Environment::world_rank(); }
inline int world_size() { return tshard::Environment::world_size(); }

// REQUIRE that holds on every rank: all ranks agree, so all fail together and none is left
// waiting in the next collective.
#define TS_REQUIRE_ALL(...)                                                                             \
  do {                                                                                                 \
    const bool ts_ok_ = static_cast<bool>(__VA_ARGS__);                                                \
    INFO("rank " << tshard_test::world_rank() << ": `" #__VA_ARGS__ "` " << (ts_ok_ ? "held" : "FAILED")); \
    REQUIRE(tshard::agree(ts_ok_));                                                                    \
  } while (0)

// Every way to factor `p` ranks into `axes` axis sizes (for 6 and 2 axes: 1x6, 2x3, 3x2, 6x1).
inline std::vector<std::vector<int>> mesh_shapes(int p, int axes) {
  std::vector<std::vector<int>> out;
  if (axes == 1) return {{p}};
  for (int s = 1; s <= p; ++s)
    if (p % s == 0)
      for (auto rest : mesh_shapes(p / s, axes - 1)) {
        rest.insert(rest.begin(), s);
        out.push_back(rest);
      }
  return out;
}

// First mismatch between two tensors of equal shape, or "" when they agree within tol.
template <class T, int R>
std::string compare(const Eigen::Tensor<T, R>& got, const Eigen::Tensor<T, R>& want, double tol = 0) {
  for (int d = 0; d < R; ++d)
    if (got.dimension(d) != want.dimension(d)) return "shapes differ at dim " + std::to_string(d);
  for (Eigen::Index i = 0; i < got.size(); ++i) {
    const double diff = std::abs(std::complex<double>(got.data()[i]) - std::complex<double>(want.data()[i]));
    if (!(diff <= tol)) {
      std::ostringstream s;
      s << "element " << i << " (column-major) is " << got.data()[i] << ", want " << want.data()[i];
      return s.str();
    }
  }
  return "";
}

// A global tensor whose every element tells where it is (bitwise checks of data movement).
template <class T, int R>
Eigen::Tensor<T, R> iota_tensor(const std::array<Eigen::Index, R>& shape, int salt = 0) {
  Eigen::Tensor<T, R> t(shape);
  for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = T(double(i % 100003) + 0.5 * salt);
  return t;
}

// All specs of a given rank over `axes` mesh axes: each axis on at most one dim, in any order
// (11 for rank 2 over 2 axes, 19 for rank 3).
inline std::vector<tshard::detail::SpecDesc> all_specs(int rank, int axes) {
  std::vector<tshard::detail::SpecDesc> out;
  tshard::detail::SpecDesc s;
  s.rank = rank;
  std::function<void(int, std::uint32_t)> place = [&](int dim, std::uint32_t used) {
    if (dim == rank) {
      out.push_back(s);
      return;
    }
    std::function<void(std::uint32_t)> extend = [&](std::uint32_t u) {
      place(dim + 1, u);
      for (int a = 0; a < axes; ++a)
        if (!(u & (1u << a))) {
          s.dims[dim].push(a);
          extend(u | (1u << a));
          s.dims[dim].count--;
        }
    };
    extend(used);
  };
  place(0, 0);
  return out;
}

// This rank's padded block of a global column-major tensor laid out as `spec`.
template <class T>
std::vector<T> local_block(tshard::detail::MeshState& mesh, const tshard::detail::SpecDesc& spec,
                           const tshard::detail::Extents& shape, const T* global) {
  const auto l = tshard::detail::shard_layout(spec, shape, mesh.shape(), mesh.coords());
  std::vector<T> block(static_cast<std::size_t>(std::max<tshard::detail::Index>(l.padded_size(), 1)), T(-7));
  tshard::detail::copy_box(global, shape, l.offset, block.data(), l.padded, tshard::detail::Extents{}, l.valid, spec.rank);
  return block;
}

// The global value of a block laid out as `spec` (a partial is resolved), on every rank.
template <class T>
std::vector<T> global_of(tshard::detail::MeshState& mesh, const tshard::detail::SpecDesc& spec,
                         const tshard::detail::Extents& shape, const T* block) {
  std::vector<T> g(static_cast<std::size_t>(std::max<tshard::detail::Index>(tshard::detail::volume(shape, spec.rank), 1)));
  tshard::detail::gather_to_all(mesh, spec, shape, block, g.data());
  return g;
}

}  // namespace tshard_test
