// One registered parameter as data parallelism and weight-update sharding see it (the buckets
// that reduce and gather them are parallel/bucket.hpp), and the bytes ZeRO divides. Weight-update
// sharding over the data axis (Xu et al. 2020, "Automatic cross-replica sharding of weight
// update"; ZeRO, Rajbhandari et al. 2020):
//
//   stage 0  gradients all-reduced; every rank updates its whole local block, state replicated
//   stage 1  gradients all-reduced; rank c of the data axis updates chunk c of the block and
//            holds state for that chunk only; the parameters are all-gathered back
//   stage 2  gradients reduce-scattered: each rank receives only its chunk, and the full
//            gradient's memory goes back to the pool once its reduction has ended
//   stage 3  as 2, and a module's parameters exist only around its uses (gathered just before,
//            released after); each rank keeps its chunk. With prefetch, the next module's
//            gather is in flight while this one computes (the order is the previous step's;
//            parallel/prefetch.hpp), and a module used twice in a row stays present between
//            the two uses
//
// A chunk is a 1/N slice of the flattened local block (N the data axis' size, or the product
// of the data axes' sizes where the optimizer names several), the same
// slicing whatever the parameter's spec, as DeepSpeed flattens. A parameter already split over
// the data axis has nothing to shard and takes the stage-0 path.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/core/shard.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::parallel {

// Bytes this rank holds for parameters, gradients and optimizer state (what ZeRO divides).
struct OptimizerMemory {
  std::uint64_t parameters = 0, gradients = 0, state = 0;
  std::uint64_t model_elements = 0;  // the local parameter elements (Psi of ZeRO's formulas)
  // Of those, the elements of parameters split over the data axis rather than replicated on it
  // (GShard's experts): ZeRO has no copies of them to divide, so every stage holds them whole.
  // ZeRO-k's formula is then its usual one in (Psi - Psi_split) plus 4 Psi_split.
  std::uint64_t data_split_elements = 0;
  std::uint64_t total() const { return parameters + gradients + state; }
};

namespace detail {

using tshard::detail::Index;

// One registered parameter: typed access through closures, and its chunk of the data axis.
template <class T>
struct Slot {
  std::function<T*()> param, grad;  // the buffers (acquired where released)
  std::function<bool()> param_present, grad_present;
  std::function<void(std::shared_ptr<const tshard::detail::RestoreValues<T>>)> release_param;
  std::function<void()> release_grad;
  std::shared_ptr<tshard::detail::MeshState> mesh;  // (keeps the data axis' communicator alive)
  tshard::detail::ShardLayout layout;
  Index size = 0;         // padded local elements
  bool sharded = false;   // stage >= 1 and replicated over a data axis of size > 1
  bool deferred = false;  // the gradient holds this rank's partial sum over the data axis
  bool streamed = false;  // stage 3: present only between its layer's hooks
  Index chunk = 0;        // ceil(size / N)
  std::uint32_t replica_axes = 0;  // mesh axes the parameter is replicated over
  // The optimizer's state, in float for a bfloat16 parameter (mixed precision, as PyTorch's AMP
  // and DeepSpeed keep it), and then a float master copy of the range this rank updates: the
  // update runs on it and the parameter is its rounding.
  using State = tshard::accumulator_t<T>;
  std::vector<std::shared_ptr<State>> state;
  std::shared_ptr<State> master32;
  std::shared_ptr<T> master;   // stage 3: this rank's chunk of the parameter
  std::shared_ptr<T> reduced;  // stages 2 and 3: this rank's chunk of the reduced gradient
  std::optional<double> lr, weight_decay;  // a parameter group's own settings (else the optimizer's)
  const void* identity = nullptr;  // the registered parameter tensor
  bool norm_elsewhere = false;     // a tied copy: the gradient norm counts its twin, not it
  std::shared_ptr<void> keep;  // the registered parameter's handle: param and grad outlive their module

  Index owned_begin(int c) const { return sharded ? std::min(size, Index(c) * chunk) : 0; }
  Index owned_end(int c) const { return sharded ? std::min(size, Index(c + 1) * chunk) : size; }
  Index state_size() const { return sharded ? chunk : size; }
  // f(offset, length) over the valid runs of the block that lie in [begin, end).
  template <class F>
  void for_each_run_in(Index begin, Index end, F&& f) const {
    tshard::detail::for_each_valid_run(layout, [&](Index off, Index n) {
      const Index b = std::max(off, begin), e = std::min(off + n, end);
      if (b < e) f(b, e - b);
    });
  }
};

template <class T>
std::shared_ptr<T> zeroed_array(Index n) {
  auto p = tshard::detail::pooled_array<T>(static_cast<std::size_t>(std::max<Index>(n, 1)));
  std::memset(static_cast<void*>(p.get()), 0, sizeof(T) * static_cast<std::size_t>(std::max<Index>(n, 1)));
  return p;
}

}  // namespace detail
}  // namespace tshard::parallel

namespace tshard::nn {
using parallel::OptimizerMemory;
}  // namespace tshard::nn
