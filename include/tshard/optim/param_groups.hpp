// Parameter groups: settings of an optimizer's own for some parameters, chosen by name and
// shape when a model is added (PyTorch's param_groups, picked by a function).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <Eigen/Core>

namespace tshard::optim {

// What opt.add(model, groups) is told of each parameter, to choose its group.
struct ParameterInfo {
  std::string name;                  // as in model.parameter_names()
  int rank = 0;
  std::vector<Eigen::Index> shape;   // global
};
// A parameter group's own settings; an empty member keeps the optimizer's (which later changes
// to opt.options(), such as a learning-rate schedule, then reach).
struct ParameterGroup {
  std::optional<double> lr;
  std::optional<double> weight_decay;
};
// nanoGPT's recipe: weight decay for matrices and embeddings (rank >= 2), none for biases and
// norms. opt.add(model, ts::optim::decay_matrices_only(0.1f)).
inline std::function<ParameterGroup(const ParameterInfo&)> decay_matrices_only(double weight_decay) {
  return [weight_decay](const ParameterInfo& p) {
    return ParameterGroup{.lr = std::nullopt, .weight_decay = p.rank >= 2 ? weight_decay : 0.0};
  };
}

}  // namespace tshard::optim

namespace tshard::nn {
using optim::decay_matrices_only;
using optim::ParameterGroup;
using optim::ParameterInfo;
}  // namespace tshard::nn
