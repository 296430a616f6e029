// Pipeline parallelism over a mesh axis (GPipe, arXiv 1811.06965; PipeDream-flush's 1F1B,
// arXiv 2104.04473): the model's layers are cut into K stages along the axis, the batch into M
// micro-batches, and each stage runs its micro-batches' forwards and backwards in the order of a
// schedule. Activations go to the next stage and gradients to the previous one point to point
// through comm/, counted like every collective. Before each task a stage posts the receive of
// the task's input and completes it together with the send of the previous task's result (as
// Megatron pairs send_forward with recv_backward): neighbours that send to each other never wait
// on one another, any K and M >= 1 run without deadlock (fewer micro-batches than stages
// included), and a large message moves while both sides are in MPI, not when the sender next
// calls MPI after a long computation.
//
// A stage is a ts::nn::Module written forward only, with
//   using Activation = ShardedTensor<...>;
//   Activation boundary(const MicroBatch&) const;
//   Activation forward(const MicroBatch&, const Activation* in);  // stages before the last; in: null on stage 0
//   auto loss(const MicroBatch&, const Activation* in);           // the last stage: the micro-batch's loss, a scalar
// and its gradients are derived: each micro-batch's forward is recorded on its own tape
// (ts::ad::vjp), held by the pipeline until its backward task runs the pullback with the
// gradient that came back, adding d/dp into the stage's parameter gradients. The micro-batch is
// the stage module's own context (Module::micro_batch(), set through its tree for each task). The step's loss is
// the mean of the micro-batches' losses (each pullback is seeded with 1/M, as PyTorch's pipeline
// schedules scale them), returned in PipelineStats::loss on every rank. Nothing of a step is
// kept outside the pipeline's own run: no process-wide micro-batch store is involved.
#pragma once
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tshard/comm/clock.hpp"
#include "tshard/ad/vjp.hpp"
#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/comm/point_to_point.hpp"
#include "tshard/core/error.hpp"
#include "tshard/parallel/micro_batch.hpp"
#include "tshard/parallel/schedule.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::parallel {

// What one step of a pipeline measured on this rank.
struct PipelineStats {
  double seconds = 0;           // the step's wall time on this stage
  double idle_seconds = 0;      // blocked waiting for another stage (its message, or its receive of ours)
  double busy_seconds = 0;      // inside the stage's forwards and backwards
  std::uint64_t peak_activation_bytes = 0;   // the buffer pool's peak over the step, above its start
  std::uint64_t microbatch_activation_bytes = 0;  // what a forward keeps for backward (A), the mean over the step's forwards
  std::uint64_t kept_bytes = 0;              // still in use after the step, above its start: the gradients
  std::uint64_t boundary_bytes = 0;          // one stage input (a micro-batch's activation), this rank's block
  int in_flight = 0;                         // the most micro-batches holding activations at once
  double loss = 0;  // the step's loss (mean over micro-batches), on every rank
  // (The bubble is 1 - busy / step, with the step of the slowest stage: gather busy_seconds and
  // seconds over the stages, as train_transformer does.)
};

// A stage written forward only, whose gradients the pipeline derives (see the top of the file).
template <class Stage>
concept DerivedStage = requires(Stage& s, const MicroBatch& mb, const typename Stage::Activation* in) {
  { s.forward(mb, in) } -> std::same_as<typename Stage::Activation>;
  s.loss(mb, in);
  s.set_micro_batch(mb);
} && tshard::detail::TrackedModel<Stage>;

namespace detail {

// The value of a stage's loss (ad::Scalar or a rank-0 tensor, maybe partial), the same on every
// rank of its stage.
template <class R>
double loss_value(const R& r) {
  return double(tshard::detail::result_tensor(r).gather()());
}

// A stage module's micro-batch for a scope, back to the whole batch after.
template <class Stage>
class StageMicroBatch {
 public:
  StageMicroBatch(Stage& stage, const MicroBatch& mb) : stage_(stage) { stage_.set_micro_batch(mb); }
  ~StageMicroBatch() { stage_.set_micro_batch(MicroBatch{}); }
  StageMicroBatch(const StageMicroBatch&) = delete;
  StageMicroBatch& operator=(const StageMicroBatch&) = delete;

 private:
  Stage& stage_;
};

// How Pipeline::run computes a task of a stage written forward only: each micro-batch's forward
// is recorded by ts::ad::vjp and its pullback kept here, per micro-batch, until the backward task
// (under remat the forward runs untracked and is recorded again in the backward task).
template <class Stage>
class DerivedTasks {
 public:
  using Activation = typename Stage::Activation;
  using Pullback = std::function<std::optional<Activation>(const Activation*)>;
  DerivedTasks(Stage& stage, bool first, bool last, bool remat)
      : stage_(stage), first_(first), last_(last), remat_(remat) {}

