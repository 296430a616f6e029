// Matrix products on a 2-D mesh: the spec of the result is deduced from the operands', the
// strategy (GSPMD section 3.5) and the bytes it moved are printed, and every product is checked
// against the serial one.   mpirun -np 4 ./matmul [--m 300 --k 200 --n 100]
#include <tshard/tshard.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ts = tshard;

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Eigen::Index m = 300, k = 200, n = 100;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--m")) m = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--k")) k = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--n")) n = std::atol(argv[i + 1]);
  }
  const int p = ts::Environment::world_size();
  using M = ts::Mesh<"data", "model">;
  M mesh({p % 2 == 0 ? p / 2 : p, p % 2 == 0 ? 2 : 1});
  const bool root = mesh.rank() == 0;
  if (mesh.rank() == 0) std::printf("%s\n", ts::kernels_report().c_str());  // which kernels run
  auto x = ts::random<double, ts::Spec<ts::S<"data">, ts::R>>(mesh, {m, k}, 1);
  auto w = ts::random<double, ts::Spec<ts::R, ts::S<"model">>>(mesh, {k, n}, 2);
  // The serial truth, from the gathered inputs.
  Eigen::Tensor<double, 2> gx = x.gather(), gw = w.gather();
  Eigen::array<Eigen::IndexPair<int>, 1> contract{Eigen::IndexPair<int>(1, 0)};
  Eigen::Tensor<double, 2> want = gx.contract(gw, contract);
  bool all_ok = true;
  auto report = [&](const char* title, const auto& y, const std::string& strategy) {
    const auto moved = ts::comm_stats().total();
    Eigen::Tensor<double, 2> got = y.gather();
    double err = 0;
    for (Eigen::Index i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got.data()[i] - want.data()[i]));
    const bool ok = ts::agree(err <= 1e-9 * double(k));
    all_ok &= ok;
    if (root)
      std::printf("%-44s -> %-24s %s\n   strategy: %s\n   rank 0 received %llu bytes in %llu calls; max error %.2e\n",
                  title, y.describe().c_str(), ok ? "ok" : "WRONG", strategy.c_str(),
                  (unsigned long long)moved.bytes_received, (unsigned long long)moved.calls, err);
    ts::reset_comm_stats();
  };
  if (root)
    std::printf("tshard %s: [%lld x %lld] x [%lld x %lld] on a %d x %d (data x model) mesh\n", TSHARD_VERSION_STRING,
                (long long)m, (long long)k, (long long)k, (long long)n, mesh.size<"data">(), mesh.size<"model">());
  ts::reset_comm_stats();

  // Rows split by data, columns by model: each rank multiplies its blocks, nothing moves.
  auto y = ts::matmul(x, w);
  report("x {data, R} . w {R, model}", y, ts::explain_einsum<"ij,jk->ik">(x, w));

  // The contracting dim split by data in both: a local product and a lazy partial sum,
  // resolved here by a reduce-scatter into rows split over data.
  auto xc = ts::reshard<ts::Spec<ts::R, ts::S<"data">>>(x);
  auto wc = ts::reshard<ts::Spec<ts::S<"data">, ts::R>>(w);
  ts::reset_comm_stats();
  auto partial = ts::matmul(xc, wc);
  auto yc = ts::reshard<ts::Spec<ts::S<"data">, ts::R>>(partial);
  report("x {R, data} . w {data, R}, reduce-scattered", yc, ts::explain_einsum<"ij,jk->ik">(xc, wc));

  // Free dims of both split by data: gather one operand, or rotate it around the ring.
  auto wr = ts::reshard<ts::Spec<ts::R, ts::S<"data">>>(w);
  ts::reset_comm_stats();
  for (auto s : {ts::EinsumStrategy::GatherRight, ts::EinsumStrategy::Windowed}) {
    auto yr = ts::matmul(x, wr, s);
    report("x {data, R} . w {R, data}", yr, ts::explain_einsum<"ij,jk->ik">(x, wr, s));
  }
  if (root) std::printf("%s\n", all_ok ? "all products match the serial one" : "MISMATCH");
  return all_ok ? 0 : 1;
}
