// Initial values that depend only on (seed, global index), so every mesh starts from the same
// model and trains along the same loss curve.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tshard/tensor/factories.hpp"

namespace tshard::nn {
namespace detail {

// Uniform in [-bound, bound) from (seed, global index): the same values on every mesh.
template <class T, class SpecT, class M, std::size_t N>
auto uniform_init(const M& mesh, const Eigen::Index (&shape)[N], std::uint64_t seed, double bound) {
  std::array<Eigen::Index, N> dims{};
  for (std::size_t d = 0; d < N; ++d) dims[d] = shape[d];
  return from_function<T, SpecT>(mesh, shape, [=](const std::array<Eigen::Index, N>& i) {
    std::uint64_t linear = 0, stride = 1;
    for (std::size_t d = 0; d < N; ++d) {
      linear += std::uint64_t(i[d]) * stride;
      stride *= std::uint64_t(dims[d]);
    }
    return T((2 * tshard::detail::random_value<double>(seed, linear) - 1) * bound);
  });
}

}  // namespace detail

// Public initialisers: the values depend on (seed, global index) alone, so a model starts the same
// on every mesh.
//   auto w = ts::nn::init::uniform<float, Spec<R, S<"model">>>(mesh, {in, out}, seed, ts::nn::init::default_bound(in));
namespace init {

// PyTorch's default bound for nn.Linear's and nn.Conv's weights and biases: 1 / sqrt(fan_in).
inline double default_bound(Eigen::Index fan_in) { return 1.0 / std::sqrt(double(std::max<Eigen::Index>(fan_in, 1))); }
// He et al.'s bound for ReLU layers: sqrt(6 / fan_in) (torch.nn.init.kaiming_uniform_, a = 0).
inline double kaiming_bound(Eigen::Index fan_in) { return std::sqrt(6.0 / double(std::max<Eigen::Index>(fan_in, 1))); }

// Uniform in [-bound, bound).
template <class T, class SpecT, MeshType M, std::size_t N>
auto uniform(const M& mesh, const Eigen::Index (&shape)[N], std::uint64_t seed, double bound) {
  static_assert(std::is_floating_point_v<T>, "tshard: init::uniform makes float or double tensors");
  static_assert(SpecT::rank == int(N), "tshard: init::uniform's shape has one extent per dim of the spec");
  return detail::uniform_init<T, SpecT>(mesh, shape, seed, bound);
}
// PyTorch's default for a layer with fan_in inputs: uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)).
template <class T, class SpecT, MeshType M, std::size_t N>
auto pytorch_default(const M& mesh, const Eigen::Index (&shape)[N], Eigen::Index fan_in, std::uint64_t seed) {
  return uniform<T, SpecT>(mesh, shape, seed, default_bound(fan_in));
}
// Kaiming (He) uniform for ReLU layers: uniform in [-sqrt(6/fan_in), sqrt(6/fan_in)).
template <class T, class SpecT, MeshType M, std::size_t N>
auto kaiming_uniform(const M& mesh, const Eigen::Index (&shape)[N], Eigen::Index fan_in, std::uint64_t seed) {
  return uniform<T, SpecT>(mesh, shape, seed, kaiming_bound(fan_in));
}

}  // namespace init
}  // namespace tshard::nn
