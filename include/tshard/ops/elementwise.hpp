// Elementwise operators: + - * / between sharded tensors and with scalars, comparisons giving
// masks, where(), unary functions and map. Operands of different rank align at their last dim
// and size-1 dims broadcast, as in numpy. Output specs follow the elementwise rule (docs/architecture.md) at
// compile time; operands are aligned by implicit reshards (counted, forbiddable); kernels run
// on padded local blocks and are instantiated per element type, never per spec.
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

enum class BinaryKind { Add, Sub, Mul, Div };
enum class UnaryKind { Exp, Log, Tanh, Relu, Sqrt, Abs, Neg, Sigmoid, Square };

// The tags of elementwise operators on the tape (tensor/tape.hpp); their rules are in ad/.
namespace grad {
template <BinaryKind K>
struct Binary {};
template <BinaryKind K, bool ScalarLeft, class T>
struct WithScalar {
  T s;
};
template <UnaryKind K>
struct Unary {};
template <class T>
struct Pow {
  T p;
};
struct Where {};
}  // namespace grad

// Integer division that leaves padding harmless (padding may hold zeros).
template <class T>
struct SafeDivide {
  T operator()(const T& a, const T& b) const { return b == T(0) ? T(0) : T(a / b); }
};

template <class T, class A, class B, class O>
void assign_binary(BinaryKind k, O&& o, const A& a, const B& b) {
  switch (k) {
    case BinaryKind::Add: o = a + b; break;
    case BinaryKind::Sub: o = a - b; break;
    case BinaryKind::Mul: o = a * b; break;
    case BinaryKind::Div:
      if constexpr (std::is_integral_v<T>)
        o = a.binaryExpr(b, SafeDivide<T>{});
      else
        o = a / b;
      break;
  }
}

// out = (alpha a) (k) (beta b) over padded blocks, one pass; alpha and beta are the factors
// of unevaluated `s * x` operands (1 otherwise).
template <class T>
void binary_kernel(BinaryKind k, T* out, const Extents& op, const T* a, const Extents& ap, T alpha, const T* b,
                   const Extents& bp, T beta, int rank) {
  using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
  const bool scaled = alpha != T(1) || beta != T(1);
  for_each_broadcast_run<2>(op, rank, {ap, bp}, [&](Index o, const auto& off, const auto& inner, Index n) {
    Eigen::Map<Array> dst(out + o, n);
    with_run(a + off[0], inner[0], n, [&](const auto& x) {
      with_run(b + off[1], inner[1], n, [&](const auto& y) {
        if (scaled)
          assign_binary<T>(k, dst, x * alpha, y * beta);
        else
          assign_binary<T>(k, dst, x, y);
      });
    });
  });
}

// out (laid out as dout over sout) = (alpha a) (k) (beta b) on descriptors, instantiated per
// element type: each operand is aligned to the output's layout, replicated where it broadcasts.
template <class T>
void binary_run(MeshState& mesh, BinaryKind k, const SpecDesc& da, const Extents& sa, const T* a, const SpecDesc& db,
                const Extents& sb, const T* b, const SpecDesc& dout, const Extents& sout, T* out, const char* name,
                T alpha = T(1), T beta = T(1)) {
  const auto al = align_input(mesh, da, sa, a, dout, sout, name);
  const auto bl = align_input(mesh, db, sb, b, dout, sout, name);
  const auto lo = shard_layout(dout, sout, mesh.shape(), mesh.coords());
  binary_kernel<T>(k, out, lo.padded, al.buffer.data, al.padded, alpha, bl.buffer.data, bl.padded, beta, dout.rank);
}

template <class X>
inline constexpr bool is_partial_sum_v =
    X::PartialType::is_partial && partial_kind<typename X::PartialType>() == PartialKind::Sum;

// Resolves a partial operand (an implicit all-reduce) or passes a plain one through.
template <class X>
decltype(auto) resolved(const X& x, const char* op) {
  if constexpr (X::is_partial)
    return implicit_reshard<typename X::SpecType>(x, op);
  else
    return (x);
}

template <class T>
inline constexpr bool no_arithmetic_on_masks = !std::is_same_v<T, bool>;

// An operator with an arbitrary function has no derivative to record: a gradient taken through
// it would silently be wrong, so it is refused (the same on every rank: tracking is global).
[[noreturn]] inline void refuse_untraceable(const char* op, const std::string& x) {
  throw SpecError(std::string("tshard::") + op + ": " + x +
                  " is tracked by a gradient, and a user function has no derivative: write it with "
                  "differentiable operators, or give it one with ts::ad::custom_vjp");
}

