// An einsum's strategy and operand layouts, on descriptors only: where both operands split a
// free dim over the same axes, gather the right operand, gather the left one, or rotate the
// right one around the ring (windowed), Auto choosing by the cost model of comm/cost.hpp over
// the reshard planner's cached plans.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tshard/comm/cost.hpp"
#include "tshard/ops/einsum_decision.hpp"
#include "tshard/ops/einsum_labels.hpp"
#include "tshard/reshard/plan_cache.hpp"

namespace tshard {

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

}  // namespace detail
}  // namespace tshard
