// einsum / matmul with GSPMD's propagation (arXiv 2105.04663, section 3.5): the output spec is
// deduced at compile time label by label (the left operand's split wins, a mesh axis is used
// once), contracting a dim both operands split over the same axes gives a partial sum resolved
// lazily, and operands split otherwise are aligned by implicit reshards (a slice where they
// are replicated, an all-to-all or all-gather where they are split differently). The local
// product runs as GEMMs that read the valid blocks in place (ops/local_einsum.hpp).
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>

#include <array>
#include <string>
#include <type_traits>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/spec_algebra.hpp"
#include "tshard/ops/einsum_decision.hpp"
#include "tshard/ops/einsum_labels.hpp"
#include "tshard/ops/einsum_plan.hpp"
#include "tshard/ops/einsum_ring.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/local_einsum.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {
namespace detail {

// The whole einsum on descriptors, instantiated per element type only: aligns the operands
// (implicit reshards), multiplies locally or around the ring, moves a GatherLeft result.
template <class T>
void einsum_run(MeshState& mesh, const EinsumLabels& e, const EinsumDecision& decision, const SpecDesc& da,
                const Extents& sa, const T* a, const SpecDesc& db, const Extents& sb, const T* b,
                const SpecDesc& dout, const Extents& sout, T* out, EinsumStrategy strategy) {
  const EinsumPlan plan = plan_einsum(e, decision, da, sa, db, sb, dout, sout, mesh.shape(), strategy, sizeof(T));
  auto al = implicit_reshard(mesh, da, plan.wa, sa, a, "einsum");
  auto bl = implicit_reshard(mesh, db, plan.wb, sb, b, "einsum");
  const auto la = shard_layout(plan.wa, sa, mesh.shape(), mesh.coords());
  const auto lb = shard_layout(plan.wb, sb, mesh.shape(), mesh.coords());
  const auto lo = shard_layout(dout, sout, mesh.shape(), mesh.coords());
  if (plan.strategy == EinsumStrategy::Windowed) {
    windowed_matmul<T>(mesh, plan.wa, plan.wb, sa, sb, al.data, bl.data, out, lo);
  } else if (plan.wc == dout) {
    local_einsum<T>(e, al.data, la, bl.data, lb, out, lo);
  } else {  // GatherLeft: the product is split like the right operand, then moved
    SpecDesc wc = plan.wc;
    wc.partial = dout.partial;
    wc.partial_axes = dout.partial_axes;
    const auto lc = shard_layout(wc, sout, mesh.shape(), mesh.coords());
    Scratch<T> c(static_cast<std::size_t>(lc.padded_size()));
    local_einsum<T>(e, al.data, la, bl.data, lb, c.data(), lc);
    require_implicit_allowed(mesh, wc, dout, sout, "einsum");
    OperatorScope move("einsum/auto");
    execute_reshard(mesh, wc, dout, sout, c.data(), out);
  }
}

inline void check_einsum_shapes(const EinsumLabels& e, std::string_view eq, const Extents& sa, const Extents& sb,
                                Text a, Text b) {
  for (int i = 0; i < e.na; ++i)
    if (int j = e.in_b(e.a[i]); j >= 0 && sa[i] != sb[j])
      throw ShapeError("tshard::einsum<\"" + std::string(eq) + "\">: index '" + e.a[i] + "' has extent " +
                       std::to_string(sa[i]) + " in a and " + std::to_string(sb[j]) + " in b: a is " + a.str() + ", b is " +
                       b.str());
}

inline Extents einsum_output_shape(const EinsumLabels& e, const Extents& sa, const Extents& sb) {
  Extents s{};
  for (int i = 0; i < e.no; ++i) {
    const int ia = e.in_a(e.o[i]);
    s[i] = ia >= 0 ? sa[ia] : sb[e.in_b(e.o[i])];
  }
  return s;
}

namespace grad {  // the tag of einsum on the tape; its rule (two einsums) is in ad/
// The labels at run time: every einsum of a model shares one rule per element type, which runs
// on its operands' descriptors.
struct Einsum {
  static constexpr bool any_output = true;
  EinsumLabels e;
};
}  // namespace grad

// einsum on parsed labels (einsum<Eq> parses its string; gradient rules build theirs). Gradient
// rules pass Record = false: their products run while recording is paused (no gradients of
// gradients), so the recording branch, which would instantiate a rule for each of them and so on,
// is not compiled (a third of a model file's compile time was rules of rules).
template <EinsumLabels e, ShardedTensorType A, ShardedTensorType B, bool Record = true>
auto einsum_labeled(const A& a_in, const B& b_in, EinsumStrategy strategy, std::string_view eq) {
  static_assert(e.well_formed, "tshard: an einsum string reads 'operand,operand->output' with letters for indices");
  static_assert(!detail::labels_repeat(e.a, e.na) && !detail::labels_repeat(e.b, e.nb),
                "tshard: an einsum operand repeats an index (diagonals are not supported)");
  static_assert(!detail::labels_repeat(e.o, e.no), "tshard: the einsum output repeats an index");
  static_assert(detail::outputs_known(e), "tshard: an einsum output index appears in neither operand");
  static_assert(e.na == A::rank && e.nb == B::rank, "tshard: the einsum string's operand ranks differ from the tensors' ranks");
  static_assert(std::is_same_v<typename A::Scalar, typename B::Scalar>, "tshard: einsum operands have one element type");
  static_assert(std::is_same_v<typename A::MeshT, typename B::MeshT>, "tshard: einsum operands live on one mesh type");
  // After a failed check, stop: the sentence above stays the only error.
  constexpr bool valid = e.well_formed && !detail::labels_repeat(e.a, e.na) && !detail::labels_repeat(e.b, e.nb) &&
                         !detail::labels_repeat(e.o, e.no) && detail::outputs_known(e) && e.na == A::rank &&
                         e.nb == B::rank && std::is_same_v<typename A::Scalar, typename B::Scalar> &&
                         std::is_same_v<typename A::MeshT, typename B::MeshT>;
  if constexpr (!valid) {
    return 0;  // never used: compilation has failed
  } else {
    using T = typename A::Scalar;
    using M = typename A::MeshT;
    detail::OperatorScope scope("einsum");
    const auto& a = detail::resolved(a_in, "einsum");
    const auto& b = detail::resolved(b_in, "einsum");
    detail::require_same_mesh(a, b, "einsum");
    detail::check_einsum_shapes(e, eq, detail::extents_of(a), detail::extents_of(b), [&] { return a.describe(); },
                                [&] { return b.describe(); });
    using O = detail::einsum_output<typename A::SpecType, typename B::SpecType, M, e>;
    using Out = ShardedTensor<T, M, typename O::spec, typename O::partial>;
    static_assert(Out::spec_desc == detail::einsum_output_desc(e, O::decision, O::da, O::db),
                  "tshard: internal: the typed and descriptor einsum decisions disagree");
    const detail::Extents shape = detail::einsum_output_shape(e, detail::extents_of(a), detail::extents_of(b));
    if constexpr (!Record) detail::refuse_tracked("einsum", detail::kNoSecondOrder, a, b);
    auto* kept = Record && detail::recording(a, b) ? detail::KeptProducts::active() : nullptr;  // a selective checkpoint's
    if (kept && kept->replaying()) {
      Out out(detail::AdoptStorage{}, a.mesh(), detail::to_array<e.no>(shape), nullptr);
      out = Out(detail::AdoptStorage{}, a.mesh(), out.global_shape(), kept->template take<T>(out.padded_size()));
      if constexpr (Record) detail::record(out, grad::Einsum{e}, detail::tape_block(a), detail::tape_block(b));
      return out;
    }
    Out out(a.mesh(), detail::to_array<e.no>(shape));
    detail::einsum_run<T>(*detail::state_of(a.mesh()), e, O::decision, O::da, detail::extents_of(a), a.data(), O::db,
                          detail::extents_of(b), b.data(), Out::spec_desc, shape, out.data(), strategy);
    if (kept) kept->keep(detail::TensorAccess::storage(out), out.padded_size());
    if constexpr (Record)
      if (detail::recording(a, b)) detail::record(out, grad::Einsum{e}, detail::tape_block(a), detail::tape_block(b));
    return out;
  }
}

}  // namespace detail

