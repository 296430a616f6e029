// The definitions of plan.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tshard/reshard/plan.hpp"

namespace tshard::detail {

TSHARD_FUNC Index box_overlap(const ShardLayout& a, const ShardLayout& b) {
  Index v = 1;
  for (int d = 0; d < a.rank; ++d) {
    Index lo = std::max(a.offset[d], b.offset[d]);
    Index hi = std::min(a.offset[d] + a.valid[d], b.offset[d] + b.valid[d]);
    if (hi <= lo) return 0;
    v *= hi - lo;
  }
  return v;
}

TSHARD_FUNC bool box_inside(const ShardLayout& inner, const ShardLayout& outer, int d) {
  if (inner.valid[d] == 0) return true;
  return inner.offset[d] >= outer.offset[d] && inner.offset[d] + inner.valid[d] <= outer.offset[d] + outer.valid[d];
}

TSHARD_FUNC std::vector<int> direct_senders(const SpecDesc& from, const MeshShape& mesh, int r) {
  std::vector<int> v;
  for (int s = 0; s < mesh.size(); ++s)
    if (mesh.same_outside(s, r, from.split_axes())) v.push_back(s);
  return v;
}

TSHARD_FUNC ReshardPlan Planner::plan(const SpecDesc& src, const SpecDesc& dst) const {
  // Partial values moved as they are (operators aligning partial operands): the partial axes
  // are split by neither spec, so the plain plan keeps every value in its partial group.
  if (dst.partial != PartialKind::None && src.partial == dst.partial && src.partial_axes == dst.partial_axes)
    return plan(src.without_partial(), dst.without_partial());
  ReshardPlan p;
  SpecDesc cur = src;
  if (cur.partial != PartialKind::None) resolve_partial(cur, dst, p);
  if (cur.partial != PartialKind::None) {
    // Still partial over the axes dst keeps partial (a sum left to an owner), summed over the
    // others: the rest moves the values as they are, as above (a plain copy after the sum is
    // not needed; a local slice is).
    const ReshardPlan rest = plan(cur.without_partial(), dst.without_partial());
    const bool copy_only = rest.steps.size() == 1 && rest.steps[0].kind == StepKind::Local &&
                           rest.steps[0].from == rest.steps[0].to;
    if (!copy_only)
      for (auto& st : rest.steps) p.add(st);
    return p;
  }
  std::optional<ReshardPlan> staged = staged_plan(cur, dst);
  ReshardPlan direct;
  if (!(cur == dst)) direct.add(ReshardStep{StepKind::Direct, cur, dst, -1, -1, {}, busiest_direct_traffic(cur, dst)});
  // Regular collectives are bandwidth-optimal and better tuned than point-to-point: the staged
  // plan wins unless the direct one is cheaper by more than kStagedPreference.
  const ReshardPlan& best =
      (staged && (staged->cost <= kStagedPreference * direct.cost || cur == dst)) ? *staged : direct;
  for (auto& st : best.steps) p.add(st);
  if (p.steps.empty()) p.steps.push_back({StepKind::Local, cur, dst});  // a plain copy
  return p;
}

// How many blocks of size p, tiling a dim from 0, meet [lo, hi) (hi > lo).
constexpr Index blocks_met(Index lo, Index hi, Index p) { return p == 0 ? 0 : (hi - 1) / p - lo / p + 1; }

TSHARD_FUNC Traffic Planner::direct_traffic(const SpecDesc& from, const SpecDesc& to, int r) const {
  // In closed form, dim by dim: r's partners are the ranks q that agree with r off `from`'s
  // split axes, whose coordinates on those axes are free. A box overlap is a product over dims,
  // and the free axes of different dims vary independently, so each sum over q is a product of
  // per-dim sums (O(rank) per rank, not the O(P) walk over its partners).
  const auto c = mesh_.coords_of(r);
  const std::uint32_t free_axes = from.split_axes();
  const ShardLayout mine_from = layout(from, r), mine_to = layout(to, r);
  // Received: `from`'s blocks tile each dim, so r gets its whole `to` block, from the blocks
  // it meets.
  std::uint64_t received = 1, receives = 1;
  for (int d = 0; d < from.rank; ++d) {
    if (mine_to.valid[d] == 0) received = receives = 0;
    if (received == 0) break;
    const DimBlock f = dim_block(from.dims[d], shape_[d], mesh_, c);
    received *= std::uint64_t(mine_to.valid[d]);
    receives *= std::uint64_t(blocks_met(mine_to.offset[d], mine_to.offset[d] + mine_to.valid[d], f.padded));
  }
  // Sent: along d, the `to` blocks of r's partners are those whose digits on the fixed axes
  // (split by `to` along d, not by `from`) are r's; a free axis `to` does not split repeats
  // every box once per coordinate.
  std::uint64_t sent = 1, sends = 1;
  for (int a = 0; a < mesh_.axes(); ++a)
    if ((free_axes & ~to.split_axes()) & (1u << a)) sent *= std::uint64_t(mesh_.sizes[a]), sends *= std::uint64_t(mesh_.sizes[a]);
  for (int d = 0; d < from.rank && sent > 0; ++d) {
    const DimSplit& t = to.dims[d];
    const Index lo = mine_from.offset[d], hi = lo + mine_from.valid[d];
    if (hi <= lo) {
      sent = sends = 0;
      break;
    }
    const Index p = padded_extent(shape_[d], split_parts(t, mesh_));
    std::uint64_t len = 0, met = 0;
    auto count = [&](const std::array<int, kMaxAxes>& q) {
      const DimBlock b = dim_block(t, shape_[d], mesh_, q);
      const Index o = std::min(hi, b.end()) - std::max(lo, b.offset);
      if (b.valid > 0 && o > 0) len += std::uint64_t(o), ++met;
    };
    const std::uint32_t t_free = t.mask() & free_axes;
    Index combos = 1;
    for (int i = 0; i < t.count; ++i)
      if (t_free & (1u << t[i])) combos *= mesh_.sizes[t[i]];
    const Index first = lo / p, last = (hi - 1) / p;
    if (t_free == t.mask()) {
      // Every partner's block along d: they tile the dim, so r's block goes out whole.
      len = std::uint64_t(hi - lo);
      met = std::uint64_t(last - first + 1);
    } else if (combos <= last - first + 1) {
      for_each_coords(mesh_, t_free, c, count);
    } else {
      // Fewer blocks meet r's than the free axes give: walk those, keeping the ones whose
      // fixed digits are r's.
      auto q = c;
      for (Index j = first; j <= last; ++j) {
        set_split_coord(t, mesh_, j, q);
        bool mine = true;
        for (int i = 0; i < t.count; ++i)
          if (!(t_free & (1u << t[i])) && q[t[i]] != c[t[i]]) mine = false;
        if (mine) count(q);
      }
    }
    sent *= len;
    sends *= met;
  }
  // Both sums counted r itself.
  if (const Index self = box_overlap(mine_from, mine_to)) {
    sent -= std::uint64_t(self), received -= std::uint64_t(self);
    --sends, --receives;
  }
  return messages_traffic(sent * bytes_, received * bytes_, int(sends), int(receives));
}

TSHARD_FUNC bool Planner::refines(const SpecDesc& from, const SpecDesc& to, int d) const {
  bool inside = true;
  for_each_coords(mesh_, from.dims[d].mask() | to.dims[d].mask(), {}, [&](const std::array<int, kMaxAxes>& c) {
    const DimBlock f = dim_block(from.dims[d], shape_[d], mesh_, c), t = dim_block(to.dims[d], shape_[d], mesh_, c);
    if (t.valid > 0 && (t.offset < f.offset || t.end() > f.end())) inside = false;
  });
  return inside;
}

TSHARD_FUNC bool Planner::gathers(const SpecDesc& from, const SpecDesc& to, int d,
                                  const std::vector<int>& axes) const {
  // One check per group over `axes`: the groups differ only on the other axes that split d.
  std::uint32_t group = 0;
  for (int a : axes) group |= 1u << a;
  const std::uint32_t outside = (from.dims[d].mask() | to.dims[d].mask()) & ~group;
  bool ok = true;
  for_each_coords(mesh_, outside, {}, [&](const std::array<int, kMaxAxes>& g) {
    if (!ok) return;
    Index lo = shape_[d], hi = 0;
    bool any = false;
    for_each_coords(mesh_, group, g, [&](const std::array<int, kMaxAxes>& c) {
      const DimBlock f = dim_block(from.dims[d], shape_[d], mesh_, c);
      if (f.valid == 0) return;
      lo = std::min(lo, f.offset), hi = std::max(hi, f.end()), any = true;
    });
    for_each_coords(mesh_, group, g, [&](const std::array<int, kMaxAxes>& c) {
      const DimBlock t = dim_block(to.dims[d], shape_[d], mesh_, c);
      // Every member's slices must land inside the new buffer (they are received in place),
      // and they must cover its valid part.
      if (any && (lo < t.offset || hi > t.offset + t.padded)) ok = false;
      if (t.valid > 0 && (t.offset < lo || t.end() > hi)) ok = false;
    });
  });
  return ok;
}

TSHARD_FUNC void Planner::resolve_partial(SpecDesc& cur, const SpecDesc& dst, ReshardPlan& p) const {
  // Reduce-scatter along the dim whose target split continues with partial axes.
  int best_dim = -1;
  std::vector<int> best_axes;
  Index best_k = 1;
  for (int d = 0; d < cur.rank; ++d) {
    if (!cur.dims[d].is_prefix_of(dst.dims[d])) continue;
    std::vector<int> q;
    SpecDesc next = cur;
    for (int i = cur.dims[d].count; i < dst.dims[d].count; ++i) {
      int a = dst.dims[d][i];
      if (!(cur.partial_axes & (1u << a))) break;
      q.push_back(a);
      next.dims[d].push(a);
    }
    while (!q.empty()) {
      if (refines(cur.without_partial(), next.without_partial(), d)) break;
      q.pop_back();
      next.dims[d].count--;
    }
    if (!q.empty() && axes_size(q) > best_k) {
      best_k = axes_size(q);
      best_dim = d;
      best_axes = q;
    }
  }
  if (best_dim >= 0) {
    SpecDesc next = cur;
    for (int a : best_axes) {
      next.dims[best_dim].push(a);
      next.partial_axes &= ~(1u << a);
    }
    if (next.partial_axes == 0) next.partial = PartialKind::None;
    p.add({StepKind::ReduceScatter, cur, next, best_dim, -1, best_axes,
           reduce_scatter_traffic(std::uint64_t(max_padded(next)) * bytes_, int(best_k))});
    cur = next;
  }
  // dst may keep the sum over some of the partial axes (of the same kind): those stay partial.
  const std::uint32_t keep = dst.partial == cur.partial && (dst.partial_axes & ~cur.partial_axes) == 0 ? dst.partial_axes : 0u;
  if (cur.partial != PartialKind::None && (cur.partial_axes & ~keep)) {
    SpecDesc next = cur.without_partial();
    if (keep) {
      next.partial = cur.partial;
      next.partial_axes = keep;
    }
    std::vector<int> axes;
    for (int a = 0; a < mesh_.axes(); ++a)
      if (cur.partial_axes & ~keep & (1u << a)) axes.push_back(a);
    p.add({StepKind::AllReduce, cur, next, -1, -1, axes, all_reduce_traffic(std::uint64_t(max_padded(cur)) * bytes_, int(axes_size(axes)))});
    cur = next;
  }
}

TSHARD_FUNC std::optional<ReshardPlan> Planner::staged_plan(const SpecDesc& cur, const SpecDesc& dst) const {
  std::map<std::string, std::optional<ReshardPlan>> memo;
  return search(cur, dst, 3 * kMaxAxes, memo);
}

TSHARD_FUNC std::optional<ReshardPlan> Planner::search(
    const SpecDesc& cur, const SpecDesc& dst, int depth,
    std::map<std::string, std::optional<ReshardPlan>>& memo) const {
  if (cur == dst) return ReshardPlan{};
  if (depth == 0) return std::nullopt;
  const std::string key = cur.to_string(mesh_);
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  memo[key] = std::nullopt;  // cuts cycles while this state is open
  std::vector<ReshardStep> options;
  if (auto s = slice_option(cur, dst)) {
    options.push_back(*s);
  } else {
    all_to_all_options(cur, dst, options);
    all_gather_options(cur, dst, options);
  }
  std::optional<ReshardPlan> best;
  for (auto& st : options) {
    auto rest = search(st.to, dst, depth - 1, memo);
    if (!rest) continue;
    // The cheaper plan; within rounding, the one of fewer steps (fewer copies, one call).
    const double c = st.traffic.seconds() + rest->cost;
    if (!best || c < best->cost * (1 - 1e-9) ||
        (c <= best->cost * (1 + 1e-9) && rest->steps.size() + 1 < best->steps.size())) {
      ReshardPlan p;
      p.add(st);
      for (auto& r : rest->steps) p.add(r);
      best = p;
    }
  }
  memo[key] = best;
  return best;
}

TSHARD_FUNC std::optional<ReshardStep> Planner::slice_option(const SpecDesc& cur, const SpecDesc& dst) const {
  SpecDesc next = cur;
  bool any = false;
  for (int d = 0; d < cur.rank; ++d) {
    if (!cur.dims[d].is_prefix_of(dst.dims[d])) continue;
    SpecDesc trial = next;
    for (int i = cur.dims[d].count; i < dst.dims[d].count; ++i) {
      int a = dst.dims[d][i];
      if ((trial.split_axes() & (1u << a))) break;
      trial.dims[d].push(a);
    }
    while (trial.dims[d].count > cur.dims[d].count && !refines(cur, trial, d)) trial.dims[d].count--;
    if (trial.dims[d].count > cur.dims[d].count) {
      next = trial;
      any = true;
    }
  }
  if (!any) return std::nullopt;
  return ReshardStep{StepKind::Local, cur, next};
}

TSHARD_FUNC void Planner::all_to_all_options(const SpecDesc& cur, const SpecDesc& dst,
                                             std::vector<ReshardStep>& out) const {
  for (int d1 = 0; d1 < cur.rank; ++d1) {
    if (cur.dims[d1].count == 0 || cur.dims[d1].is_prefix_of(dst.dims[d1])) continue;
    for (int len = 1; len <= cur.dims[d1].count; ++len) {
      std::vector<int> axes;
      for (int i = cur.dims[d1].count - len; i < cur.dims[d1].count; ++i) axes.push_back(cur.dims[d1][i]);
      for (int d2 = 0; d2 < cur.rank; ++d2) {
        if (d2 == d1 || !cur.dims[d2].is_prefix_of(dst.dims[d2])) continue;
        const int at = cur.dims[d2].count;
        if (dst.dims[d2].count < at + len) continue;
        bool continues = true;
        for (int i = 0; i < len; ++i) continues &= dst.dims[d2][at + i] == axes[i];
        if (!continues) continue;
        SpecDesc next = cur;
        next.dims[d1].count -= len;
        for (int a : axes) next.dims[d2].push(a);
        if (!gathers(cur, next, d1, axes) || !refines(cur, next, d2)) continue;
        const Index k = axes_size(axes);
        const Index chunk =
            max_padded(cur) / std::max<Index>(1, layout(cur, 0).padded[d2]) * layout(next, 0).padded[d2];
        out.push_back({StepKind::AllToAll, cur, next, d1, d2, axes, all_to_all_traffic(std::uint64_t(chunk) * bytes_, int(k))});
      }
    }
  }
}

TSHARD_FUNC void Planner::all_gather_options(const SpecDesc& cur, const SpecDesc& dst,
                                             std::vector<ReshardStep>& out) const {
  for (int d = 0; d < cur.rank; ++d) {
    if (cur.dims[d].is_prefix_of(dst.dims[d])) continue;
    int keep = 0;
    while (keep < cur.dims[d].count && keep < dst.dims[d].count && cur.dims[d][keep] == dst.dims[d][keep]) ++keep;
    for (int first = keep; first < cur.dims[d].count; ++first) {
      std::vector<int> axes;
      for (int i = first; i < cur.dims[d].count; ++i) axes.push_back(cur.dims[d][i]);
      SpecDesc next = cur;
      next.dims[d].count = first;
      if (!gathers(cur, next, d, axes)) continue;
      const Index k = axes_size(axes);
      out.push_back({StepKind::AllGather, cur, next, d, -1, axes, all_gather_traffic(std::uint64_t(max_padded(cur)) * bytes_, int(k))});
    }
  }
}

TSHARD_FUNC Traffic Planner::busiest_direct_traffic(const SpecDesc& from, const SpecDesc& to) const {
  // A rank's traffic depends only on its coordinates on the axes either spec splits.
  Traffic worst;
  for_each_coords(mesh_, from.split_axes() | to.split_axes(), {}, [&](const std::array<int, kMaxAxes>& c) {
    const Traffic t = direct_traffic(from, to, mesh_.rank_of(c));
    if (t.seconds() > worst.seconds()) worst = t;
  });
  return worst;
}

TSHARD_FUNC ReshardPlan plan_reshard(const SpecDesc& src, const SpecDesc& dst, const Extents& shape,
                                     const MeshShape& mesh, std::size_t element_bytes) {
  return Planner(shape, mesh, element_bytes).plan(src, dst);
}

TSHARD_FUNC Traffic predicted_traffic(const ReshardPlan& plan, const Extents& shape, const MeshShape& mesh,
                                      std::size_t element_bytes, int r) {
  Traffic t;
  const Planner planner(shape, mesh, element_bytes);
  for (const auto& st : plan.steps) t += st.kind == StepKind::Direct ? planner.direct_traffic(st.from, st.to, r) : st.traffic;
  return t;
}

}  // namespace tshard::detail
