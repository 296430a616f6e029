// Which micro-batch a model's forward belongs to. A pipeline runs several micro-batches' forwards
// before their backwards; what depends on the global position of a row (dropout masks, GShard's
// random routing) reads the micro-batch's row offset in the whole batch. Each model holds its own
// (Module::micro_batch(), set through its tree by its owner): nothing process-wide. Outside a
// pipeline the context is micro-batch 0 of 1 covering the whole tensor.
#pragma once
#include <Eigen/Core>

namespace tshard::parallel {

struct MicroBatch {
  int index = 0;                 // which micro-batch of the step
  int count = 1;                 // how many the step has
  Eigen::Index row_offset = 0;   // global index of its first row (dim 0) in the whole batch
  Eigen::Index rows_total = 0;   // rows of the whole batch; 0: the tensor's own dim 0
  bool recompute = false;        // a re-materialising forward: the same step, the same masks
  bool inference = false;        // an evaluation forward: no dropout, no random routing, no step counted
};

}  // namespace tshard::parallel

namespace tshard::nn {
using parallel::MicroBatch;
}  // namespace tshard::nn
