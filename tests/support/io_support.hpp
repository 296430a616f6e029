// Helpers for file tests: typed values of every element type, bitwise comparison, IoError
// checks, scratch file names, a python3 with a given module.
#pragma once
#include "test_support.hpp"

#include <complex>
#include <cstdio>
#include <cstring>
#include <string>

namespace tshard_test {

template <class S>
std::string spec_name(const M2& mesh) {
  return tshard::ShardedTensor<double, M2, S>::spec_desc.to_string(mesh.shape());
}

// A per-test file name, the same on every rank.
inline std::string scratch_file(const std::string& name) { return "tshard_test_io_" + name; }

template <class T>
T element(double v) {
  if constexpr (std::is_integral_v<T>) return T(std::llround(v * 1000));
  else if constexpr (tshard::is_complex_v<T>) return T(v, -2 * v);
  else return T(v);
}

template <class T>
Eigen::Tensor<T, 2> typed_values(Eigen::Index r, Eigen::Index c, int salt) {
  const Eigen::Tensor<double, 2> v = values(r, c, salt);
  Eigen::Tensor<T, 2> out(r, c);
  for (Eigen::Index i = 0; i < v.size(); ++i) out.data()[i] = element<T>(v.data()[i]);
  return out;
}

template <class T>
bool bitwise_equal(const Eigen::Tensor<T, 2>& a, const Eigen::Tensor<T, 2>& b) {
  if (a.dimensions() != b.dimensions()) return false;
  return std::memcmp(a.data(), b.data(), sizeof(T) * std::size_t(a.size())) == 0;
}

// Whether `f` throws an IoError whose message contains `words`.
template <class F>
bool io_error(F&& f, const std::string& words) {
  try {
    f();
  } catch (const tshard::IoError& e) {
    return std::string(e.what()).find(words) != std::string::npos;
  }
  return false;
}

// A python3 that imports `module` (Debian's /usr/bin/python3 first: a pyenv one may lack it),
// or "" where none does.
inline std::string python_with(const std::string& module) {
  for (std::string py : {"/usr/bin/python3", "python3"})
    if (std::system((py + " -c 'import " + module + "' > /dev/null 2>&1").c_str()) == 0) return py;
  return "";
}

// x as a Python nested list, [[x(0, 0), x(0, 1), ...], ...], to compare with what numpy reads.
inline std::string python_list(const Eigen::Tensor<double, 2>& x) {
  std::string s = "[";
  for (Eigen::Index i = 0; i < x.dimension(0); ++i) {
    s += "[";
    for (Eigen::Index j = 0; j < x.dimension(1); ++j) s += std::to_string(x(i, j)) + ",";
    s += "],";
  }
  return s + "]";
}

inline void remove_on_rank0(const std::string& path) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(path.c_str());
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace tshard_test
