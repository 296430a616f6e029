// Byte and time accounting per operator and collective, so the cost of a program can be read.
//
// Bytes are counted from the arguments of each MPI call, as what this rank hands to other
// ranks (sent) and what it takes from them (received), self-copies excluded:
//   all-gather, all-to-all, reduce-scatter of n bytes per rank block: n*(p-1) each way;
//   all-reduce of n bytes: 2*n*(p-1)/p each way (the reduce-scatter + all-gather optimum);
//   broadcast of n bytes: the root sends n*(p-1), every other rank receives n;
//   point-to-point (permute, all-to-all-v, gather-v, scatter-v, halos): the message sizes.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tshard/comm/clock.hpp"
#include "tshard/comm/profile.hpp"
#include "tshard/comm/trace.hpp"
#include "tshard/comm/watchdog.hpp"
#include "tshard/core/kernel_instances.hpp"

namespace tshard {

struct CollectiveStats {
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  double seconds = 0;

  CollectiveStats& operator+=(const CollectiveStats& o) {
    calls += o.calls;
    bytes_sent += o.bytes_sent;
    bytes_received += o.bytes_received;
    seconds += o.seconds;
    return *this;
  }
};

// What one operator (reshard, gather, matmul, ...) did, per collective kind.
struct OperatorStats {
  std::map<std::string, CollectiveStats> collectives;
  CollectiveStats total() const;
  std::uint64_t calls(const std::string& collective) const;
};

class CommStats;
namespace detail {
// Counts one call of collective `kind` under operator `op` in this rank's stats.
void record_collective(const std::string& op, const char* kind, std::uint64_t sent, std::uint64_t received,
                       double seconds);
}

class CommStats {
 public:
  // Operators by name; nested operators are joined with '/': "matmul/reshard".
  const std::map<std::string, OperatorStats>& operators() const { return ops_; }
  const OperatorStats& op(const std::string& name) const;
  CollectiveStats total() const;
  // Total over every operator of one collective kind ("all_gather", "all_to_all", ...).
  CollectiveStats collective(const std::string& kind) const;
  void reset() { ops_.clear(); }
  std::string report() const;
 private:
  // Only comm/ records, through detail::record_collective.
  friend void detail::record_collective(const std::string&, const char*, std::uint64_t, std::uint64_t, double);
  void record(const std::string& op, const char* kind, std::uint64_t sent, std::uint64_t received, double seconds);

  std::map<std::string, OperatorStats> ops_;
};

// This rank's counters since the start or the last reset.
CommStats& comm_stats();
inline void reset_comm_stats() { comm_stats().reset(); }

namespace detail {

// An operator's label path ("matmul/reshard"), interned: one node per distinct path, made the
// first time the path is entered and kept for the thread's life, so entering a scope and
// counting a collective under it build no string.
class OperatorLabel {
 public:
  OperatorLabel(std::string name, std::string path) : name_(std::move(name)), path_(std::move(path)) {}
  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }
  // The label of `name` entered inside this one (inside the root, unnamed: `name` alone).
  OperatorLabel* child(std::string_view name);

 private:
  std::string name_, path_;
  std::vector<std::unique_ptr<OperatorLabel>> children_;  // few per label: searched in order
};

// The calling thread's open operator scopes, innermost last.
struct OperatorStack {
  OperatorLabel root{"", "user"};  // outside every operator: "user"
  std::vector<OperatorLabel*> open;
  OperatorLabel& top() { return open.empty() ? root : *open.back(); }
};
OperatorStack& operator_stack();

// The path of the innermost open operator, "user" outside them all.
inline const std::string& current_operator() { return operator_stack().top().path(); }

// Names the operator that the collectives inside this scope are counted under. An operator
// that re-enters itself (a resolve-then-retry path) is not named twice: "subtract/auto", never
// "subtract/subtract/auto".
class OperatorScope {
 public:
  explicit OperatorScope(std::string_view name);
  // Enters an interned label itself (a backward rule runs under its forward's path + "/backward"),
  // or `fallback` inside the current scope where there is none.
  OperatorScope(OperatorLabel* label, std::string_view fallback);
  ~OperatorScope();
  OperatorScope(const OperatorScope&) = delete;
  OperatorScope& operator=(const OperatorScope&) = delete;

 private:
  void enter(OperatorLabel* label);
  bool pushed_ = false;
  double start_us_ = -1;
};

// Times one collective call and records it under the current operator.
class CollectiveTimer {
 public:
  // `comm`, where given, lets a StepProfiler tell waiting for the last member from moving bytes.
  CollectiveTimer(const char* kind, std::uint64_t sent, std::uint64_t received, MPI_Comm comm = MPI_COMM_NULL);
  ~CollectiveTimer();
  CollectiveTimer(const CollectiveTimer&) = delete;
  CollectiveTimer& operator=(const CollectiveTimer&) = delete;

 private:
  const char* kind_;
  std::uint64_t sent_, received_;
  MPI_Comm comm_;
  Clock::time_point start_;
  WatchedCall watched_;  // the watchdog's view: this rank may block here
};

}  // namespace detail

// Names the communication of a block of code: the collectives inside it are counted (comm_stats(),
// --trace) under "name/...", and those of its backward under the forward's path + "/backward".
//   { auto s = ts::scope("attention"); y = attn(x); }
class [[nodiscard]] Scope {
 public:
  explicit Scope(std::string_view name) : scope_(name) {}

 private:
  detail::OperatorScope scope_;
};
[[nodiscard]] inline Scope scope(std::string_view name) { return Scope(name); }

}  // namespace tshard

#if TSHARD_HEADER_BODIES
#include "tshard/comm/stats-inl.hpp"
#endif
