// A registered parameter without its type: the value and its gradient, and what a module, an
// optimizer and ts::ad::backward do with them (zero the gradient, make the value a leaf of a
// gradient being taken, add the leaf's cotangent into the gradient). Shared by handle: an
// optimizer keeps the slot alive, so nothing it holds dangles.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tshard/ad/grad.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/parallel/gradient_sum.hpp"
#include "tshard/parallel/parameter_view.hpp"
#include "tshard/nn/state_dict.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::nn::detail {

using parallel::detail::ParameterView;
using parallel::detail::view_of;

class ParameterSlot {
 public:
  virtual ~ParameterSlot() = default;
  virtual void zero_grad() = 0;
  // A fresh leaf on the active tape, set on the value until untrack(). The caller keeps it:
  // several forwards' leaves may wait for their backward at once (a pipeline's micro-batches).
  virtual std::shared_ptr<tshard::detail::GradNode> track() = 0;
  virtual void untrack() = 0;  // the value is plain again
  // grad += the cotangent of a leaf track() made (dropped from the leaf once added).
  virtual void collect(tshard::detail::GradNode& leaf, std::uint32_t deferred) = 0;
  virtual int rank() const = 0;
  virtual std::vector<Eigen::Index> shape() const = 0;
  virtual Eigen::Index padded_size() const = 0;  // this rank's block
  virtual const void* identity() const = 0;           // the value tensor (one registration each)
  virtual std::string describe() const = 0;
  // The value and the gradient as entries of a state dict (they refer to this slot's tensors).
  virtual std::shared_ptr<StateTensor> value_state() = 0;
  virtual std::shared_ptr<StateTensor> gradient_state() = 0;
};

template <class T>
class ElementParameterSlot : public ParameterSlot {
 public:
  virtual ParameterView<T> view() = 0;
  // A new tensor of the parameter's shape and spec in the optimizer state's element type
  // (accumulator_t<T>), zeroed, and its block: what a state dict holds of a state array.
  virtual std::pair<std::shared_ptr<StateTensor>, accumulator_t<T>*> state_like() const = 0;
};

// state_like() of a parameter tensor.
template <class T, class M, class S>
std::pair<std::shared_ptr<StateTensor>, accumulator_t<T>*> state_like(const ShardedTensor<T, M, S>& param) {
  auto t = std::make_shared<ShardedTensor<accumulator_t<T>, M, S>>(param.mesh(), param.global_shape());
  auto* block = t->data();
  std::fill(block, block + t->padded_size(), accumulator_t<T>(0));
  return {state_of_tensor(std::move(t)), block};
}

// What a slot does that needs no more than the element type: on the two tensors' blocks, their
// mesh and spec. Compiled once per element type (tshard::kernels); the typed slot below adds the
// tensors themselves and what needs their type.
template <class T>
class BlockParameterSlot : public ElementParameterSlot<T> {
 public:
  [[gnu::noinline]] void zero_grad() override {
    tshard::detail::TensorAccess::acquire_block(*grad_.block, false);
    std::fill_n(tshard::detail::TensorAccess::block_data(*grad_.block), grad_.layout().padded_size(), T(0));
  }
  void untrack() override { tshard::detail::TensorAccess::set_block_node(*value_.block, nullptr); }
  void collect(tshard::detail::GradNode& node, std::uint32_t deferred) override {
    auto& leaf = static_cast<tshard::detail::TypedGradNode<T>&>(node);
    if (leaf.leaf_tensor != identity_)
      throw SpecError("tshard::nn: internal: a gradient collected from another parameter's leaf (" + describe() + ")");
    if (!leaf.cotangent) return;
    tshard::detail::TensorAccess::acquire_block(*grad_.block, true);
    parallel::detail::accumulate_gradient(*leaf.mesh, tshard::detail::TensorAccess::block_data(*grad_.block), grad_.spec,
                                          grad_.shape(), leaf.cotangent.get(), leaf.cotangent_desc, deferred, "backward");
    leaf.cotangent.reset();
  }
  int rank() const override { return value_.spec.rank; }
  std::vector<Eigen::Index> shape() const override {
    return std::vector<Eigen::Index>(value_.shape().begin(), value_.shape().begin() + value_.spec.rank);
  }
  Eigen::Index padded_size() const override { return value_.layout().padded_size(); }
  const void* identity() const override { return identity_; }
  std::string describe() const override { return value_.describe(); }

