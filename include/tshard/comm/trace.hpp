// The event recorder behind traces (debug/trace.hpp writes them): while on, every operator scope
// and every collective leaves an event (name, start, duration, bytes, operator path). Off by
// default; one relaxed atomic load per scope and collective when off.
#pragma once
#include "tshard/comm/clock.hpp"
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tshard::detail {

struct TraceEvent {
  std::string name;      // the operator, or the collective kind
  std::string op;        // the operator path a collective was called from ("" for operators)
  double start_us = 0, duration_us = 0;
  std::uint64_t sent = 0, received = 0;
  bool collective = false;
};

class TraceRecorder {
 public:
  static TraceRecorder& instance() {
    static TraceRecorder r;
    return r;
  }
  bool on() const { return on_.load(std::memory_order_relaxed); }
  void start() {
    events_.clear();
    origin_ = Clock::now();
    on_.store(true, std::memory_order_relaxed);
  }
  void stop() { on_.store(false, std::memory_order_relaxed); }
  double now_us() const { return std::chrono::duration<double, std::micro>(Clock::now() - origin_).count(); }
  void add(TraceEvent e) { events_.push_back(std::move(e)); }
  const std::vector<TraceEvent>& events() const { return events_; }
  Clock::time_point origin() const { return origin_; }

 private:
  std::atomic<bool> on_{false};
  std::vector<TraceEvent> events_;
  Clock::time_point origin_{};
};

}  // namespace tshard::detail
