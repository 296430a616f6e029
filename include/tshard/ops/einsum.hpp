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

#include "tshard/core/spec_algebra.hpp"
#include "tshard/ops/einsum_labels.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/local_einsum.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {
namespace detail {

// ---- the compile-time sharding decision ----
// Where a label's split comes from: 0 = the left operand's dim idx, 1 = the right's, 2 = R.
struct LabelSource {
  int src = 2, idx = -1;
};

struct EinsumDecision {
  std::array<char, 2 * kMaxRank> label{};
  std::array<LabelSource, 2 * kMaxRank> source{};
  int n = 0;
  constexpr LabelSource of(char c) const {
    for (int i = 0; i < n; ++i)
      if (label[i] == c) return source[i];
    return {};
  }
};

// GSPMD's propagation, label by label (the left operand's labels first): a label keeps the left
// operand's split if it has one, else the right's, unless that reuses a mesh axis already taken.
// One constexpr function for the typed API (at compile time) and for descriptors (at run time).
constexpr EinsumDecision decide_einsum(const EinsumLabels& e, const SpecDesc& a, const SpecDesc& b) {
  EinsumDecision d;
  std::uint32_t used = 0;
  auto decide = [&](char c) {
    const int ia = e.in_a(c), ib = e.in_b(c);
    LabelSource s;
    if (ia >= 0 && a.dims[ia].count > 0) {
      if (!(a.dims[ia].mask() & used)) {
        s = {0, ia};
        used |= a.dims[ia].mask();
      }
    } else if (ib >= 0 && b.dims[ib].count > 0) {
      if (!(b.dims[ib].mask() & used)) {
        s = {1, ib};
        used |= b.dims[ib].mask();
      }
    }
    d.label[d.n] = c;
    d.source[d.n++] = s;
  };
  for (int i = 0; i < e.na; ++i) decide(e.a[i]);
  for (int i = 0; i < e.nb; ++i)
    if (e.in_a(e.b[i]) < 0) decide(e.b[i]);
  return d;
}

constexpr DimSplit split_of(const LabelSource& s, const SpecDesc& a, const SpecDesc& b) {
  return s.src == 0 ? a.dims[s.idx] : s.src == 1 ? b.dims[s.idx] : DimSplit{};
}

// The output's descriptor: each output label's decided split; a partial sum over the splits
// of every summed label (contracted, or summed in one operand alone).
constexpr SpecDesc einsum_output_desc(const EinsumLabels& e, const EinsumDecision& d, const SpecDesc& a,
                                      const SpecDesc& b) {
  SpecDesc o;
  o.rank = e.no;
  for (int i = 0; i < e.no; ++i) o.dims[i] = split_of(d.of(e.o[i]), a, b);
  for (int i = 0; i < d.n; ++i)
    if (e.in_o(d.label[i]) < 0) o.partial_axes |= split_of(d.source[i], a, b).mask();
  if (o.partial_axes) o.partial = PartialKind::Sum;
  return o;
}

// The output type of the typed API, built from the same decision.
template <class SA, class SB, class M, auto E, class Seq = std::make_index_sequence<std::size_t(E.no)>>
struct einsum_output;
template <class SA, class SB, class M, auto E, std::size_t... I>
struct einsum_output<SA, SB, M, E, std::index_sequence<I...>> {
  static constexpr SpecDesc da = make_desc<SA, NoPartial>(M::axis_names);
  static constexpr SpecDesc db = make_desc<SB, NoPartial>(M::axis_names);
  static constexpr EinsumDecision decision = decide_einsum(E, da, db);
  template <int Src, int Idx>
  using dim = std::conditional_t<Src == 0, dim_at_t<SA, (Src == 0 ? Idx : 0)>,
                                 std::conditional_t<Src == 1, dim_at_t<SB, (Src == 1 ? Idx : 0)>, R>>;
  using spec = Spec<dim<decision.of(E.o[I]).src, decision.of(E.o[I]).idx>...>;
  // The summed labels that carry a split: their axes make the partial.
  static constexpr auto summed = [] {
    std::array<LabelSource, 2 * kMaxRank> c{};
    int n = 0;
    for (int i = 0; i < decision.n; ++i)
      if (E.in_o(decision.label[i]) < 0 && decision.source[i].src != 2) c[n++] = decision.source[i];
    return std::pair{c, n};
  }();
  template <std::size_t... J>
  static auto partial_axes_of(std::index_sequence<J...>) ->
      typename concat_axes<typename dim_axes<dim<summed.first[J].src, summed.first[J].idx>>::type...>::type;
  using axes = decltype(partial_axes_of(std::make_index_sequence<std::size_t(summed.second)>{}));
  using partial = typename partial_of<ReduceOp::Sum, axes>::type;
};

}  // namespace detail

