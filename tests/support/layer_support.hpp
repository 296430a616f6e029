// Helpers for layer tests on {data, model} meshes (and, given the input's spec, on others): random tensors, the one-rank comparison and
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

// Every parameter's (or gradient's) global value of a module, in parameter_names() order.
inline std::vector<std::vector<double>> parameters_of(const ts::nn::Module& layer, bool gradients) {
  std::vector<std::vector<double>> out;
  layer.for_each_slot([&](const std::string&, ts::nn::detail::ParameterSlot& s, const ts::nn::Module&) {
    out.push_back((gradients ? s.gradient_state() : s.value_state())->values());
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

// One forward of a layer on x (laid out as In), recorded, and its pullback with dL/dy = w
// (ts::ad::vjp): (y, dx, the parameters' gradients), gathered.
template <class In = Acts, class L, class M>
auto run_layer(L& layer, const M& mesh, const T3& x, const T3& w) {
  layer.zero_grad();
  auto [y, pullback] = ts::ad::vjp(layer, [&](const auto& v) { return layer(v); }, ts::distribute<In>(mesh, x));
  auto [dx] = pullback(ts::distribute<In>(mesh, w));
  return std::tuple{T3(y.gather()), T3(dx.gather()), parameters_of(layer, true)};
}

// A one-rank module's parameter as a writable buffer of doubles (the whole tensor: one rank).
inline double* one_rank_values(ts::nn::detail::ParameterSlot& slot) {
  ts::detail::SpecDesc desc{};
  ts::detail::Extents extents{};
  const void* mesh = nullptr;
  return const_cast<double*>(static_cast<const double*>(slot.value_state()->block(desc, extents, mesh)));
}

// Central differences of sum(w * layer(x)) for a few parameter elements of a one-rank layer.
template <class In = Acts, class L, class M>
void check_parameter_gradients(L& layer, const M& mesh, const T3& x, const T3& w) {
  auto [y, dx, grads] = run_layer<In>(layer, mesh, x, w);
  auto loss = [&](const T3& in) { return dot<3>(T3(layer(ts::distribute<In>(mesh, in)).gather()), w); };
  int index = 0;
  layer.for_each_slot([&](const std::string& name, ts::nn::detail::ParameterSlot& slot, const ts::nn::Module&) {
    const auto& g = grads[std::size_t(index++)];
    double* d = one_rank_values(slot);
    for (std::size_t e = 0; e < g.size(); e += 1 + g.size() / 5) {
      const double keep = d[e], h = 1e-6;
      d[e] = keep + h;
      const double up = loss(x);
      d[e] = keep - h;
      const double down = loss(x);
      d[e] = keep;
      INFO("parameter " << name << " element " << e);
      TS_REQUIRE_ALL(std::abs((up - down) / (2 * h) - g[e]) < 1e-7 * (1 + std::abs(g[e])));
    }
  });
  // dx against central differences of the input.
  T3 xs = x;
  for (Eigen::Index i = 0; i < xs.size(); i += 7) {
    const double keep = xs.data()[i], h = 1e-6;
    xs.data()[i] = keep + h;
    const double up = loss(xs);
    xs.data()[i] = keep - h;
    const double down = loss(xs);
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
