// Fits the cost model of include/tshard/comm/cost.hpp on this machine or cluster:
//
//   seconds = alpha * rounds + beta * max(bytes sent, bytes received) + gamma * bytes reduced
//
// by timing tshard's own all-gather, all-reduce, reduce-scatter and all-to-all over groups of
// every size that divides the rank count, 8 B to 16 MiB per block, and solving the relative
// least-squares problem for (alpha, beta, gamma) >= 0. Prints the fit, how well it predicts
// each collective, and the line that makes tshard use it:
//   mpirun -np 16 ./tshard_bench_cost_model [--max-bytes 16777216] [--reps 5] [--project]
// --project then projects train_transformer's step to 64..2048 ranks with the fitted model
// (docs/scaling.md; one rank: with TSHARD_COST_MODEL or the defaults, nothing fitted);
// --inter alpha,beta,gamma gives the data axis, between nodes, other coefficients.
#include <tshard/tshard.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace ts = tshard;
namespace d = tshard::detail;

namespace {

struct Sample {
  std::string what;
  int p;
  std::uint64_t block;
  ts::Traffic traffic;
  double seconds;
};

// Solves the 3x3 system a x = b (Gaussian elimination; the normal equations are small).
std::array<double, 3> solve(std::array<std::array<double, 3>, 3> a, std::array<double, 3> b) {
  for (int c = 0; c < 3; ++c) {
    int pivot = c;
    for (int r = c + 1; r < 3; ++r)
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    std::swap(a[c], a[pivot]);
    std::swap(b[c], b[pivot]);
    if (std::abs(a[c][c]) < 1e-300) continue;
    for (int r = 0; r < 3; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int k = 0; k < 3; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  std::array<double, 3> x{};
  for (int c = 0; c < 3; ++c) x[c] = std::abs(a[c][c]) < 1e-300 ? 0 : b[c] / a[c][c];
  return x;
}

// Minimises sum ((model - t) / t)^2 over the coefficients left free (a coefficient that comes
// out negative is fixed at 0 and the rest refitted).
ts::CostModel fit(const std::vector<Sample>& samples) {
  std::array<bool, 3> free{true, true, true};
  std::array<double, 3> x{};
  for (int round = 0; round < 3; ++round) {
    std::array<std::array<double, 3>, 3> a{};
    std::array<double, 3> b{};
    for (const auto& s : samples) {
      const double f[3] = {free[0] ? s.traffic.rounds / s.seconds : 0,
                           free[1] ? double(std::max(s.traffic.bytes_sent, s.traffic.bytes_received)) / s.seconds : 0,
                           free[2] ? double(s.traffic.bytes_reduced) / s.seconds : 0};
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) a[i][j] += f[i] * f[j];
        b[i] += f[i];
      }
    }
    for (int i = 0; i < 3; ++i)
      if (!free[i]) a[i][i] = 1, b[i] = 0;
    x = solve(a, b);
    bool again = false;
    for (int i = 0; i < 3; ++i)
      if (x[i] < 0) free[i] = false, x[i] = 0, again = true;
    if (!again) break;
  }
  return ts::CostModel{x[0], std::max(x[1], 1e-13), x[2]};
}

// train_transformer's step (bench/run_transformer_step.sh's size) on P ranks as {data, model}
// = {P / m, m}, weak scaling (8 sequences per data rank), float: the compute at `rate` FLOP/s
// per rank, Megatron's four activation all-reduces per block (two forward, two backward) over
// model, the vocab-split embedding and loss (an all-reduce of the embedding's [b, T, D] partial
// forward and backward), and the gradients' all-reduce over data, all by the cost model: `m`
// within a node (the model axis), `inter` between nodes (the data axis). The gradients' all-reduce
// flat (every byte over the network) and in two levels (comm/all_reduce.hpp: nodes of 32 ranks,
// the model axis inside them; the node's reduce-scatter and all-gather at `m`, the network's
// all-reduce of a 1/L share at `inter`).
void project(const ts::CostModel& m, const ts::CostModel& inter, double rate) {
  const double D = 1024, T = 256, b = 8, V = 1024, L = 2, H = 4 * D, bytes = 4;
  const double block_params = 4 * D * D + 2 * D * H + 9 * D + H;  // qkv, out, MLP, norms and biases
  const double params = L * block_params + V * D + T * D + 2 * D + D * V + V;
  const double tokens = b * T;
  const double flops = tokens * (6 * (L * block_params + D * V) + 12 * L * T * D);  // per data rank, all model ranks
  std::printf("\nprojection of train_transformer's step (D %.0f, %.0f layers, T %.0f, V %.0f, %.0f sequences per data rank, "
              "float), %.0f GFLOP/s per rank:\n", D, L, T, V, b, rate / 1e9);
  std::printf("  %6s %10s %10s %10s %10s %10s %10s %8s %10s %10s %8s\n", "ranks", "{data,mod}", "compute s", "TP comm s", "DP comm s",
              "step s", "overlap s", "eff.", "DP 2-lvl s", "step s", "eff.");
  for (int p = 64; p <= 2048; p *= 2) {
    for (int model : {1, 8}) {
      const int data = p / model;
      const double compute = flops / model / rate;
      ts::Traffic tp;
      const std::uint64_t act = std::uint64_t(b * T * D * bytes);
      for (int l = 0; l < int(L) * 4 + 2; ++l) tp += d::all_reduce_traffic(act, model);
      const ts::Traffic dp = d::all_reduce_traffic(std::uint64_t(params / model * bytes), data);
      const double step = compute + tp.seconds(m) + dp.seconds(inter);
      // With the gradient reduction overlapped with backward (--overlap): hidden up to backward's 2/3.
      const double overlapped = compute + tp.seconds(m) + std::max(0.0, dp.seconds(inter) - compute * 2 / 3);
      const int per_node = 32 / model;  // data ranks of one node
      const auto two = d::two_level_all_reduce_traffic(std::uint64_t(params / model * bytes), data / per_node, per_node);
      const double dp2 = two.node.seconds(m) + two.network.seconds(inter), step2 = compute + tp.seconds(m) + dp2;
      std::printf("  %6d %5d,%-4d %10.4f %10.4f %10.4f %10.4f %10.4f %7.0f%% %10.4f %10.4f %7.0f%%\n", p, data, model, compute,
                  tp.seconds(m), dp.seconds(inter), step, overlapped, 100 * compute / step, dp2, step2, 100 * compute / step2);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  std::uint64_t max_bytes = 16u << 20;
  int reps = 5;
  bool projection = false;
  std::optional<ts::CostModel> inter;  // --inter alpha,beta,gamma: between nodes (default: as within)
  double rate = 145e9;  // train_transformer's step at this size: ~70 % of a core's 207 GFLOP/s sgemm (OpenBLAS, SkylakeX kernels)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--project") projection = true;
    else if (i + 1 < argc && a == "--max-bytes") max_bytes = std::strtoull(argv[++i], nullptr, 10);
    else if (i + 1 < argc && a == "--reps") reps = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--rate") rate = std::atof(argv[++i]);
    else if (i + 1 < argc && a == "--inter") {
      ts::CostModel c;
      if (std::sscanf(argv[++i], "%lf,%lf,%lf", &c.alpha, &c.beta, &c.gamma) == 3) inter = c;
    }
  }
  const int world = ts::Environment::world_size(), rank = ts::Environment::world_rank();
  std::vector<Sample> samples;
  for (int p = 2; p <= world; ++p) {
    if (world % p) continue;
    MPI_Comm group;
    MPI_Comm_split(MPI_COMM_WORLD, rank / p, rank, &group);
    for (std::uint64_t block = 8; block <= max_bytes; block *= 4) {
      const d::Index n = d::Index(block / sizeof(float));
      std::vector<float> send(std::size_t(n) * p, 1.0f), recv(std::size_t(n) * p);
      struct Kind {
        const char* name;
        ts::Traffic traffic;
        std::function<void()> run;
      };
      const std::vector<Kind> kinds = {
          {"all_gather", d::all_gather_traffic(block, p), [&] { d::all_gather(group, send.data(), n, recv.data()); }},
          {"all_reduce", d::all_reduce_traffic(block * p, p),
           [&] { d::all_reduce(group, send.data(), recv.data(), n * p, ts::ReduceOp::Sum); }},
          {"reduce_scatter", d::reduce_scatter_traffic(block, p),
           [&] { d::reduce_scatter_block(group, send.data(), recv.data(), n, ts::ReduceOp::Sum); }},
          {"all_to_all", d::all_to_all_traffic(block, p), [&] { d::all_to_all(group, send.data(), recv.data(), n); }},
      };
      for (const auto& k : kinds) {
        std::vector<double> t;
        for (int r = 0; r < reps + 1; ++r) {
          const double slowest = tshard_bench::time_once(k.run);
          if (r > 0) t.push_back(slowest);  // the first is a warm-up
        }
        samples.push_back({k.name, p, block, k.traffic, tshard_bench::median(t)});
      }
    }
    MPI_Comm_free(&group);
  }
  if (world < 2) {
    if (rank == 0) std::printf("the cost model needs at least 2 ranks to fit; the model in use: alpha %.3g, beta %.3g, gamma %.3g\n",
                               ts::cost_model().alpha, ts::cost_model().beta, ts::cost_model().gamma);
    if (rank == 0 && projection) project(ts::cost_model(), inter.value_or(ts::cost_model()), rate);
    return 0;
  }
  const ts::CostModel m = fit(samples);
  if (rank == 0) {
    std::printf("cost model fitted on %d ranks from %zu timings (medians of %d):\n", world, samples.size(), reps);
    std::printf("  alpha %.3g s per round (latency), beta %.3g s per byte (%.2f GB/s), gamma %.3g s per reduced byte (%.2f GB/s)\n",
                m.alpha, m.beta, 1e-9 / m.beta, m.gamma, m.gamma > 0 ? 1e-9 / m.gamma : 0.0);
    std::printf("  %-15s %3s %10s %12s %12s %7s\n", "collective", "p", "block B", "measured s", "model s", "ratio");
    double worst = 0, sum = 0;
    for (const auto& s : samples) {
      const double model = s.traffic.seconds(m), ratio = model / s.seconds;
      worst = std::max(worst, std::max(ratio, 1 / ratio));
      sum += std::abs(std::log(ratio));
      if (s.block == 8 || s.block >= max_bytes / 4)
        std::printf("  %-15s %3d %10llu %12.3g %12.3g %7.2f\n", s.what.c_str(), s.p, (unsigned long long)s.block, s.seconds,
                    model, ratio);
    }
    std::printf("  geometric mean error %.0f%%, worst factor %.1f over all %zu timings\n",
                100 * (std::exp(sum / double(samples.size())) - 1), worst, samples.size());
    std::printf("export TSHARD_COST_MODEL=%.3g,%.3g,%.3g\n", m.alpha, m.beta, m.gamma);
    if (projection) project(m, inter.value_or(m), rate);
  }
  return 0;
}
