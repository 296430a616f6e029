// Helpers shared by the MPI tests: collective checks, serial references, mesh enumeration.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <complex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tshard/tshard.hpp"

namespace tshard_test {

inline int world_rank() { return tshard::Environment::world_rank(); }
inline int world_size() { return tshard::Environment::world_size(); }

// REQUIRE that holds on every rank: all ranks agree, so all fail together and none is left
// waiting in the next collective.
#define TS_REQUIRE_ALL(...)                                                                             \
  do {                                                                                                 \
    const bool ts_ok_ = static_cast<bool>(__VA_ARGS__);                                                \
    INFO("rank " << tshard_test::world_rank() << ": `" #__VA_ARGS__ "` " << (ts_ok_ ? "held" : "FAILED")); \
    REQUIRE(tshard::agree(ts_ok_));                                                                    \
  } while (0)

// Every way to factor `p` ranks into `axes` axis sizes (for 6 and 2 axes: 1x6, 2x3, 3x2, 6x1).
inline std::vector<std::vector<int>> mesh_shapes(int p, int axes) {
  std::vector<std::vector<int>> out;
  if (axes == 1) return {{p}};
  for (int s = 1; s <= p; ++s)
    if (p % s == 0)
      for (auto rest : mesh_shapes(p / s, axes - 1)) {
        rest.insert(rest.begin(), s);
        out.push_back(rest);
      }
  return out;
}

// First mismatch between two tensors of equal shape, or "" when they agree within tol.
template <class T, int R>
std::string compare(const Eigen::Tensor<T, R>& got, const Eigen::Tensor<T, R>& want, double tol = 0) {
  for (int d = 0; d < R; ++d)
    if (got.dimension(d) != want.dimension(d)) return "shapes differ at dim " + std::to_string(d);
  for (Eigen::Index i = 0; i < got.size(); ++i) {
    const double diff = std::abs(std::complex<double>(got.data()[i]) - std::complex<double>(want.data()[i]));
    if (!(diff <= tol)) {
      std::ostringstream s;
      s << "element " << i << " (column-major) is " << got.data()[i] << ", want " << want.data()[i];
      return s.str();
    }
  }
  return "";
}

// A global tensor whose every element tells where it is (bitwise checks of data movement).
template <class T, int R>
Eigen::Tensor<T, R> iota_tensor(const std::array<Eigen::Index, R>& shape, int salt = 0) {
  Eigen::Tensor<T, R> t(shape);
  for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = T(double(i % 100003) + 0.5 * salt);
  return t;
}

}  // namespace tshard_test
