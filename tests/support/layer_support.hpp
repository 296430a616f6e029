// Helpers for layer tests on {data, model} meshes: random tensors, the one-rank comparison and
// finite-difference checks of a layer's gradients.
#pragma once
#include "test_support.hpp"

namespace ts = tshard;

namespace tshard_test {
using DM = ts::Mesh<"data", "model">;
using T4 = Eigen::Tensor<double, 4>;
using T3 = Eigen::Tensor<double, 3>;

template <class F>
inline void on_every_dm_mesh(F&& f) {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    DM mesh({sizes[0], sizes[1]});
    f(mesh, sizes);
  }
}

template <int R>
Eigen::Tensor<double, R> random_tensor(const std::array<Eigen::Index, R>& dims, std::uint64_t seed) {
  Eigen::Tensor<double, R> t(dims);
  for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = 2 * ts::detail::random_value<double>(seed, std::uint64_t(i)) - 1;
  return t;
}

template <int R>
double dot(const Eigen::Tensor<double, R>& a, const Eigen::Tensor<double, R>& b) {
  const Eigen::Tensor<double, 0> s = (a * b).sum();
  return s();
}

// Every parameter's and gradient's global value of a layer, in order.
template <class L>
std::vector<std::vector<double>> parameters_of(L& layer, bool gradients) {
  std::vector<std::vector<double>> out;
  layer.for_each_parameter([&](auto& p, auto& g) {
    const auto t = (gradients ? g : p).gather();
    out.emplace_back(t.data(), t.data() + t.size());
  });
  return out;
}

inline bool close(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b, double tol) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    for (std::size_t j = 0; j < a[i].size(); ++j)
      if (std::abs(a[i][j] - b[i][j]) > tol * (1 + std::abs(b[i][j]))) return false;
  }
  return true;
}

using Acts = ts::Spec<ts::S<"data">, ts::R, ts::R>;

// One forward and backward of a layer on x with dL/dy = w: (y, dx, gradients), gathered.
template <class L>
auto run_layer(L& layer, const DM& mesh, const T3& x, const T3& w) {
  layer.zero_grad();
  auto y = layer.forward(ts::distribute<Acts>(mesh, x));
  auto dx = layer.backward(ts::distribute<Acts>(mesh, w));
  return std::tuple{T3(y.gather()), T3(dx.gather()), parameters_of(layer, true)};
}

// Central differences of sum(w * layer(x)) for a few parameter elements of a one-rank layer.
template <class L>
void check_parameter_gradients(L& layer, const DM& mesh, const T3& x, const T3& w) {
  auto [y, dx, grads] = run_layer(layer, mesh, x, w);
  int index = 0;
  layer.for_each_parameter([&](auto& p, auto&) {
    const auto& g = grads[std::size_t(index++)];
    for (std::size_t e = 0; e < g.size(); e += 1 + g.size() / 5) {
      auto* d = p.data();  // one rank: the buffer is the whole tensor
      const double keep = d[e], h = 1e-6;
      d[e] = keep + h;
      const double up = dot<3>(T3(layer.forward(ts::distribute<Acts>(mesh, x)).gather()), w);
      d[e] = keep - h;
      const double down = dot<3>(T3(layer.forward(ts::distribute<Acts>(mesh, x)).gather()), w);
      d[e] = keep;
      INFO("parameter " << index - 1 << " element " << e);
      TS_REQUIRE_ALL(std::abs((up - down) / (2 * h) - g[e]) < 1e-7 * (1 + std::abs(g[e])));
    }
  });
  // dx against central differences of the input.
  T3 xs = x;
  for (Eigen::Index i = 0; i < xs.size(); i += 7) {
    const double keep = xs.data()[i], h = 1e-6;
    xs.data()[i] = keep + h;
    const double up = dot<3>(T3(layer.forward(ts::distribute<Acts>(mesh, xs)).gather()), w);
    xs.data()[i] = keep - h;
    const double down = dot<3>(T3(layer.forward(ts::distribute<Acts>(mesh, xs)).gather()), w);
    xs.data()[i] = keep;
    TS_REQUIRE_ALL(std::abs((up - down) / (2 * h) - dx.data()[i]) < 1e-7 * (1 + std::abs(dx.data()[i])));
  }
}

// The layer built by make(mesh) on every mesh equals the same layer on a one-rank mesh.
template <class Make>
void check_layer_on_meshes(Make&& make, const std::array<Eigen::Index, 3>& dims) {
  const T3 x = random_tensor<3>(dims, 11), w = random_tensor<3>(dims, 12);
  DM self(MPI_COMM_SELF, {1, 1});
  auto serial = make(self);
  const auto [y0, dx0, g0] = run_layer(serial, self, x, w);
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    auto layer = make(mesh);
    const auto [y, dx, g] = run_layer(layer, mesh, x, w);
    TS_REQUIRE_ALL(compare(y, y0, 1e-12) == "");
    TS_REQUIRE_ALL(compare(dx, dx0, 1e-12) == "");
    TS_REQUIRE_ALL(close(g, g0, 1e-12));
  });
}

// ... and the one-rank layer's gradients equal finite differences.
template <class Make>
void check_layer(Make&& make, const std::array<Eigen::Index, 3>& dims) {
  const T3 x = random_tensor<3>(dims, 11), w = random_tensor<3>(dims, 12);
  DM self(MPI_COMM_SELF, {1, 1});
  auto serial = make(self);
  check_parameter_gradients(serial, self, x, w);
  check_layer_on_meshes(make, dims);
}

}  // namespace tshard_test
