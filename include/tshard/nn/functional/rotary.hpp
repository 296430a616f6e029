// Rotary position embeddings (Su et al. 2021, RoFormer) in Hugging Face's rotate_half form: a
// head's features i and i + Dh/2 turn together by the angle p * theta^(-2i/Dh) of position p (or
// by Llama 3's rescaled frequencies).
//
//   auto [cos, sin] = ts::nn::rotary_tables<T, 4, 1, 2>(mesh, t, head_dim, offset);  // [1, t, Dh, 1]
//   auto q = ts::nn::rotary<2>(q_raw, cos, sin);   // q_raw [B, T, Dh, H]: Dh at dim 2
//   auto [c, s] = ts::nn::rotary_tables<T, 4, 1, 2>(mesh, positions, head_dim);  // [B, t, Dh, 1]: a row each
//
// The tables are replicated tensors shaped to broadcast against the activations (t at TDim, Dh at
// DhDim, 1 elsewhere); sin carries rotate_half's sign, so rotary(x) = x cos + swap_halves(x) sin,
// differentiable as the operators it is written with.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/shape.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {

// The frequencies: theta^(-2i/Dh) for pair i, and, where `llama3` is set, Llama 3.1's long-context
// rescaling of them (HF's "rope_type": "llama3": wavelengths past the original context divided by
// `factor`, short ones kept, those between interpolated smoothly).
struct Rope {
  double theta = 10000.0;
  bool llama3 = false;
  double factor = 8, low_freq_factor = 1, high_freq_factor = 4, original_max_position_embeddings = 8192;

  double inverse_frequency(Eigen::Index pair, Eigen::Index head_dim) const {
    const double f = std::pow(theta, -2.0 * double(pair) / double(head_dim));
    if (!llama3) return f;
    const double wavelength = 2 * M_PI / f, low = original_max_position_embeddings / low_freq_factor,
                 high = original_max_position_embeddings / high_freq_factor;
    if (wavelength < high) return f;
    if (wavelength > low) return f / factor;
    const double smooth = (original_max_position_embeddings / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
    return (1 - smooth) * f / factor + smooth * f;
  }
};

namespace detail {
// rotate_half pairs feature i with i + Dh/2: the head dim even and at least 2.
inline void check_rotary_head_dim(Eigen::Index head_dim) {
  if (head_dim < 2 || head_dim % 2 != 0)
    throw ShapeError("tshard::nn::rotary_tables: the head dim " + std::to_string(head_dim) +
                     " must be even and at least 2 (rotate_half pairs feature i with i + head_dim / 2)");
}
}  // namespace detail

// cos and (signed) sin of positions [offset, offset + t) for a head dim of `head_dim` (even), as
// rank-Rank replicated tensors with t at TDim and head_dim at DhDim.
template <class T, int Rank, int TDim, int DhDim, MeshType M>
std::pair<ShardedTensor<T, M, Replicated<Rank>>, ShardedTensor<T, M, Replicated<Rank>>> rotary_tables(
    const M& mesh, Eigen::Index t, Eigen::Index head_dim, Eigen::Index offset = 0, const Rope& rope = {}) {
  static_assert(TDim != DhDim && TDim < Rank && DhDim < Rank, "tshard: rotary_tables' TDim and DhDim are two dims of the tables");
  detail::check_rotary_head_dim(head_dim);
  Eigen::Index dims[Rank];
  std::fill(dims, dims + Rank, 1);
  dims[TDim] = t, dims[DhDim] = head_dim;
  auto table = [&](bool sine) {
    return from_function<T, Replicated<Rank>>(mesh, dims, [=](const auto& i) {
      const Eigen::Index d = i[DhDim], half = head_dim / 2;
      const double angle = double(offset + i[TDim]) * rope.inverse_frequency(d % half, head_dim);
      return T(sine ? (d < half ? -std::sin(angle) : std::sin(angle)) : std::cos(angle));
    });
  };
  return {table(false), table(true)};
}

// The same for positions of each batch row of their own (HF's position_ids [B, T]: positions
// restarted at each packed document, say, from position_in_document): one row of T positions per
// batch row, the tables [B, ...] with B at dim 0, t at TDim and head_dim at DhDim.
template <class T, int Rank, int TDim, int DhDim, MeshType M>
std::pair<ShardedTensor<T, M, Replicated<Rank>>, ShardedTensor<T, M, Replicated<Rank>>> rotary_tables(
    const M& mesh, const std::vector<std::vector<Eigen::Index>>& positions, Eigen::Index head_dim, const Rope& rope = {}) {
  static_assert(TDim != DhDim && TDim > 0 && DhDim > 0 && TDim < Rank && DhDim < Rank,
                "tshard: rotary_tables' TDim and DhDim are two dims of the tables after the batch dim 0");
  detail::check_rotary_head_dim(head_dim);
  if (positions.empty()) throw ShapeError("tshard::nn::rotary_tables: positions has no rows (one per batch row)");
  const Eigen::Index rows = Eigen::Index(positions.size()), t = Eigen::Index(positions[0].size());
  for (std::size_t b = 0; b < positions.size(); ++b) {
    const auto& row = positions[b];
    const std::string at = "tshard::nn::rotary_tables: positions[" + std::to_string(b) + "]";
    if (Eigen::Index(row.size()) != t)
      throw ShapeError(at + " has " + std::to_string(row.size()) + " positions and positions[0] " + std::to_string(t) +
                       ": one row of T per batch row");
    if (std::any_of(row.begin(), row.end(), [](Eigen::Index p) { return p < 0; }))
      throw ShapeError(at + " has a negative position");
  }
  Eigen::Index dims[Rank];
  std::fill(dims, dims + Rank, 1);
  dims[0] = rows, dims[TDim] = t, dims[DhDim] = head_dim;
  auto table = [&](bool sine) {
    return from_function<T, Replicated<Rank>>(mesh, dims, [&](const auto& i) {
      const Eigen::Index d = i[DhDim], half = head_dim / 2;
      const double angle = double(positions[std::size_t(i[0])][std::size_t(i[TDim])]) * rope.inverse_frequency(d % half, head_dim);
      return T(sine ? (d < half ? -std::sin(angle) : std::sin(angle)) : std::cos(angle));
    });
  };
  return {table(false), table(true)};
}

// x with its halves along Dim exchanged: (second half, first half).
template <int Dim, class X>
auto swap_halves(const X& x) {
  Eigen::Index at[X::rank] = {}, half[X::rank], second_at[X::rank] = {};
  const auto e = x.global_shape();
  std::copy(e.begin(), e.end(), half);
  half[Dim] = e[Dim] / 2, second_at[Dim] = e[Dim] / 2;
  return concat<Dim>(slice(x, second_at, half), slice(x, at, half));
}

// x rotated by the tables of rotary_tables (the head dim at Dim).
template <int Dim, class X, class C>
auto rotary(const X& x, const C& cos, const C& sin) {
  static_assert(C::rank == X::rank,
                "tshard: rotary's tables have x's rank (rotary_tables' Rank), shaped to broadcast against x");
  return x * cos + swap_halves<Dim>(x) * sin;
}

}  // namespace tshard::nn