// How an einsum handles a mesh axis that splits a free dim of both operands (GSPMD 3.5):
// gather the right operand (the output keeps the left's split), gather the left one and
// move the smaller output, or rotate the right operand's blocks around the axis ring while
// multiplying (windowed einsum; rank-2 "ij,jk->ik" only). Auto picks the cheaper of the two
// gathers by the cost model of comm/cost.hpp (the same plans and model as reshard's).
enum class EinsumStrategy { Auto, GatherRight, GatherLeft, Windowed };

namespace detail {

struct EinsumPlan {
  EinsumStrategy strategy = EinsumStrategy::GatherRight;
  SpecDesc wa, wb, wc;       // operand layouts for the local product, and its result's layout
  std::uint32_t conflict = 0;  // axes splitting a free dim of both operands
};

// What an einsum moves as planned, on rank r (r < 0: on the busiest rank of each move): the
// operands' reshards to the plan's layouts, the windowed ring's k - 1 shifts of B's block, and
// GatherLeft's move of the product to the output spec.
inline Traffic einsum_traffic(const EinsumPlan& q, const SpecDesc& da, const Extents& sa, const SpecDesc& db,
                              const Extents& sb, const SpecDesc& out_desc, const Extents& so, const MeshShape& mesh,
                              std::size_t bytes, int r) {
  Traffic t = reshard_traffic(mesh, da, q.wa, sa, bytes, r);
  t += reshard_traffic(mesh, db, q.wb, sb, bytes, r);
  if (q.strategy == EinsumStrategy::Windowed) {
    const int k = split_parts(q.wb.dims[1], mesh);
    const std::uint64_t block = std::uint64_t(shard_layout_of_rank(q.wb, sb, mesh, r < 0 ? 0 : r).padded_size()) * bytes;
    for (int step = 0; step + 1 < k; ++step) t += messages_traffic(block, block, 1, 1);
  } else if (q.conflict && !(q.wc == out_desc)) {
    SpecDesc wc = q.wc;
    wc.partial = out_desc.partial;
    wc.partial_axes = out_desc.partial_axes;
    t += reshard_traffic(mesh, wc, out_desc, so, bytes, r);
  }
  return t;
}

inline std::string strategy_name(EinsumStrategy s, std::uint32_t conflict) {
  if (!conflict) return "aligned operands, local product";
  switch (s) {
    case EinsumStrategy::GatherLeft: return "all-gather the left operand, move the output";
    case EinsumStrategy::Windowed: return "windowed: rotate the right operand around the ring";
    default: return "all-gather the right operand";
  }
}

// Decides the operand layouts (descriptors only) from the decision, and the strategy for
// axes that split a free dim of both operands.
inline EinsumPlan plan_einsum(const EinsumLabels& e, const EinsumDecision& decision, const SpecDesc& da,
                              const Extents& sa, const SpecDesc& db, const Extents& sb, const SpecDesc& out_desc,
                              const Extents& so, const MeshShape& mesh, EinsumStrategy wanted, std::size_t element_bytes) {
  EinsumPlan p;
  auto aligned = [&](const std::array<char, kMaxRank>& labels, int n) {
    SpecDesc w;
    w.rank = n;
    for (int i = 0; i < n; ++i) w.dims[i] = split_of(decision.of(labels[i]), da, db);
    return w;
  };
  p.wa = aligned(e.a, e.na);
  p.wb = aligned(e.b, e.nb);
  p.wc = out_desc;
  // Axes that split a free dim of the left operand and, in the input, a free dim of the right.
  std::uint32_t left_free = 0, right_free = 0;
  bool whole = true;  // every conflicting dim is split by conflicting axes only
  auto free_in_a = [&](char c) { return e.in_b(c) < 0 && e.in_o(c) >= 0; };
  auto free_in_b = [&](char c) { return e.in_a(c) < 0 && e.in_o(c) >= 0; };
  for (int i = 0; i < e.na; ++i)
    if (free_in_a(e.a[i])) left_free |= p.wa.dims[i].mask();
  for (int i = 0; i < e.nb; ++i)
    if (free_in_b(e.b[i])) right_free |= db.dims[i].mask();
  p.conflict = left_free & right_free;
  if (!p.conflict) return p;
  for (int i = 0; i < e.na; ++i)
    if (free_in_a(e.a[i]) && (p.wa.dims[i].mask() & p.conflict))
      whole &= p.wa.dims[i].mask() == (p.wa.dims[i].mask() & p.conflict);
  for (int i = 0; i < e.nb; ++i)
    if (free_in_b(e.b[i]) && (db.dims[i].mask() & p.conflict))
      whole &= db.dims[i].mask() == (db.dims[i].mask() & p.conflict);
  const bool windowable = whole && e.na == 2 && e.nb == 2 && e.no == 2 && e.in_b(e.a[0]) < 0 && e.a[1] == e.b[0] &&
                          e.in_a(e.b[1]) < 0 && e.o[0] == e.a[0] && e.o[1] == e.b[1] &&
                          p.wa.dims[0] == db.dims[1] && p.wb.dims[0] == p.wa.dims[1];
  // The layouts each strategy multiplies in (GatherRight: the aligned ones).
  auto with_strategy = [&](EinsumStrategy s) {
    EinsumPlan q = p;
    q.strategy = s;
    if (s == EinsumStrategy::GatherLeft) {
      // The left operand drops the conflicting axes; the right keeps its free splits; the
      // product comes out split like the right operand and is then moved to the output spec.
      for (int i = 0; i < e.na; ++i)
        if (free_in_a(e.a[i]) && (q.wa.dims[i].mask() & q.conflict)) q.wa.dims[i] = DimSplit{};
      for (int i = 0; i < e.nb; ++i)
        if (free_in_b(e.b[i]) && (db.dims[i].mask() & q.conflict)) q.wb.dims[i] = db.dims[i];
      for (int i = 0; i < e.no; ++i) {
        const int ia = e.in_a(e.o[i]), ib = e.in_b(e.o[i]);
        q.wc.dims[i] = ia >= 0 ? q.wa.dims[ia] : q.wb.dims[ib];
      }
    }
    if (s == EinsumStrategy::Windowed) q.wb.dims[1] = db.dims[1];  // B keeps its column blocks
    return q;
  };
  EinsumStrategy s = wanted;
  if (s == EinsumStrategy::Windowed && !windowable) s = EinsumStrategy::GatherRight;
  if (s == EinsumStrategy::GatherLeft && !whole) s = EinsumStrategy::GatherRight;
  if (s == EinsumStrategy::Auto) {
    s = EinsumStrategy::GatherRight;
    if (whole) {
      auto seconds = [&](const EinsumPlan& q) {
        return einsum_traffic(q, da, sa, db, sb, out_desc, so, mesh, element_bytes, -1).seconds();
      };
      if (seconds(with_strategy(EinsumStrategy::GatherLeft)) < seconds(with_strategy(EinsumStrategy::GatherRight)))
        s = EinsumStrategy::GatherLeft;
    }
  }
  return with_strategy(s);
}

// C (rows split over the ring, all columns) = A (rows split) x B (columns split), B's blocks
// rotating around the ring: each step multiplies the block in hand while the next arrives.
template <class T>
void windowed_matmul(MeshState& mesh, const SpecDesc& wa, const SpecDesc& wb, const Extents& ashape,
                     const Extents& bshape, const T* a, const T* b, T* c, const ShardLayout& lc) {
  const MeshShape& m = mesh.shape();
  const ShardLayout la = shard_layout(wa, ashape, m, mesh.coords());
  const ShardLayout lb = shard_layout(wb, bshape, m, mesh.coords());
  MPI_Comm ring = mesh.group(wb.dims[1]);
  const int k = comm_size(ring), me = comm_rank(ring);
  const Index n = bshape[1], block = lb.padded_size(), rows = la.valid[0], inner = la.valid[1];
  Scratch<T> buf0(static_cast<std::size_t>(block)), buf1(static_cast<std::size_t>(block));
  T* cur = buf0.data();
  T* next = buf1.data();
  std::copy(b, b + block, cur);
  for (int s = 0; s < k; ++s) {
    const int q = (me + s) % k;  // the column block in hand
    AsyncExchange<T> shift;
    if (s + 1 < k)
      shift.start(ring, {{(me - 1 + k) % k, cur, block}}, {{(me + 1) % k, next, block}}, "ring_shift");
    const Index col = shard_offset(n, k, q), cols = shard_valid(n, k, q);
    if (rows && cols)
      gemm<T>(false, false, rows, cols, inner, a, std::max<Index>(la.padded[0], 1), cur, std::max<Index>(lb.padded[0], 1),
              c + col * lc.padded[0], std::max<Index>(lc.padded[0], 1));
    shift.wait();
    std::swap(cur, next);
  }
}

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
                                const std::string& a, const std::string& b) {
  for (int i = 0; i < e.na; ++i)
    if (int j = e.in_b(e.a[i]); j >= 0 && sa[i] != sb[j])
      throw ShapeError("tshard::einsum<\"" + std::string(eq) + "\">: index '" + e.a[i] + "' has extent " +
                       std::to_string(sa[i]) + " in a and " + std::to_string(sb[j]) + " in b: a is " + a + ", b is " +
                       b);
}