  Activation boundary(const MicroBatch& mb) const { return stage_.boundary(mb); }

  std::optional<Activation> forward(const MicroBatch& mb, const Activation* in) {
    StageMicroBatch scope(stage_, mb);
    if (remat_) {
      if (!last_) return stage_.forward(mb, in);
      losses_ += loss_value(stage_.loss(mb, in)) / double(mb.count);
      return std::nullopt;
    }
    auto [y, pullback] = record(mb, in);
    pullbacks_.resize(std::size_t(mb.count));
    pullbacks_[std::size_t(mb.index)] = std::move(pullback);
    return y;
  }
  std::optional<Activation> backward(const MicroBatch& mb, const Activation* in, const Activation* dy) {
    Pullback pullback;
    if (remat_) {  // the forward again, recorded this time
      MicroBatch again = mb;
      again.recompute = true;
      StageMicroBatch scope(stage_, again);
      pullback = record(again, in).second;
    } else {
      auto& slot = pullbacks_.at(std::size_t(mb.index));  // (sized by the forward)
      pullback = std::move(slot);
      slot = nullptr;
    }
    return pullback(dy);
  }
  // The mean of the micro-batches' losses, on the last stage.
  double loss() const { return losses_; }

 private:
  // The forward of micro-batch mb on the tape, and its pullback: dy (null on the last stage) ->
  // the input's gradient (none on the first).
  std::pair<std::optional<Activation>, Pullback> record(const MicroBatch& mb, const Activation* in) {
    const double share = 1.0 / double(mb.count);
    if (last_) {
      auto pull_loss = [&](auto&& recorded) -> std::pair<std::optional<Activation>, Pullback> {
        auto& [loss, pb] = recorded;
        if (!mb.recompute) losses_ += loss_value(loss) * share;
        auto kept = std::make_shared<std::remove_cvref_t<decltype(pb)>>(std::move(pb));  // (std::function copies)
        return {std::nullopt, [kept, share](const Activation*) -> std::optional<Activation> {
                  return from_tuple((*kept)(share));
                }};
      };
      if (first_) return pull_loss(ad::vjp(stage_, [&] { return stage_.loss(mb, nullptr); }));
      return pull_loss(ad::vjp(stage_, [&](const Activation& x) { return stage_.loss(mb, &x); }, *in));
    }
    auto pull = [](auto&& recorded) -> std::pair<std::optional<Activation>, Pullback> {
      auto& [y, pb] = recorded;
      auto kept = std::make_shared<std::remove_cvref_t<decltype(pb)>>(std::move(pb));
      return {std::move(y), [kept](const Activation* dy) -> std::optional<Activation> {
                return from_tuple((*kept)(*dy));
              }};
    };
    if (first_) return pull(ad::vjp(stage_, [&] { return stage_.forward(mb, nullptr); }));
    return pull(ad::vjp(stage_, [&](const Activation& x) { return stage_.forward(mb, &x); }, *in));
  }
  static std::optional<Activation> from_tuple(std::tuple<>) { return std::nullopt; }
  static std::optional<Activation> from_tuple(std::tuple<Activation>&& t) { return std::move(std::get<0>(t)); }

  Stage& stage_;
  bool first_, last_, remat_;
  std::vector<Pullback> pullbacks_;
  double losses_ = 0;
};

}  // namespace detail

// The pipeline over the mesh axis StageAxis of a mesh M.
template <class M, FixedString StageAxis = "stage">
class Pipeline {
 public:
  Pipeline(const M& mesh, PipelineOptions o) : mesh_(mesh), o_(o) {
    constexpr int axis = M::template axis_index<StageAxis>();
    stage_comm_ = tshard::detail::state_of(mesh)->group(std::vector<int>{axis});
    stages_ = mesh.template size<StageAxis>();
    stage_ = mesh.template coord<StageAxis>();
    if (o_.microbatches < 1)
      throw ShapeError("tshard::parallel::Pipeline: " + std::to_string(o_.microbatches) + " micro-batches; at least 1 is needed");
  }

