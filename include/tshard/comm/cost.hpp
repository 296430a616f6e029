// The cost of each collective, next to the collectives (as CTF's CommData::estimate_*_time):
// the bytes one rank sends and receives, exactly as comm_stats() counts them (collectives.hpp
// records these very functions), the message rounds its algorithm takes and the bytes it
// reduces; and a time from three named coefficients:
//
//   seconds = alpha * rounds + beta * max(bytes sent, bytes received) + gamma * bytes reduced
//
// alpha is a message's latency, beta the inverse bandwidth of one rank, gamma the inverse rate
// of a reduction. The defaults were fitted on our 2-core development machines; on a cluster,
// `bash bench/run_cost_model.sh` fits them and prints the line that sets them:
//   export TSHARD_COST_MODEL=alpha,beta,gamma     (seconds, seconds per byte, seconds per byte)
// The reshard planner and einsum's Auto strategy choose by this model, and nothing else.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace tshard {

struct CostModel {
  double alpha = 2e-6;        // seconds per message round (latency)
  double beta = 1.0 / 6e9;    // seconds per byte moved by the busiest rank
  double gamma = 1.0 / 1e10;  // seconds per byte reduced
};

namespace detail {
inline CostModel& cost_model_state() {
  static CostModel model = [] {
    CostModel m;
    if (const char* v = std::getenv("TSHARD_COST_MODEL")) {
      double a = 0, b = 0, g = 0;
      if (std::sscanf(v, "%lf,%lf,%lf", &a, &b, &g) == 3 && a >= 0 && b > 0 && g >= 0) m = CostModel{a, b, g};
      else std::fprintf(stderr, "tshard: TSHARD_COST_MODEL='%s' is not alpha,beta,gamma: the defaults are used\n", v);
    }
    return m;
  }();
  return model;
}
}  // namespace detail

// The coefficients the planner and einsum use (TSHARD_COST_MODEL, or set in code).
inline const CostModel& cost_model() { return detail::cost_model_state(); }
inline void set_cost_model(const CostModel& m) { detail::cost_model_state() = m; }

// What one rank does in a collective (or a sequence of them, added up).
struct Traffic {
  std::uint64_t bytes_sent = 0, bytes_received = 0;  // bytes, as comm_stats() counts them
  std::uint64_t bytes_reduced = 0;                    // bytes combined with an operator
  double rounds = 0;                                  // message rounds on the critical path

  Traffic& operator+=(const Traffic& o) {
    bytes_sent += o.bytes_sent;
    bytes_received += o.bytes_received;
    bytes_reduced += o.bytes_reduced;
    rounds += o.rounds;
    return *this;
  }
  double seconds(const CostModel& m = cost_model()) const {
    return m.alpha * rounds + m.beta * double(bytes_sent > bytes_received ? bytes_sent : bytes_received) + m.gamma * double(bytes_reduced);
  }
};

namespace detail {

inline double log2_rounds(int p) {
  int l = 0;
  while ((1 << l) < p) ++l;
  return double(l);
}

// Group sizes p; `block` is the bytes of one rank's block (all-gather, reduce-scatter,
// all-to-all: per peer) or of the whole buffer (all-reduce, broadcast).
inline Traffic all_gather_traffic(std::uint64_t block, int p) {  // recursive doubling / ring
  if (p <= 1 || block == 0) return {};
  return {block * std::uint64_t(p - 1), block * std::uint64_t(p - 1), 0, log2_rounds(p)};
}
inline Traffic reduce_scatter_traffic(std::uint64_t block, int p) {
  if (p <= 1 || block == 0) return {};
  return {block * std::uint64_t(p - 1), block * std::uint64_t(p - 1), block * std::uint64_t(p - 1), log2_rounds(p)};
}
inline Traffic all_reduce_traffic(std::uint64_t bytes, int p) {  // reduce-scatter + all-gather optimum
  if (p <= 1 || bytes == 0) return {};
  const std::uint64_t moved = 2 * bytes * std::uint64_t(p - 1) / std::uint64_t(p);
  return {moved, moved, bytes * std::uint64_t(p - 1) / std::uint64_t(p), 2 * log2_rounds(p)};
}
// The two levels of comm/all_reduce.hpp over `nodes` nodes of `per_node` ranks: a reduce-scatter
// and an all-gather of the bytes inside the node, and the all-reduce of each rank's 1/per_node
// share among the nodes (what crosses the network).
struct TwoLevelTraffic {
  Traffic node, network;
};
inline TwoLevelTraffic two_level_all_reduce_traffic(std::uint64_t bytes, int nodes, int per_node) {
  if (per_node <= 1 || nodes <= 1) return per_node <= 1 ? TwoLevelTraffic{{}, all_reduce_traffic(bytes, nodes)}
                                                        : TwoLevelTraffic{all_reduce_traffic(bytes, per_node), {}};
  const std::uint64_t share = (bytes + std::uint64_t(per_node) - 1) / std::uint64_t(per_node);
  Traffic node = reduce_scatter_traffic(share, per_node);
  node += all_gather_traffic(share, per_node);
  return {node, all_reduce_traffic(share, nodes)};
}
// (Bruck's log p rounds, as MPI libraries run small all-to-alls; large ones go pairwise, where
// the bytes dominate the rounds anyway.)
inline Traffic all_to_all_traffic(std::uint64_t block, int p) {
  if (p <= 1 || block == 0) return {};
  return {block * std::uint64_t(p - 1), block * std::uint64_t(p - 1), 0, log2_rounds(p)};
}
inline Traffic broadcast_traffic(std::uint64_t bytes, int p, bool root) {  // binomial tree
  if (p <= 1 || bytes == 0) return {};
  return {root ? bytes * std::uint64_t(p - 1) : 0, root ? 0 : bytes, 0, log2_rounds(p)};
}
// Point to point: the message sizes; the rounds are the larger of the two message counts.
inline Traffic messages_traffic(std::uint64_t sent, std::uint64_t received, int sends, int receives) {
  return {sent, received, 0, double(sends > receives ? sends : receives)};
}

}  // namespace detail
}  // namespace tshard
