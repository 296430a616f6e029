// Where a step's time goes on each rank, split three ways: computing, waiting for the slowest
// rank of a collective to arrive (skew), and moving bytes. While a StepProfiler is on, every
// blocking collective leaves its arrival and departure times and its communicator, and every
// wait for a non-blocking collective or message its time blocked. At the end of a step the ranks
// exchange their arrivals (one all-gather, no barrier inside the step): in a collective nobody
// can leave before the last member arrives, so on each rank
//   skew     = the last member's arrival - this rank's arrival,
//   transfer = this rank's departure - the last member's arrival (and every wait's time blocked),
//   compute  = the step's time - skew - transfer.
// Clocks are made comparable once, when the profiler starts (offsets to rank 0's clock by a
// ping-pong with each rank, Cristian's way). With a trace on (ts::start_trace), each collective
// gets two events, "skew" and "transfer", so merged Chrome traces of all ranks show the split.
//
//   tshard::StepProfiler profile(mesh.comm());
//   for (...) { profile.begin_step(); ...; const auto t = profile.end_step(); }  // t.median.skew, ...
#pragma once
#include "tshard/comm/clock.hpp"
#include "tshard/comm/mpi.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "tshard/comm/trace.hpp"

namespace tshard {

// Seconds of a step on one rank, or a statistic of them over the ranks.
struct TimeSplit {
  double compute = 0, skew = 0, transfer = 0;
};
struct StepTimes {
  TimeSplit mine, min, median, max;  // (min, median and max of each part apart)
  double seconds = 0;                // the step, on this rank
  int ranks = 0;
};

namespace detail {

// One blocking collective (comm set) or one wait (comm null): steady-clock seconds.
struct ProfileRecord {
  MPI_Comm comm = MPI_COMM_NULL;
  double enter = 0, exit = 0;
};

class ProfileRecorder {
 public:
  static ProfileRecorder& instance() {
    static ProfileRecorder r;
    return r;
  }
  bool on() const { return on_; }
  void set(bool on) { on_ = on, records_.clear(); }
  static double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }
  void add(MPI_Comm comm, double enter, double exit) { records_.push_back({comm, enter, exit}); }
  std::vector<ProfileRecord> take() { return std::exchange(records_, {}); }

 private:
  bool on_ = false;
  std::vector<ProfileRecord> records_;
};

// A blocked wait of `seconds` ending now (a non-blocking collective's or a message's).
inline void profile_wait(double seconds) {
  auto& p = ProfileRecorder::instance();
  if (p.on()) p.add(MPI_COMM_NULL, ProfileRecorder::now() - seconds, ProfileRecorder::now());
}

}  // namespace detail

class StepProfiler {
 public:
  // Collective over comm (the ranks whose steps are profiled): the clock offsets; recording on.
  explicit StepProfiler(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_group(comm_, &group_);
    measure_offsets();
    detail::ProfileRecorder::instance().set(true);
  }
  ~StepProfiler() {
    detail::ProfileRecorder::instance().set(false);
    MPI_Group_free(&group_);
  }
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void begin_step() {
    detail::ProfileRecorder::instance().take();
    start_ = detail::ProfileRecorder::now();
  }

  // Collective over comm: this step's split on this rank and over the ranks.
  StepTimes end_step() {
    const double end = detail::ProfileRecorder::now();
    const auto records = detail::ProfileRecorder::instance().take();
    // This rank's message: [records, groups, then per record (group, enter, exit) in rank 0's
    // clock, then per group its size and members (ranks of comm)]. A group outside comm's ranks
    // (or a wait) is -1: its time is all transfer.
    std::map<MPI_Comm, int> group_of;
    std::vector<std::vector<int>> groups;
    std::vector<double> mine = {double(records.size()), 0};
    for (const auto& r : records) {
      int g = -1;
      if (r.comm != MPI_COMM_NULL) {
        auto it = group_of.find(r.comm);
        if (it == group_of.end()) {
          std::vector<int> members = members_of(r.comm);
          it = group_of.emplace(r.comm, members.empty() ? -1 : int(groups.size())).first;
          if (!members.empty()) groups.push_back(std::move(members));
        }
        g = it->second;
      }
      mine.insert(mine.end(), {double(g), r.enter + offset_, r.exit + offset_});
    }
    mine[1] = double(groups.size());
    for (const auto& g : groups) {
      mine.push_back(double(g.size()));
      mine.insert(mine.end(), g.begin(), g.end());
    }
    int count = int(mine.size());
    const auto ranks = static_cast<std::size_t>(size_);
    std::vector<int> counts(ranks), at(ranks);
    MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_);
    for (int r = 1; r < size_; ++r) at[std::size_t(r)] = at[std::size_t(r - 1)] + counts[std::size_t(r - 1)];
    std::vector<double> all(std::size_t(at.back() + counts.back()));
    MPI_Allgatherv(mine.data(), count, MPI_DOUBLE, all.data(), counts.data(), at.data(), MPI_DOUBLE, comm_);

