// What data parallelism and an optimizer need of a parameter and its gradient, with their spec
// erased: the buffers (acquired where ZeRO released them), their release (with the way back to
// the values), the layout, the spec descriptor and the mesh.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::parallel::detail {

template <class T>
struct ParameterView {
  std::function<T*()> param, grad;
  std::function<bool()> param_present, grad_present;
  std::function<void(std::shared_ptr<const tshard::detail::RestoreValues<T>>)> release_param;  // with the way back
  std::function<void()> release_grad;
  tshard::detail::ShardLayout layout;
  tshard::detail::SpecDesc spec{};
  std::shared_ptr<tshard::detail::MeshState> mesh;
  const void* identity = nullptr;
  std::string describe;
  std::shared_ptr<void> keep;  // holds what the functions refer to (a registered slot), if anything
};

// The view of a parameter's and its gradient's blocks, per element type.
template <class T>
ParameterView<T> view_of_blocks(tshard::detail::TensorBlock<T>& param, tshard::detail::TensorBlock<T>& grad) {
  using Access = tshard::detail::TensorAccess;
  ParameterView<T> v;
  v.param = [&param] {
    Access::acquire_block(param, false);
    return Access::block_data(param);
  };
  v.grad = [&grad] {
    Access::acquire_block(grad, true);
    return Access::block_data(grad);
  };
  v.param_present = [&param] { return Access::has_block_storage(param); };
  v.grad_present = [&grad] { return Access::has_block_storage(grad); };
  v.release_param = [&param](std::shared_ptr<const tshard::detail::RestoreValues<T>> restore) {
    Access::release_block(param, std::move(restore));
  };
  v.release_grad = [&grad] { Access::release_block(grad); };
  return v;
}

template <class T, class M, class S>
ParameterView<T> view_of(ShardedTensor<T, M, S>& param, ShardedTensor<T, M, S>& grad, std::shared_ptr<void> keep) {
  tshard::detail::require_same_mesh(param, grad, "optim::Optimizer::add");
  if (tshard::detail::extents_of(param) != tshard::detail::extents_of(grad))
    throw ShapeError("tshard::optim: the gradient " + grad.describe() + " does not match the parameter " + param.describe());
  using Access = tshard::detail::TensorAccess;
  ParameterView<T> v = view_of_blocks(Access::block(param), Access::block(grad));
  v.layout = tshard::detail::layout_of(param);
  v.spec = ShardedTensor<T, M, S>::spec_desc;
  v.mesh = tshard::detail::state_of(param.mesh());
  v.identity = &param;
  v.describe = param.describe();
  v.keep = std::move(keep);
  return v;
}

}  // namespace tshard::parallel::detail
