// The definitions of report.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "tshard/train/report.hpp"

namespace tshard::train {

TSHARD_FUNC Resident resident_memory() {
  Resident r;
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      double kib = 0;
      if (std::sscanf(line, "VmRSS: %lf kB", &kib) == 1) r.now = kib * 1024;
      if (std::sscanf(line, "VmHWM: %lf kB", &kib) == 1) r.peak = kib * 1024;
    }
    std::fclose(f);
  }
  return r;
}

TSHARD_FUNC void reset_resident_peak() {
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

TSHARD_FUNC void MemoryMeter::start() {
  reset_resident_peak();
  before_ = resident_memory().now;
}

TSHARD_FUNC void MemoryMeter::sample_pool() {
  pool_now_ = double(pool_stats().bytes_in_use);
  pool_peak_ = double(pool_stats().peak_bytes_in_use);
}

TSHARD_FUNC double largest_relative_difference(const std::vector<double>& got,
                                               const std::vector<double>& want, std::size_t first) {
  double worst = 0;
  for (std::size_t s = 0; s < got.size() && s + first < want.size(); ++s)
    worst = std::max(worst, std::abs(got[s] - want[s + first]) / std::abs(want[s + first]));
  return worst;
}

TSHARD_FUNC CurveCheck::CurveCheck(const RunLog& run, const RunLog& serial, double tolerance,
                                   bool compare_sample) {
  worst = largest_relative_difference(run.losses, serial.losses, std::size_t(run.first_step));
  for (std::size_t e = 0; e < run.evals.size() && e < serial.evals.size(); ++e)
    worst = std::max(worst, std::abs(run.evals[e].second - serial.evals[e].second) / serial.evals[e].second);
  same_sample = !compare_sample || run.sample == serial.sample;
  ok = worst < tolerance && same_sample;
}

TSHARD_FUNC void CurveCheck::print(bool agreed_ok) const {
  std::printf("largest relative difference from the single-rank curve %.2e%s%s\n", worst, same_sample ? "" : "; the sample differs",
              agreed_ok ? "" : " (FAILED)");
}

}  // namespace tshard::train
