// How elementwise operands meet: numpy's rank alignment and broadcasting, the elementwise spec
// rule (docs/architecture.md) at compile time and on descriptors, the run engine that walks an
// output's padded block with each operand's offset and stride, and the alignment of an operand
// to the output's layout (an implicit reshard, counted and forbiddable). Kernels built on it are
// instantiated per element type, never per spec.
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>

#include <cmath>
#include <complex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "tshard/core/box_copy.hpp"
#include "tshard/core/spec_algebra.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/factories.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {
namespace detail {

// ---- rank alignment (numpy): missing leading dims are replicated dims of extent 1 ----

template <int N, class SpecT>
struct prepend_replicated {
  using type = SpecT;
};
template <int N, class... D>
  requires(N > 0)
struct prepend_replicated<N, Spec<D...>> {
  using type = typename prepend_replicated<N - 1, Spec<R, D...>>::type;
};
// SpecT seen as a spec of rank Rank: numpy aligns the last dims, so R dims go in front.
template <class SpecT, int Rank>
using spec_of_rank = typename prepend_replicated<Rank - SpecT::rank, SpecT>::type;

// The extents of a rank-`from` tensor seen at rank `to`: leading extents of 1. In column-major
// order this is the same buffer: a dim of extent 1 in front moves no element.
inline Extents extents_of_rank(const Extents& e, int from, int to) {
  Extents out{};
  for (int d = 0; d < to; ++d) out[d] = d < to - from ? 1 : e[d - (to - from)];
  return out;
}

// The descriptor of a tensor type seen at rank Rank.
template <class X, int Rank>
constexpr SpecDesc desc_of_rank() {
  return make_desc<spec_of_rank<typename X::SpecType, Rank>, typename X::PartialType>(X::MeshT::axis_names);
}

// ---- the elementwise spec rule ----

// Elementwise specs (docs/architecture.md) on descriptors: per dim the left operand's split; else the
// right's where its axes are free in the left's spec; else R. Shared by the typed API (at
// compile time) and by descriptor code (at run time).
constexpr SpecDesc elementwise_desc(const SpecDesc& a, const SpecDesc& b) {
  SpecDesc o;
  o.rank = a.rank;
  const std::uint32_t left = a.split_axes();
  for (int d = 0; d < a.rank; ++d) o.dims[d] = a.dims[d].count ? a.dims[d] : (b.dims[d].mask() & left) ? DimSplit{} : b.dims[d];
  return o;
}

// The elementwise rule as a type, built from the same decision (operands of one rank).
template <class SA, class SB, class M>
struct elementwise_type {
  static constexpr SpecDesc da = make_desc<SA, NoPartial>(M::axis_names);
  static constexpr SpecDesc db = make_desc<SB, NoPartial>(M::axis_names);
  static constexpr auto choice = [] {
    std::array<int, std::size_t(SA::rank)> c{};
    const std::uint32_t left = da.split_axes();
    for (int d = 0; d < SA::rank; ++d) c[d] = da.dims[d].count ? 0 : (db.dims[d].mask() & left) ? 2 : 1;
    return c;
  }();
  using type = typename merge_dims<SA, SB, choice>::type;
};

// The rule folded left to right over several operand types (any ranks, aligned at the last dim).
template <class M, int Rank, class... S>
struct elementwise_fold;
template <class M, int Rank, class S>
struct elementwise_fold<M, Rank, S> {
  using type = spec_of_rank<S, Rank>;
};
template <class M, int Rank, class S1, class S2, class... Rest>
struct elementwise_fold<M, Rank, S1, S2, Rest...> {
  using first = typename elementwise_type<spec_of_rank<S1, Rank>, spec_of_rank<S2, Rank>, M>::type;
  using type = typename elementwise_fold<M, Rank, first, Rest...>::type;
};

template <class... X>
inline constexpr int max_rank_v = std::max({X::rank...});

// The shape operands broadcast to (each given at the output's rank); ShapeError where not.
inline Extents broadcast_shape(const Extents& a, const Extents& b, int rank, const char* op, Text da, Text db) {
  Extents s{};
  for (int d = 0; d < rank; ++d) {
    if (a[d] != b[d] && a[d] != 1 && b[d] != 1)
      throw ShapeError(std::string("tshard::") + op + ": shapes do not broadcast: a is " + da.str() + ", b is " + db.str());
    s[d] = a[d] == 1 ? b[d] : a[d];
  }
  return s;
}

// ---- the local engine: runs of the output with each operand's offset and inner stride ----

// Calls f(out_offset, offsets, inner_strides, length) over the output's padded block (extents
// `out`) in runs; an operand whose extent is 1 where the output's is not is read with stride 0
// along that dim (broadcast). A run spans the leading dims across which every operand is read
// either contiguously or as one broadcast element (inner stride 1 or 0): [B, T, D] x [B, T, 1]
// runs over B T, not B. Without broadcasting the whole block is one run.
template <std::size_t N, class F>
void for_each_broadcast_run(const Extents& out, int rank, const std::array<Extents, N>& in, F&& f) {
  const Index n = volume(out, rank);
  if (n == 0) return;
  enum Read : unsigned char { Unknown, Contiguous, Broadcast };
  std::array<Read, N> read{};
  int first = 0;  // dims [0, first) form the run
  for (; first < rank; ++first) {
    if (out[first] == 1) continue;  // merges whatever the operands do
    std::array<Read, N> next = read;
    bool merges = true;
    for (std::size_t j = 0; j < N; ++j) {
      const Read r = in[j][first] == out[first] ? Contiguous : Broadcast;
      merges &= next[j] == Unknown || next[j] == r;
      next[j] = r;
    }
    if (!merges) break;
    read = next;
  }
  std::array<Index, N> off{}, inner{};
  for (std::size_t j = 0; j < N; ++j) inner[j] = read[j] == Broadcast ? 0 : 1;
  if (first >= rank) return f(Index(0), off, inner, n);
  std::array<Extents, N> stride{};
  for (std::size_t j = 0; j < N; ++j)
    for (Index d = 0, t = 1; d < rank; ++d) {
      stride[j][d] = in[j][d] == out[d] ? t : 0;
      t *= in[j][d];
    }
  const Index run = volume(out, first);
  Extents i{};
  for (Index o = 0;; o += run) {
    for (std::size_t j = 0; j < N; ++j) {
      off[j] = 0;
      for (int d = first; d < rank; ++d) off[j] += i[d] * stride[j][d];
    }
    f(o, off, inner, run);
    int d = first;
    for (; d < rank; ++d) {
      if (++i[d] < out[d]) break;
      i[d] = 0;
    }
    if (d >= rank) return;
  }
}

// One operand run as an Eigen array expression: contiguous, or strided (0: broadcast).
template <class T, class G>
void with_run(const T* p, Index inner, Index length, G&& g) {
  using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
  if (inner == 1)
    g(Eigen::Map<const Array>(p, length));
  else
    g(Eigen::Map<const Array, 0, Eigen::InnerStride<>>(p, length, Eigen::InnerStride<>(inner)));
}

// An operand laid out as the output needs it (aligned by an implicit reshard where it is not)
// with its padded extents.
template <class T>
struct AlignedInput {
  AlignedOperand<T> buffer;
  Extents padded{};
};

// The operand (descriptor `have` over `shape`) aligned to the output (dout over sout): the
// output's split on the dims where its extent matches, replicated where it broadcasts.
template <class T>
AlignedInput<T> align_input(MeshState& mesh, const SpecDesc& have, const Extents& shape, const T* data,
                            const SpecDesc& dout, const Extents& sout, const char* name) {
  SpecDesc want = dout;
  want.partial = have.partial;
  want.partial_axes = have.partial_axes;
  for (int d = 0; d < dout.rank; ++d)
    if (shape[d] != sout[d]) want.dims[d] = DimSplit{};
  AlignedInput<T> in{implicit_reshard(mesh, have, want, shape, data, name)};
  in.padded = shard_layout(want, shape, mesh.shape(), mesh.coords()).padded;
  return in;
}

template <class X>
inline constexpr bool is_partial_sum_v =
    X::PartialType::is_partial && partial_kind<typename X::PartialType>() == PartialKind::Sum;

template <class T>
inline constexpr bool no_arithmetic_on_masks = !std::is_same_v<T, bool>;

// An operator with an arbitrary function has no derivative to record: a gradient taken through
// it would silently be wrong, so it is refused (the same on every rank: tracking is global).
[[noreturn]] inline void refuse_untraceable(const char* op, const std::string& x) {
  throw SpecError(std::string("tshard::") + op + ": " + x +
                  " is tracked by a gradient, and a user function has no derivative: write it with "
                  "differentiable operators, or give it one with ts::ad::custom_vjp");
}


template <class X>
concept RealTensor = ShardedTensorType<X> && Numeric<typename std::remove_cvref_t<X>::Scalar> &&
                     !is_complex_v<typename std::remove_cvref_t<X>::Scalar>;
template <class X>
concept FloatingTensor = ShardedTensorType<X> && Numeric<typename std::remove_cvref_t<X>::Scalar> &&
                         !std::is_integral_v<typename std::remove_cvref_t<X>::Scalar>;

template <class X, class S>
concept ScalarFor = ShardedTensorType<X> && (std::is_arithmetic_v<S> || is_complex_v<S> || std::is_same_v<S, bfloat16>) &&
                    std::is_constructible_v<typename std::remove_cvref_t<X>::Scalar, S>;


enum class BinaryKind { Add, Sub, Mul, Div };
enum class UnaryKind { Exp, Log, Tanh, Relu, Sqrt, Abs, Neg, Sigmoid, Square };

// The tags of elementwise operators on the tape (tensor/tape.hpp); their rules are in ad/.
namespace grad {
// (any_output: the rule reads nothing of the output's type, see tensor/tape.hpp: the linear ones
// keep only their operands' nodes, the others their values as descriptors.)
template <BinaryKind K>
struct Binary {
  static constexpr bool any_output = true;
};
template <BinaryKind K, bool ScalarLeft, class T>
struct WithScalar {
  static constexpr bool any_output = !(K == BinaryKind::Div && ScalarLeft);
  T s;
};
template <UnaryKind K>
struct Unary {
  static constexpr bool any_output = true;
};
template <class T>
struct Pow {
  T p;
};
struct Where {
  static constexpr bool any_output = true;
};
}  // namespace grad

}  // namespace detail
}  // namespace tshard
