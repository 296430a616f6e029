// Reverse-mode gradients of forward code written once: value_and_grad and grad for functions of
// tensors (JAX's), backward for a model's registered parameters (PyTorch's loss.backward()).
// The forward runs with a tape active; its result's cotangent, 1, is sent back node by node in
// reverse creation order, each node's saved values freed as soon as its rule has run.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tshard/ad/cotangent.hpp"
#include "tshard/ad/scalar.hpp"

namespace tshard::ad {

// Operators inside the scope record nothing, whatever their inputs (torch.no_grad()).
using NoGrad = detail::PauseRecording;

}  // namespace tshard::ad

namespace tshard::detail {

// The tape of one gradient, active for a scope: gradients of gradients are not taken.
class ActiveTape {
 public:
  explicit ActiveTape(Tape& tape) {
    if (Tape::active())
      throw SpecError(
          "tshard::ad: a gradient is already being taken: value_and_grad, grad and backward do not nest "
          "(gradients of gradients are not supported)");
    Tape::active() = &tape;
    paused_ = Tape::paused();
    Tape::paused() = false;
  }
  ~ActiveTape() {
    Tape::active() = nullptr;
    Tape::paused() = paused_;
  }
  ActiveTape(const ActiveTape&) = delete;
  ActiveTape& operator=(const ActiveTape&) = delete;

 private:
  bool paused_ = false;
};

// GradNode::swap_leaf_node for a tensor of type X.
template <class X>
std::shared_ptr<GradNode> swap_node_of(const void* tensor, std::shared_ptr<GradNode> node) {
  auto& x = *const_cast<X*>(static_cast<const X*>(tensor));
  auto old = TensorAccess::node(x);
  TensorAccess::set_node(x, std::move(node));
  return old;
}

// A fresh leaf node for a tensor of this shape and spec, on the active tape.
template <class X>
std::shared_ptr<TypedGradNode<typename X::Scalar>> make_leaf(const X& x) {
  auto node = new_grad_node<typename X::Scalar>(state_of(x.mesh()), extents_of(x), X::spec_desc);
  node->leaf_tensor = &x;
  Tape::active()->add(node);
  return node;
}

// Makes each element of `leaves` (copies of the arguments, buffers shared) a fresh leaf of the
// active tape, in place (a leaf knows its tensor's address); returns their nodes.
template <class... X>
auto make_leaves(std::tuple<X...>& leaves) {
  auto nodes = std::apply([](auto&... v) { return std::make_tuple(make_leaf(v)...); }, leaves);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (TensorAccess::set_node(std::get<I>(leaves), std::get<I>(nodes)), ...);
  }(std::index_sequence_for<X...>{});
  return nodes;
}

template <class R>
constexpr bool is_loss_v = ad::is_scalar<std::remove_cvref_t<R>>::value;
template <class R>
constexpr bool is_rank0_tensor_v = [] {
  if constexpr (is_sharded_tensor<std::remove_cvref_t<R>>::value)
    return std::remove_cvref_t<R>::rank == 0;
  else
    return false;
}();

// Runs every live node of the tape, newest first, calling progress(order) after each: every node
// of that order or newer has run.
template <class Progress>
void propagate_all(Tape& tape, Progress&& progress) {
  PauseRecording pause;
  for (auto& n : tape.live_nodes_newest_first()) {
    n->propagate();
    progress(n->order);
  }
}

// The loss's value (the same on every rank) after sending it its cotangent, 1, and running
// every rule back to the leaves (progress as propagate_all's).
template <class R, class Progress = void (*)(std::uint64_t)>
double run_backward(Tape& tape, const R& result, Progress&& progress = [](std::uint64_t) {}) {
  static_assert(is_loss_v<R> || is_rank0_tensor_v<R>,
                "tshard: the function differentiated returns a scalar: cross_entropy's result or a full "
                "reduction such as ts::sum<0, 1>(y) (a rank-0 tensor)");
  const auto& loss = [&]() -> const auto& {
    if constexpr (is_loss_v<R>) return result.tensor();
    else return result;
  }();
  using L = std::remove_cvref_t<decltype(loss)>;
  using T = typename L::Scalar;
  const double value = [&] {
    PauseRecording pause;
    const Eigen::Tensor<T, 0> v = loss.gather();  // resolves a partial sum: every rank calls it
    return double(v());
  }();
  if (auto* node = node_of(loss)) {
    auto one = pooled_array<T>(1);
    one.get()[0] = T(1);
    add_cotangent(*node, node->primal, std::move(one));
  }
  propagate_all(tape, progress);
  return value;
}

