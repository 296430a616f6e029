// Arithmetic: + - * / between sharded tensors and with scalars, unary functions (exp, log, tanh,
// sqrt, sigmoid, relu, abs, square, negation) and pow. Output specs follow the elementwise rule;
// an expiring operand lends its buffer to the result.
#pragma once
#include "tshard/core/dispatch.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/ops/elementwise/operands.hpp"

namespace tshard {
namespace detail {

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
// of unevaluated `s * x` operands (1 otherwise). Dispatched (core/dispatch.hpp).
template <class T>
void binary_kernel(BinaryKind k, T* out, const Extents& op, const T* a, const Extents& ap, T alpha, const T* b,
                   const Extents& bp, T beta, int rank) {
  TSHARD_DISPATCH((binary_kernel<T>), k, out, op, a, ap, alpha, b, bp, beta, rank);
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


// An operand of binary_block: its block, the block again where the caller gave it as an
// expiring tensor of the result's type, its own spec, and its spec and extents at the output's rank.
template <class T>
struct BinaryOperand {
  const TensorBlock<T>* block;
  TensorBlock<T>* expiring;
  SpecDesc own;
  SpecDesc desc;
  Extents shape;
};

// binary()'s body on blocks, per element type: out (shape sout laid out as dout, no buffer yet)
// = a (k) b, recorded where an operand is tracked.
template <class T>
void binary_block(BinaryKind k, const std::shared_ptr<MeshState>& mesh, const BinaryOperand<T>& a,
                  const BinaryOperand<T>& b, const SpecDesc& dout, const Extents& sout, TensorBlock<T>& out,
                  const char* name) {
  const bool linear = k == BinaryKind::Add || k == BinaryKind::Sub;  // rules that keep no value
  const auto& node_a = TensorAccess::block_node(*a.block);
  const auto& node_b = TensorAccess::block_node(*b.block);
  const bool rec = Tape::active() && !Tape::paused() && (node_a || node_b);
  // (the nodes, before an operand's buffer is taken)
  TapeNode<T> keep_a{rec && linear ? node_a : nullptr}, keep_b{rec && linear ? node_b : nullptr};
  const auto va = TensorAccess::block_buffer(*a.block), vb = TensorAccess::block_buffer(*b.block);
  // An expiring operand of the result's own type and shape (no broadcast) that owns its
  // buffer, without an unevaluated factor, lends it to the result: the kernel reads each
  // element before it writes it, so the arithmetic is the same. Not while a rule would keep
  // the operands' values (multiply and divide under a gradient).
  auto lends = [&](const BinaryOperand<T>& x) {
    if (!x.expiring || !(linear || !rec) || !TensorAccess::reusable_block(*x.expiring)) return false;
    for (int d = 0; d < dout.rank; ++d)
      if (x.shape[d] != sout[d]) return false;
    return true;
  };
  if (lends(a)) TensorAccess::take_block(*a.expiring, out);
  else if (lends(b)) TensorAccess::take_block(*b.expiring, out);
  else TensorAccess::allocate_block(out);
  binary_run<T>(*mesh, k, a.desc, a.shape, va.data, b.desc, b.shape, vb.data, dout, sout,
                TensorAccess::block_data(out), name, va.scale, vb.scale);
  if (!rec) return;
  auto recorded = [&](auto tag, auto&& sa, auto&& sb) {
    using Saved = std::remove_cvref_t<decltype(sa)>;
    TensorAccess::set_block_node(out, record_node<T, AnyOutput, decltype(tag), Saved, Saved>(
                                          mesh, sout, dout, std::move(tag), std::move(sa), std::move(sb)));
  };
  auto value = [](const BinaryOperand<T>& x) {
    return TapeValue<T>{TensorAccess::block_node(*x.block), TensorAccess::block_storage(*x.block), x.own,
                        TensorAccess::block_shape(*x.block)};
  };
  switch (k) {
    case BinaryKind::Add: recorded(grad::Binary<BinaryKind::Add>{}, std::move(keep_a), std::move(keep_b)); break;
    case BinaryKind::Sub: recorded(grad::Binary<BinaryKind::Sub>{}, std::move(keep_a), std::move(keep_b)); break;
    case BinaryKind::Mul: recorded(grad::Binary<BinaryKind::Mul>{}, value(a), value(b)); break;
    case BinaryKind::Div: recorded(grad::Binary<BinaryKind::Div>{}, value(a), value(b)); break;
  }
}

// A partial sum X combined with a plain operand Y of its rank split, on dims where X is whole,
// over axes X sums over (Megatron's sequence-parallel residual: x {S<model> on T} + a row-parallel
// product partial over model): X resolves by reduce-scatter straight into Y's split (GSPMD's
// choice), not by an all-reduce whose result is then sliced. `type` is X's resolved spec with
// those dims split as Y's; `moves` whether any is.
template <class X, class Y>
struct scatter_target {
  using M = typename X::MeshT;
  static constexpr bool applies = is_partial_sum_v<X> && !Y::is_partial && X::rank == Y::rank;
  static constexpr SpecDesc dx = make_desc<typename X::SpecType, typename X::PartialType>(M::axis_names);
  static constexpr SpecDesc dy = make_desc<typename Y::SpecType, NoPartial>(M::axis_names);
  static constexpr auto choice = [] {
    std::array<int, std::size_t(X::rank)> c{};
    for (int d = 0; d < X::rank; ++d) {
      const std::uint32_t m = dy.dims[d].mask();
      c[std::size_t(d)] = applies && dx.dims[d].count == 0 && m != 0 && (m & dx.partial_axes) == m &&
                          (m & dx.split_axes()) == 0;
    }
    return c;
  }();
  static constexpr bool moves = [] {
    for (int c : choice)
      if (c) return true;
    return false;
  }();
  using type = typename std::conditional_t<moves, merge_dims<typename X::SpecType, typename Y::SpecType, choice>,
                                            std::type_identity<typename X::SpecType>>::type;
  // At run time: only where those dims of x do not broadcast against y's.
  static bool fits(const X& x, const Y& y) {
    const Extents ex = extents_of(x), ey = extents_of(y);
    for (int d = 0; d < X::rank; ++d)
      if (choice[std::size_t(d)] && ex[d] != ey[d]) return false;
    return true;
  }
};

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
    using ToA = scatter_target<A, B>;
    using ToB = scatter_target<B, A>;
    using Resolved = decltype(binary<K>(resolved(a, name), resolved(b, name), name));
    if constexpr (ToA::moves) {
      using Scattered = ShardedTensor<T, M, typename ToA::type>;
      if constexpr (std::is_same_v<decltype(binary<K>(std::declval<const Scattered&>(), b, name)), Resolved>)
        if (ToA::fits(a, b)) return binary<K>(implicit_reshard<typename ToA::type>(a, name), b, name);
    } else if constexpr (ToB::moves) {
      using Scattered = ShardedTensor<T, M, typename ToB::type>;
      if constexpr (std::is_same_v<decltype(binary<K>(a, std::declval<const Scattered&>(), name)), Resolved>)
        if (ToB::fits(b, a)) return binary<K>(a, implicit_reshard<typename ToB::type>(b, name), name);
    }
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
    Out out(AdoptStorage{}, a.mesh(), to_array<Rank>(shape), nullptr);
    // (an operand may lend its buffer only to a result of its own type)
    TensorBlock<T>* lend_a = nullptr;
    TensorBlock<T>* lend_b = nullptr;
    if constexpr (std::is_same_v<A, Out>)
      if (expiring_a) lend_a = &TensorAccess::block(*expiring_a);
    if constexpr (std::is_same_v<B, Out>)
      if (expiring_b) lend_b = &TensorAccess::block(*expiring_b);
    binary_block<T>(K, state_of(a.mesh()), {&TensorAccess::block(a), lend_a, A::spec_desc, desc_of_rank<A, Rank>(), ea},
                    {&TensorAccess::block(b), lend_b, B::spec_desc, desc_of_rank<B, Rank>(), eb}, Out::spec_desc, shape,
                    TensorAccess::block(out), name);
    return out;
  }
}

// out = in (k) v, or v (k) in where ScalarLeft, over n elements: the kernel of with_scalar,
// instantiated per element type, not per spec.
template <BinaryKind K, bool ScalarLeft, class T>
void scalar_loop(const T* in, T v, T* o, Index n) {
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
// The real kinds by value, one kernel per element type: dispatched (core/dispatch.hpp).
template <class T>
void scalar_kernel(BinaryKind k, bool scalar_left, const T* in, T v, T* o, Index n) {
  TSHARD_DISPATCH((scalar_kernel<T>), k, scalar_left, in, v, o, n);
  switch (k) {
    case BinaryKind::Add: scalar_loop<BinaryKind::Add, false>(in, v, o, n); break;
    case BinaryKind::Sub:
      if (scalar_left) scalar_loop<BinaryKind::Sub, true>(in, v, o, n);
      else scalar_loop<BinaryKind::Sub, false>(in, v, o, n);
      break;
    case BinaryKind::Div:
      if (scalar_left) scalar_loop<BinaryKind::Div, true>(in, v, o, n);
      else scalar_loop<BinaryKind::Div, false>(in, v, o, n);
      break;
    case BinaryKind::Mul: break;  // (lazy: a tensor's scale)
  }
}
template <BinaryKind K, bool ScalarLeft, class T>
void scalar_run(const T* in, T v, T* o, Index n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
    scalar_kernel<T>(K, ScalarLeft, in, v, o, n);
  else
    scalar_loop<K, ScalarLeft>(in, v, o, n);
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
    if (recording(x)) record(out, grad::WithScalar<K, ScalarLeft, T>{T(s)}, tape_node(x));
    return out;
  } else {
    X out(x.mesh(), x.global_shape());
    scalar_run<K, ScalarLeft, T>(x.data(), T(s), out.data(), x.padded_size());
    if (recording(x)) {
      if constexpr (K == BinaryKind::Div && ScalarLeft)  // s / x reads x back
        record(out, grad::WithScalar<K, ScalarLeft, T>{T(s)}, tape_value(x));
      else
        record(out, grad::WithScalar<K, ScalarLeft, T>{T(s)}, tape_node(x));
    }
    return out;
  }
}


// out = k(in) over n elements, instantiated per element type, not per spec.
template <UnaryKind K, class T>
void unary_loop(const T* in, T* out, Index n) {
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
// The real kinds by value, one kernel per element type: dispatched (core/dispatch.hpp).
template <class T>
void unary_kernel(UnaryKind k, const T* in, T* out, Index n) {
  TSHARD_DISPATCH((unary_kernel<T>), k, in, out, n);
  switch (k) {
    case UnaryKind::Exp: unary_loop<UnaryKind::Exp>(in, out, n); break;
    case UnaryKind::Log: unary_loop<UnaryKind::Log>(in, out, n); break;
    case UnaryKind::Tanh: unary_loop<UnaryKind::Tanh>(in, out, n); break;
    case UnaryKind::Sqrt: unary_loop<UnaryKind::Sqrt>(in, out, n); break;
    case UnaryKind::Relu: unary_loop<UnaryKind::Relu>(in, out, n); break;
    case UnaryKind::Abs: unary_loop<UnaryKind::Abs>(in, out, n); break;
    case UnaryKind::Square: unary_loop<UnaryKind::Square>(in, out, n); break;
    case UnaryKind::Sigmoid: unary_loop<UnaryKind::Sigmoid>(in, out, n); break;
    default: break;
  }
}
template <UnaryKind K, class T>
void unary_run(const T* in, T* out, Index n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
    unary_kernel<T>(K, in, out, n);
  else
    unary_loop<K>(in, out, n);
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
    if (recording(x)) record(out, grad::Unary<K>{}, tape_node(x));
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
        auto node = tape_block(x, false);  // (no buffer: only the node goes with it)
        X out = TensorAccess::taken(std::move(x));
        unary_run<K, T>(out.data(), out.data(), out.padded_size());
        if (rec) record(out, grad::Unary<K>{}, std::move(node), tape_output_block(out));
        return out;
      }
    }
    X out(x.mesh(), x.global_shape());
    unary_run<K, T>(x.data(), out.data(), x.padded_size());
    if (recording(x)) {
      if constexpr (by_output)
        record(out, grad::Unary<K>{}, tape_block(x, false), tape_output_block(out));
      else
        record(out, grad::Unary<K>{}, tape_block(x), TapeValue<T>{});
    }
    return out;
  }
}
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

