// Learning-rate schedules: the rate for each step, set on an optimizer before its step() (every
// parameter without a rate of its own group follows it).
//
//   ts::optim::WarmupCosine lr{.peak = 3e-4, .warmup = 100, .total = 5000, .floor = 3e-5};
//   for (long step = 0; ...) { ts::optim::set_lr(opt, lr, step); ... opt.step(); }
#pragma once
#include <algorithm>
#include <cmath>

namespace tshard::optim {

// Linear warm-up over `warmup` steps, then cosine decay from `peak` to `floor` at step `total`,
// and `floor` after it (nanoGPT's get_lr): step < warmup: peak (step + 1) / (warmup + 1); then
// floor + (peak - floor) (1 + cos(pi (step - warmup) / (total - warmup))) / 2.
struct WarmupCosine {
  double peak = 1e-3;
  long warmup = 0;
  long total = 0;
  double floor = 0.0;
  double at(long step) const {
    if (step < warmup) return peak * double(step + 1) / double(warmup + 1);
    if (step >= total || total <= warmup) return step >= total ? floor : peak;
    const double ratio = double(step - warmup) / double(total - warmup);
    return floor + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (peak - floor);
  }
};

// The same rate at every step.
struct ConstantLr {
  double lr = 1e-3;
  double at(long) const { return lr; }
};

// The optimizer's rate for `step` (0-based: the step about to run).
template <class Optimizer, class Schedule>
void set_lr(Optimizer& opt, const Schedule& schedule, long step) {
  opt.options().lr = decltype(opt.options().lr)(schedule.at(step));
}

}  // namespace tshard::optim
