// Initial values that depend only on (seed, global index), so every mesh starts from the same
// model and trains along the same loss curve.
#pragma once
#include <array>
#include <cstdint>

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

}  // namespace tshard::nn
