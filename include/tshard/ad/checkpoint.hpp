// Activation checkpointing (JAX's jax.checkpoint, PyTorch's torch.utils.checkpoint): y = f(x...)
// without keeping what f's operators saved for the backward. The backward runs f again, recorded
// this time, and sends y's cotangent through it, so a model's activations cost one checkpointed
// block's at a time plus the blocks' inputs, for a second forward.
//
//   auto y = ts::ad::checkpoint(f, x);                                     // recompute all of f
//   auto y = ts::ad::checkpoint<ts::ad::Recompute::AllButProducts>(f, x);  // keep the einsum outputs
//
// The second is torchtitan's selective checkpointing: the GEMMs' outputs are kept, the cheap
// elementwise ops, norms and softmaxes run twice. f takes its arguments as `const auto&` and
// returns a ShardedTensor or an ad::Scalar. Because it runs again in the backward, f computes the
// same values from the same inputs (dropout masks from a seed, as nn/'s layers draw them), and
// what it captures outlives the backward: parameters and modules by reference, other tensors by
// value or as arguments. The parameters f reads get the gradients they would get without the
// checkpoint. ts::nn::checkpoint(module, x) checkpoints a module's forward.
#pragma once
#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "tshard/ad/vjp.hpp"

namespace tshard::ad {

// What a checkpoint recomputes in the backward.
enum class Recompute {
  Everything,      // keep only f's inputs
  AllButProducts,  // keep the einsum outputs too (the GEMMs): recompute the cheap ops alone
};

}  // namespace tshard::ad

namespace tshard::detail {

// `tape` is the active tape, recording, for a scope: nested in the one active before.
class NestedTape {
 public:
  explicit NestedTape(Tape& tape) : outer_(Tape::active()), paused_(Tape::paused()) {
    Tape::active() = &tape;
    Tape::paused() = false;
  }
  ~NestedTape() {
    Tape::active() = outer_;
    Tape::paused() = paused_;
  }
  NestedTape(const NestedTape&) = delete;
  NestedTape& operator=(const NestedTape&) = delete;

 private:
  Tape* outer_;
  bool paused_;
};

// Einsums keep their outputs in (or take them from) `kept` for a scope; null: neither.
class UsingKeptProducts {
 public:
  explicit UsingKeptProducts(KeptProducts* kept) : previous_(KeptProducts::active()) { KeptProducts::active() = kept; }
  ~UsingKeptProducts() { KeptProducts::active() = previous_; }
  UsingKeptProducts(const UsingKeptProducts&) = delete;
  UsingKeptProducts& operator=(const UsingKeptProducts&) = delete;

 private:
  KeptProducts* previous_;
};

// The leaves among `nodes` that can be put back on their tensors (parameters) carry them again
// for a scope: a pipeline stage's parameters are untracked once its forward has ended.
class ReattachedLeaves {
 public:
  explicit ReattachedLeaves(const std::vector<std::shared_ptr<GradNode>>& nodes) {
    for (const auto& n : nodes)
      if (n->swap_leaf_node) swapped_.push_back({n, n->swap_leaf_node(n->leaf_tensor, n)});
  }
  ~ReattachedLeaves() {
    for (auto it = swapped_.rbegin(); it != swapped_.rend(); ++it)
      it->node->swap_leaf_node(it->node->leaf_tensor, std::move(it->previous));
  }
  ReattachedLeaves(const ReattachedLeaves&) = delete;
  ReattachedLeaves& operator=(const ReattachedLeaves&) = delete;