inline Extents einsum_output_shape(const EinsumLabels& e, const Extents& sa, const Extents& sb) {
  Extents s{};
  for (int i = 0; i < e.no; ++i) {
    const int ia = e.in_a(e.o[i]);
    s[i] = ia >= 0 ? sa[ia] : sb[e.in_b(e.o[i])];
  }
  return s;
}

}  // namespace detail

// The einsum of two sharded tensors, e.g. einsum<"bij,bjk->bik">(a, b). The output spec is
// deduced (see the file comment); contracting split dims gives a partial sum.
template <FixedString Eq, ShardedTensorType A, ShardedTensorType B>
auto einsum(const A& a_in, const B& b_in, EinsumStrategy strategy = EinsumStrategy::Auto) {
  constexpr detail::EinsumLabels e = detail::parse_einsum(Eq);
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
    detail::check_einsum_shapes(e, Eq.view(), a.extents(), b.extents(), a.describe(), b.describe());
    using O = detail::einsum_output<typename A::SpecType, typename B::SpecType, M, e>;
    using Out = ShardedTensor<T, M, typename O::spec, typename O::partial>;
    static_assert(Out::spec_desc == detail::einsum_output_desc(e, O::decision, O::da, O::db),
                  "tshard: internal: the typed and descriptor einsum decisions disagree");
    const detail::Extents shape = detail::einsum_output_shape(e, a.extents(), b.extents());
    Out out(a.mesh(), detail::to_array<e.no>(shape));
    detail::einsum_run<T>(*a.mesh().state(), e, O::decision, O::da, a.extents(), a.data(), O::db, b.extents(), b.data(),
                          Out::spec_desc, shape, out.data(), strategy);
    return out;
  }
}

