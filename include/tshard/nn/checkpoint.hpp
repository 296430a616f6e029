// Activation checkpointing of a module (PyTorch's checkpoint_wrapper): y = module(x...) with its
// activations recomputed in the backward instead of kept (ts::ad::checkpoint). The module's
// micro-batch context at the forward is given back to it for the recomputation, marked as one,
// so dropout draws the same masks and per-step counters count the forward once, whatever ran
// in between (a pipeline's other micro-batches).
//
//   auto h = ts::nn::checkpoint(block, x);                                       // full
//   auto h = ts::nn::checkpoint<ts::ad::Recompute::AllButProducts>(block, x);    // selective
#pragma once
#include <memory>
#include <type_traits>

#include "tshard/ad/checkpoint.hpp"
#include "tshard/nn/module.hpp"

namespace tshard::nn {

template <ad::Recompute policy = ad::Recompute::Everything, class Layer, ShardedTensorType... X>
  requires std::is_base_of_v<Module, Layer>
auto checkpoint(Layer& layer, const X&... x) {
  static_assert(std::is_invocable_v<Layer&, const X&...>,
                "tshard::nn::checkpoint: the module is callable on these inputs (layer(x...))");
  MicroBatch at_forward = layer.micro_batch();
  at_forward.recompute = true;
  auto outside = std::make_shared<MicroBatch>();  // the context the recomputation interrupts
  tshard::detail::RecomputeScope scope{[&layer, at_forward, outside] {
                                 *outside = layer.micro_batch();
                                 layer.set_micro_batch(at_forward);
                               },
                               [&layer, outside] { layer.set_micro_batch(*outside); }};
  return tshard::detail::checkpoint(policy, [&layer](const auto&... a) { return layer(a...); }, std::move(scope), x...);
}

}  // namespace tshard::nn