// expiring_a / expiring_b: the same operands where the caller gave them as rvalues (their
// buffers may then hold the result).
template <BinaryKind K, class T, class M, class SA, class PA, class SB, class PB>
auto binary(const ShardedTensor<T, M, SA, PA>& a, const ShardedTensor<T, M, SB, PB>& b, const char* name,
            std::type_identity_t<ShardedTensor<T, M, SA, PA>>* expiring_a = nullptr,
            std::type_identity_t<ShardedTensor<T, M, SB, PB>>* expiring_b = nullptr) {
  static_assert(no_arithmetic_on_masks<T>, "tshard: masks (bool tensors) take no arithmetic: use where(mask, a, b)");
  using A = ShardedTensor<T, M, SA, PA>;
  using B = ShardedTensor<T, M, SB, PB>;
  // Only partial sum +/- partial sum over the same axes stays partial (docs/architecture.md, Partial).
  constexpr bool keep = (K == BinaryKind::Add || K == BinaryKind::Sub) && is_partial_sum_v<A> &&
                        is_partial_sum_v<B> && same_name_set(PA::names, PB::names);
  OperatorScope scope(name);
  if constexpr ((PA::is_partial || PB::is_partial) && !keep) {
    return binary<K>(resolved(a, name), resolved(b, name), name);
  } else {
    constexpr int Rank = max_rank_v<A, B>;
    using E = elementwise_type<spec_of_rank<SA, Rank>, spec_of_rank<SB, Rank>, M>;
    using Out = ShardedTensor<T, M, typename E::type, std::conditional_t<keep, PA, NoPartial>>;
    static_assert(Out::spec_desc.without_partial() == elementwise_desc(E::da, E::db),
                  "tshard: internal: the typed and descriptor elementwise rules disagree");
    require_same_mesh(a, b, name);
    const Extents ea = extents_of_rank(detail::extents_of(a), A::rank, Rank),
                  eb = extents_of_rank(detail::extents_of(b), B::rank, Rank);
    const Extents shape =
        broadcast_shape(ea, eb, Rank, name, [&] { return a.describe(); }, [&] { return b.describe(); });
    constexpr bool linear = K == BinaryKind::Add || K == BinaryKind::Sub;  // rules that keep no value
    const bool rec = recording(a, b);
    std::optional<A> shape_a;
    std::optional<B> shape_b;
    if (rec && linear) {  // (the nodes, before an operand's buffer is taken)
      shape_a.emplace(tape_shape(a));
      shape_b.emplace(tape_shape(b));
    }
    const auto va = TensorAccess::buffer(a), vb = TensorAccess::buffer(b);
    // An expiring operand of the result's own type and shape (no broadcast) that owns its
    // buffer, without an unevaluated factor, lends it to the result: the kernel reads each
    // element before it writes it, so the arithmetic is the same. Not while a rule would keep
    // the operands' values (multiply and divide under a gradient).
    auto whole = [&](const Extents& e) {  // an operand that does not broadcast
      for (int d = 0; d < Rank; ++d)
        if (e[d] != shape[d]) return false;
      return true;
    };
    Out out = [&] {
      if (linear || !rec) {
        if constexpr (std::is_same_v<A, Out>)
          if (expiring_a && whole(ea) && TensorAccess::reusable(*expiring_a)) return TensorAccess::taken(std::move(*expiring_a));
        if constexpr (std::is_same_v<B, Out>)
          if (expiring_b && whole(eb) && TensorAccess::reusable(*expiring_b)) return TensorAccess::taken(std::move(*expiring_b));
      }
      return Out(a.mesh(), to_array<Rank>(shape));
    }();
    // (out's mesh: an operand whose buffer out took has expired)
    binary_run<T>(*detail::state_of(out.mesh()), K, desc_of_rank<A, Rank>(), ea, va.data, desc_of_rank<B, Rank>(), eb,
                  vb.data, Out::spec_desc, shape, out.data(), name, va.scale, vb.scale);
    if (rec) {
      if constexpr (linear)
        record(out, grad::Binary<K>{}, std::move(*shape_a), std::move(*shape_b));
      else
        record(out, grad::Binary<K>{}, tape_value(a), tape_value(b));
    }
    return out;
  }
}

// out = in (k) v, or v (k) in where ScalarLeft, over n elements: the kernel of with_scalar,
// instantiated per element type, not per spec.
template <BinaryKind K, bool ScalarLeft, class T>
void scalar_run(const T* in, T v, T* o, Index n) {
  Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>> xi(in, n);
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> xo(o, n);
  if constexpr (K == BinaryKind::Add) xo = xi + v;
  if constexpr (K == BinaryKind::Sub) {
    if constexpr (ScalarLeft) xo = v - xi;
    else xo = xi - v;
  }
  if constexpr (K == BinaryKind::Div) {
    if constexpr (std::is_integral_v<T>) {
      for (Index i = 0; i < n; ++i) o[i] = ScalarLeft ? SafeDivide<T>{}(v, in[i]) : SafeDivide<T>{}(in[i], v);
    } else if constexpr (ScalarLeft) {
      xo = v / xi;
    } else {
      xo = xi / v;
    }
  }
}