// The gradient of a leaf as the leaf's own type: its cotangent resolved into its spec, or zeros
// where the loss does not depend on it.
template <class W>
W leaf_gradient(const TypedGradNode<typename W::Scalar>& node, const W& w) {
  if (!node.cotangent) return zeros_like(w);
  auto a = implicit_reshard(*node.mesh, node.cotangent_desc, W::spec_desc, node.shape, node.cotangent.get(), "backward");
  return W(AdoptStorage{}, w.mesh(), w.global_shape(), a.owned ? std::move(a.owned) : node.cotangent);
}

template <class Model>
using GradientCollectorOf =
    std::remove_cvref_t<decltype(std::declval<Model&>().gradient_collector(std::declval<Model&>().track_parameters()))>;

template <class W>
void require_differentiable() {
  static_assert(is_sharded_tensor<W>::value, "tshard: gradients are taken with respect to ShardedTensors");
  if constexpr (is_sharded_tensor<W>::value) {
    static_assert(is_real_floating_v<typename W::Scalar>,
                  "tshard: gradients are taken with respect to float, double or bfloat16 tensors");
    static_assert(!W::is_partial, "tshard: take gradients with respect to resolved tensors (reshard a partial first)");
  }
}

}  // namespace tshard::detail

namespace tshard::ad {

// f(w...)'s value and its gradients with respect to each w: {loss, dw1, dw2, ...}. f takes its
// arguments as `const auto&` and returns a scalar (cross_entropy's result, or a full reduction);
// what it captures is constant. Each gradient has its tensor's exact type (spec, no partial) and
// is the one-rank gradient on every mesh.
template <class F, class... W>
auto value_and_grad(F&& f, const W&... w) {
  (detail::require_differentiable<W>(), ...);
  detail::Tape tape;
  detail::ActiveTape active(tape);
  std::tuple<W...> leaves{detail::tape_value(w)...};
  const auto nodes = detail::make_leaves(leaves);
  double loss = 0;
  {
    auto result = std::apply(f, std::as_const(leaves));
    loss = detail::run_backward(tape, result);
  }
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::tuple<double, W...>{loss, detail::leaf_gradient(*std::get<I>(nodes), w)...};
  }(std::index_sequence_for<W...>{});
}

// The gradients alone, as a std::tuple.
template <class F, class... W>
auto grad(F&& f, const W&... w) {
  auto all = value_and_grad(std::forward<F>(f), w...);
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::tuple<W...>{std::move(std::get<I + 1>(all))...};
  }(std::index_sequence_for<W...>{});
}

// Runs the closure (a forward pass returning the loss) and adds d loss / d p into the gradient
// of every parameter the model registered; returns the loss. Alone, gradients are complete
// after it; once an optimizer owns the model, it reduces their data-parallel sums.
template <class Model, class F>
double backward(Model& model, F&& closure) {
  detail::Tape tape;
  std::optional<detail::GradientCollectorOf<Model>> collector;
  double loss = 0;
  {
    detail::ActiveTape active(tape);
    struct Untrack {
      Model& m;
      ~Untrack() { m.untrack_parameters(); }
    } untrack{model};
    collector.emplace(model.gradient_collector(model.track_parameters()));
    auto result = closure();
    // Each module's gradients are collected, and reported ready to an owning optimizer (which
    // may start reducing them), as soon as every node that reads its parameters has run.
    loss = detail::run_backward(tape, result, [&](std::uint64_t order) { collector->advance(order); });
  }
  collector->finish();
  return loss;
}

}  // namespace tshard::ad
