// Initial values that depend only on (seed, global index), so every mesh starts from the same
// model and trains along the same loss curve.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/simulated_timing.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {
namespace detail {

// uniform_init's values on this rank's block, per element type (compiled once, not per spec).
template <class T>
void fill_uniform(const tshard::detail::ShardLayout& l, const tshard::detail::Extents& shape, T* data, std::uint64_t seed,
                  double bound) {
  TSHARD_SAMPLED_KERNEL(l, shape);
  tshard::detail::for_each_local<tshard::detail::kMaxRank>(l, [&](const auto& g, tshard::detail::Index at) {
    std::uint64_t linear = 0, stride = 1;
    for (int d = 0; d < l.rank; ++d) {
      linear += std::uint64_t(g[d]) * stride;
      stride *= std::uint64_t(shape[d]);
    }
    data[at] = T((2 * tshard::detail::random_value<double>(seed, linear) - 1) * bound);
  });
}

// A tensor of the given global shape (ShapeError on every rank for a negative extent), its
// values unset.
template <class T, class SpecT, class M, std::size_t N>
ShardedTensor<T, M, SpecT> init_tensor(const M& mesh, const Eigen::Index (&shape)[N], const char* op) {
  using Out = ShardedTensor<T, M, SpecT>;
  const auto dims = tshard::detail::shape_argument<SpecT::rank>(shape);
  tshard::detail::check_shape_nonnegative(mesh, dims, op, Out::spec_desc.to_string(mesh.shape()));
  return Out(mesh, dims);
}

// Uniform in [-bound, bound) from (seed, global index): the same values on every mesh.
template <class T, class SpecT, class M, std::size_t N>
auto uniform_init(const M& mesh, const Eigen::Index (&shape)[N], std::uint64_t seed, double bound) {
  auto out = init_tensor<T, SpecT>(mesh, shape, "nn::init::uniform");
  fill_uniform<T>(tshard::detail::layout_of(out), tshard::detail::extents_of(out), out.data(), seed, bound);
  return out;
}

// Every element `value` (a norm's scale of ones, a running variance).
template <class T, class SpecT, class M, std::size_t N>
auto constant_init(const M& mesh, const Eigen::Index (&shape)[N], T value) {
  auto out = init_tensor<T, SpecT>(mesh, shape, "nn::init::constant");
  std::fill_n(out.data(), out.padded_size(), value);
  return out;
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

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::nn::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void fill_uniform<T>(const tshard::detail::ShardLayout&, \
    const tshard::detail::Extents&, T*, std::uint64_t, double))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::nn::detail