// tensor (k) scalar, or scalar (k) tensor where ScalarLeft. Only partial sum * s, s * partial
// sum and partial sum / s stay partial: s - p, s / p and p + s would count s once per rank.
template <BinaryKind K, bool ScalarLeft, class X, class S>
auto with_scalar(const X& x, S s, const char* name) {
  using T = typename X::Scalar;
  static_assert(no_arithmetic_on_masks<T>, "tshard: masks (bool tensors) take no arithmetic: use where(mask, a, b)");
  constexpr bool keep =
      is_partial_sum_v<X> && (K == BinaryKind::Mul || (K == BinaryKind::Div && !ScalarLeft && !std::is_integral_v<T>));
  if constexpr (X::is_partial && !keep) {
    OperatorScope scope(name);
    return with_scalar<K, ScalarLeft>(resolved(x, name), s, name);
  } else if constexpr (K == BinaryKind::Mul) {
    X out = TensorAccess::scaled(x, T(s));  // unevaluated: fused into the next + - += -=
    if (recording(x)) record(out, grad::WithScalar<K, ScalarLeft, T>{T(s)}, tape_shape(x));
    return out;
  } else {
    X out(x.mesh(), x.global_shape());
    scalar_run<K, ScalarLeft, T>(x.data(), T(s), out.data(), x.padded_size());
    if (recording(x)) {
      if constexpr (K == BinaryKind::Div && ScalarLeft)  // s / x reads x back
        record(out, grad::WithScalar<K, ScalarLeft, T>{T(s)}, tape_value(x));
      else
        record(out, grad::WithScalar<K, ScalarLeft, T>{T(s)}, tape_shape(x));
    }
    return out;
  }
}


// out = k(in) over n elements, instantiated per element type, not per spec.
template <UnaryKind K, class T>
void unary_run(const T* in, T* out, Index n) {
  Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>> xi(in, n);
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> xo(out, n);
  if constexpr (K == UnaryKind::Exp) xo = xi.exp();
  if constexpr (K == UnaryKind::Log) xo = xi.log();
  if constexpr (K == UnaryKind::Tanh) xo = xi.tanh();
  if constexpr (K == UnaryKind::Sqrt) xo = xi.sqrt();
  if constexpr (K == UnaryKind::Relu) xo = xi.max(T(0));
  if constexpr (K == UnaryKind::Abs) xo = xi.abs();
  if constexpr (K == UnaryKind::Square) xo = xi.square();
  if constexpr (K == UnaryKind::Sigmoid) xo = T(1) / (T(1) + (-xi).exp());
}

