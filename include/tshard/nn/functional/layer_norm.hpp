// Layer normalisation over the last dim (which may be split: its mean and variance are partials
// resolved over one value per row), with its backward (Ba, Kiros, Hinton 2016).
#pragma once
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "tshard/core/dispatch.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/ad/custom_vjp.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/tensor/factories.hpp"
#include "tshard/ops/reduce.hpp"

namespace tshard::nn {
namespace detail {

// (x - mean) and 1 / sqrt(var + eps) along the last dim.
template <int Dim, class X, class T>
auto normalised(const X& x, T eps) {
  auto xc = x - mean<Dim>(x, keep_dims);
  using A = accumulator_t<T>;
  auto rstd = tshard::map([eps](T v) { return T(A(1) / std::sqrt(A(v) + A(eps))); }, mean<Dim>(square(xc), keep_dims));
  return std::pair{std::move(xc), std::move(rstd)};
}

// The fused kernels run where each rank holds whole rows: the last dim and gamma, beta not
// split, nothing partial (else the general path of partials below).
template <class X, class G, class B>
inline constexpr bool fused_layer_norm_v = !X::is_partial && !G::is_partial && !B::is_partial &&
                                           X::spec_desc.dims[X::rank - 1].count == 0 && G::spec_desc.dims[0].count == 0 &&
                                           B::spec_desc.dims[0].count == 0 &&
                                           std::is_same_v<typename X::Scalar, typename G::Scalar> &&
                                           std::is_same_v<typename X::Scalar, typename B::Scalar>;

// The local block as [rows, n]: rows the padded leading dims (contiguous), n the last dim.
template <class X>
std::pair<tshard::detail::Index, tshard::detail::Index> row_view(const X& x) {
  const auto& l = tshard::detail::layout_of(x);
  tshard::detail::Index rows = 1;
  for (int k = 0; k + 1 < X::rank; ++k) rows *= l.padded[k];
  return {rows, l.padded[X::rank - 1]};
}

// Whether padded row r (column-major over the leading dims) is a valid row of the block.
inline bool row_is_valid(const tshard::detail::ShardLayout& l, int dims, tshard::detail::Index r) {
  for (int k = 0; k < dims; ++k) {
    if (r % l.padded[k] >= l.valid[k]) return false;
    r /= l.padded[k];
  }
  return true;
}

// Per row: the mean and 1 / sqrt(var + eps), two passes over contiguous rows (padding rows get
// values too; nothing reads them).
// Kept in A: T itself, float for bfloat16.
template <class T, class A>
void row_statistics(const T* x, tshard::detail::Index rows, tshard::detail::Index n, A eps, A* mean, A* rstd) {
  std::fill(mean, mean + rows, A(0));
  std::fill(rstd, rstd + rows, A(0));
  for (tshard::detail::Index d = 0; d < n; ++d)
    for (tshard::detail::Index r = 0; r < rows; ++r) mean[r] += A(x[r + rows * d]);
  for (tshard::detail::Index r = 0; r < rows; ++r) mean[r] /= A(n);
  for (tshard::detail::Index d = 0; d < n; ++d)
    for (tshard::detail::Index r = 0; r < rows; ++r) {
      const A c = A(x[r + rows * d]) - mean[r];
      rstd[r] += c * c;
    }
  for (tshard::detail::Index r = 0; r < rows; ++r) rstd[r] = A(1) / std::sqrt(rstd[r] / A(n) + eps);
}

// y = (x - mean) rstd gamma + beta over whole rows [rows, n] (column-major). Dispatched
// (core/dispatch.hpp).
template <class T, class A>
void layer_norm_rows(const T* x, tshard::detail::Index rows, tshard::detail::Index n, A eps, const T* gamma, const T* beta,
                     T* y) {
  TSHARD_DISPATCH((layer_norm_rows<T, A>), x, rows, n, eps, gamma, beta, y);
  std::vector<A> mean(static_cast<std::size_t>(rows)), rstd(mean.size());
  row_statistics(x, rows, n, eps, mean.data(), rstd.data());
  for (tshard::detail::Index d = 0; d < n; ++d)
    for (tshard::detail::Index r = 0; r < rows; ++r)
      y[r + rows * d] = T((A(x[r + rows * d]) - mean[std::size_t(r)]) * rstd[std::size_t(r)] * A(gamma[d]) + A(beta[d]));
}

// The backward over whole rows: two passes after the statistics, dgamma, dbeta and the row sums of
// dxhat and dxhat xhat, then dx. counted[r] is 1 for valid rows (0: padding, left out of dgamma
// and dbeta); extent is the normalised dim's global size. Dispatched.
template <class T, class A>
void layer_norm_backward_rows(const T* x, tshard::detail::Index rows, tshard::detail::Index n, tshard::detail::Index extent,
                              A eps, const T* gamma, const T* dn, const A* counted, T* dx, T* dgamma, T* dbeta) {
  TSHARD_DISPATCH((layer_norm_backward_rows<T, A>), x, rows, n, extent, eps, gamma, dn, counted, dx, dgamma, dbeta);
  using tshard::detail::Index;
  std::vector<A> mean(static_cast<std::size_t>(rows)), rstd(mean.size()), a(mean.size()), c(mean.size());
  row_statistics(x, rows, n, eps, mean.data(), rstd.data());
  for (Index d = 0; d < n; ++d) {
    A sg = A(0), sb = A(0);
    for (Index r = 0; r < rows; ++r) {
      const A xhat = (A(x[r + rows * d]) - mean[std::size_t(r)]) * rstd[std::size_t(r)];
      const A dnv = A(dn[r + rows * d]);
      const A dxhat = dnv * A(gamma[d]);
      a[std::size_t(r)] += dxhat;
      c[std::size_t(r)] += dxhat * xhat;
      if (counted[r] != A(0)) {  // padding rows may hold anything, NaN included
        sg += dnv * xhat;
        sb += dnv;
      }
    }
    dgamma[d] = T(sg);
    dbeta[d] = T(sb);
  }
  const A inv_n = A(1) / A(extent);
  for (Index d = 0; d < n; ++d)
    for (Index r = 0; r < rows; ++r) {
      const A xhat = (A(x[r + rows * d]) - mean[std::size_t(r)]) * rstd[std::size_t(r)];
      const A dxhat = A(dn[r + rows * d]) * A(gamma[d]);
      dx[r + rows * d] = T(rstd[std::size_t(r)] * (dxhat - a[std::size_t(r)] * inv_n - xhat * c[std::size_t(r)] * inv_n));
    }
}

}  // namespace detail

template <int Dim, tshard::detail::FloatingTensor X, tshard::detail::FloatingTensor G, tshard::detail::FloatingTensor DN>
auto layer_norm_backward(const X& x, const G& gamma, const DN& dn, typename X::Scalar eps);

namespace detail {
template <int Dim, class X, class G, class B>
auto layer_norm_forward(const X& x, const G& gamma, const B& beta, typename X::Scalar eps) {
  if constexpr (detail::fused_layer_norm_v<X, G, B>) {
    using T = typename X::Scalar;
    using A = accumulator_t<T>;
    ShardedTensor<T, typename X::MeshT, typename X::SpecType> y(x.mesh(), x.global_shape());
    const auto [rows, n] = detail::row_view(x);
    detail::layer_norm_rows<T, A>(x.data(), rows, n, A(eps), gamma.data(), beta.data(), y.data());
    return y;
  } else {
    auto [xc, rstd] = detail::normalised<Dim>(x, eps);
    return xc * rstd * gamma + beta;
  }
}
}  // namespace detail

// (x - mean) / sqrt(var + eps) * gamma + beta along Dim, the last dim; gamma and beta: [H].
// Under a gradient, one node whose rule is layer_norm_backward (the statistics recomputed).
template <int Dim, tshard::detail::FloatingTensor X, tshard::detail::FloatingTensor G, tshard::detail::FloatingTensor B>
auto layer_norm(const X& x, const G& gamma, const B& beta, typename X::Scalar eps) {
  static_assert(Dim == X::rank - 1, "tshard: layer_norm normalises the last dim (gamma and beta align with it)");
  static_assert(G::rank == 1 && B::rank == 1, "tshard: layer_norm's gamma and beta are rank-1 tensors [H]");
  tshard::detail::OperatorScope scope("layer_norm");
  return ad::custom_vjp(
      [eps](const auto& v, const auto& g, const auto& b) { return detail::layer_norm_forward<Dim>(v, g, b, eps); },
      [eps](const auto& dn, const auto&, const auto& v, const auto& g, const auto&) {
        return layer_norm_backward<Dim>(v, g, dn, eps);
      },
      x, gamma, beta);
}

// dx, dgamma, dbeta given x, gamma and dL/dn (the statistics are recomputed). dgamma and dbeta
// are sums over the rows: partial sums where the rows are split, resolved when used.
template <int Dim, tshard::detail::FloatingTensor X, tshard::detail::FloatingTensor G, tshard::detail::FloatingTensor DN>
auto layer_norm_backward(const X& x, const G& gamma, const DN& dn, typename X::Scalar eps) {
  static_assert(Dim == X::rank - 1, "tshard: layer_norm normalises the last dim (gamma and beta align with it)");
  static_assert(G::rank == 1, "tshard: layer_norm's gamma is a rank-1 tensor [H]");
  tshard::detail::OperatorScope scope("layer_norm_backward");
  tshard::detail::refuse_tracked("nn::layer_norm_backward", tshard::detail::kNoSecondOrder, x, gamma, dn);
  if constexpr (detail::fused_layer_norm_v<X, G, G> && !DN::is_partial &&
                std::is_same_v<typename DN::SpecType, typename X::SpecType>) {
    // Two passes after the statistics: dgamma, dbeta and the row sums of dxhat and dxhat xhat,
    // then dx. dgamma and dbeta are partials over the rows' axes, as on the general path.
    using T = typename X::Scalar;
    using Part = decltype(sum_leading_dims(x));
    ShardedTensor<T, typename X::MeshT, typename X::SpecType> dx(x.mesh(), x.global_shape());
    Part dgamma(x.mesh(), {tshard::detail::extents_of(x)[Dim]}), dbeta(x.mesh(), {tshard::detail::extents_of(x)[Dim]});
    const auto [rows, n] = detail::row_view(x);
    using A = accumulator_t<T>;
    const auto& layout = tshard::detail::layout_of(x);
    std::vector<A> counted(static_cast<std::size_t>(rows));  // 1 for valid rows, 0 for padding
    for (tshard::detail::Index r = 0; r < rows; ++r) counted[std::size_t(r)] = detail::row_is_valid(layout, Dim, r) ? A(1) : A(0);
    detail::layer_norm_backward_rows<T, A>(x.data(), rows, n, tshard::detail::extents_of(x)[Dim], A(eps), gamma.data(),
                                           dn.data(), counted.data(), dx.data(), dgamma.data(), dbeta.data());
    return std::tuple{std::move(dx), std::move(dgamma), std::move(dbeta)};
  }
  auto [xc, rstd] = detail::normalised<Dim>(x, eps);
  auto xhat = xc * rstd;
  auto dgamma = sum_leading_dims(dn * xhat);
  auto dbeta = sum_leading_dims(dn);
  auto dxhat = dn * gamma;
  auto dx = rstd * (dxhat - mean<Dim>(dxhat, keep_dims) - xhat * mean<Dim>(dxhat * xhat, keep_dims));
  return std::tuple{std::move(dx), std::move(dgamma), std::move(dbeta)};
}

}  // namespace tshard::nn

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::nn::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void row_statistics<T, T>(const T*, tshard::detail::Index, \
    tshard::detail::Index, T, T*, T*))
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (layer_norm_rows<T, T>), const T*, tshard::detail::Index, \
    tshard::detail::Index, T, const T*, const T*, T*)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (layer_norm_backward_rows<T, T>), const T*, \
    tshard::detail::Index, tshard::detail::Index, tshard::detail::Index, T, const T*, const T*, const T*, T*, T*, T*)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::nn::detail
