// Element types and their MPI datatypes: Boost.MPI's mapping for native types, the C++
// complex datatypes by hand (Boost.MPI has none for std::complex).
#pragma once
#include <mpi.h>

#include <boost/mpi/datatype.hpp>
#include <complex>
#include <cstdint>
#include <type_traits>

#include "tshard/core/spec.hpp"

namespace tshard {

// The element types tshard moves and computes with, and bool for masks (x > y, where).
template <class T>
concept Element = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                  std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>> ||
                  std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, bool>;

// Element types with arithmetic (every element type but bool).
template <class T>
concept Numeric = Element<T> && !std::is_same_v<T, bool>;

template <class T>
inline constexpr bool is_complex_v = std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>;

namespace detail {

template <class T>
MPI_Datatype mpi_datatype() {
  static_assert(Element<T>, "tshard: element types are float, double, std::complex<float/double>, int32_t and int64_t");
  if constexpr (std::is_same_v<T, bool>) {
    return MPI_CXX_BOOL;
  } else if constexpr (std::is_same_v<T, std::complex<float>>) {
    return MPI_CXX_FLOAT_COMPLEX;
  } else if constexpr (std::is_same_v<T, std::complex<double>>) {
    return MPI_CXX_DOUBLE_COMPLEX;
  } else {
    return boost::mpi::get_mpi_datatype<T>(T{});
  }
}

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

}  // namespace detail
}  // namespace tshard