template <UnaryKind K, class XR>
auto unary(XR&& x, const char* name) {
  using X = std::remove_cvref_t<XR>;
  using T = typename X::Scalar;
  static_assert(no_arithmetic_on_masks<T>, "tshard: masks (bool tensors) take no arithmetic: use where(mask, a, b)");
  constexpr bool keep = K == UnaryKind::Neg && is_partial_sum_v<X>;
  if constexpr (X::is_partial && !keep) {
    OperatorScope scope(name);
    return unary<K>(resolved(x, name), name);
  } else if constexpr (K == UnaryKind::Neg) {
    X out = TensorAccess::scaled(x, T(-1));
    if (recording(x)) record(out, grad::Unary<K>{}, tape_shape(x), tape_shape(out));
    return out;
  } else {
    // exp, tanh, sqrt and sigmoid differentiate through their output; the others through x.
    constexpr bool by_output = K == UnaryKind::Exp || K == UnaryKind::Tanh || K == UnaryKind::Sqrt ||
                               K == UnaryKind::Sigmoid;
    if constexpr (!std::is_lvalue_reference_v<XR>) {
      // An expiring x that owns its buffer lends it to the result (the same arithmetic, in
      // place), unless a rule would read x's value afterwards.
      if (TensorAccess::reusable(x) && (by_output || !recording(x))) {
        const bool rec = recording(x);
        X shape = tape_shape(x);  // (no buffer: only the node goes with it)
        X out = TensorAccess::taken(std::move(x));
        unary_run<K, T>(out.data(), out.data(), out.padded_size());
        if (rec) record(out, grad::Unary<K>{}, std::move(shape), tape_output(out));
        return out;
      }
    }
    X out(x.mesh(), x.global_shape());
    unary_run<K, T>(x.data(), out.data(), x.padded_size());
    if (recording(x)) {
      if constexpr (by_output)
        record(out, grad::Unary<K>{}, tape_shape(x), tape_output(out));
      else
        record(out, grad::Unary<K>{}, tape_value(x), tape_shape(out));
    }
    return out;
  }
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

// ---- comparisons and where: several operands, one broadcasting pass ----

enum class CompareKind { Less, Greater, LessEqual, GreaterEqual, Equal, NotEqual };

template <class T>
bool compare_values(CompareKind k, const T& a, const T& b) {
  if constexpr (is_complex_v<T>) {
    return k == CompareKind::Equal ? a == b : a != b;
  } else {
    switch (k) {
      case CompareKind::Less: return a < b;
      case CompareKind::Greater: return a > b;
      case CompareKind::LessEqual: return a <= b;
      case CompareKind::GreaterEqual: return a >= b;
      case CompareKind::Equal: return a == b;
      default: return a != b;
    }
  }
}

// A scalar seen as an operand of the engine: one element, extent 1 along every dim.
template <class T>
struct ScalarOperand {
  T value;
  static constexpr SpecDesc desc(int rank) {
    SpecDesc d;
    d.rank = rank;
    return d;
  }
  static Extents shape(int rank) {
    Extents e{};
    for (int d = 0; d < rank; ++d) e[d] = 1;
    return e;
  }
};

// mask = a (k) b on descriptors (either side may be a one-element scalar operand).
template <class T>
void compare_run(MeshState& mesh, CompareKind k, const SpecDesc& da, const Extents& sa, const T* a, const SpecDesc& db,
                 const Extents& sb, const T* b, const SpecDesc& dout, const Extents& sout, bool* out, const char* name) {
  const auto al = align_input(mesh, da, sa, a, dout, sout, name);
  const auto bl = align_input(mesh, db, sb, b, dout, sout, name);
  const auto lo = shard_layout(dout, sout, mesh.shape(), mesh.coords());
  const T* x = al.buffer.data;
  const T* y = bl.buffer.data;
  for_each_broadcast_run<2>(lo.padded, dout.rank, {al.padded, bl.padded}, [&](Index o, const auto& off, const auto& inner, Index n) {
    for (Index i = 0; i < n; ++i) out[o + i] = compare_values(k, x[off[0] + i * inner[0]], y[off[1] + i * inner[1]]);
  });
}

// out = mask ? a : b on descriptors.
template <class T>
void where_run(MeshState& mesh, const SpecDesc& dm, const Extents& sm, const bool* m, const SpecDesc& da,
               const Extents& sa, const T* a, const SpecDesc& db, const Extents& sb, const T* b, const SpecDesc& dout,
               const Extents& sout, T* out) {
  const auto ml = align_input(mesh, dm, sm, m, dout, sout, "where");
  const auto al = align_input(mesh, da, sa, a, dout, sout, "where");
  const auto bl = align_input(mesh, db, sb, b, dout, sout, "where");
  const auto lo = shard_layout(dout, sout, mesh.shape(), mesh.coords());
  // The runs cover the padded box, where an aligned mask's padding was never written: its bytes
  // are read as unsigned char, not as bool (an unwritten bool is undefined behaviour; UBSan).
  const auto* mk = reinterpret_cast<const unsigned char*>(ml.buffer.data);
  const T* x = al.buffer.data;
  const T* y = bl.buffer.data;
  for_each_broadcast_run<3>(lo.padded, dout.rank, {ml.padded, al.padded, bl.padded},
                            [&](Index o, const auto& off, const auto& inner, Index n) {
                              for (Index i = 0; i < n; ++i)
                                out[o + i] = mk[off[0] + i * inner[0]] != 0 ? x[off[1] + i * inner[1]] : y[off[2] + i * inner[2]];
                            });
}

// A where() or comparison operand: a tensor, or a scalar of the tensors' element type.
template <class X>
struct OperandTraits {  // a scalar
  static constexpr bool tensor = false;
  static constexpr int rank = 0;
  using SpecType = Spec<>;
  using PartialType = NoPartial;
};
template <class T, class M, class S, class P>
struct OperandTraits<ShardedTensor<T, M, S, P>> {
  static constexpr bool tensor = true;
  static constexpr int rank = S::rank;
  using SpecType = S;
  using PartialType = P;
};

// Descriptor, extents and data of a resolved operand at rank Rank (scalars: one element).
template <int Rank, class M, class T, class X>
auto operand_view(const X& x, const T& scalar_store) {
  struct View {
    SpecDesc desc;
    Extents shape;
    const T* data;
  };
  if constexpr (OperandTraits<X>::tensor) {
    return View{make_desc<spec_of_rank<typename X::SpecType, Rank>, NoPartial>(M::axis_names),
                extents_of_rank(detail::extents_of(x), X::rank, Rank), x.data()};
  } else {
    return View{ScalarOperand<T>::desc(Rank), ScalarOperand<T>::shape(Rank), &scalar_store};
  }
}

template <class X>
decltype(auto) resolved_operand(const X& x, const char* op) {
  if constexpr (OperandTraits<X>::tensor)
    return resolved(x, op);
  else
    return (x);
}

template <class... X>
struct first_tensor_mesh;
template <class X, class... Rest>
struct first_tensor_mesh<X, Rest...> {
  static const auto& of(const X& x, const Rest&... rest) {
    if constexpr (OperandTraits<X>::tensor)
      return x.mesh();
    else
      return first_tensor_mesh<Rest...>::of(rest...);
  }
};

template <CompareKind K, class A, class B>
auto compare(const A& ain, const B& bin, const char* name) {
  using TA = OperandTraits<A>;
  using TB = OperandTraits<B>;
  using X = std::conditional_t<TA::tensor, A, B>;
  using T = typename X::Scalar;
  using M = typename X::MeshT;
  static_assert(!is_complex_v<T> || K == CompareKind::Equal || K == CompareKind::NotEqual,
                "tshard: complex values have no order: compare them with == or != only");
  OperatorScope scope(name);
  const auto& a = resolved_operand(ain, name);
  const auto& b = resolved_operand(bin, name);
  constexpr int Rank = std::max(TA::rank, TB::rank);
  using Out = ShardedTensor<bool, M,
                            typename elementwise_fold<M, Rank, typename TA::SpecType, typename TB::SpecType>::type>;
  if constexpr (TA::tensor && TB::tensor) require_same_mesh(a, b, name);
  const T sa = [&] { if constexpr (TA::tensor) return T(0); else return T(a); }();
  const T sb = [&] { if constexpr (TB::tensor) return T(0); else return T(b); }();
  const auto va = operand_view<Rank, M, T>(a, sa);
  const auto vb = operand_view<Rank, M, T>(b, sb);
  const auto describe_a = [&] { if constexpr (TA::tensor) return a.describe(); else return std::string("a scalar"); };
  const auto describe_b = [&] { if constexpr (TB::tensor) return b.describe(); else return std::string("a scalar"); };
  const Extents shape = broadcast_shape(va.shape, vb.shape, Rank, name, describe_a, describe_b);
  const auto& mesh = first_tensor_mesh<A, B>::of(ain, bin);
  Out out(mesh, to_array<Rank>(shape));
  compare_run<T>(*detail::state_of(mesh), K, va.desc, va.shape, va.data, vb.desc, vb.shape, vb.data, Out::spec_desc,
                 shape, out.data(), name);
  return out;
}

template <class X, class S>
concept CompareScalar = ShardedTensorType<X> && std::is_arithmetic_v<S> &&
                        std::is_constructible_v<typename std::remove_cvref_t<X>::Scalar, S>;

}  // namespace detail

