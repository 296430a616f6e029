// A two-layer MLP classifier trained with tshard's nn layer: a column-parallel Linear, gelu, a
// row-parallel Linear (Megatron's MLP by annotation alone), cross-entropy, AdamW, on a
// {data, model} mesh, written forward only (the gradients are derived). The data and the initial
// weights depend only on the seed, so the loss curve is the single-rank one whatever the mesh;
// with --check the program also trains on a one-rank mesh over MPI_COMM_SELF and compares the
// two curves.
//
//   mpirun -np 4 ./train_mlp --model 2 --steps 20 --check
#include <tshard/tshard.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace ts = tshard;
using M = ts::Mesh<"data", "model">;

struct Options {
  int batch = 24, features = 10, hidden = 19, classes = 7, steps = 15, model = 1;
  bool check = false;
};

// Synthetic classification: features from the seed, the class of a sample is the argmax of a
// fixed random projection of its features (learnable).
template <class Rows>
auto make_data(const M& mesh, const Options& o) {
  auto x = ts::random<double, Rows>(mesh, {o.batch, o.features}, 1) * 2.0 - 1.0;
  auto projection = ts::random<double, ts::Spec<ts::R, ts::R>>(mesh, {o.features, o.classes}, 2) - 0.5;
  auto labels = ts::map([](std::int64_t c) { return std::int32_t(c); },
                        ts::argmax<1>(ts::einsum<"bf,fc->bc">(x, projection)));
  return std::pair{std::move(x), std::move(labels)};
}

// A column-parallel Linear, gelu, a row-parallel Linear: Megatron's MLP by annotation alone.
struct Mlp : ts::nn::Module {
  ts::nn::Linear<double, M, ts::Spec<ts::R, ts::S<"model">>> fc1;  // [B, hidden] split over data and model
  ts::nn::Linear<double, M, ts::Spec<ts::S<"model">, ts::R>> fc2;  // its partial over model resolved before the bias
  Mlp(const M& mesh, const Options& o) : fc1(mesh, o.features, o.hidden, 11), fc2(mesh, o.hidden, o.classes, 12) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  auto operator()(const auto& x) { return fc2(ts::nn::gelu(fc1(x))); }
};

std::vector<double> train(const M& mesh, const Options& o) {
  using Rows = ts::Spec<ts::S<"data">, ts::R>;
  auto [x, labels] = make_data<Rows>(mesh, o);
  Mlp mlp(mesh, o);
  ts::nn::AdamW opt({.lr = 2e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f});
  opt.add(mlp);
  std::vector<double> losses;
  for (int step = 0; step < o.steps; ++step) {
    opt.zero_grad();
    losses.push_back(ts::ad::backward(mlp, [&] { return ts::nn::cross_entropy(mlp(x), labels); }));
    opt.step();
  }
  return losses;
}

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--batch") o.batch = next();
    else if (a == "--features") o.features = next();
    else if (a == "--hidden") o.hidden = next();
    else if (a == "--classes") o.classes = next();
    else if (a == "--steps") o.steps = next();
    else if (a == "--model") o.model = next();
    else if (a == "--check") o.check = true;
  }
  const int p = ts::Environment::world_size();
  M mesh({-1, p % o.model == 0 ? o.model : 1});
  if (mesh.rank() == 0) std::printf("%s\n", ts::kernels_report().c_str());  // which kernels run
  const auto losses = train(mesh, o);
  bool ok = losses.back() < losses.front();
  double worst = 0;
  if (o.check) {  // the single-rank curve, on every rank alone
    M self(MPI_COMM_SELF, {1, 1});
    const auto serial = train(self, o);
    for (std::size_t s = 0; s < losses.size(); ++s)
      worst = std::max(worst, std::abs(losses[s] - serial[s]) / std::abs(serial[s]));
    ok &= worst < 1e-9;
  }
  ok = ts::agree(ok);
  if (mesh.rank() == 0) {
    for (std::size_t s = 0; s < losses.size(); ++s) std::printf("step %zu loss %.17g\n", s, losses[s]);
    std::printf("mesh {data, model} = {%d, %d}: loss %.4f -> %.4f", mesh.size<"data">(), mesh.size<"model">(),
                losses.front(), losses.back());
    if (o.check) std::printf(", largest relative difference from the single-rank curve %.2e", worst);
    std::printf("%s\n", ok ? "" : " (FAILED)");
  }
  return ok ? 0 : 1;
}
