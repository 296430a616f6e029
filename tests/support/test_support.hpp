// Helpers shared by the MPI tests: collective checks, serial references, mesh enumeration.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <complex>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
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

// ---- typed-API helpers: 2-D meshes over the world, spec lists, serial values ----
using M2 = tshard::Mesh<"x", "y">;

template <class... T>
struct TypeList {};
template <class... T, class F>
void for_each_type(TypeList<T...>, F&& f) {
  (f(static_cast<T*>(nullptr)), ...);
}
// Representative pairs from two spec lists, 2n instead of n^2 (compile time: each pair is a new
// set of template instances): every A_i with B_i and with B_(i+1), so each spec meets itself
// and a different one. Every pair is covered at run time by the descriptor-level tests.
template <class... A, class... B, class F>
void for_each_pair(TypeList<A...>, TypeList<B...>, F&& f) {
  using Bs = std::tuple<B...>;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((f(static_cast<A*>(nullptr), static_cast<std::tuple_element_t<I % sizeof...(B), Bs>*>(nullptr)),
      f(static_cast<A*>(nullptr), static_cast<std::tuple_element_t<(I + 1) % sizeof...(B), Bs>*>(nullptr))),
     ...);
  }(std::index_sequence_for<A...>{});
}

// R, S over one axis, two axes in both orders, on either dim: every case of the per-dim rules.
using Specs2 = TypeList<tshard::Spec<tshard::R, tshard::R>, tshard::Spec<tshard::S<"x">, tshard::R>,
                        tshard::Spec<tshard::R, tshard::S<"y">>, tshard::Spec<tshard::S<"y">, tshard::S<"x">>,
                        tshard::Spec<tshard::S<"x", "y">, tshard::R>>;

// f(mesh, sizes) on every 2-D mesh of the world size (for 6 ranks: 1x6, 2x3, 3x2, 6x1).
template <class F>
void on_every_mesh(F&& f) {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    f(mesh, sizes);
  }
}

// What f() throws as a tshard::Error ("" if nothing): for tests of the message every rank gives.
template <class F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const tshard::Error& e) {
    return e.what();
  }
  return "";
}

inline Eigen::Tensor<double, 2> values(Eigen::Index r, Eigen::Index c, int salt) {
  Eigen::Tensor<double, 2> t(r, c);
  for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = std::sin(double(i * 7 + salt)) + 0.1 * salt;
  return t;
}

// C = einsum over column-major buffers, serially (labels as in the string).
inline std::vector<double> serial_einsum(const tshard::detail::EinsumLabels& e, const tshard::detail::Extents& sa,
                                         const std::vector<double>& a, const tshard::detail::Extents& sb,
                                         const std::vector<double>& b, const tshard::detail::Extents& so) {
  namespace d = tshard::detail;
  std::map<char, d::Index> extent;
  for (int i = 0; i < e.na; ++i) extent[e.a[i]] = sa[i];
  for (int i = 0; i < e.nb; ++i) extent[e.b[i]] = sb[i];
  std::vector<char> labels;
  for (auto& [c, n] : extent) labels.push_back(c);
  std::vector<double> out(static_cast<std::size_t>(std::max<d::Index>(d::volume(so, e.no), 1)), 0.0);
  std::map<char, d::Index> at;
  std::function<void(std::size_t)> loop = [&](std::size_t li) {
    if (li == labels.size()) {
      auto lin = [&](const std::array<char, d::kMaxRank>& l, int n, const d::Extents& s) {
        d::Index x = 0, stride = 1;
        for (int i = 0; i < n; ++i) {
          x += at[l[i]] * stride;
          stride *= s[i];
        }
        return x;
      };
      out[lin(e.o, e.no, so)] += a[lin(e.a, e.na, sa)] * b[lin(e.b, e.nb, sb)];
      return;
    }
    for (at[labels[li]] = 0; at[labels[li]] < extent[labels[li]]; ++at[labels[li]]) loop(li + 1);
  };
  loop(0);
  return out;
}

}  // namespace tshard_test