// ---- tensor (op) tensor ----
template <class T, class M, class SA, class PA, class SB, class PB>
auto operator+(const ShardedTensor<T, M, SA, PA>& a, const ShardedTensor<T, M, SB, PB>& b) {
  return detail::binary<detail::BinaryKind::Add>(a, b, "add");
}
template <class T, class M, class SA, class PA, class SB, class PB>
auto operator-(const ShardedTensor<T, M, SA, PA>& a, const ShardedTensor<T, M, SB, PB>& b) {
  return detail::binary<detail::BinaryKind::Sub>(a, b, "subtract");
}
template <class T, class M, class SA, class PA, class SB, class PB>
auto operator*(const ShardedTensor<T, M, SA, PA>& a, const ShardedTensor<T, M, SB, PB>& b) {
  return detail::binary<detail::BinaryKind::Mul>(a, b, "multiply");
}
template <class T, class M, class SA, class PA, class SB, class PB>
auto operator/(const ShardedTensor<T, M, SA, PA>& a, const ShardedTensor<T, M, SB, PB>& b) {
  return detail::binary<detail::BinaryKind::Div>(a, b, "divide");
}
// An expiring operand (a temporary, or std::move(x)) of the result's spec and shape that owns
// its buffer lends it to the result, as the unary operators' do: y = f(x) + g(x) allocates once.
#define TSHARD_EXPIRING_BINARY(op, kind, label)                                                           \
  template <class T, class M, class SA, class PA, class SB, class PB>                                     \
  auto operator op(ShardedTensor<T, M, SA, PA>&& a, const ShardedTensor<T, M, SB, PB>& b) {               \
    return detail::binary<detail::BinaryKind::kind>(a, b, label, &a, nullptr);                            \
  }                                                                                                       \
  template <class T, class M, class SA, class PA, class SB, class PB>                                     \
  auto operator op(const ShardedTensor<T, M, SA, PA>& a, ShardedTensor<T, M, SB, PB>&& b) {               \
    return detail::binary<detail::BinaryKind::kind>(a, b, label, nullptr, &b);                            \
  }                                                                                                       \
  template <class T, class M, class SA, class PA, class SB, class PB>                                     \
  auto operator op(ShardedTensor<T, M, SA, PA>&& a, ShardedTensor<T, M, SB, PB>&& b) {                    \
    return detail::binary<detail::BinaryKind::kind>(a, b, label, &a, &b);                                 \
  }
TSHARD_EXPIRING_BINARY(+, Add, "add")
TSHARD_EXPIRING_BINARY(-, Sub, "subtract")
TSHARD_EXPIRING_BINARY(*, Mul, "multiply")
TSHARD_EXPIRING_BINARY(/, Div, "divide")
#undef TSHARD_EXPIRING_BINARY

