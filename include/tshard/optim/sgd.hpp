// SGD with momentum: its settings, its pure update rule and the optimizer that applies it.
#pragma once
#include <cstdint>
#include <string>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/optim/optimizer.hpp"

namespace tshard::optim {

struct SGDOptions {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  int zero_stage = 0;
  std::string data_axis = "data";  // the axes gradients are summed over, as AdamW's
  bool overlap = false;
  bool prefetch = false;  // ZeRO-3's, as AdamW's
  std::int64_t bucket_bytes = std::int64_t(25) << 20;  // gradients reduced together, as AdamW's
};

// SGD with momentum, PyTorch's formula: d = g + wd p; b = momentum b + d (b = d at the first
// step); p -= lr b (p -= lr d without momentum).
struct SGDRule {
  static constexpr int states = 1;
  static constexpr const char* state_names[] = {"momentum_buffer"};
  template <class T>
  static void update(const SGDOptions& o, long t, T* p, const T* g, T* const* s, Index n) {
    const T lr = T(o.lr), mu = T(o.momentum), wd = T(o.weight_decay);
    T* buf = s[0];
    for (Index i = 0; i < n; ++i) {
      const T d = g[i] + wd * p[i];
      buf[i] = t == 1 ? d : mu * buf[i] + d;
      p[i] -= lr * (mu != T(0) ? buf[i] : d);
    }
  }
};

class SGD : public Optimizer<SGDOptions, SGDRule> {
 public:
  using Options = SGDOptions;
  explicit SGD(const Options& options) : Optimizer(options) {}
};

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
TSHARD_KERNEL_INSTANCE(class Optimizer<SGDOptions, SGDRule>)
TSHARD_KERNEL_INSTANCE(void Optimizer<SGDOptions, SGDRule>::add_module_slot<nn::detail::ParameterSlot>(
    nn::detail::ParameterSlot&, const std::string&, const std::function<ParameterGroup(const ParameterInfo&)>&, bool,
    Optimizer<SGDOptions, SGDRule>::ModuleBucket&, Optimizer<SGDOptions, SGDRule>::OpenBucket&, std::uint32_t&))

}  // namespace tshard::optim

namespace tshard::nn {
using optim::SGD;
using optim::SGDOptions;
}  // namespace tshard::nn
