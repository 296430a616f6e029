// Pipeline schedules (GPipe, arXiv 1811.06965; PipeDream-flush's 1F1B, arXiv 2104.04473): the
// order in which a stage runs its micro-batches' forwards and backwards. Pure arithmetic, the
// same on every rank; parallel/pipeline.hpp runs it.
#pragma once
#include <algorithm>
#include <vector>

#include "tshard/core/kernel_instances.hpp"

namespace tshard::parallel {

enum class Schedule {
  GPipe,     // every forward, then every backward
  OneFOneB,  // PipeDream-flush: after K - s - 1 warm-up forwards, stage s alternates one forward, one backward
};

inline const char* to_string(Schedule s) { return s == Schedule::GPipe ? "gpipe" : "1f1b"; }

struct PipelineOptions {
  int microbatches = 1;
  Schedule schedule = Schedule::GPipe;
  bool remat = false;  // GPipe's re-materialisation: keep only the stage's inputs, recompute in backward
};

// One entry of a stage's order.
struct PipelineTask {
  bool forward;
  int microbatch;
  bool operator==(const PipelineTask&) const = default;
};

// The order in which stage `stage` of `stages` runs the forwards and backwards of `microbatches`
// micro-batches. Pure arithmetic, the same on every rank.
std::vector<PipelineTask> pipeline_order(Schedule schedule, int stages, int stage, int microbatches);

}  // namespace tshard::parallel

namespace tshard::nn {
using parallel::pipeline_order;
using parallel::PipelineOptions;
using parallel::PipelineTask;
using parallel::Schedule;
using parallel::to_string;
}  // namespace tshard::nn

#if TSHARD_HEADER_BODIES
#include "tshard/parallel/schedule-inl.hpp"
#endif
