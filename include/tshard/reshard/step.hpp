// A reshard plan as data: its steps (which collective, over which axes, between which specs) and
// their predicted traffic. reshard/plan.hpp decides them, reshard/steps/ runs each kind.
#pragma once
#include <string>
#include <vector>

#include "tshard/comm/cost.hpp"
#include "tshard/core/mesh_shape.hpp"
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
  Traffic traffic;        // this step on the busiest rank (a collective's: on every rank)
};

struct ReshardPlan {
  std::vector<ReshardStep> steps;
  Traffic traffic;   // summed over the steps (each on its busiest rank)
  double cost = 0;   // seconds by the cost model, summed over the steps

  void add(const ReshardStep& st) {
    steps.push_back(st);
    traffic += st.traffic;
    cost += st.traffic.seconds();
  }

  std::string describe(const MeshShape& mesh) const {
    std::string s;
    for (auto& st : steps) {
      if (!s.empty()) s += "; ";
      s += std::string(step_name(st.kind)) + " " + st.from.to_string(mesh) + " -> " + st.to.to_string(mesh);
    }
    return s;
  }
};

}  // namespace tshard::detail
