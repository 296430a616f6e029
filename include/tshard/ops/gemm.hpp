// One local GEMM with BLAS's transpose flags and leading dimensions: CBLAS where the build
// found one (TSHARD_USE_BLAS, the default when OpenBLAS is installed), Eigen's matrix product
// otherwise (never the Tensor module's contract, which never calls BLAS: 110-146 GFLOP/s
// in float here, against 207 for OpenBLAS's sgemm on one core).
#pragma once
#include <Eigen/Core>

#include <algorithm>
#include <complex>
#include <type_traits>

#ifdef TSHARD_USE_BLAS
#include <cblas.h>
#endif

#include "tshard/core/shard.hpp"

namespace tshard {

// Which library runs local products in this translation unit: "cblas" or "eigen".
constexpr const char* local_gemm_backend() {
#ifdef TSHARD_USE_BLAS
  return "cblas";
#else
  return "eigen";
#endif
}

namespace detail {

// C (m x n, column-major, leading dim ldc) = beta C + op(A) op(B), op(X) = X or X^T. A is stored
// m x k (lda) or, transposed, k x m; B is k x n (ldb) or n x k. beta is 0 or 1.
template <class T>
void gemm(bool trans_a, bool trans_b, Index m, Index n, Index k, const T* a, Index lda, const T* b, Index ldb, T* c,
          Index ldc, bool accumulate = false) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate)
      for (Index j = 0; j < n; ++j) std::fill(c + j * ldc, c + j * ldc + m, T(0));
    return;
  }
#ifdef TSHARD_USE_BLAS
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasColMajor, ta, tb, int(m), int(n), int(k), 1.0f, a, int(lda), b, int(ldb), accumulate ? 1.0f : 0.0f,
                c, int(ldc));
    return;
  } else if constexpr (std::is_same_v<T, double>) {
    cblas_dgemm(CblasColMajor, ta, tb, int(m), int(n), int(k), 1.0, a, int(lda), b, int(ldb), accumulate ? 1.0 : 0.0, c,
                int(ldc));
    return;
  } else if constexpr (std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>) {
    const T one(1), beta(accumulate ? 1 : 0);
    if constexpr (std::is_same_v<T, std::complex<float>>)
      cblas_cgemm(CblasColMajor, ta, tb, int(m), int(n), int(k), &one, a, int(lda), b, int(ldb), &beta, c, int(ldc));
    else
      cblas_zgemm(CblasColMajor, ta, tb, int(m), int(n), int(k), &one, a, int(lda), b, int(ldb), &beta, c, int(ldc));
    return;
  }
#endif
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  using Const = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
  const Const A(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  const Const B(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  Eigen::Map<Mat, 0, Eigen::OuterStride<>> C(c, m, n, Eigen::OuterStride<>(ldc));
  // Eigen's GEMM reads a transposed map in place (as row-major): no copy either way.
  auto run = [&](const auto& x, const auto& y) {
    if (accumulate)
      C.noalias() += x * y;
    else
      C.noalias() = x * y;
  };
  if (trans_a && trans_b) run(A.transpose(), B.transpose());
  else if (trans_a) run(A.transpose(), B);
  else if (trans_b) run(A, B.transpose());
  else run(A, B);
}

}  // namespace detail
}  // namespace tshard
