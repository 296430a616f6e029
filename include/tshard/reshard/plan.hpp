// The reshard planner, on run-time descriptors only (types check, descriptors do: docs/architecture.md).
//
// A plan is a short sequence of steps, each one regular collective over the group of the
// mesh axes it touches (GSPMD section 3.3; the per-axis transitions of Elemental's
// redistributions):
//   partial -> S     reduce-scatter over the partial axes the target splits a dim by,
//   partial -> R     all-reduce over the (remaining) partial axes (a target partial over some of
//                    them keeps those: a sum left to an owner),
//   R -> S           local slice (no communication),
//   S -> R           all-gather over the trailing axes a dim drops,
//   S(d1) -> S(d2)   all-to-all over the axis that moves between dims.
// With ceil padding a step is only taken where every rank's new block lies inside what the
// step gives it (refining S<x> to S<x,y> slices locally only when sizes divide). The staged
// plan is compared with a direct redistribution (each rank receives exactly the elements it
// lacks from one owner, point to point: a permute where each rank has one partner) by the
// cost model of comm/cost.hpp (latency rounds, bytes of the busiest rank), and the cheaper runs.
#pragma once
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tshard/comm/cost.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/shard.hpp"
#include "tshard/core/spec_descriptor.hpp"
#include "tshard/reshard/step.hpp"

namespace tshard::detail {

// How much cheaper a direct redistribution must be to replace the staged collectives.
inline constexpr double kStagedPreference = 2.0;

// The ranks that send to rank r in a direct redistribution from `from`: those whose
// coordinates on the axes `from` does not split equal r's (one owner per element).
std::vector<int> direct_senders(const SpecDesc& from, const MeshShape& mesh, int r);

class Planner {
 public:
  // `element_bytes`: the size of one element, so costs are in bytes and seconds.
  Planner(const Extents& shape, const MeshShape& mesh, std::size_t element_bytes)
      : shape_(shape), mesh_(mesh), bytes_(element_bytes) {}

  ReshardPlan plan(const SpecDesc& src, const SpecDesc& dst) const;

  // What rank r sends and receives in a direct redistribution from `from` to `to`: the boxes
  // it owns that others lack, and those it lacks. In closed form, O(rank) per rank (the
  // planner's busiest rank is a walk over the distinct ranks, not over pairs of them).
  Traffic direct_traffic(const SpecDesc& from, const SpecDesc& to, int r) const;

  // Every rank's `to` block along dim d lies inside its `from` block (a local slice).
  bool refines(const SpecDesc& from, const SpecDesc& to, int d) const;
  // Every rank's `to` block along d lies inside the union of the `from` blocks of its group
  // over `axes` (what an all-gather over those axes gives it), and those land inside its buffer.
  // Both are decided once per distinct block of dim d, not once per rank.
  bool gathers(const SpecDesc& from, const SpecDesc& to, int d, const std::vector<int>& axes) const;

 private:
  ShardLayout layout(const SpecDesc& s, int r) const { return shard_layout_of_rank(s, shape_, mesh_, r); }
  Index axes_size(const std::vector<int>& axes) const { return group_size(mesh_, axes); }
  Index max_padded(const SpecDesc& s) const { return layout(s, 0).padded_size(); }

  void resolve_partial(SpecDesc& cur, const SpecDesc& dst, ReshardPlan& p) const;

  // The cheapest sequence of regular steps from cur to dst, by a small exhaustive search:
  // a free local slice is always taken first; otherwise every all-to-all and all-gather that
  // makes progress is tried. Memoised per spec; nullopt where only a direct move will do.
  std::optional<ReshardPlan> staged_plan(const SpecDesc& cur, const SpecDesc& dst) const;

  std::optional<ReshardPlan> search(const SpecDesc& cur, const SpecDesc& dst, int depth,
                                    std::map<std::string, std::optional<ReshardPlan>>& memo) const;

  // Adds free target axes to every dim whose split is a prefix of its target's.
  std::optional<ReshardStep> slice_option(const SpecDesc& cur, const SpecDesc& dst) const;

  // Moves trailing axes of a dim that must shed them (one, or several together over their
  // group) to a dim whose target continues with exactly those axes.
  void all_to_all_options(const SpecDesc& cur, const SpecDesc& dst, std::vector<ReshardStep>& out) const;

  // Drops trailing axes of a dim that are not in its target: every suffix the padding allows.
  void all_gather_options(const SpecDesc& cur, const SpecDesc& dst, std::vector<ReshardStep>& out) const;

  // The direct redistribution's traffic on its busiest rank (by the cost model's seconds).
  Traffic busiest_direct_traffic(const SpecDesc& from, const SpecDesc& to) const;

 private:
  Extents shape_;
  const MeshShape& mesh_;
  std::uint64_t bytes_;
};

ReshardPlan plan_reshard(const SpecDesc& src, const SpecDesc& dst, const Extents& shape,
                         const MeshShape& mesh, std::size_t element_bytes);

// What rank r sends and receives (bytes as comm_stats() counts them) when the plan runs: the
// collectives' padded blocks (equal on every rank; the executor moves only valid elements where
// shards are uneven, so it measures at most this), a direct step's exact boxes.
Traffic predicted_traffic(const ReshardPlan& plan, const Extents& shape, const MeshShape& mesh,
                          std::size_t element_bytes, int r);

}  // namespace tshard::detail

#if TSHARD_HEADER_BODIES
#include "tshard/reshard/plan-inl.hpp"
#endif
