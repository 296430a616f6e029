// The reshard planner, on run-time descriptors only (DESIGN: types check, descriptors do).
//
// A plan is a short sequence of steps, each one regular collective over the group of the
// mesh axes it touches (GSPMD section 3.3; the per-axis transitions of Elemental's
// redistributions):
//   partial -> S     reduce-scatter over the partial axes the target splits a dim by,
//   partial -> R     all-reduce over the (remaining) partial axes,
//   R -> S           local slice (no communication),
//   S -> R           all-gather over the trailing axes a dim drops,
//   S(d1) -> S(d2)   all-to-all over the axis that moves between dims.
// With ceil padding a step is only taken where every rank's new block lies inside what the
// step gives it (refining S<x> to S<x,y> slices locally only when sizes divide). The staged
// plan is compared with a direct redistribution (each rank receives exactly the elements it
// lacks from one owner, point to point: a permute where each rank has one partner) by a
// cost of bytes plus a per-message latency, and the cheaper one runs.
#pragma once
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tshard/core/shard.hpp"
#include "tshard/core/spec_descriptor.hpp"

namespace tshard::detail {

enum class StepKind { Local, AllGather, AllToAll, ReduceScatter, AllReduce, Direct };

inline const char* step_name(StepKind k) {
  switch (k) {
    case StepKind::Local: return "local slice";
    case StepKind::AllGather: return "all-gather";
    case StepKind::AllToAll: return "all-to-all";
    case StepKind::ReduceScatter: return "reduce-scatter";
    case StepKind::AllReduce: return "all-reduce";
    default: return "direct point-to-point";
  }
}

struct ReshardStep {
  StepKind kind = StepKind::Local;
  SpecDesc from, to;
  int dim = -1;           // AllGather, ReduceScatter: the dim; AllToAll: the dim the axis leaves
  int dim2 = -1;          // AllToAll: the dim the axis joins
  std::vector<int> axes;  // the group's axes, in the order that makes group rank = shard coordinate
};

struct ReshardPlan {
  std::vector<ReshardStep> steps;
  double cost = 0;  // elements received by the busiest rank plus latency, summed over steps

  std::string describe(const MeshShape& mesh) const {
    std::string s;
    for (auto& st : steps) {
      if (!s.empty()) s += "; ";
      s += std::string(step_name(st.kind)) + " " + st.from.to_string(mesh) + " -> " + st.to.to_string(mesh);
    }
    return s;
  }
};

// Elements a message's latency is worth in the cost model (~16 KiB of floats).
inline constexpr double kLatencyElements = 4096;
// How much cheaper a direct redistribution must be to replace the staged collectives.
inline constexpr double kStagedPreference = 2.0;

inline int log2_ceil(int p) {
  int l = 0;
  while ((1 << l) < p) ++l;
  return l;
}

inline Index box_overlap(const ShardLayout& a, const ShardLayout& b) {
  Index v = 1;
  for (int d = 0; d < a.rank; ++d) {
    Index lo = std::max(a.offset[d], b.offset[d]);
    Index hi = std::min(a.offset[d] + a.valid[d], b.offset[d] + b.valid[d]);
    if (hi <= lo) return 0;
    v *= hi - lo;
  }
  return v;
}

inline bool box_inside(const ShardLayout& inner, const ShardLayout& outer, int d) {
  if (inner.valid[d] == 0) return true;
  return inner.offset[d] >= outer.offset[d] && inner.offset[d] + inner.valid[d] <= outer.offset[d] + outer.valid[d];
}

// The ranks that send to rank r in a direct redistribution from `from`: those whose
// coordinates on the axes `from` does not split equal r's (one owner per element).
inline std::vector<int> direct_senders(const SpecDesc& from, const MeshShape& mesh, int r) {
  const std::uint32_t split = from.split_axes();
  auto cr = mesh.coords_of(r);
  std::vector<int> v;
  for (int s = 0; s < mesh.size(); ++s) {
    auto cs = mesh.coords_of(s);
    bool same = true;
    for (int a = 0; a < mesh.axes(); ++a)
      if (!(split & (1u << a)) && cs[a] != cr[a]) same = false;
    if (same) v.push_back(s);
  }
  return v;
}

class Planner {
 public:
  Planner(const Extents& shape, const MeshShape& mesh) : shape_(shape), mesh_(mesh) {}

