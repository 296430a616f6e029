// Scalars of sharded tensors on the host: dot, norm, and item() of a full reduction. The product
// is fused into the local sum (no tensor of products is made), an unevaluated `s * x` is read as
// it lies, and one all-reduce of one number over the axes the tensor is split by gives every rank
// the same value (replicated axes hold the same sums and send nothing). The one-rank result up to
// the order of summation: each rank sums its block, then the blocks are summed.
//
//   double rr = ts::dot(r, r);                 // sum of r_i * r_i; conj(a_i) * b_i for complex
//   double e = ts::norm(u - v, ts::inf);       // max |u_i - v_i|; norm(x) is the 2-norm
//   double total = ts::sum<0, 1, 2>(u).item(); // a reduction to no dims, as a number
#pragma once
#include <cmath>
#include <complex>
#include <limits>
#include <string>
#include <type_traits>

#include "tshard/comm/collectives.hpp"
#include "tshard/core/box_copy.hpp"
#include "tshard/core/error.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/sharded_tensor.hpp"
#include "tshard/tensor/tape.hpp"

namespace tshard {

// The order of the max norm: ts::norm(x, ts::inf).
inline constexpr double inf = std::numeric_limits<double>::infinity();

namespace detail {

// Float sums run in double: a dot of a million floats keeps its digits, as BLAS's dsdot does.
template <class T>
using wide_t = std::conditional_t<std::is_same_v<T, float>, double,
                                  std::conditional_t<std::is_same_v<T, std::complex<float>>, std::complex<double>, T>>;

template <class T>
constexpr auto conj_if_complex(const T& v) {
  if constexpr (is_complex_v<T>)
    return std::conj(v);
  else
    return v;
}

// The communicator of the axes a spec splits its dims by (the ranks holding different blocks of
// one copy); null where it splits none.
inline MPI_Comm split_group(MeshState& mesh, const SpecDesc& spec) {
  return spec.split_axes() ? mesh.group_of_mask(spec.split_axes()) : MPI_COMM_NULL;
}

// What dot and norm refuse to leave the tape with: a number has no place on it. (item() reads a
// tracked tensor's value, as PyTorch's loss.item() does: no gradient flows through the number.)
inline constexpr const char* kScalarInstead =
    "a host number cannot carry a gradient: take the gradient of a tensor result, such as ts::sum<...>(a * b)";

template <class T, class M, class S, class P>
const ShardedTensor<T, M, S, P>& scalar_operand(const ShardedTensor<T, M, S, P>& x, const char* op) {
  refuse_tracked(op, kScalarInstead, x);
  if (x.padded_size() > 0 && !TensorAccess::buffer(x).data) throw_released(op, x.describe());
  return x;
}

// Sum over this rank's block of conj(a) * b, both laid out as `a`, scaled as each still is.
template <class T, class M, class S>
wide_t<T> local_dot(const ShardedTensor<T, M, S>& a, const ShardedTensor<T, M, S>& b) {
  using W = wide_t<T>;
  const ScaledBuffer<T> ba = TensorAccess::buffer(a), bb = TensorAccess::buffer(b);
  W s{};
  if (ba.data == bb.data) {  // a norm: one stream
    for_each_valid_run(layout_of(a), [&](Index off, Index n) {
      const T* x = ba.data + off;
      for (Index i = 0; i < n; ++i) s += W(conj_if_complex(x[i])) * W(x[i]);
    });
  } else {
    for_each_valid_run(layout_of(a), [&](Index off, Index n) {
      const T *x = ba.data + off, *y = bb.data + off;
      for (Index i = 0; i < n; ++i) s += W(conj_if_complex(x[i])) * W(y[i]);
    });
  }
  return s * W(conj_if_complex(ba.scale)) * W(bb.scale);
}

// conj(a) . b summed over every rank, in the wide type: dot's value, and norm's before its root.
template <class T, class M, class SA, class PA, class SB, class PB>
wide_t<T> global_dot(const ShardedTensor<T, M, SA, PA>& a_in, const ShardedTensor<T, M, SB, PB>& b_in) {
  static_assert(SA::rank == SB::rank, "tshard: dot takes two tensors of the same shape (it sums over every element)");
  static_assert(!std::is_same_v<T, bool>, "tshard: masks (bool tensors) have no dot: where(mask, 1, 0) gives numbers");
  require_same_mesh(a_in, b_in, "dot");
  if (extents_of(a_in) != extents_of(b_in))
    throw ShapeError("tshard::dot: the operands' shapes differ: " + a_in.describe() + " and " + b_in.describe());
  const auto& a = resolved(scalar_operand(a_in, "dot"), "dot");
  const auto& b_res = resolved(scalar_operand(b_in, "dot"), "dot");
  auto compute = [&](const auto& b) {
    wide_t<T> s = local_dot(a, b);
    if (MPI_Comm g = split_group(*state_of(a.mesh()), a.spec_desc); g != MPI_COMM_NULL)
      all_reduce(g, &s, &s, 1, ReduceOp::Sum);
    return s;
  };
  if constexpr (std::is_same_v<SA, SB>)
    return compute(b_res);
  else
    return compute(implicit_reshard<SA>(b_res, "dot"));
}

// dot and norm are function objects, as std::ranges' algorithms are: argument-dependent lookup
// never finds them, so a caller's own unqualified dot(a, b) over tshard tensors stays its own.
struct DotFunction {
  template <class T, class M, class SA, class PA, class SB, class PB>
  T operator()(const ShardedTensor<T, M, SA, PA>& a, const ShardedTensor<T, M, SB, PB>& b) const {
    OperatorScope scope("dot");
    return T(global_dot(a, b));
  }
};

struct NormFunction {
  template <class T, class M, class S, class P>
  auto operator()(const ShardedTensor<T, M, S, P>& x_in, double ord = 2) const {
    static_assert(!std::is_same_v<T, bool>, "tshard: masks (bool tensors) have no norm: where(mask, 1, 0) gives numbers");
    using Real = decltype(std::abs(T{}));
    using Wide = decltype(std::abs(wide_t<T>{}));
    OperatorScope scope("norm");
    if (ord != 1 && ord != 2 && ord != inf)
      throw ValueError("tshard::norm: the order is 1, 2 or ts::inf, not " + std::to_string(ord));
    const auto& x = resolved(scalar_operand(x_in, "norm"), "norm");
    if (ord == 2) return Real(std::sqrt(std::real(global_dot(x, x))));
    const ScaledBuffer<T> bx = TensorAccess::buffer(x);
    // (max, whether a NaN was seen): a NaN wins, so a diverged solve is seen, though neither
    // a comparison nor MPI's max keeps one.
    Wide s[2] = {0, 0};
    for_each_valid_run(layout_of(x), [&](Index off, Index n) {
      const T* v = bx.data + off;
      for (Index i = 0; i < n; ++i) {
        const Wide m = Wide(std::abs(v[i]));
        if (ord == 1)
          s[0] += m;
        else if (std::isnan(m))
          s[1] = 1;
        else if (m > s[0])
          s[0] = m;
      }
    });
    s[0] *= Wide(std::abs(bx.scale));
    if (MPI_Comm g = split_group(*state_of(x.mesh()), x.spec_desc); g != MPI_COMM_NULL)
      all_reduce(g, s, s, ord == 1 ? 1 : 2, ord == 1 ? ReduceOp::Sum : ReduceOp::Max);
    return s[1] != 0 ? std::numeric_limits<Real>::quiet_NaN() : Real(s[0]);
  }
};

}  // namespace detail

// ts::dot(a, b): the inner product of two tensors of one global shape, the sum of conj(a_i) * b_i
// (numpy's vdot; a_i * b_i for real values). b is aligned to a's layout where the two differ (an
// implicit reshard, refused under ImplicitCommunication::Forbid) and partials are summed first.
// Collective over the mesh; every rank returns the same number.
inline constexpr detail::DotFunction dot{};

// ts::norm(x, ord = 2): the 2-norm sqrt(sum |x_i|^2), the 1-norm (ord 1) or the max norm
// max |x_i| (ord ts::inf) of every element, as a real number on every rank; a NaN element gives
// NaN. Collective.
inline constexpr detail::NormFunction norm{};

}  // namespace tshard