// Two tensors of different element types or mesh types meet no operator above; these say why in
// one sentence instead of every candidate the compiler tried.
namespace detail {
template <class A, class B>
concept MixedTensors =
    ShardedTensorType<A> && ShardedTensorType<B> &&
    (!std::is_same_v<typename std::remove_cvref_t<A>::Scalar, typename std::remove_cvref_t<B>::Scalar> ||
     !std::is_same_v<typename std::remove_cvref_t<A>::MeshT, typename std::remove_cvref_t<B>::MeshT>);

template <class A, class B>
std::remove_cvref_t<A> refuse_mixed() {
  using X = std::remove_cvref_t<A>;
  using Y = std::remove_cvref_t<B>;
  if constexpr (!std::is_same_v<typename X::MeshT, typename Y::MeshT>)
    static_assert(spec_mismatch<X, Y>::value,
                  "tshard: an operator's tensors live on one mesh, and these two have different mesh types "
                  "(spec_mismatch's arguments): make both from one mesh");
  else
    static_assert(spec_mismatch<X, Y>::value,
                  "tshard: an operator's tensors have one element type, and these two differ (spec_mismatch's "
                  "arguments, e.g. float and double): convert one first, ts::map(x, [](float v) { return double(v); })");
  return refused<X>();
}
}  // namespace detail