// ---- tensor (op) scalar and scalar (op) tensor ----
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator+(const X& x, S s) { return detail::with_scalar<detail::BinaryKind::Add, false>(x, s, "add"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator+(S s, const X& x) { return detail::with_scalar<detail::BinaryKind::Add, true>(x, s, "add"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator-(const X& x, S s) { return detail::with_scalar<detail::BinaryKind::Sub, false>(x, s, "subtract"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator-(S s, const X& x) { return detail::with_scalar<detail::BinaryKind::Sub, true>(x, s, "subtract"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator*(const X& x, S s) { return detail::with_scalar<detail::BinaryKind::Mul, false>(x, s, "multiply"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator*(S s, const X& x) { return detail::with_scalar<detail::BinaryKind::Mul, true>(x, s, "multiply"); }
// An expiring tensor times a scalar keeps its buffer (nothing shared: it may be resolved in place).
template <class X, class S>
  requires(detail::ScalarFor<X, S> && !std::is_reference_v<X> && !std::is_const_v<X> &&
           (!X::is_partial || detail::is_partial_sum_v<X>))
auto operator*(S s, X&& x) {
  static_assert(detail::no_arithmetic_on_masks<typename X::Scalar>, "tshard: masks (bool tensors) take no arithmetic: use where(mask, a, b)");
  if (detail::recording(x)) return detail::with_scalar<detail::BinaryKind::Mul, true>(std::as_const(x), s, "multiply");
  return detail::TensorAccess::scaled(std::move(x), typename X::Scalar(s));
}
template <class X, class S>
  requires(detail::ScalarFor<X, S> && !std::is_reference_v<X> && !std::is_const_v<X> &&
           (!X::is_partial || detail::is_partial_sum_v<X>))
auto operator*(X&& x, S s) {
  static_assert(detail::no_arithmetic_on_masks<typename X::Scalar>, "tshard: masks (bool tensors) take no arithmetic: use where(mask, a, b)");
  if (detail::recording(x)) return detail::with_scalar<detail::BinaryKind::Mul, false>(std::as_const(x), s, "multiply");
  return detail::TensorAccess::scaled(std::move(x), typename X::Scalar(s));
}
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator/(const X& x, S s) { return detail::with_scalar<detail::BinaryKind::Div, false>(x, s, "divide"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator/(S s, const X& x) { return detail::with_scalar<detail::BinaryKind::Div, true>(x, s, "divide"); }

// ---- comparisons: a mask (ShardedTensor of bool) with the elementwise spec rule ----
#define TSHARD_COMPARISON(op, kind, label)                                                              \
  template <class T, class M, class SA, class PA, class SB, class PB>                                  \
  auto operator op(const ShardedTensor<T, M, SA, PA>& a, const ShardedTensor<T, M, SB, PB>& b) {       \
    return detail::compare<detail::CompareKind::kind>(a, b, label);                                     \
  }                                                                                                    \
  template <class X, class S> requires detail::CompareScalar<X, S>                                     \
  auto operator op(const X& x, S s) { return detail::compare<detail::CompareKind::kind>(x, s, label); } \
  template <class X, class S> requires detail::CompareScalar<X, S>                                     \
  auto operator op(S s, const X& x) { return detail::compare<detail::CompareKind::kind>(s, x, label); }
TSHARD_COMPARISON(<, Less, "less")
TSHARD_COMPARISON(>, Greater, "greater")
TSHARD_COMPARISON(<=, LessEqual, "less_equal")
TSHARD_COMPARISON(>=, GreaterEqual, "greater_equal")
TSHARD_COMPARISON(==, Equal, "equal")
TSHARD_COMPARISON(!=, NotEqual, "not_equal")
#undef TSHARD_COMPARISON

// mask ? a : b elementwise; a and b are tensors of one element type or scalars (not both
// scalars). Shapes broadcast as numpy's; the spec folds the elementwise rule over mask, a, b.
template <ShardedTensorType Mask, class A, class B>
auto where(const Mask& mask_in, const A& a_in, const B& b_in) {
  static_assert(std::is_same_v<typename Mask::Scalar, bool>, "tshard: where's first argument is a mask (x > y, a bool tensor)");
  using TA = detail::OperandTraits<A>;
  using TB = detail::OperandTraits<B>;
  static_assert(TA::tensor || TB::tensor, "tshard: where needs a tensor for a or b (both are scalars)");
  using X = std::conditional_t<TA::tensor, A, B>;
  using T = typename X::Scalar;
  using M = typename X::MeshT;
  static_assert(std::is_same_v<typename Mask::MeshT, M>, "tshard: where's operands live on one mesh type");
  if constexpr (TA::tensor && TB::tensor)
    static_assert(std::is_same_v<typename A::Scalar, typename B::Scalar>, "tshard: where's a and b have one element type");
  detail::OperatorScope scope("where");
  const auto& a = detail::resolved_operand(a_in, "where");
  const auto& b = detail::resolved_operand(b_in, "where");
  constexpr int Rank = std::max({Mask::rank, TA::rank, TB::rank});
  using OutSpec = typename detail::elementwise_fold<M, Rank, typename Mask::SpecType, typename TA::SpecType,
                                                    typename TB::SpecType>::type;
  using Out = ShardedTensor<T, M, OutSpec>;
  if constexpr (TA::tensor) detail::require_same_mesh(mask_in, a, "where");
  if constexpr (TB::tensor) detail::require_same_mesh(mask_in, b, "where");
  const T sa = [&] { if constexpr (TA::tensor) return T(0); else return T(a); }();
  const T sb = [&] { if constexpr (TB::tensor) return T(0); else return T(b); }();
  const auto va = detail::operand_view<Rank, M, T>(a, sa);
  const auto vb = detail::operand_view<Rank, M, T>(b, sb);
  const detail::SpecDesc dm = detail::desc_of_rank<Mask, Rank>();
  const detail::Extents sm = detail::extents_of_rank(detail::extents_of(mask_in), Mask::rank, Rank);
  const auto name_a = [&] { if constexpr (TA::tensor) return a.describe(); else return std::string("a scalar"); };
  const auto name_b = [&] { if constexpr (TB::tensor) return b.describe(); else return std::string("a scalar"); };
  const auto both = [&] { return name_a() + " with " + name_b(); };
  const detail::Extents ab = detail::broadcast_shape(va.shape, vb.shape, Rank, "where", name_a, name_b);
  const detail::Extents shape =
      detail::broadcast_shape(sm, ab, Rank, "where", [&] { return mask_in.describe(); }, both);
  Out out(mask_in.mesh(), detail::to_array<Rank>(shape));
  detail::where_run<T>(*detail::state_of(mask_in.mesh()), dm, sm, mask_in.data(), va.desc, va.shape, va.data, vb.desc,
                       vb.shape, vb.data, Out::spec_desc, shape, out.data());
  if (detail::recording(a, b)) {  // the mask carries no gradient; a scalar side is a constant
    auto side = [](const auto& v) {
      if constexpr (detail::OperandTraits<std::remove_cvref_t<decltype(v)>>::tensor)
        return detail::tape_shape(v);
      else
        return v;
    };
    detail::record(out, detail::grad::Where{}, detail::tape_value(mask_in), side(a), side(b));
  }
  return out;
}

// ---- unary ----
template <ShardedTensorType X>
auto operator-(const X& x) { return detail::unary<detail::UnaryKind::Neg>(x, "negate"); }
// An expiring argument (a temporary, or std::move(x)) that owns its buffer lends it to the
// result: exp(std::move(z)) allocates nothing.
template <class X>
  requires detail::FloatingTensor<std::remove_cvref_t<X>>
auto exp(X&& x) { return detail::unary<detail::UnaryKind::Exp>(std::forward<X>(x), "exp"); }
template <class X>
  requires detail::FloatingTensor<std::remove_cvref_t<X>>
auto log(X&& x) { return detail::unary<detail::UnaryKind::Log>(std::forward<X>(x), "log"); }
template <class X>
  requires detail::FloatingTensor<std::remove_cvref_t<X>>
auto tanh(X&& x) { return detail::unary<detail::UnaryKind::Tanh>(std::forward<X>(x), "tanh"); }
template <class X>
  requires detail::FloatingTensor<std::remove_cvref_t<X>>
auto sqrt(X&& x) { return detail::unary<detail::UnaryKind::Sqrt>(std::forward<X>(x), "sqrt"); }
template <class X>
  requires detail::FloatingTensor<std::remove_cvref_t<X>>
auto sigmoid(X&& x) { return detail::unary<detail::UnaryKind::Sigmoid>(std::forward<X>(x), "sigmoid"); }
template <class X>
  requires detail::RealTensor<std::remove_cvref_t<X>>
auto relu(X&& x) { return detail::unary<detail::UnaryKind::Relu>(std::forward<X>(x), "relu"); }
template <class X>
  requires detail::RealTensor<std::remove_cvref_t<X>>
auto abs(X&& x) { return detail::unary<detail::UnaryKind::Abs>(std::forward<X>(x), "abs"); }
template <ShardedTensorType X>
auto square(const X& x) { return detail::unary<detail::UnaryKind::Square>(x, "square"); }

// x^p elementwise for a scalar exponent (std::pow; a partial is resolved first).
template <detail::FloatingTensor X, class S> requires std::is_arithmetic_v<S>
auto pow(const X& xin, S p) {
  using T = typename X::Scalar;
  detail::OperatorScope scope("pow");
  const auto& x = detail::resolved(xin, "pow");
  using Out = ShardedTensor<T, typename X::MeshT, typename X::SpecType>;
  Out out(x.mesh(), x.global_shape());
  const detail::Index n = x.padded_size();
  Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>> xi(x.data(), n);
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> xo(out.data(), n);
  xo = xi.pow(T(p));
  if (detail::recording(x)) detail::record(out, detail::grad::Pow<T>{T(p)}, detail::tape_value(x));
  return out;
}

// f applied to every valid element (never to padding); the result's element type is f's.
template <ShardedTensorType X, class F>
  requires std::is_invocable_v<F&, typename X::Scalar>
auto map(const X& x, F&& f) {
  using T = typename X::Scalar;
  using U = std::remove_cvref_t<std::invoke_result_t<F&, T>>;
  static_assert(Element<U>, "tshard: map's function must return an element type (float, double, complex, int32, int64, bool)");
  if (detail::recording(x)) detail::refuse_untraceable("map", x.describe());
  if constexpr (X::is_partial) {
    detail::OperatorScope scope("map");
    return map(detail::resolved(x, "map"), std::forward<F>(f));
  } else {
    ShardedTensor<U, typename X::MeshT, typename X::SpecType> out(x.mesh(), x.global_shape());
    const T* in = x.data();
    U* o = out.data();
    detail::for_each_valid_run(detail::layout_of(x), [&](detail::Index off, detail::Index n) {
      for (detail::Index i = off; i < off + n; ++i) o[i] = U(f(in[i]));
    });
    return out;
  }
}

namespace detail {
// map's run form for kernels that vectorise: f(out, in0, in1, ..., n) on each contiguous run of
// valid elements (pointers at the run's start), U the output's element type. Same specs,
// alignment and resolution as map.
template <class U, class F, ShardedTensorType X0, ShardedTensorType... Xs>
auto map_runs(F&& f, const X0& x0_in, const Xs&... xs_in) {
  if (recording(x0_in, xs_in...)) refuse_untraceable("map", x0_in.describe());
  using M = typename X0::MeshT;
  using OutSpec = typename elementwise_fold<M, X0::rank, typename X0::SpecType, typename Xs::SpecType...>::type;
  using Out = ShardedTensor<U, M, OutSpec>;
  auto run = [&](const auto& x0, const auto&... xs) {
    (require_same_mesh(x0, xs, "map"), ...);
    ((detail::extents_of(xs) != detail::extents_of(x0)
          ? throw ShapeError("tshard::map: the tensors' shapes differ: " + x0.describe() + " and " + xs.describe())
          : void()),
     ...);
    Out out(x0.mesh(), x0.global_shape());
    auto& mesh = *detail::state_of(x0.mesh());
    auto aligned = [&](const auto& x) {
      return implicit_reshard(mesh, x.spec_desc, Out::spec_desc, detail::extents_of(x), x.data(), "map");
    };
    const auto a0 = aligned(x0);
    const std::tuple<decltype(aligned(xs))...> as{aligned(xs)...};
    U* o = out.data();
    for_each_valid_run(detail::layout_of(out), [&](Index off, Index n) {
      std::apply([&](const auto&... a) { f(o + off, a0.data + off, (a.data + off)..., n); }, as);
    });
    return out;
  };
  return run(resolved(x0_in, "map"), resolved(xs_in, "map")...);
}
}  // namespace detail

// n-ary map: out(i) = f(a(i), b(i), ...) for 1 to 4 tensors of one shape (any element types and
// specs), in one pass over the valid elements (never padding). The output spec folds the
// elementwise rule over the inputs; inputs laid out otherwise are aligned by implicit reshards
// and partial inputs are resolved first. E.g. relu's backward:
//   auto dx = ts::map([](float h, float g) { return h > 0 ? g : 0.0f; }, h, dy);
template <class F, ShardedTensorType X0, ShardedTensorType... Xs>
  requires(!ShardedTensorType<F> && sizeof...(Xs) <= 3)
auto map(F&& f, const X0& x0_in, const Xs&... xs_in) {
  using U = std::remove_cvref_t<std::invoke_result_t<F&, typename X0::Scalar, typename Xs::Scalar...>>;
  static_assert(Element<U>, "tshard: map's function must return an element type (float, double, complex, int32, int64, bool)");
  static_assert((std::is_same_v<typename X0::MeshT, typename Xs::MeshT> && ...), "tshard: map's tensors live on one mesh type");
  static_assert(((Xs::rank == X0::rank) && ...), "tshard: map's tensors have one shape (and so one rank)");
  detail::OperatorScope scope("map");
  return detail::map_runs<U>(
      [&](U* o, const typename X0::Scalar* a0, const typename Xs::Scalar*... a, detail::Index n) {
        for (detail::Index i = 0; i < n; ++i) o[i] = U(f(a0[i], a[i]...));
      },
      x0_in, xs_in...);
}

}  // namespace tshard