 protected:
  // `identity`: the typed value tensor (the address a leaf names).
  [[gnu::noinline]] BlockParameterSlot(tshard::detail::ErasedTensor<T> value, tshard::detail::ErasedTensor<T> grad,
                                       const void* identity)
      : value_(std::move(value)), grad_(std::move(grad)), identity_(identity) {}
  // value_mesh / grad_mesh: the tensors' meshes now (a parameter may have been assigned anew since
  // it was registered: another shape or mesh than its gradient's is an error, not a view).
  [[gnu::noinline]] ParameterView<T> view_with(const std::shared_ptr<tshard::detail::MeshState>& value_mesh,
                                               const std::shared_ptr<tshard::detail::MeshState>& grad_mesh,
                                               std::shared_ptr<void> keep) {
    if (value_mesh != grad_mesh)
      tshard::detail::throw_different_meshes("optim::Optimizer::add", describe(), value_mesh->shape(),
                                             grad_.describe(), grad_mesh->shape());
    if (value_.shape() != grad_.shape())
      throw ShapeError("tshard::optim: the gradient " + grad_.describe() + " does not match the parameter " + describe());
    value_.mesh = value_mesh;
    ParameterView<T> v = parallel::detail::view_of_blocks(*value_.block, *grad_.block);
    v.layout = value_.layout();
    v.spec = value_.spec;
    v.mesh = value_.mesh;
    v.identity = identity_;
    v.describe = describe();
    v.keep = std::move(keep);
    return v;
  }

 private:
  tshard::detail::ErasedTensor<T> value_, grad_;
  const void* identity_;
};

template <class T, class M, class S>
class TypedParameterSlot final : public BlockParameterSlot<T>,
                                 public std::enable_shared_from_this<TypedParameterSlot<T, M, S>> {
 public:
  using Tensor = ShardedTensor<T, M, S>;

  // The module's parameter and its gradient, starting at zero.
  explicit TypedParameterSlot(Tensor value) : TypedParameterSlot(std::make_unique<Tensors>(std::move(value))) {}
  Tensor& value() { return t_->value; }
  Tensor& grad() { return t_->grad; }

  std::shared_ptr<tshard::detail::GradNode> track() override {
    auto leaf = tshard::detail::make_leaf(t_->value);
    leaf->swap_leaf_node = &tshard::detail::swap_node_of<Tensor>;  // (the value outlives every forward)
    tshard::detail::TensorAccess::set_node(t_->value, leaf);
    return leaf;
  }
  ParameterView<T> view() override {
    return this->view_with(tshard::detail::state_of(t_->value.mesh()), tshard::detail::state_of(t_->grad.mesh()),
                           this->shared_from_this());
  }
  std::pair<std::shared_ptr<StateTensor>, accumulator_t<T>*> state_like() const override { return detail::state_like(t_->value); }
  std::shared_ptr<StateTensor> value_state() override {
    return detail::state_of_tensor(std::shared_ptr<Tensor>(this->shared_from_this(), &t_->value));
  }
  std::shared_ptr<StateTensor> gradient_state() override {
    return detail::state_of_tensor(std::shared_ptr<Tensor>(this->shared_from_this(), &t_->grad));
  }

 private:
  // (Held apart from the slot, so that the base's erased views of them exist before it is built.)
  struct Tensors {
    explicit Tensors(Tensor v) : value(std::move(v)), grad(value.mesh(), value.global_shape()) {
      tshard::detail::TensorAccess::set_node(value, nullptr);
    }
    Tensor value, grad;
  };
  explicit TypedParameterSlot(std::unique_ptr<Tensors> t)
      : BlockParameterSlot<T>(tshard::detail::erased(t->value), tshard::detail::erased(t->grad), &t->value), t_(std::move(t)) {
    this->zero_grad();
  }
  std::unique_ptr<Tensors> t_;
};

}  // namespace tshard::nn::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::nn::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(class BlockParameterSlot<T>)
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::nn::detail
