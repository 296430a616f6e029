// Elementwise operators: + - * / between sharded tensors (with broadcasting of size-1 dims)
// and with scalars, unary functions, and map(t, f). Output specs follow DESIGN's elementwise
// rule at compile time; operands are aligned by implicit reshards (counted, forbiddable);
// kernels run on padded local blocks through Eigen and are instantiated per (type, rank).
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>

#include <cmath>
#include <complex>
#include <string>
#include <type_traits>

#include "tshard/core/spec_algebra.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/factories.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {
namespace detail {

enum class BinaryKind { Add, Sub, Mul, Div };

// Integer division that leaves padding harmless (padding may hold zeros).
template <class T>
struct SafeDivide {
  T operator()(const T& a, const T& b) const { return b == T(0) ? T(0) : T(a / b); }
};

template <class T, class A, class B, class O>
void assign_binary(BinaryKind k, O& o, const A& a, const B& b) {
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

// out = a (k) b over whole padded blocks, instantiated per element type only. Equal layouts
// run as one vectorised pass over the flat buffers; an operand whose padded extent is 1 where
// the output's is not is broadcast along that dim (a strided pass, one output run at a time).
template <class T>
void binary_kernel(BinaryKind k, T* out, const Extents& op, const T* a, const Extents& ap, const T* b,
                   const Extents& bp, int rank) {
  const Index n = volume(op, rank);
  if (n == 0) return;
  using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
  bool broadcast = false;
  for (int d = 0; d < rank; ++d) broadcast |= ap[d] != op[d] || bp[d] != op[d];
  if (!broadcast) {
    Eigen::Map<Array> o(out, n);
    assign_binary<T>(k, o, Eigen::Map<const Array>(a, n), Eigen::Map<const Array>(b, n));
    return;
  }
  // Strides of a and b over the output's index space (0 along the dims they broadcast).
  Extents sa{}, sb{}, i{};
  for (Index d = 0, ta = 1, tb = 1; d < rank; ++d) {
    sa[d] = ap[d] == op[d] ? ta : 0;
    sb[d] = bp[d] == op[d] ? tb : 0;
    ta *= ap[d];
    tb *= bp[d];
  }
  const Index run = op[0];
  for (Index o = 0;; o += run) {
    Index ia = 0, ib = 0;
    for (int d = 1; d < rank; ++d) {
      ia += i[d] * sa[d];
      ib += i[d] * sb[d];
    }
    using Strided = Eigen::Map<const Array, 0, Eigen::InnerStride<>>;
    Eigen::Map<Array> dst(out + o, run);
    assign_binary<T>(k, dst, Strided(a + ia, run, Eigen::InnerStride<>(sa[0])),
                     Strided(b + ib, run, Eigen::InnerStride<>(sb[0])));
    int d = 1;
    for (; d < rank; ++d) {
      if (++i[d] < op[d]) break;
      i[d] = 0;
    }
    if (d >= rank) return;
  }
}

// Elementwise specs (DESIGN) on descriptors: per dim the left operand's split; else the
// right's where its axes are free in the left's spec; else R. Shared by the typed API (at
// compile time) and by descriptor code (at run time).
constexpr SpecDesc elementwise_desc(const SpecDesc& a, const SpecDesc& b) {
  SpecDesc o;
  o.rank = a.rank;
  const std::uint32_t left = a.split_axes();
  for (int d = 0; d < a.rank; ++d) o.dims[d] = a.dims[d].count ? a.dims[d] : (b.dims[d].mask() & left) ? DimSplit{} : b.dims[d];
  return o;
}

// The elementwise rule as a type, built from the same decision.
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

// The shape a and b broadcast to; ShapeError where they do not.
inline Extents broadcast_shape(const Extents& a, const Extents& b, int rank, const char* op, const std::string& da,
                               const std::string& db) {
  Extents s{};
  for (int d = 0; d < rank; ++d) {
    if (a[d] != b[d] && a[d] != 1 && b[d] != 1)
      throw ShapeError(std::string("tshard::") + op + ": shapes do not broadcast: a is " + da + ", b is " + db);
    s[d] = a[d] == 1 ? b[d] : a[d];
  }
  return s;
}

// out (laid out as dout over sout) = a (k) b on descriptors, instantiated per element type:
// each operand is aligned to the output's layout, replicated along the dims it broadcasts.
template <class T>
void binary_run(MeshState& mesh, BinaryKind k, const SpecDesc& da, const Extents& sa, const T* a, const SpecDesc& db,
                const Extents& sb, const T* b, const SpecDesc& dout, const Extents& sout, T* out, const char* name) {
  auto want = [&](const SpecDesc& have, const Extents& shape) {
    SpecDesc w = dout;
    w.partial = have.partial;
    w.partial_axes = have.partial_axes;
    for (int d = 0; d < dout.rank; ++d)
      if (shape[d] != sout[d]) w.dims[d] = DimSplit{};
    return w;
  };
  const SpecDesc wa = want(da, sa), wb = want(db, sb);
  auto al = implicit_reshard(mesh, da, wa, sa, a, name);
  auto bl = implicit_reshard(mesh, db, wb, sb, b, name);
  const auto la = shard_layout(wa, sa, mesh.shape(), mesh.coords());
  const auto lb = shard_layout(wb, sb, mesh.shape(), mesh.coords());
  const auto lo = shard_layout(dout, sout, mesh.shape(), mesh.coords());
  binary_kernel<T>(k, out, lo.padded, al.data, la.padded, bl.data, lb.padded, dout.rank);
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

template <BinaryKind K, class T, class M, class SA, class PA, class SB, class PB>
auto binary(const ShardedTensor<T, M, SA, PA>& a, const ShardedTensor<T, M, SB, PB>& b, const char* name) {
  static_assert(SA::rank == SB::rank, "tshard: elementwise operands must have the same rank");
  using A = ShardedTensor<T, M, SA, PA>;
  using B = ShardedTensor<T, M, SB, PB>;
  // Only partial sum +/- partial sum over the same axes stays partial (DESIGN).
  constexpr bool keep = (K == BinaryKind::Add || K == BinaryKind::Sub) && is_partial_sum_v<A> &&
                        is_partial_sum_v<B> && same_name_set(PA::names, PB::names);
  if constexpr ((PA::is_partial || PB::is_partial) && !keep) {
    OperatorScope scope(name);
    return binary<K>(resolved(a, name), resolved(b, name), name);
  } else {
    constexpr int Rank = SA::rank;
    using E = elementwise_type<SA, SB, M>;
    using Out = ShardedTensor<T, M, typename E::type, std::conditional_t<keep, PA, NoPartial>>;
    static_assert(Out::spec_desc.without_partial() == elementwise_desc(E::da, E::db),
                  "tshard: internal: the typed and descriptor elementwise rules disagree");
    require_same_mesh(a, b, name);
    const Extents shape = broadcast_shape(a.extents(), b.extents(), Rank, name, a.describe(), b.describe());
    OperatorScope scope(name);
    Out out(a.mesh(), to_array<Rank>(shape));
    binary_run<T>(*a.mesh().state(), K, a.spec_desc, a.extents(), a.data(), b.spec_desc, b.extents(), b.data(),
                  Out::spec_desc, shape, out.data(), name);
    return out;
  }
}

template <BinaryKind K, class X, class S>
auto with_scalar(const X& x, S s, bool scalar_left, const char* name) {
  using T = typename X::Scalar;
  // Partial sums stay partial under multiplication by a scalar (and division, for fields).
  constexpr bool keep = is_partial_sum_v<X> && (K == BinaryKind::Mul || (K == BinaryKind::Div && !std::is_integral_v<T>));
  if constexpr (X::is_partial && !keep) {
    OperatorScope scope(name);
    return with_scalar<K>(resolved(x, name), s, scalar_left, name);
  } else {
    X out(x.mesh(), x.global_shape());
    const T v = T(s);
    const Index n = x.local_size();
    const T* in = x.data();
    T* o = out.data();
    Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>> xi(in, n);
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> xo(o, n);
    switch (K) {
      case BinaryKind::Add: xo = xi + v; break;
      case BinaryKind::Sub:
        if (scalar_left)
          xo = v - xi;
        else
          xo = xi - v;
        break;
      case BinaryKind::Mul: xo = xi * v; break;
      case BinaryKind::Div:
        if constexpr (std::is_integral_v<T>) {
          for (Index i = 0; i < n; ++i) o[i] = scalar_left ? SafeDivide<T>{}(v, in[i]) : SafeDivide<T>{}(in[i], v);
        } else {
          if (scalar_left)
            xo = v / xi;
          else
            xo = xi / v;
        }
        break;
    }
    return out;
  }
}

enum class UnaryKind { Exp, Log, Tanh, Relu, Sqrt, Abs, Neg };

template <UnaryKind K, class X>
auto unary(const X& x, const char* name) {
  using T = typename X::Scalar;
  constexpr bool keep = K == UnaryKind::Neg && is_partial_sum_v<X>;
  if constexpr (X::is_partial && !keep) {
    OperatorScope scope(name);
    return unary<K>(resolved(x, name), name);
  } else {
    X out(x.mesh(), x.global_shape());
    const Index n = x.local_size();
    Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>> xi(x.data(), n);
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> xo(out.data(), n);
    if constexpr (K == UnaryKind::Exp) xo = xi.exp();
    if constexpr (K == UnaryKind::Log) xo = xi.log();
    if constexpr (K == UnaryKind::Tanh) xo = xi.tanh();
    if constexpr (K == UnaryKind::Sqrt) xo = xi.sqrt();
    if constexpr (K == UnaryKind::Neg) xo = -xi;
    if constexpr (K == UnaryKind::Relu) xo = xi.max(T(0));
    if constexpr (K == UnaryKind::Abs) xo = xi.abs();
    return out;
  }
}

template <class X>
concept RealTensor = ShardedTensorType<X> && !is_complex_v<typename std::remove_cvref_t<X>::Scalar>;
template <class X>
concept FloatingTensor = ShardedTensorType<X> && !std::is_integral_v<typename std::remove_cvref_t<X>::Scalar>;

template <class X, class S>
concept ScalarFor = ShardedTensorType<X> && (std::is_arithmetic_v<S> || is_complex_v<S>) &&
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

// ---- tensor (op) scalar and scalar (op) tensor ----
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator+(const X& x, S s) { return detail::with_scalar<detail::BinaryKind::Add>(x, s, false, "add"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator+(S s, const X& x) { return detail::with_scalar<detail::BinaryKind::Add>(x, s, true, "add"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator-(const X& x, S s) { return detail::with_scalar<detail::BinaryKind::Sub>(x, s, false, "subtract"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator-(S s, const X& x) { return detail::with_scalar<detail::BinaryKind::Sub>(x, s, true, "subtract"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator*(const X& x, S s) { return detail::with_scalar<detail::BinaryKind::Mul>(x, s, false, "multiply"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator*(S s, const X& x) { return detail::with_scalar<detail::BinaryKind::Mul>(x, s, true, "multiply"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator/(const X& x, S s) { return detail::with_scalar<detail::BinaryKind::Div>(x, s, false, "divide"); }
template <class X, class S> requires detail::ScalarFor<X, S>
auto operator/(S s, const X& x) { return detail::with_scalar<detail::BinaryKind::Div>(x, s, true, "divide"); }

// ---- unary ----
template <ShardedTensorType X>
auto operator-(const X& x) { return detail::unary<detail::UnaryKind::Neg>(x, "negate"); }
template <detail::FloatingTensor X>
auto exp(const X& x) { return detail::unary<detail::UnaryKind::Exp>(x, "exp"); }
template <detail::FloatingTensor X>
auto log(const X& x) { return detail::unary<detail::UnaryKind::Log>(x, "log"); }
template <detail::FloatingTensor X>
auto tanh(const X& x) { return detail::unary<detail::UnaryKind::Tanh>(x, "tanh"); }
template <detail::FloatingTensor X>
auto sqrt(const X& x) { return detail::unary<detail::UnaryKind::Sqrt>(x, "sqrt"); }
template <detail::RealTensor X>
auto relu(const X& x) { return detail::unary<detail::UnaryKind::Relu>(x, "relu"); }
template <detail::RealTensor X>
auto abs(const X& x) { return detail::unary<detail::UnaryKind::Abs>(x, "abs"); }

// f applied to every valid element (never to padding); the result's element type is f's.
template <ShardedTensorType X, class F>
auto map(const X& x, F&& f) {
  using T = typename X::Scalar;
  using U = std::remove_cvref_t<std::invoke_result_t<F&, T>>;
  static_assert(Element<U>, "tshard: map's function must return an element type (float, double, complex, int32, int64)");
  if constexpr (X::is_partial) {
    detail::OperatorScope scope("map");
    return map(detail::resolved(x, "map"), std::forward<F>(f));
  } else {
    ShardedTensor<U, typename X::MeshT, typename X::SpecType> out(x.mesh(), x.global_shape());
    const T* in = x.data();
    U* o = out.data();
    detail::for_each_local<X::rank>(x.layout(), [&](const auto&, detail::Index lin) { o[lin] = U(f(in[lin])); });
    return out;
  }
}

}  // namespace tshard
