// Traces: what every operator and collective did, when, on which rank, as one Chrome trace JSON
// file that Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
//   ts::start_trace();            // collective: ranks start their clocks together
//   ... the program ...
//   ts::write_trace("run.json");  // collective: every rank's events merged into one file
//
// Each rank is a process (pid = rank) with two rows: operators (tid 0, nested as they were
// called) and collectives (tid 1: kind, bytes sent and received, the calling operator path).
#pragma once
#include <cstdio>
#include <fstream>
#include <string>

#include "tshard/comm/failure.hpp"
#include "tshard/comm/text.hpp"
#include "tshard/comm/trace.hpp"
#include "tshard/core/error.hpp"

namespace tshard {
namespace detail {

inline std::string json_escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 32) continue;
    out += c;
  }
  return out;
}

}  // namespace detail

// Starts recording on every rank of comm (after an agreement, so the clocks start together).
inline void start_trace(MPI_Comm comm = MPI_COMM_WORLD) {
  (void)agree(true, comm);
  detail::TraceRecorder::instance().start();
}

inline void stop_trace() { detail::TraceRecorder::instance().stop(); }

// Stops recording and writes every rank's events to `path` (on the first rank of comm) as
// Chrome trace JSON. Collective over comm; an IoError on every rank if the file cannot be written.
inline void write_trace(const std::string& path, MPI_Comm comm = MPI_COMM_WORLD) {
  auto& recorder = detail::TraceRecorder::instance();
  recorder.stop();
  const int rank = detail::comm_rank(comm);
  std::string mine;
  char line[256];
  std::snprintf(line, sizeof line,
                "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n"
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"operators\"}},\n"
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":\"collectives\"}},\n",
                rank, rank, rank, rank);
  mine += line;
  for (const auto& e : recorder.events()) {
    std::snprintf(line, sizeof line, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d",
                  detail::json_escaped(e.name).c_str(), e.collective ? "collective" : "operator", e.start_us, e.duration_us,
                  rank, e.collective ? 1 : 0);
    mine += line;
    if (e.collective) {
      std::snprintf(line, sizeof line, ",\"args\":{\"operator\":\"%s\",\"bytes_sent\":%llu,\"bytes_received\":%llu}",
                    detail::json_escaped(e.op).c_str(), (unsigned long long)e.sent, (unsigned long long)e.received);
      mine += line;
    }
    mine += "},\n";
  }
  const std::string all = detail::gather_text(comm, mine);
  bool ok = true;
  if (rank == 0) {
    std::ofstream f(path);
    f << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n" << all.substr(0, all.size() >= 2 ? all.size() - 2 : 0) << "\n]}\n";
    ok = bool(f);
  }
  if (!agree(ok, comm)) throw IoError("tshard::write_trace: cannot write '" + path + "'");
}

}  // namespace tshard