  int stages() const { return stages_; }
  int stage() const { return stage_; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }
  const PipelineOptions& options() const { return o_; }
  // The ranks of this rank's stage-axis line: one per stage, ordered by stage.
  MPI_Comm stage_comm() const { return stage_comm_; }
  // A parameter the first and last stages each hold (a tied embedding and head): `opt` sums the
  // two copies' gradients after the data-parallel sums and counts them once in the norm
  // (ts::optim::Optimizer::tie). Both stages call it with their copy; with one stage, nothing.
  template <class Optimizer, class P>
  void tie_ends(Optimizer& opt, const P& param) const {
    if (stages_ > 1 && (first() || last())) opt.tie(param, stage_comm_, first() ? stages_ - 1 : 0, first());
  }

  // Which of `count` items (layers) stage s holds: [begin, end), as even as possible, the first
  // stages taking one more where they do not divide.
  static std::pair<int, int> partition(int count, int stages, int s) {
    const int base = count / stages, extra = count % stages;
    const int begin = s * base + std::min(s, extra);
    return {begin, begin + base + (s < extra ? 1 : 0)};
  }
  std::pair<int, int> partition(int count) const { return partition(count, stages_, stage_); }

  // One step over a batch of `rows` rows (dim 0 of the stage inputs) cut into M micro-batches.
  // Throws ShapeError on every rank alike where M does not divide the rows.
  template <class Stage>
  PipelineStats run(Stage& stage, Eigen::Index rows) {
    require_stage<Stage>();
    return run_tasks(detail::DerivedTasks<Stage>(stage, first(), last(), o_.remat), rows);
  }

  // Forwards alone, for evaluation: `microbatches` micro-batches (0: the pipeline's) stream
  // through the stages, each stage computing m while the next computes m - 1. Every forward runs
  // with MicroBatch::inference (no dropout, no random routing, no step counted), records nothing,
  // and leaves a training step in progress untouched. The result holds the mean of the
  // micro-batches' losses.
  template <class Stage>
  PipelineStats evaluate(Stage& stage, Eigen::Index rows, int microbatches = 0) {
    require_stage<Stage>();
    using Activation = typename Stage::Activation;
    const int mbs = microbatches > 0 ? microbatches : o_.microbatches;
    check_rows(rows, mbs);
    const Eigen::Index b = rows / mbs;
    PipelineStats st;
    const auto start = Clock::now();
    std::optional<Activation> input, sending;
    tshard::detail::PendingMessage outgoing;
    double losses = 0;
    for (int m = 0; m < mbs; ++m) {
      const MicroBatch mb{.index = m, .count = mbs, .row_offset = m * b, .rows_total = rows, .inference = true};
      tshard::detail::PendingMessage incoming;
      if (!first()) {
        input = stage.boundary(mb);
        incoming = receive(*input, m, true);
      }
      st.idle_seconds += tshard::detail::wait_all({&outgoing, &incoming});
      sending.reset();
      std::optional<Activation> result;
      const auto t0 = Clock::now();
      {
        const Activation* in = first() ? nullptr : &*input;
        ad::NoGrad untracked;  // (inside a gradient being taken, an evaluation adds nothing to it)
        detail::StageMicroBatch scope(stage, mb);
        if (last()) losses += detail::loss_value(stage.loss(mb, in)) / double(mbs);
        else result = stage.forward(mb, in);
      }
      st.busy_seconds += seconds_since(t0);
      input.reset();
      if (last()) continue;
      if (!result) throw SpecError("tshard::parallel::Pipeline: a stage before the last returned no activation");
      sending = std::move(result);
      outgoing = send(*sending, m, true);
    }
    st.idle_seconds += outgoing.wait();
    st.loss = share_loss(losses);
    st.seconds = seconds_since(start);
    return st;
  }

