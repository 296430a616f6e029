// ZeRO-3's parameter streaming: which module's parameters are gathered when, and which gather is
// started ahead (DeepSpeed's stage3_prefetch_bucket_size and max_reuse_distance, for one module
// ahead). The modules' uses in one step are recorded; with prefetch, a use starts the gather of
// the bucket that came next in the previous step's order before completing its own (so that MPI
// progresses both while this rank waits), and a bucket used again right after stays present
// between the two uses (a layer called twice in a row, a checkpointed block's forward and its
// recompute). Once the order differs from the last step's, nothing more is guessed until the
// step ends. Every rank of a data group records the same order, so the non-blocking gathers start
// in the same order on each (as MPI requires).
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "tshard/parallel/bucket.hpp"

namespace tshard::parallel {

// How ZeRO-3 brought layers' parameters in during the last step, one count per layer use:
// gathered there and waited for; prefetched (started during the layer before); still present
// (the layer was used just before, and prefetch kept it); and prefetches never used because
// the layers ran in another order than the step before (their bytes were moved for nothing).
struct ParameterGatherStats {
  int blocking = 0, prefetched = 0, kept = 0, discarded = 0;
};

namespace detail {

class ParameterStreaming {
 public:
  explicit ParameterStreaming(bool prefetch) : prefetch_(prefetch) {}

  // Before a use of bucket b's parameters: present after it.
  void before_use(BucketBase* b) {
    if (uses_.size() < kMaxRecordedUses) uses_.push_back(b);
    const std::size_t i = uses_.size();  // this use's position + 1
    if (prefetch_ && !diverged_) {
      if (i > previous_.size() || previous_[i - 1] != b)
        diverged_ = true;
      else if (i < previous_.size() && previous_[i] != b && !previous_[i]->kept)
        previous_[i]->prefetch_parameters();
    }
    if (b->kept) {
      b->kept = false;
      ++this_gathers_.kept;
      return;
    }
    ++(b->prefetching() ? this_gathers_.prefetched : this_gathers_.blocking);
    b->gather_parameters(true);
  }
  // After it: released, unless the same bucket comes next.
  void after_use(BucketBase* b, const std::vector<std::unique_ptr<BucketBase>>& all) {
    const std::size_t i = uses_.size();
    if (prefetch_ && !diverged_ && i < previous_.size() && previous_[i] == b && uses_.back() == b) {
      b->kept = true;
    } else {
      b->release_parameters();
    }
    if (prefetch_)
      for (auto& other : all) other->test();  // let MPI progress the prefetch in flight
  }
  // At step(): the chunks are about to change, so a prefetch never used is completed and
  // dropped, and every stage-3 parameter leaves memory (one gathered by hand included: read
  // after the update, it would be stale). This step's order predicts the next one's.
  void end_step(const std::vector<std::unique_ptr<BucketBase>>& all) {
    for (auto& b : all) {
      if (b->prefetching()) ++this_gathers_.discarded;
      b->drop_prefetch();
      b->kept = false;
      b->release_parameters();
    }
    previous_ = std::move(uses_);
    uses_.clear();
    diverged_ = false;
    gathers_ = this_gathers_;
    this_gathers_ = {};
  }
  // The last step's counts.
  const ParameterGatherStats& last_step() const { return gathers_; }

 private:
  static constexpr std::size_t kMaxRecordedUses = std::size_t(1) << 16;
  bool prefetch_;
  std::vector<BucketBase*> uses_, previous_;
  bool diverged_ = false;
  ParameterGatherStats gathers_, this_gathers_;
};

}  // namespace detail
}  // namespace tshard::parallel

namespace tshard::nn {
using parallel::ParameterGatherStats;
}  // namespace tshard::nn
