// The README's example: write for one device, annotate the split, run on every rank.
#include <tshard/tshard.hpp>
#include <cstdio>
namespace ts = tshard;

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);                       // MPI up and down
  using M = ts::Mesh<"data", "model">;
  M mesh({-1, 1});                                       // all ranks on "data"
  if (mesh.rank() == 0) std::printf("%s\n", ts::kernels_report().c_str());  // which kernels run
  Eigen::Tensor<float, 2> global(1000, 64);              // the single-device value
  global.setRandom();
  auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, global);  // rows split
  auto y = ts::reshard<ts::Spec<ts::R, ts::S<"data">>>(x);  // columns split: one all-to-all
  Eigen::Tensor<float, 2> back = y.gather();             // the global value on every rank
  Eigen::Tensor<bool, 0> same = (back == global).all();
  if (mesh.rank() == 0)
    std::printf("%s; moved %llu bytes\n", same() ? "same value" : "DIFFERENT",
                (unsigned long long)ts::comm_stats().op("reshard").total().bytes_sent);
  return same() ? 0 : 1;
}