 private:
  template <class Stage>
  static constexpr void require_stage() {
    static_assert(DerivedStage<Stage>,
                  "tshard: a pipeline stage is a ts::nn::Module with `using Activation = ...`, "
                  "Activation boundary(const MicroBatch&) const, Activation forward(const MicroBatch&, const Activation*) "
                  "and loss(const MicroBatch&, const Activation*)");
  }
  // One step of a stage: the schedule's tasks, their messages and the measurements;
  // `tasks` computes each task.
  template <class Tasks>
  PipelineStats run_tasks(Tasks tasks, Eigen::Index rows) {
    using Activation = typename Tasks::Activation;
    using T = typename Activation::Scalar;
    const int mbs = o_.microbatches;
    check_rows(rows, mbs);
    const Eigen::Index b = rows / mbs;
    PipelineStats st;
    const auto start = Clock::now();
    const std::uint64_t base = pool_stats().bytes_in_use;
    reset_pool_peak();
    std::vector<std::optional<Activation>> inputs(static_cast<std::size_t>(mbs));  // stage inputs, kept for remat
    std::optional<Activation> sending;  // the last task's result while it is in flight
    tshard::detail::PendingMessage outgoing;
    int live = 0;
    std::uint64_t kept_by_forwards = 0;
    auto busy = [&](auto&& f) {
      const auto t0 = Clock::now();
      f();
      st.busy_seconds += seconds_since(t0);
    };
    for (const PipelineTask& task : pipeline_order(o_.schedule, stages_, stage_, mbs)) {
      const int m = task.microbatch;
      const MicroBatch mb{.index = m, .count = mbs, .row_offset = m * b, .rows_total = rows, .recompute = false};
      // What this task needs is posted, then completed together with the last task's send.
      tshard::detail::PendingMessage incoming;
      std::optional<Activation> dy;
      if (task.forward && !first()) {
        inputs[m] = tasks.boundary(mb);
        incoming = receive(*inputs[m], m, true);
        st.boundary_bytes = std::uint64_t(inputs[m]->padded_size()) * sizeof(T);
      } else if (!task.forward && !last()) {
        dy = tasks.boundary(mb);
        incoming = receive(*dy, m, false);
      }
      st.idle_seconds += tshard::detail::wait_all({&outgoing, &incoming});
      sending.reset();
      std::optional<Activation> result;
      if (task.forward) {
        const std::uint64_t before = pool_stats().bytes_in_use;
        busy([&] { result = tasks.forward(mb, first() ? nullptr : &*inputs[m]); });
        kept_by_forwards += pool_stats().bytes_in_use - before;
        if (!o_.remat) inputs[m].reset();  // the layers (or the tape) hold what they need
        st.in_flight = std::max(st.in_flight, ++live);
        if (last()) continue;
        if (!result) throw SpecError("tshard::parallel::Pipeline: a stage before the last returned no activation");
      } else {
        busy([&] { result = tasks.backward(mb, inputs[m] ? &*inputs[m] : nullptr, dy ? &*dy : nullptr); });
        inputs[m].reset();
        --live;
        if (first()) continue;
        if (!result) throw SpecError("tshard::parallel::Pipeline: a stage after the first returned no gradient");
      }
      sending = std::move(result);
      outgoing = send(*sending, m, task.forward);
    }
    st.idle_seconds += outgoing.wait();
    sending.reset();
    const auto stats = pool_stats();
    st.microbatch_activation_bytes = kept_by_forwards / std::uint64_t(mbs);
    st.kept_bytes = stats.bytes_in_use > base ? stats.bytes_in_use - base : 0;
    st.peak_activation_bytes = stats.peak_bytes_in_use > base ? stats.peak_bytes_in_use - base : 0;
    st.loss = share_loss(tasks.loss());
    st.seconds = seconds_since(start);
    return st;
  }

  // The last stage's loss, on every rank of the stage line.
  double share_loss(double loss) const {
    tshard::detail::broadcast(stage_comm_, &loss, 1, stages_ - 1);
    return loss;
  }
  static int tag(int microbatch, bool forward) { return 8101 + 2 * microbatch + (forward ? 0 : 1); }
  static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  // Micro-batch m's activation (forward: from the stage before, to the stage after) or its
  // gradient (the other way), posted now and completed by wait_all.
  template <class A>
  tshard::detail::PendingMessage receive(A& a, int m, bool forward) const {
    return tshard::detail::PendingMessage::receive(stage_comm_, forward ? stage_ - 1 : stage_ + 1, a.data(),
                                                   a.padded_size(), tag(m, forward));
  }
  template <class A>
  tshard::detail::PendingMessage send(A& a, int m, bool forward) const {
    return tshard::detail::PendingMessage::send(stage_comm_, forward ? stage_ + 1 : stage_ - 1, std::as_const(a).data(),
                                                a.padded_size(), tag(m, forward));
  }
  static void check_rows(Eigen::Index rows, int microbatches) {
    if (microbatches < 1 || rows % microbatches != 0)
      throw ShapeError("tshard::parallel::Pipeline: a batch of " + std::to_string(rows) + " rows does not divide into " +
                       std::to_string(microbatches) + " micro-batches of equal size");
  }

  M mesh_;
  PipelineOptions o_;
  MPI_Comm stage_comm_ = MPI_COMM_NULL;
  int stages_ = 1, stage_ = 0;
};

}  // namespace tshard::parallel

namespace tshard::nn {
using parallel::DerivedStage;
using parallel::Pipeline;
using parallel::PipelineStats;
}  // namespace tshard::nn
