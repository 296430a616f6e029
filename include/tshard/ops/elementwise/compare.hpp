// Comparisons giving masks (ShardedTensor of bool) and where(mask, a, b): several operands,
// tensors or scalars, in one broadcasting pass with the elementwise spec rule.
#pragma once
#include "tshard/core/dispatch.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/ops/elementwise/operands.hpp"

namespace tshard {
namespace detail {

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

// mask = a (k) b over padded blocks (operands broadcast by their extents). Dispatched
// (core/dispatch.hpp).
template <class T>
void compare_kernel(CompareKind k, bool* out, const Extents& op, const T* a, const Extents& ap, const T* b,
                    const Extents& bp, int rank) {
  TSHARD_DISPATCH((compare_kernel<T>), k, out, op, a, ap, b, bp, rank);
  for_each_broadcast_run<2>(op, rank, {ap, bp}, [&](Index o, const auto& off, const auto& inner, Index n) {
    for (Index i = 0; i < n; ++i) out[o + i] = compare_values(k, a[off[0] + i * inner[0]], b[off[1] + i * inner[1]]);
  });
}

// mask = a (k) b on descriptors (either side may be a one-element scalar operand).
template <class T>
void compare_run(MeshState& mesh, CompareKind k, const SpecDesc& da, const Extents& sa, const T* a, const SpecDesc& db,
                 const Extents& sb, const T* b, const SpecDesc& dout, const Extents& sout, bool* out, const char* name) {
  const auto al = align_input(mesh, da, sa, a, dout, sout, name);
  const auto bl = align_input(mesh, db, sb, b, dout, sout, name);
  const auto lo = shard_layout(dout, sout, mesh.shape(), mesh.coords());
  compare_kernel<T>(k, out, lo.padded, al.buffer.data, al.padded, bl.buffer.data, bl.padded, dout.rank);
}

// out = mask ? a : b over padded blocks. The runs cover the padded box, where an aligned mask's
// padding was never written: its bytes are read as unsigned char, not as bool (an unwritten bool
// is undefined behaviour; UBSan). Dispatched.
template <class T>
void where_kernel(T* out, const Extents& op, const unsigned char* m, const Extents& mp, const T* a, const Extents& ap,
                  const T* b, const Extents& bp, int rank) {
  TSHARD_DISPATCH((where_kernel<T>), out, op, m, mp, a, ap, b, bp, rank);
  for_each_broadcast_run<3>(op, rank, {mp, ap, bp}, [&](Index o, const auto& off, const auto& inner, Index n) {
    for (Index i = 0; i < n; ++i)
      out[o + i] = m[off[0] + i * inner[0]] != 0 ? a[off[1] + i * inner[1]] : b[off[2] + i * inner[2]];
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
  where_kernel<T>(out, lo.padded, reinterpret_cast<const unsigned char*>(ml.buffer.data), ml.padded, al.buffer.data,
                  al.padded, bl.buffer.data, bl.padded, dout.rank);
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
    auto side = [](const auto& v) {  // (a scalar side: no node)
      if constexpr (detail::OperandTraits<std::remove_cvref_t<decltype(v)>>::tensor)
        return detail::tape_block(v, false);
      else
        return detail::TapeValue<T>{};
    };
    detail::record(out, detail::grad::Where{}, detail::tape_block(mask_in), side(a), side(b));
  }
  return out;
}

}  // namespace tshard

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp); the loops
// of float and double also per instruction-set level (core/dispatch.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T)                                                                                          \
  TSHARD_DISPATCHED_KERNEL(void, (compare_kernel<T>), CompareKind, bool*, const Extents&, const T*, const Extents&, \
                           const T*, const Extents&, int)                                                          \
  TSHARD_DISPATCHED_KERNEL(void, (where_kernel<T>), T*, const Extents&, const unsigned char*, const Extents&,      \
                           const T*, const Extents&, const T*, const Extents&, int)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void compare_run<T>(MeshState&, CompareKind, const SpecDesc&, \
    const Extents&, const T*, const SpecDesc&, const Extents&, const T*, const SpecDesc&, const Extents&, bool*, \
    const char*))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void where_run<T>(MeshState&, const SpecDesc&, const Extents&, \
    const bool*, const SpecDesc&, const Extents&, const T*, const SpecDesc&, const Extents&, const T*, \
    const SpecDesc&, const Extents&, T*))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