  ReshardPlan plan(const SpecDesc& src, const SpecDesc& dst) const {
    // Partial values moved as they are (operators aligning partial operands): the partial axes
    // are split by neither spec, so the plain plan keeps every value in its partial group.
    if (dst.partial != PartialKind::None && src.partial == dst.partial && src.partial_axes == dst.partial_axes)
      return plan(src.without_partial(), dst.without_partial());
    ReshardPlan p;
    SpecDesc cur = src;
    if (cur.partial != PartialKind::None) resolve_partial(cur, dst, p);
    std::optional<ReshardPlan> staged = staged_plan(cur, dst);
    ReshardPlan direct;
    if (!(cur == dst)) {
      ReshardStep st{StepKind::Direct, cur, dst};
      direct.steps.push_back(st);
      direct.cost = direct_cost(cur, dst);
    }
    // Regular collectives are bandwidth-optimal and better tuned than point-to-point: the staged
    // plan wins unless the direct one is cheaper by more than kStagedPreference.
    const ReshardPlan& best =
        (staged && (staged->cost <= kStagedPreference * direct.cost || cur == dst)) ? *staged : direct;
    for (auto& st : best.steps) p.steps.push_back(st);
    p.cost += best.cost;
    if (p.steps.empty()) p.steps.push_back({StepKind::Local, cur, dst});  // a plain copy
    return p;
  }

 private:
  ShardLayout layout(const SpecDesc& s, int r) const { return shard_layout_of_rank(s, shape_, mesh_, r); }
  Index axes_size(const std::vector<int>& axes) const {
    Index k = 1;
    for (int a : axes) k *= mesh_.sizes[a];
    return k;
  }

  // Every rank's `to` block along dim d lies inside its `from` block (a local slice).
  bool refines(const SpecDesc& from, const SpecDesc& to, int d) const {
    for (int r = 0; r < mesh_.size(); ++r)
      if (!box_inside(layout(to, r), layout(from, r), d)) return false;
    return true;
  }
  // Every rank's `to` block along d lies inside the union of the `from` blocks of its group
  // over `axes` (what an all-gather over those axes gives it).
  bool gathers(const SpecDesc& from, const SpecDesc& to, int d, const std::vector<int>& axes) const {
    for (int r = 0; r < mesh_.size(); ++r) {
      ShardLayout t = layout(to, r);
      auto c = mesh_.coords_of(r);
      Index lo = shape_[d], hi = 0;
      for (Index g = 0; g < axes_size(axes); ++g) {
        Index rest = g;
        for (int i = int(axes.size()) - 1; i >= 0; --i) {
          c[axes[i]] = int(rest % mesh_.sizes[axes[i]]);
          rest /= mesh_.sizes[axes[i]];
        }
        ShardLayout f = shard_layout(from, shape_, mesh_, c);
        if (f.valid[d] == 0) continue;
        // Every member's slices must land inside the new buffer (they are received in place).
        if (f.offset[d] < t.offset[d] || f.offset[d] + f.valid[d] > t.offset[d] + t.padded[d]) return false;
        lo = std::min(lo, f.offset[d]);
        hi = std::max(hi, f.offset[d] + f.valid[d]);
      }
      if (t.valid[d] > 0 && (t.offset[d] < lo || t.offset[d] + t.valid[d] > hi)) return false;
    }
    return true;
  }
  Index max_padded(const SpecDesc& s) const { return layout(s, 0).padded_size(); }

  void resolve_partial(SpecDesc& cur, const SpecDesc& dst, ReshardPlan& p) const {
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
      const Index n = max_padded(cur);
      p.steps.push_back({StepKind::ReduceScatter, cur, next, best_dim, -1, best_axes});
      p.cost += double(n) * double(best_k - 1) / double(best_k) + kLatencyElements * log2_ceil(int(best_k));
      cur = next;
    }
    if (cur.partial != PartialKind::None) {
      SpecDesc next = cur.without_partial();
      std::vector<int> axes;
      for (int a = 0; a < mesh_.axes(); ++a)
        if (cur.partial_axes & (1u << a)) axes.push_back(a);
      const Index k = axes_size(axes);
      p.steps.push_back({StepKind::AllReduce, cur, next, -1, -1, axes});
      p.cost += 2.0 * double(max_padded(cur)) * double(k - 1) / double(k) + kLatencyElements * log2_ceil(int(k));
      cur = next;
    }
  }

