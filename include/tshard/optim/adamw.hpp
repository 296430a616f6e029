// AdamW: its settings, its update rule (pure: one run of elements in, no state of its own beyond
// the arrays it is handed) and the optimizer that applies it to sharded parameters.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <Eigen/Core>

#include "tshard/core/dispatch.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/optim/optimizer.hpp"

namespace tshard::optim {

// AdamW's settings: the first five in this order (designated initializers: {.lr = 1e-3f, ...}),
// then weight-update sharding over the mesh axes named in data_axis, whose gradient sums the
// buckets reduce ("data", or a list such as "data,context" where the batch is split over
// several axes: one group, ZeRO's chunks partitioned over all of it; a name the mesh lacks adds
// no axis, and none at all means no data parallelism),
// whether layers' gradient reductions start, non-blocking, during backward (PyTorch DDP's
// overlap: the reductions in flight are tested between the backward's nodes, so MPI moves them
// without a progress thread), and whether ZeRO-3 prefetches (below). Overlap is off by default:
// on a machine with one core per rank, the backward and the transfers share the cores.
// bucket_bytes (DDP's bucket_cap_mb, 25 MiB as its default) coalesces the gradients of
// consecutive modules of one add(model) into one reduction up to that size (a module is never
// split; 0: one reduction per module). ZeRO-3 keeps one module a bucket: its unit of gathering
// parameters is the module (FSDP's wrapping).
// The settings are doubles, so a double-precision run can follow a reference that writes
// betas=(0.9, 0.95) exactly; the defaults are the float values they always were (1e-3f, ...),
// so programs that keep them, or pass floats, compute bitwise what they did.
// ZeRO-3's prefetch (DeepSpeed's stage3_prefetch_bucket_size and max_reuse_distance, for one
// layer ahead): a layer's use starts the next layer's parameter gather, non-blocking, in the
// order of the step before, and a layer used twice in a row keeps its parameters between the
// two uses. It holds one more layer's parameters at a time; the result is the same bitwise.
struct AdamWOptions {
  double lr = 1e-3f;
  double beta1 = 0.9f;
  double beta2 = 0.999f;
  double eps = 1e-8f;
  double weight_decay = 0.01f;
  int zero_stage = 0;
  std::string data_axis = "data";  // owned: a caller's temporary string may end before add() reads it
  bool overlap = false;
  bool prefetch = false;
  std::int64_t bucket_bytes = std::int64_t(25) << 20;
};

// Adam with decoupled weight decay (Loshchilov and Hutter 2019), PyTorch's formula:
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// One AdamW step of n elements: the moments m and v, then p, with the step's coefficients
// (decay = 1 - lr wd, step = lr / (1 - beta1^t), root_bc2 = sqrt(1 - beta2^t)). Dispatched
// (core/dispatch.hpp).
struct AdamWCoefficients {
  double b1, b2, eps, decay, step, root_bc2;
};
template <class T>
void adamw_kernel(const AdamWCoefficients& c, T* p, const T* g, T* m_state, T* v_state, Index n) {
  TSHARD_DISPATCH((adamw_kernel<T>), c, p, g, m_state, v_state, n);
  const T b1 = T(c.b1), b2 = T(c.b2), eps = T(c.eps), decay = T(c.decay), step = T(c.step), root_bc2 = T(c.root_bc2);
  using A = Eigen::Array<T, Eigen::Dynamic, 1>;
  for (Index at = 0; at < n; at += 512) {  // vectorised, in blocks that stay in cache
    const Index k = std::min<Index>(512, n - at);
    Eigen::Map<A> m(m_state + at, k), v(v_state + at, k), pv(p + at, k);
    Eigen::Map<const A> gv(g + at, k);
    m = b1 * m + (T(1) - b1) * gv;
    v = b2 * v + (T(1) - b2) * gv.square();
    pv = pv * decay - step * m / (v.sqrt() / root_bc2 + eps);
  }
}

struct AdamWRule {
  static constexpr int states = 2;
  static constexpr const char* state_names[] = {"exp_avg", "exp_avg_sq"};
  template <class T>
  static void update(const AdamWOptions& o, long t, T* p, const T* g, T* const* s, Index n) {
    // (each coefficient rounded to T as before: the same update bit for bit)
    const T lr = T(o.lr);
    const AdamWCoefficients c{double(T(o.beta1)),
                              double(T(o.beta2)),
                              double(T(o.eps)),
                              double(T(T(1) - lr * T(o.weight_decay))),
                              double(T(lr / T(1 - std::pow(double(o.beta1), double(t))))),
                              double(T(std::sqrt(1 - std::pow(double(o.beta2), double(t)))))};
    adamw_kernel<T>(c, p, g, s[0], s[1], n);
  }
};

class AdamW : public Optimizer<AdamWOptions, AdamWRule> {
 public:
  using Options = AdamWOptions;
  explicit AdamW(const Options& options) : Optimizer(options) {}
};

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp); the update
// also per instruction-set level (core/dispatch.hpp).
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (adamw_kernel<T>), const AdamWCoefficients&, T*, const T*, T*, \
    T*, Index)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
TSHARD_KERNEL_INSTANCE(class Optimizer<AdamWOptions, AdamWRule>)
TSHARD_KERNEL_INSTANCE(void Optimizer<AdamWOptions, AdamWRule>::add_module_slot<nn::detail::ParameterSlot>(
    nn::detail::ParameterSlot&, const std::string&, const std::function<ParameterGroup(const ParameterInfo&)>&, bool,
    Optimizer<AdamWOptions, AdamWRule>::ModuleBucket&, Optimizer<AdamWOptions, AdamWRule>::OpenBucket&, std::uint32_t&))

}  // namespace tshard::optim

namespace tshard::nn {
using optim::AdamW;
using optim::AdamWOptions;
}  // namespace tshard::nn
