// Element types and their MPI datatypes: MPI's own for the builtin types and std::complex, and
// bfloat16 (Eigen's) moved as 16-bit words and reduced by operations of its own that add in float.
#pragma once
#include "tshard/comm/mpi.hpp"

#include <Eigen/Core>

#include <complex>
#include <cstdint>
#include <type_traits>

#include "tshard/core/spec.hpp"

namespace tshard {

// Brain floating point (8 exponent bits, 7 mantissa bits): storage and communication at half
// float's bytes; arithmetic converts to float.
using bfloat16 = Eigen::bfloat16;

// The element types tshard moves and computes with, and bool for masks (x > y, where).
template <class T>
concept Element = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bfloat16> ||
                  std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>> ||
                  std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, bool>;

// Element types with arithmetic (every element type but bool).
template <class T>
concept Numeric = Element<T> && !std::is_same_v<T, bool>;

// Real floating-point element types: float, double and bfloat16 (what gradients are taken of).
template <class T>
inline constexpr bool is_real_floating_v =
    std::is_floating_point_v<T> || std::is_same_v<std::remove_cv_t<T>, bfloat16>;

// The type a kernel accumulates T in: float for bfloat16, T itself otherwise.
template <class T>
using accumulator_t = std::conditional_t<std::is_same_v<T, bfloat16>, float, T>;

template <class T>
inline constexpr bool is_complex_v = std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>;

namespace detail {

template <class T>
MPI_Datatype mpi_datatype() {
  static_assert(Element<T>,
                "tshard: element types are float, double, bfloat16, std::complex<float/double>, int32_t and int64_t");
  if constexpr (std::is_same_v<T, bool>) {
    return MPI_CXX_BOOL;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return MPI_UINT16_T;  // moved bitwise; reduced only by bfloat16_op's operations
  } else if constexpr (std::is_same_v<T, std::complex<float>>) {
    return TSHARD_MPI_FLOAT_COMPLEX;
  } else if constexpr (std::is_same_v<T, std::complex<double>>) {
    return TSHARD_MPI_DOUBLE_COMPLEX;
  } else if constexpr (std::is_same_v<T, float>) {
    return MPI_FLOAT;
  } else if constexpr (std::is_same_v<T, double>) {
    return MPI_DOUBLE;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return MPI_INT;  // (the C types' datatypes, as Boost.MPI gave them: the same MPI calls as before)
  } else {
    static_assert(sizeof(long) == 8 || sizeof(long long) == 8);
    return sizeof(long) == 8 ? MPI_LONG : MPI_LONG_LONG;
  }
}

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

// MPI's reduction operations over bfloat16 words: each pair combined in float and rounded once.
template <ReduceOp Op>
void bfloat16_combine(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bfloat16*>(in);
  auto* b = static_cast<bfloat16*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = float(a[i]), y = float(b[i]);
    b[i] = bfloat16(Op == ReduceOp::Max ? (x > y ? x : y) : Op == ReduceOp::Min ? (x < y ? x : y) : x + y);
  }
}
inline MPI_Op bfloat16_op(ReduceOp op) {
  auto make = [](MPI_User_function* f) {
    MPI_Op o;
    MPI_Op_create(f, /*commutative*/ 1, &o);
    return o;
  };
  // Made once, after MPI_Init (the first reduction), and kept until the process ends.
  static const MPI_Op sum = make(&bfloat16_combine<ReduceOp::Sum>), max = make(&bfloat16_combine<ReduceOp::Max>),
                      min = make(&bfloat16_combine<ReduceOp::Min>);
  return op == ReduceOp::Max ? max : op == ReduceOp::Min ? min : sum;
}

// The operation reducing elements of type T.
template <class T>
MPI_Op mpi_op(ReduceOp op) {
  if constexpr (std::is_same_v<T, bfloat16>) return bfloat16_op(op);
  else return mpi_op(op);
}

}  // namespace detail
}  // namespace tshard