// Which strategy einsum<Eq>(a, b, strategy) takes and how its operands move.
template <FixedString Eq, ShardedTensorType A, ShardedTensorType B>
std::string explain_einsum(const A& a, const B& b, EinsumStrategy strategy = EinsumStrategy::Auto) {
  static_assert(!A::is_partial && !B::is_partial, "tshard: explain_einsum takes resolved operands");
  constexpr detail::EinsumLabels e = detail::parse_einsum(Eq);
  using O = detail::einsum_output<typename A::SpecType, typename B::SpecType, typename A::MeshT, e>;
  const detail::SpecDesc out = detail::einsum_output_desc(e, O::decision, O::da, O::db);
  auto& mesh = *a.mesh().state();
  const auto c_out = detail::einsum_output_shape(e, a.extents(), b.extents());
  const auto p = detail::plan_einsum(e, O::decision, O::da, a.extents(), O::db, b.extents(), out, c_out, mesh.shape(), strategy,
                                     sizeof(typename A::Scalar));
  auto moves = [&](const auto& x, const detail::SpecDesc& w) {
    return x.spec_desc == w ? std::string("stays") : detail::cached_plan(mesh, x.spec_desc, w, x.extents(), sizeof(typename A::Scalar))->describe(mesh.shape());
  };
  std::string local = "a ring of GEMMs on column blocks";
  if (p.strategy != EinsumStrategy::Windowed) {
    detail::SpecDesc wc = p.wc;
    wc.partial = out.partial;
    wc.partial_axes = out.partial_axes;
    const auto c_shape = detail::einsum_output_shape(e, a.extents(), b.extents());
    local = detail::describe_local_product(e, detail::shard_layout(p.wa, a.extents(), mesh.shape(), mesh.coords()),
                                           detail::shard_layout(p.wb, b.extents(), mesh.shape(), mesh.coords()),
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
  const auto& mesh = a.mesh().state()->shape();
  const auto c_out = detail::einsum_output_shape(e, a.extents(), b.extents());
  const auto p = detail::plan_einsum(e, O::decision, O::da, a.extents(), O::db, b.extents(), out, c_out, mesh, strategy,
                                     sizeof(typename A::Scalar));
  return detail::einsum_traffic(p, O::da, a.extents(), O::db, b.extents(), out, c_out, mesh, sizeof(typename A::Scalar),
                                a.mesh().rank());
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
    detail::execute_reshard(*natural.mesh().state(), natural.spec_desc, Out::spec_desc, natural.extents(),
                            natural.data(), out.data());
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
