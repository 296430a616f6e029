// The definitions of schedule.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <vector>

#include "tshard/parallel/schedule.hpp"

namespace tshard::parallel {

TSHARD_FUNC std::vector<PipelineTask> pipeline_order(Schedule schedule, int stages, int stage,
                                                     int microbatches) {
  std::vector<PipelineTask> order;
  if (schedule == Schedule::GPipe) {
    for (int m = 0; m < microbatches; ++m) order.push_back({true, m});
    for (int m = 0; m < microbatches; ++m) order.push_back({false, m});
    return order;
  }
  const int warmup = std::min(stages - stage - 1, microbatches);
  int f = 0, b = 0;
  for (; f < warmup; ++f) order.push_back({true, f});
  while (f < microbatches) {
    order.push_back({true, f++});
    order.push_back({false, b++});
  }
  while (b < microbatches) order.push_back({false, b++});
  return order;
}

}  // namespace tshard::parallel