  // The cheapest sequence of regular steps from cur to dst, by a small exhaustive search:
  // a free local slice is always taken first; otherwise every all-to-all and all-gather that
  // makes progress is tried. Memoised per spec; nullopt where only a direct move will do.
  std::optional<ReshardPlan> staged_plan(const SpecDesc& cur, const SpecDesc& dst) const {
    std::map<std::string, std::optional<ReshardPlan>> memo;
    return search(cur, dst, 3 * kMaxAxes, memo);
  }

  std::optional<ReshardPlan> search(const SpecDesc& cur, const SpecDesc& dst, int depth,
                                    std::map<std::string, std::optional<ReshardPlan>>& memo) const {
    if (cur == dst) return ReshardPlan{};
    if (depth == 0) return std::nullopt;
    const std::string key = cur.to_string(mesh_);
    if (auto it = memo.find(key); it != memo.end()) return it->second;
    memo[key] = std::nullopt;  // cuts cycles while this state is open
    std::vector<std::pair<ReshardStep, double>> options;
    if (auto s = slice_option(cur, dst)) {
      options.push_back(*s);
    } else {
      all_to_all_options(cur, dst, options);
      all_gather_options(cur, dst, options);
    }
    std::optional<ReshardPlan> best;
    for (auto& [st, cost] : options) {
      auto rest = search(st.to, dst, depth - 1, memo);
      if (!rest) continue;
      if (!best || cost + rest->cost < best->cost) {
        ReshardPlan p;
        p.steps.push_back(st);
        p.steps.insert(p.steps.end(), rest->steps.begin(), rest->steps.end());
        p.cost = cost + rest->cost;
        best = p;
      }
    }
    memo[key] = best;
    return best;
  }

  // Adds free target axes to every dim whose split is a prefix of its target's.
  std::optional<std::pair<ReshardStep, double>> slice_option(const SpecDesc& cur, const SpecDesc& dst) const {
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
    return std::pair{ReshardStep{StepKind::Local, cur, next}, 0.0};
  }

  // Moves trailing axes of a dim that must shed them (one, or several together over their
  // group) to a dim whose target continues with exactly those axes.
  void all_to_all_options(const SpecDesc& cur, const SpecDesc& dst,
                          std::vector<std::pair<ReshardStep, double>>& out) const {
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
          out.push_back({ReshardStep{StepKind::AllToAll, cur, next, d1, d2, axes},
                         double(chunk) * double(k - 1) + kLatencyElements * log2_ceil(int(k))});
        }
      }
    }
  }

  // Drops trailing axes of a dim that are not in its target: every suffix the padding allows.
  void all_gather_options(const SpecDesc& cur, const SpecDesc& dst,
                          std::vector<std::pair<ReshardStep, double>>& out) const {
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
        out.push_back({ReshardStep{StepKind::AllGather, cur, next, d, -1, axes},
                       double(max_padded(cur)) * double(k - 1) + kLatencyElements * log2_ceil(int(k))});
      }
    }
  }

  // The busiest rank's received elements and messages in a direct redistribution.
  double direct_cost(const SpecDesc& from, const SpecDesc& to) const {
    double worst = 0;
    for (int r = 0; r < mesh_.size(); ++r) {
      ShardLayout t = layout(to, r);
      Index elems = 0, messages = 0;
      for (int s : direct_senders(from, mesh_, r)) {
        if (s == r) continue;
        Index o = box_overlap(layout(from, s), t);
        if (o) {
          elems += o;
          ++messages;
        }
      }
      worst = std::max(worst, double(elems) + kLatencyElements * double(messages));
    }
    return worst;
  }

 private:
  Extents shape_;
  const MeshShape& mesh_;
};

inline ReshardPlan plan_reshard(const SpecDesc& src, const SpecDesc& dst, const Extents& shape, const MeshShape& mesh) {
  return Planner(shape, mesh).plan(src, dst);
}

}  // namespace tshard::detail
