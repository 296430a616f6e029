// One local GEMM with BLAS's transpose flags and leading dimensions: CBLAS where the build
// found one (TSHARD_USE_BLAS: BLIS or OpenBLAS, cmake/tshardDependencies.cmake), Eigen's matrix
// product otherwise (never the Tensor module's contract, which never calls BLAS: 110-146 GFLOP/s
// in float here, against 207 for OpenBLAS's sgemm on one core). Both BLAS libraries choose their
// kernels at run time; where BLIS runs, tshard gives it the kernels of the level it runs its own
// at (ops/blas_kernels.hpp).
#pragma once
#include <Eigen/Core>

#include <algorithm>
#include <complex>
#include <cstdint>
#include <type_traits>

#ifdef TSHARD_USE_BLAS
#include <cblas.h>
#include <dlfcn.h>
#endif

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/datatype.hpp"
#include "tshard/core/dispatch.hpp"
#include "tshard/ops/blas_kernels.hpp"
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

#ifdef TSHARD_USE_BLAS
inline constexpr bool kBlasProducts = true;
#else
inline constexpr bool kBlasProducts = false;
#endif

// Whether this CPU multiplies bfloat16 in hardware (AVX512_BF16).
inline bool cpu_has_bf16_products() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

#if defined(TSHARD_USE_BLAS) && defined(TSHARD_BLAS_OPENBLAS)
// OpenBLAS's sbgemm (bfloat16 operands, float C), looked up at run time: only builds made with
// BUILD_BFLOAT16 have it (Debian's 0.3.21 declares it in cblas.h but does not export it).
using SbgemmFunction = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                                const std::uint16_t*, blasint, const std::uint16_t*, blasint, float, float*, blasint);
inline SbgemmFunction blas_sbgemm() {
  static const auto f = reinterpret_cast<SbgemmFunction>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
  return f;
}
#endif

// Which kernel a bfloat16 product runs: OpenBLAS's sbgemm where the CPU multiplies bfloat16 and
// the library has it, float GEMM on converted copies elsewhere.
inline const char* bf16_gemm_kernel() {
#if defined(TSHARD_USE_BLAS) && defined(TSHARD_BLAS_OPENBLAS)
  if (cpu_has_bf16_products() && blas_sbgemm()) return "sbgemm";
#endif
  return "sgemm on float copies";
}

template <class T>
void gemm(bool trans_a, bool trans_b, Index m, Index n, Index k, const T* a, Index lda, const T* b, Index ldb, T* c,
          Index ldc, bool accumulate = false);

// The bfloat16 product: every product and sum in float, C rounded to bfloat16 once.
inline void gemm_bf16(bool trans_a, bool trans_b, Index m, Index n, Index k, const bfloat16* a, Index lda,
                      const bfloat16* b, Index ldb, bfloat16* c, Index ldc, bool accumulate) {
  Scratch<float> cf(static_cast<std::size_t>(m * n));
  auto widen = [](const bfloat16* x, Index ld, Index rows, Index cols, float* out) {
    for (Index j = 0; j < cols; ++j)
      for (Index i = 0; i < rows; ++i) out[i + j * rows] = float(x[i + j * ld]);
  };
  if (accumulate) widen(c, ldc, m, n, cf.data());
#if defined(TSHARD_USE_BLAS) && defined(TSHARD_BLAS_OPENBLAS)
  if (cpu_has_bf16_products() && blas_sbgemm()) {
    static_assert(sizeof(bfloat16) == sizeof(std::uint16_t), "tshard: bfloat16 is 16 bits");
    blas_sbgemm()(CblasColMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, blasint(m),
                  blasint(n), blasint(k), 1.0f, reinterpret_cast<const std::uint16_t*>(a), blasint(lda),
                  reinterpret_cast<const std::uint16_t*>(b), blasint(ldb), accumulate ? 1.0f : 0.0f, cf.data(),
                  blasint(m));
  } else
#endif
  {
    const Index ar = trans_a ? k : m, ac = trans_a ? m : k, br = trans_b ? n : k, bc = trans_b ? k : n;
    Scratch<float> af(static_cast<std::size_t>(ar * ac)), bf(static_cast<std::size_t>(br * bc));
    widen(a, lda, ar, ac, af.data());
    widen(b, ldb, br, bc, bf.data());
    gemm<float>(trans_a, trans_b, m, n, k, af.data(), ar, bf.data(), br, cf.data(), m, accumulate);
  }
  for (Index j = 0; j < n; ++j)
    for (Index i = 0; i < m; ++i) c[i + j * ldc] = bfloat16(cf.data()[i + j * m]);
}

// gemm's product where no BLAS runs it: Eigen's GEMM. Dispatched for float and double where the
// build has no BLAS (core/dispatch.hpp): Eigen's kernels are its packets, chosen when compiling.
template <class T>
void eigen_gemm(bool trans_a, bool trans_b, Index m, Index n, Index k, const T* a, Index lda, const T* b, Index ldb,
                T* c, Index ldc, bool accumulate) {
  TSHARD_DISPATCH((eigen_gemm<T>), trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
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

// C (m x n, column-major, leading dim ldc) = beta C + op(A) op(B), op(X) = X or X^T. A is stored
// m x k (lda) or, transposed, k x m; B is k x n (ldb) or n x k. beta is 0 or 1.
template <class T>
void gemm(bool trans_a, bool trans_b, Index m, Index n, Index k, const T* a, Index lda, const T* b, Index ldb, T* c,
          Index ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  TSHARD_SAMPLED_KERNEL(trans_a, trans_b, m, n, k, lda, ldb, ldc, accumulate);
  if (k <= 0) {
    if (!accumulate)
      for (Index j = 0; j < n; ++j) std::fill(c + j * ldc, c + j * ldc + m, T(0));
    return;
  }
  // One branch per element type, so that Eigen's GEMM is not instantiated (a few seconds of
  // every translation unit's compile) for the types BLAS multiplies.
  if constexpr (std::is_same_v<T, bfloat16>) {
    gemm_bf16(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  } else if constexpr (kBlasProducts && (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                         std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>)) {
#ifdef TSHARD_USE_BLAS
    choose_blis_kernels();
    const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasColMajor, ta, tb, int(m), int(n), int(k), 1.0f, a, int(lda), b, int(ldb), accumulate ? 1.0f : 0.0f,
                  c, int(ldc));
    } else if constexpr (std::is_same_v<T, double>) {
      cblas_dgemm(CblasColMajor, ta, tb, int(m), int(n), int(k), 1.0, a, int(lda), b, int(ldb), accumulate ? 1.0 : 0.0, c,
                  int(ldc));
    } else {
      const T one(1), beta(accumulate ? 1 : 0);
      if constexpr (std::is_same_v<T, std::complex<float>>)
        cblas_cgemm(CblasColMajor, ta, tb, int(m), int(n), int(k), &one, a, int(lda), b, int(ldb), &beta, c, int(ldc));
      else
        cblas_zgemm(CblasColMajor, ta, tb, int(m), int(n), int(k), &one, a, int(lda), b, int(ldb), &beta, c, int(ldc));
    }
#endif
  } else {
    eigen_gemm<T>(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  }
}

}  // namespace detail
}  // namespace tshard

#if !defined(TSHARD_USE_BLAS)
// Compiled once where the program links tshard::kernels, and per instruction-set level.
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (eigen_gemm<T>), bool, bool, Index, Index, Index, const T*, \
    Index, const T*, Index, T*, Index, bool)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
#endif