// The einsum of two sharded tensors, e.g. einsum<"bij,bjk->bik">(a, b). The output spec is
// deduced (see the file comment); contracting split dims gives a partial sum.
template <FixedString Eq, ShardedTensorType A, ShardedTensorType B>
auto einsum(const A& a, const B& b, EinsumStrategy strategy = EinsumStrategy::Auto) {
  return detail::einsum_labeled<detail::parse_einsum(Eq)>(a, b, strategy, Eq.view());
}

// Which strategy einsum<Eq>(a, b, strategy) takes and how its operands move.
template <FixedString Eq, ShardedTensorType A, ShardedTensorType B>
std::string explain_einsum(const A& a, const B& b, EinsumStrategy strategy = EinsumStrategy::Auto) {
  static_assert(!A::is_partial && !B::is_partial, "tshard: explain_einsum takes resolved operands");
  constexpr detail::EinsumLabels e = detail::parse_einsum(Eq);
  using O = detail::einsum_output<typename A::SpecType, typename B::SpecType, typename A::MeshT, e>;
  const detail::SpecDesc out = detail::einsum_output_desc(e, O::decision, O::da, O::db);
  auto& mesh = *detail::state_of(a.mesh());
  const auto c_out = detail::einsum_output_shape(e, detail::extents_of(a), detail::extents_of(b));
  const auto p = detail::plan_einsum(e, O::decision, O::da, detail::extents_of(a), O::db, detail::extents_of(b), out,
                                     c_out, mesh.shape(), strategy, sizeof(typename A::Scalar));
  auto moves = [&](const auto& x, const detail::SpecDesc& w) {
    return x.spec_desc == w ? std::string("stays")
                            : detail::reshard_steps(mesh, x.spec_desc, w, detail::extents_of(x), sizeof(typename A::Scalar));
  };
  std::string local = "a ring of GEMMs on column blocks";
  if (p.strategy != EinsumStrategy::Windowed) {
    detail::SpecDesc wc = p.wc;
    wc.partial = out.partial;
    wc.partial_axes = out.partial_axes;
    const auto c_shape = detail::einsum_output_shape(e, detail::extents_of(a), detail::extents_of(b));
    local = detail::describe_local_product(
        e, detail::shard_layout(p.wa, detail::extents_of(a), mesh.shape(), mesh.coords()),
        detail::shard_layout(p.wb, detail::extents_of(b), mesh.shape(), mesh.coords()),
        detail::shard_layout(wc, c_shape, mesh.shape(), mesh.coords()));
  }
  return detail::strategy_name(p.strategy, p.conflict) + "; a: " + moves(a, p.wa) + "; b: " + moves(b, p.wb) +
         "; output " + out.to_string(mesh.shape()) + "; local: " + local;
}