#define TSHARD_REFUSE_MIXED(op)                            \
  template <class A, class B>                              \
    requires detail::MixedTensors<A, B>                    \
  auto operator op(A&&, B&&) {                             \
    return detail::refuse_mixed<A, B>();                   \
  }
TSHARD_REFUSE_MIXED(+)
TSHARD_REFUSE_MIXED(-)
TSHARD_REFUSE_MIXED(*)
TSHARD_REFUSE_MIXED(/)
#undef TSHARD_REFUSE_MIXED

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

}  // namespace tshard

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp); the loops
// also per instruction-set level (core/dispatch.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (binary_kernel<T>), BinaryKind, T*, const Extents&, const T*, \
    const Extents&, T, const T*, const Extents&, T, int)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (unary_kernel<T>), UnaryKind, const T*, T*, Index)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (scalar_kernel<T>), BinaryKind, bool, const T*, T, T*, Index)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void binary_run<T>(MeshState&, BinaryKind, const SpecDesc&, \
    const Extents&, const T*, const SpecDesc&, const Extents&, const T*, const SpecDesc&, const Extents&, T*, \
    const char*, T, T))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void binary_block<T>(BinaryKind, const std::shared_ptr<MeshState>&, \
    const BinaryOperand<T>&, const BinaryOperand<T>&, const SpecDesc&, const Extents&, TensorBlock<T>&, const char*))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