    // Per rank: its records on each group (by member list), in order.
    using Arrivals = std::map<std::vector<int>, std::vector<double>>;
    std::vector<Arrivals> arrivals(ranks);
    for (int r = 0; r < size_; ++r) {
      const double* m = all.data() + at[std::size_t(r)];
      const int n = int(m[0]), ng = int(m[1]);
      std::vector<std::vector<int>> gs;
      const double* p = m + 2 + 3 * n;
      for (int g = 0; g < ng; ++g) {
        const int k = int(*p++);
        gs.emplace_back(p, p + k);
        p += k;
      }
      for (int i = 0; i < n; ++i)
        if (const int g = int(m[2 + 3 * i]); g >= 0) arrivals[std::size_t(r)][gs[std::size_t(g)]].push_back(m[2 + 3 * i + 1]);
    }
    StepTimes t;
    t.seconds = end - start_;
    t.ranks = size_;
    std::map<std::vector<int>, std::size_t> seen;  // this rank's calls so far on each group
    auto& trace = detail::TraceRecorder::instance();
    const double origin = std::chrono::duration<double>(trace.origin().time_since_epoch()).count();
    for (const auto& r : records) {
      double last = r.enter + offset_;
      if (r.comm != MPI_COMM_NULL)
        if (auto it = group_of.find(r.comm); it != group_of.end() && it->second >= 0) {
          const auto& members = groups[std::size_t(it->second)];
          const std::size_t k = seen[members]++;
          for (int q : members) {
            const auto& a = arrivals[std::size_t(q)][members];
            if (k < a.size()) last = std::max(last, a[k]);
          }
        }
      last = std::min(last - offset_, r.exit);  // (back in this rank's clock)
      t.mine.skew += last - r.enter;
      t.mine.transfer += r.exit - last;
      if (trace.on() && r.comm != MPI_COMM_NULL) {
        trace.add({"skew", "", 1e6 * (r.enter - origin), 1e6 * (last - r.enter), 0, 0, true});
        trace.add({"transfer", "", 1e6 * (last - origin), 1e6 * (r.exit - last), 0, 0, true});
      }
    }
    t.mine.compute = std::max(0.0, t.seconds - t.mine.skew - t.mine.transfer);
    // Over the ranks: each part's min, median and max.
    double part[3] = {t.mine.compute, t.mine.skew, t.mine.transfer};
    std::vector<double> parts(3 * ranks);
    MPI_Allgather(part, 3, MPI_DOUBLE, parts.data(), 3, MPI_DOUBLE, comm_);
    double* stats[3][3] = {{&t.min.compute, &t.median.compute, &t.max.compute},
                           {&t.min.skew, &t.median.skew, &t.max.skew},
                           {&t.min.transfer, &t.median.transfer, &t.max.transfer}};
    for (int k = 0; k < 3; ++k) {
      std::vector<double> v;
      for (int r = 0; r < size_; ++r) v.push_back(parts[std::size_t(3 * r + k)]);
      std::sort(v.begin(), v.end());
      *stats[k][0] = v.front();
      *stats[k][1] = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
      *stats[k][2] = v.back();
    }
    return t;
  }

 private:
  // The members of `c` as ranks of comm_, in c's rank order; empty where one is outside comm_.
  std::vector<int> members_of(MPI_Comm c) const {
    MPI_Group g;
    MPI_Comm_group(c, &g);
    int n = 0;
    MPI_Group_size(g, &n);
    const auto count = static_cast<std::size_t>(n);
    std::vector<int> in(count), out(count);
    for (int i = 0; i < n; ++i) in[std::size_t(i)] = i;
    MPI_Group_translate_ranks(g, n, in.data(), group_, out.data());
    MPI_Group_free(&g);
    for (int r : out)
      if (r == MPI_UNDEFINED) return {};
    return out;
  }
  // offset_: what to add to this rank's clock to read rank 0's, from the round trip with the
  // least delay of a few (rank 0 sends its time; the other answers with its own).
  void measure_offsets() {
    for (int r = 1; r < size_; ++r)
      for (int round = 0; round < 8; ++round) {
        if (rank_ == 0) {
          double sent = detail::ProfileRecorder::now(), theirs = 0;
          MPI_Sendrecv(&sent, 1, MPI_DOUBLE, r, kTag, &theirs, 1, MPI_DOUBLE, r, kTag, comm_, MPI_STATUS_IGNORE);
          const double back = detail::ProfileRecorder::now(), offset = (sent + back) / 2 - theirs;
          double reply[2] = {back - sent, offset};
          MPI_Send(reply, 2, MPI_DOUBLE, r, kTag, comm_);
        } else if (rank_ == r) {
          double sent = 0;
          MPI_Recv(&sent, 1, MPI_DOUBLE, 0, kTag, comm_, MPI_STATUS_IGNORE);
          double now = detail::ProfileRecorder::now(), reply[2];
          MPI_Send(&now, 1, MPI_DOUBLE, 0, kTag, comm_);
          MPI_Recv(reply, 2, MPI_DOUBLE, 0, kTag, comm_, MPI_STATUS_IGNORE);
          if (round == 0 || reply[0] < best_delay_) best_delay_ = reply[0], offset_ = reply[1];
        }
      }
  }
  static constexpr int kTag = 0x7e5f;
  MPI_Comm comm_;
  MPI_Group group_;
  int rank_ = 0, size_ = 1;
  double offset_ = 0, best_delay_ = 0, start_ = 0;
};

}  // namespace tshard