// What einsum<Eq>(a, b, strategy) will send and receive on this rank, by the cost model's
// plans (the bytes comm_stats() counts; where shards are uneven the executor may move less).
template <FixedString Eq, ShardedTensorType A, ShardedTensorType B>
Traffic predict_einsum(const A& a, const B& b, EinsumStrategy strategy = EinsumStrategy::Auto) {
  static_assert(!A::is_partial && !B::is_partial, "tshard: predict_einsum takes resolved operands");
  constexpr detail::EinsumLabels e = detail::parse_einsum(Eq);
  using O = detail::einsum_output<typename A::SpecType, typename B::SpecType, typename A::MeshT, e>;
  const detail::SpecDesc out = detail::einsum_output_desc(e, O::decision, O::da, O::db);
  const auto& mesh = detail::state_of(a.mesh())->shape();
  const auto c_out = detail::einsum_output_shape(e, detail::extents_of(a), detail::extents_of(b));
  const auto p = detail::plan_einsum(e, O::decision, O::da, detail::extents_of(a), O::db, detail::extents_of(b), out,
                                     c_out, mesh, strategy, sizeof(typename A::Scalar));
  return detail::einsum_traffic(p, O::da, detail::extents_of(a), O::db, detail::extents_of(b), out, c_out, mesh,
                                sizeof(typename A::Scalar), a.mesh().rank());
}

// The einsum with its output spec pinned (the annotation users give): the natural result
// resharded to OutSpec, a partial resolved on the way (reduce-scatter where OutSpec splits).
// The user asked for that move, so it is counted under "einsum" and never refused as implicit.
template <FixedString Eq, class OutSpec, ShardedTensorType A, ShardedTensorType B>
auto einsum(const A& a, const B& b, EinsumStrategy strategy = EinsumStrategy::Auto) {
  static_assert(detail::is_spec<OutSpec>::value, "tshard: einsum<\"...\", OutSpec> takes a tshard::Spec<...>");
  auto natural = einsum<Eq>(a, b, strategy);
  using Natural = decltype(natural);
  using Out = ShardedTensor<typename Natural::Scalar, typename Natural::MeshT, OutSpec>;
  if constexpr (std::is_same_v<Natural, Out>) {
    return natural;
  } else {
    detail::OperatorScope scope("einsum");
    Out out(natural.mesh(), natural.global_shape());
    detail::execute_reshard(*detail::state_of(natural.mesh()), natural.spec_desc, Out::spec_desc,
                            detail::extents_of(natural), natural.data(), out.data());
    if (detail::recording(natural)) detail::record(out, detail::grad::Reshard{}, detail::tape_node(natural));
    return out;
  }
}

// Matrix product of two rank-2 tensors: einsum<"ij,jk->ik">.
template <ShardedTensorType A, ShardedTensorType B>
auto matmul(const A& a, const B& b, EinsumStrategy strategy = EinsumStrategy::Auto) {
  static_assert(A::rank == 2 && B::rank == 2, "tshard: matmul multiplies rank-2 tensors (use einsum for others)");
  if constexpr (A::rank == 2 && B::rank == 2)
    return einsum<"ij,jk->ik">(a, b, strategy);
  else
    return 0;  // never used: compilation has failed
}

}  // namespace tshard

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void einsum_run<T>(MeshState&, const EinsumLabels&, \
    const EinsumDecision&, const SpecDesc&, const Extents&, const T*, const SpecDesc&, const Extents&, const T*, \
    const SpecDesc&, const Extents&, T*, EinsumStrategy))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
