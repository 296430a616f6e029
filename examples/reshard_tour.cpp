// A tour of resharding: a matrix on a 2-D mesh moves through several layouts; each step prints
// who holds what, the collectives chosen and the bytes moved, and is checked against the
// original.  mpirun -np 4 ./reshard_tour [--rows N] [--cols N]
#include <tshard/tshard.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ts = tshard;

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Eigen::Index rows = 10, cols = 7;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--rows")) rows = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--cols")) cols = std::atol(argv[i + 1]);
  }
  const int p = ts::Environment::world_size();
  using M = ts::Mesh<"data", "model">;
  M mesh({p % 2 == 0 ? p / 2 : p, p % 2 == 0 ? 2 : 1});
  const bool root = mesh.rank() == 0;
  if (mesh.rank() == 0) std::printf("%s\n", ts::kernels_report().c_str());  // which kernels run

  // The single-device program's value: every rank builds it alike.
  Eigen::Tensor<double, 2> global(rows, cols);
  for (Eigen::Index j = 0; j < cols; ++j)
    for (Eigen::Index i = 0; i < rows; ++i) global(i, j) = double(100 * i + j);

  bool all_ok = true;
  auto step = [&](const char* title, const auto& t, const std::string& plan) {
    const auto moved = ts::comm_stats().op("reshard").total();
    const auto most = std::uint64_t(ts::all_reduce(mesh, double(moved.bytes_received), ts::ReduceOp::Max));
    Eigen::Tensor<double, 2> back = t.gather();
    bool ok = true;
    for (Eigen::Index i = 0; i < global.size(); ++i) ok &= back.data()[i] == global.data()[i];
    ok = ts::agree(ok);
    all_ok &= ok;
    if (root) std::printf("\n== %s\n   plan: %s\n   received by the busiest rank: %llu bytes; value %s\n", title,
                          plan.empty() ? "(distribute)" : plan.c_str(), (unsigned long long)most,
                          ok ? "matches the original" : "DIFFERS FROM THE ORIGINAL");
    ts::visualize(t);
    ts::reset_comm_stats();
  };

  if (root) std::printf("tshard %s: a %lld x %lld matrix on a %d x %d (data x model) mesh\n", TSHARD_VERSION_STRING,
                        (long long)rows, (long long)cols, mesh.size<"data">(), mesh.size<"model">());
  using RowSplit = ts::Spec<ts::S<"data">, ts::R>;
  using Tiles = ts::Spec<ts::S<"data">, ts::S<"model">>;
  using ColSplit = ts::Spec<ts::R, ts::S<"data", "model">>;
  using Swapped = ts::Spec<ts::R, ts::S<"model", "data">>;
  using Replicated = ts::Spec<ts::R, ts::R>;

  auto x = ts::distribute<RowSplit>(mesh, global);
  step("rows split over data", x, "");
  std::string plan = ts::explain_reshard<Tiles>(x);
  auto tiles = ts::reshard<Tiles>(x);
  step("tiles: rows over data, columns over model (a local slice)", tiles, plan);
  plan = ts::explain_reshard<ColSplit>(tiles);
  auto by_cols = ts::reshard<ColSplit>(tiles);
  step("columns split over data then model (the row split moves to the columns)", by_cols, plan);
  plan = ts::explain_reshard<Swapped>(by_cols);
  auto swapped = ts::reshard<Swapped>(by_cols);
  step("columns split over model then data (axis order swapped)", swapped, plan);
  plan = ts::explain_reshard<Replicated>(swapped);
  auto whole = ts::reshard<Replicated>(swapped);
  step("replicated everywhere (all-gather)", whole, plan);

  if (root) std::printf("\n%s\n", all_ok ? "all layouts hold the original value" : "MISMATCH");
  return all_ok ? 0 : 1;
}
