// What an owner of a module's parameters (an optimizer doing data parallelism and ZeRO) is told
// of their use: the module calls these around each use of its parameters and when their
// gradients are final, and the owner gathers, releases and reduces. The module system (nn/)
// knows only this interface; the buckets behind it are in parallel/bucket.hpp.
#pragma once
#include <functional>

namespace tshard::parallel {

// Set by an optimizer on a layer it owns; each may be empty.
struct LayerHooks {
  std::function<void()> before_use;       // ZeRO-3: gather the layer's parameters
  std::function<void()> after_use;        // ZeRO-3: release them again
  std::function<void()> gradients_ready;  // the layer's backward has ended: reduce its gradients
  std::function<void()> gradients_read;   // a gradient is about to be read: complete its reduction
  std::function<void()> progress;         // between a backward's nodes: let MPI move what is in flight
};

}  // namespace tshard::parallel

namespace tshard::nn {
using parallel::LayerHooks;
}  // namespace tshard::nn
