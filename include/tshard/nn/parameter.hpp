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

template <class T, class M, class S>
class TypedParameterSlot final : public ElementParameterSlot<T>,
                                 public std::enable_shared_from_this<TypedParameterSlot<T, M, S>> {
 public:
  using Tensor = ShardedTensor<T, M, S>;

  // The module's parameter and its gradient, starting at zero.
  explicit TypedParameterSlot(Tensor value) : value_(std::move(value)), grad_(value_.mesh(), value_.global_shape()) {
    tshard::detail::TensorAccess::set_node(value_, nullptr);
    zero_grad();
  }
  Tensor& value() { return value_; }
  Tensor& grad() { return grad_; }

  void zero_grad() override {
    tshard::detail::TensorAccess::acquire_storage(grad_, false);
    std::fill(grad_.data(), grad_.data() + grad_.padded_size(), T(0));
  }
  std::shared_ptr<tshard::detail::GradNode> track() override {
    auto leaf = tshard::detail::make_leaf(value_);
    leaf->swap_leaf_node = &tshard::detail::swap_node_of<Tensor>;  // (value_ outlives every forward)
    tshard::detail::TensorAccess::set_node(value_, leaf);
    return leaf;
  }
  void untrack() override { tshard::detail::TensorAccess::set_node(value_, nullptr); }
  void collect(tshard::detail::GradNode& node, std::uint32_t deferred) override {
    auto& leaf = static_cast<tshard::detail::TypedGradNode<T>&>(node);
    if (leaf.leaf_tensor != &value_)
      throw SpecError("tshard::nn: internal: a gradient collected from another parameter's leaf (" + describe() + ")");
    if (!leaf.cotangent) return;
    tshard::detail::TensorAccess::acquire_storage(grad_, true);
    parallel::detail::accumulate_gradient(*leaf.mesh, grad_.data(), Tensor::spec_desc, tshard::detail::extents_of(grad_),
                        leaf.cotangent.get(), leaf.cotangent_desc, deferred, "backward");
    leaf.cotangent.reset();
  }
  int rank() const override { return Tensor::rank; }
  std::vector<Eigen::Index> shape() const override {
    const auto s = value_.global_shape();
    return std::vector<Eigen::Index>(s.begin(), s.end());
  }
  Eigen::Index padded_size() const override { return value_.padded_size(); }
  const void* identity() const override { return &value_; }
  ParameterView<T> view() override { return view_of(value_, grad_, this->shared_from_this()); }
  std::pair<std::shared_ptr<StateTensor>, accumulator_t<T>*> state_like() const override { return detail::state_like(value_); }
  std::string describe() const override { return value_.describe(); }
  std::shared_ptr<StateTensor> value_state() override {
    return detail::state_of_tensor(std::shared_ptr<Tensor>(this->shared_from_this(), &value_));
  }
  std::shared_ptr<StateTensor> gradient_state() override {
    return detail::state_of_tensor(std::shared_ptr<Tensor>(this->shared_from_this(), &grad_));
  }

 private:
  Tensor value_, grad_;
};

}  // namespace tshard::nn::detail
