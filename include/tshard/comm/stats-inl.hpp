// The definitions of stats.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tshard/comm/clock.hpp"
#include "tshard/comm/stats.hpp"

namespace tshard {

TSHARD_FUNC CollectiveStats OperatorStats::total() const {
  CollectiveStats t;
  for (auto& [name, c] : collectives) t += c;
  return t;
}

TSHARD_FUNC std::uint64_t OperatorStats::calls(const std::string& collective) const {
  auto it = collectives.find(collective);
  return it == collectives.end() ? 0 : it->second.calls;
}

TSHARD_FUNC const OperatorStats& CommStats::op(const std::string& name) const {
  static const OperatorStats empty;
  auto it = ops_.find(name);
  return it == ops_.end() ? empty : it->second;
}

TSHARD_FUNC CollectiveStats CommStats::total() const {
  CollectiveStats t;
  for (auto& [name, o] : ops_) t += o.total();
  return t;
}

TSHARD_FUNC CollectiveStats CommStats::collective(const std::string& kind) const {
  CollectiveStats t;
  for (auto& [name, o] : ops_) {
    auto it = o.collectives.find(kind);
    if (it != o.collectives.end()) t += it->second;
  }
  return t;
}

TSHARD_FUNC std::string CommStats::report() const {
  std::string s;
  for (auto& [name, o] : ops_)
    for (auto& [kind, c] : o.collectives)
      s += name + " " + kind + ": " + std::to_string(c.calls) + " calls, " + std::to_string(c.bytes_sent) +
           " B sent, " + std::to_string(c.bytes_received) + " B received, " +
           std::to_string(c.seconds * 1e3) + " ms\n";
  return s;
}

TSHARD_FUNC void CommStats::record(const std::string& op, const char* kind, std::uint64_t sent,
                                   std::uint64_t received, double seconds) {
  CollectiveStats& c = ops_[op].collectives[kind];
  c.calls += 1;
  c.bytes_sent += sent;
  c.bytes_received += received;
  c.seconds += seconds;
}

TSHARD_FUNC CommStats& comm_stats() {
  static CommStats stats;
  return stats;
}

TSHARD_FUNC void detail::record_collective(const std::string& op, const char* kind, std::uint64_t sent,
                                           std::uint64_t received, double seconds) {
  comm_stats().record(op, kind, sent, received, seconds);
}

namespace detail {

TSHARD_FUNC OperatorLabel* OperatorLabel::child(std::string_view name) {
  for (auto& c : children_)
    if (c->name_ == name) return c.get();
  std::string path = name_.empty() ? std::string(name) : path_ + "/" + std::string(name);
  children_.push_back(std::make_unique<OperatorLabel>(std::string(name), std::move(path)));
  return children_.back().get();
}

TSHARD_FUNC OperatorStack& operator_stack() {
  thread_local OperatorStack stack;
  return stack;
}

TSHARD_FUNC OperatorScope::OperatorScope(std::string_view name) {
  auto& st = operator_stack();
  if (st.open.empty() || st.open.back()->name() != name) enter(st.top().child(name));
}

TSHARD_FUNC OperatorScope::OperatorScope(OperatorLabel* label, std::string_view fallback) {
  auto& st = operator_stack();
  if (!label) label = st.open.empty() || st.open.back()->name() != fallback ? st.top().child(fallback) : nullptr;
  if (label && (st.open.empty() || st.open.back() != label)) enter(label);
}

TSHARD_FUNC OperatorScope::~OperatorScope() {
  if (!pushed_) return;
  auto& st = operator_stack();
  auto& trace = TraceRecorder::instance();
  if (trace.on() && start_us_ >= 0) trace.add({st.open.back()->name(), "", start_us_, trace.now_us() - start_us_, 0, 0, false});
  st.open.pop_back();
}

TSHARD_FUNC void OperatorScope::enter(OperatorLabel* label) {
  pushed_ = true;
  if (TraceRecorder::instance().on()) start_us_ = TraceRecorder::instance().now_us();
  operator_stack().open.push_back(label);
}

TSHARD_FUNC CollectiveTimer::CollectiveTimer(const char* kind, std::uint64_t sent, std::uint64_t received,
                                              MPI_Comm comm)
    : kind_(kind), sent_(sent), received_(received), comm_(comm), start_(Clock::now()),
      watched_(kind, [] { return current_operator(); }) {}

TSHARD_FUNC CollectiveTimer::~CollectiveTimer() {
  double s = std::chrono::duration<double>(Clock::now() - start_).count();
  auto& trace = TraceRecorder::instance();
  if (trace.on()) {
    const double start = std::chrono::duration<double, std::micro>(start_ - trace.origin()).count();
    trace.add({kind_, current_operator(), start, s * 1e6, sent_, received_, true});
  }
  record_collective(current_operator(), kind_, sent_, received_, s);
  if (auto& profile = ProfileRecorder::instance(); profile.on()) {
    const double enter = std::chrono::duration<double>(start_.time_since_epoch()).count();
    profile.add(comm_, enter, enter + s);
  }
}

}  // namespace detail

}  // namespace tshard
