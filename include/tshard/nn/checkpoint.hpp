// Activation checkpointing of a module (PyTorch's checkpoint_wrapper): y = module(x...) with its
// activations recomputed in the backward instead of kept (ts::ad::checkpoint). The module's
// micro-batch context at the forward is given back to it for the recomputation, marked as one,
// so dropout draws the same masks and per-step counters count the forward once, whatever ran
// in between (a pipeline's other micro-batches).
//
//   auto h = ts::nn::checkpoint(block, x);                                       // full
//   auto h = ts::nn::checkpoint<ts::ad::Recompute::AllButProducts>(block, x);    // selective
//   auto h = ts::nn::checkpoint(block, x, options);                              // block(x, options)
#pragma once
#include <memory>
#include <type_traits>

#include "tshard/ad/checkpoint.hpp"
#include "tshard/nn/module.hpp"

namespace tshard::nn {

namespace detail {
// The module's micro-batch context at the forward, given back to it for the recomputation.
template <class Layer>
tshard::detail::RecomputeScope recompute_scope(Layer& layer) {
  MicroBatch at_forward = layer.micro_batch();
  at_forward.recompute = true;
  auto outside = std::make_shared<MicroBatch>();  // the context the recomputation interrupts
  return {[&layer, at_forward, outside] {
            *outside = layer.micro_batch();
            layer.set_micro_batch(at_forward);
          },
          [&layer, outside] { layer.set_micro_batch(*outside); }};
}
}  // namespace detail

template <ad::Recompute policy = ad::Recompute::Everything, class Layer, ShardedTensorType... X>
  requires std::is_base_of_v<Module, Layer>
auto checkpoint(Layer& layer, const X&... x) {
  static_assert(std::is_invocable_v<Layer&, const X&...>,
                "tshard::nn::checkpoint: the module is callable on these inputs (layer(x...))");
  return tshard::detail::checkpoint(policy, [&layer](const auto&... a) { return layer(a...); },
                                    detail::recompute_scope(layer), x...);
}

// A module called with a tensor and what is not one (a block's attention options):
// layer(x, options), the options kept by value for the recomputation.
//   auto h = ts::nn::checkpoint(block, x, ts::nn::AttentionOptions{.document_starts = starts});
template <ad::Recompute policy = ad::Recompute::Everything, class Layer, ShardedTensorType X, class Options>
  requires(std::is_base_of_v<Module, Layer> && !ShardedTensorType<Options>)
auto checkpoint(Layer& layer, const X& x, const Options& options) {
  static_assert(std::is_invocable_v<Layer&, const X&, const Options&>,
                "tshard::nn::checkpoint: the module is callable on these inputs (layer(x, options))");
  return tshard::detail::checkpoint(policy, [&layer, options](const auto& a) { return layer(a, options); },
                                    detail::recompute_scope(layer), x);
}

}  // namespace tshard::nn