 private:
  struct Swap {
    std::shared_ptr<GradNode> node, previous;
  };
  std::vector<Swap> swapped_;
};

// What the owner of a checkpointed function sets around its recomputation (a module: its
// micro-batch context, marked as a recomputation).
struct RecomputeScope {
  std::function<void()> enter, leave;
};

namespace grad {
template <class F>
struct Checkpoint {
  std::shared_ptr<F> f;
  std::shared_ptr<KeptProducts> kept;           // AllButProducts: the first run's einsum outputs
  std::vector<std::shared_ptr<GradNode>> foreign;  // the outer nodes f's rules add into
  RecomputeScope scope;
};

// f again, recorded on a tape of its own nested in the running backward's, its output seeded with
// this node's cotangent and its rules run: they add into the inputs' and the parameters' nodes.
template <class F, class Out, class T, class... X>
void vjp(const Checkpoint<F>& c, std::type_identity<Out>, TypedGradNode<T>& self, const X&... x) {
  ReattachedLeaves leaves(c.foreign);
  // (A pullback may run with no tape active: this one's orders start above any in use, so every
  // node it reads from outside is foreign to it, and none has its consumers changed.)
  Tape tape(std::numeric_limits<std::uint64_t>::max() / 2, /*nested*/ true);
  using R = std::remove_cvref_t<std::invoke_result_t<F&, const X&...>>;
  std::optional<R> y;
  {
    NestedTape nested(tape);
    UsingKeptProducts products(c.kept.get());
    if (c.kept) c.kept->start_replay();
    struct Scope {
      const RecomputeScope& s;
      explicit Scope(const RecomputeScope& scope) : s(scope) {
        if (s.enter) s.enter();
      }
      ~Scope() {
        if (s.leave) s.leave();
      }
    } scope(c.scope);
    y.emplace((*c.f)(x...));
  }
  if (auto* node = node_of(result_tensor(*y))) add_cotangent(*node, self.cotangent_desc, std::move(self.cotangent));
  propagate_all(tape, [](std::uint64_t) {});  // (the tape keeps its nodes weakly: y holds them till here)
}
}  // namespace grad

template <class F, class... X>
auto checkpoint(ad::Recompute policy, F&& f, RecomputeScope scope, const X&... x) {
  using R = std::remove_cvref_t<std::invoke_result_t<F&, const X&...>>;
  static_assert(is_sharded_tensor<R>::value || is_loss_v<R>,
                "tshard: a checkpointed function returns a ShardedTensor or a scalar (cross_entropy's result)");
  if (!Tape::active() || Tape::paused()) return R(f(x...));  // no gradient taken: nothing to save
  Tape tape(Tape::active()->next_order(), /*nested*/ true);
  auto kept = policy == ad::Recompute::AllButProducts ? std::make_shared<KeptProducts>() : nullptr;
  std::optional<R> result;
  {
    NestedTape nested(tape);
    UsingKeptProducts products(kept.get());
    result.emplace(f(x...));
  }
  const auto& y = result_tensor(*result);
  using Y = std::remove_cvref_t<decltype(y)>;
  // Nothing recorded inside (f's output is an input, or depends on nothing tracked): no node.
  if (!TensorAccess::node(y) || TensorAccess::node(y)->order < tape.first_order()) return std::move(*result);
  Y out = tape_output(y);
  result.reset();  // f's own nodes, and all they saved, go here
  // The checkpoint's node consumes every outer node f's rules add into.
  const std::uint64_t order = Tape::active()->next_order();
  for (const auto& n : tape.foreign())
    if (!Tape::active()->note_foreign(n)) n->first_consumer = std::min(n->first_consumer, order);
  using Fn = std::remove_cvref_t<F>;
  record(out,
         grad::Checkpoint<Fn>{std::make_shared<Fn>(std::forward<F>(f)), std::move(kept), tape.foreign(), std::move(scope)},
         tape_value(x)...);
  if constexpr (is_loss_v<R>)
    return R(std::move(out));
  else
    return out;
}

}  // namespace tshard::detail

namespace tshard::ad {

// y = f(x...), its activations recomputed in the backward instead of kept (see the file comment).
template <Recompute policy = Recompute::Everything, class F, ShardedTensorType... X>
auto checkpoint(F&& f, const X&... x) {
  return detail::checkpoint(policy, std::forward<F>(f), detail::RecomputeScope{}, x...);
}

}  // namespace tshard::ad
