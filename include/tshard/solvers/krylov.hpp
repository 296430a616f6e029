// Krylov solvers of A x = b over sharded tensors, PETSc KSP's in a few lines each: CG for
// symmetric (Hermitian) positive definite operators, BiCGStab and restarted GMRES(m) for any
// nonsingular one. The operator is the user's function `X A(const X&)` (a ts::stencil, an einsum,
// anything returning the same tensor type), the preconditioner another (`X M(const X&)`,
// ts::solvers::jacobi or the identity), and every scalar a dot or norm whose one all-reduce gives
// each rank the same number, so every rank takes the same branch and stops at the same iteration.
// Right-preconditioned, so the residual tested and reported is the true one, ||b - A x||.
//
//   auto A = [&](const Field& u) { return ts::stencil(u, {1, 1, 1}, ts::Boundary::Zero, laplacian); };
//   ts::solvers::Result res = ts::solvers::cg(A, b, x, {.rtol = 1e-10});
//   // res.iterations, res.converged, res.residuals (||r_k||, from k = 0)
#pragma once
#include <cmath>
#include <complex>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tshard/core/error.hpp"
#include "tshard/ops/inner_product.hpp"
#include "tshard/ops/ops.hpp"

namespace tshard::solvers {

struct Options {
  double rtol = 1e-8;        // stop at ||r|| <= max(rtol * ||b||, atol)
  double atol = 0;
  int max_iterations = 1000;  // operator applications for CG and GMRES, twice that for BiCGStab
  int restart = 30;           // GMRES(m)'s m: the basis vectors kept between restarts
  // Called on every rank with (iteration, ||r||) from iteration 0, as KSPMonitorSet's monitor.
  std::function<void(int, double)> monitor;
};

struct Result {
  int iterations = 0;
  bool converged = false;
  double residual = 0;             // ||b - A x|| at the end, as the recurrence has it
  std::vector<double> residuals;   // every iteration's, from the initial residual on
  std::string reason;              // why it stopped: "converged", "iterations", "breakdown"
};

// The identity: no preconditioner.
struct Identity {
  template <class X>
  const X& operator()(const X& r) const {
    return r;
  }
};

// The Jacobi (diagonal) preconditioner: z = r / diag(A), elementwise. `diagonal` is A's diagonal
// laid out as the vectors are.
template <class X>
auto jacobi(const X& diagonal) {
  using T = typename X::Scalar;
  return [inv = X(T(1) / diagonal)](const X& r) { return X(inv * r); };
}

namespace detail {

template <class X>
void require_vector(const X& b, const X& x, const Options& o, const char* name) {
  static_assert(tshard::detail::is_sharded_tensor<X>::value && !X::is_partial,
                "tshard::solvers: b and x are sharded tensors of one plain (not partial) type");
  if (b.global_shape() != x.global_shape())
    throw ShapeError(std::string("tshard::solvers::") + name + ": x " + x.describe() + " and b " + b.describe() +
                     " differ in shape");
  if (!(o.rtol >= 0) || !(o.atol >= 0) || o.max_iterations < 0 || o.restart < 1)
    throw ValueError(std::string("tshard::solvers::") + name +
                     ": rtol and atol are non-negative, max_iterations non-negative and restart at least 1");
}

// The residual history, the monitor and the stopping test, as every solver keeps them.
class Progress {
 public:
  Progress(const Options& o, double b_norm) : o_(o), tol_(std::max(o.rtol * b_norm, o.atol)) {}
  bool below_tolerance(double r) const { return r <= tol_; }
  // Records ||r|| of the current iterate; true when it has converged.
  bool record(double r) {
    res_.residual = r;
    res_.residuals.push_back(r);
    if (o_.monitor) o_.monitor(res_.iterations, r);
    if (r <= tol_) {
      res_.converged = true;
      res_.reason = "converged";
    }
    return res_.converged;
  }
  bool exhausted() {
    if (res_.iterations < o_.max_iterations) return false;
    res_.reason = "iterations";
    return true;
  }
  // Replaces the last record's residual (GMRES's true one at a restart, where the recurrence's
  // was recorded for the same iteration); true when it has converged.
  bool revise(double r) {
    res_.residual = r;
    res_.residuals.back() = r;
    if (r <= tol_) {
      res_.converged = true;
      res_.reason = "converged";
    }
    return res_.converged;
  }
  void next() { ++res_.iterations; }
  Result breakdown() {
    res_.reason = "breakdown";
    return std::move(res_);
  }
  Result done() { return std::move(res_); }
  int iterations() const { return res_.iterations; }

 private:
  const Options& o_;
  double tol_;
  Result res_;
};

template <class X, class Op>
X apply(Op& A, const X& v) {
  static_assert(std::is_invocable_v<Op&, const X&>, "tshard::solvers: the operator is called as A(x) with a vector x");
  using Out = std::decay_t<std::invoke_result_t<Op&, const X&>>;
  static_assert(std::is_same_v<Out, X>,
                "tshard::solvers: the operator (and the preconditioner) return the vectors' own tensor type: "
                "reshard to it inside where a product changes the layout");
  return A(v);
}

}  // namespace detail

// Conjugate gradients (Hestenes-Stiefel), preconditioned by M (symmetric positive definite).
// x holds the initial guess and gets the solution.
template <class X, class Op, class Pre = Identity>
Result cg(Op&& A, const X& b, X& x, const Options& o = {}, Pre&& M = {}) {
  detail::require_vector(b, x, o, "cg");
  using T = typename X::Scalar;
  detail::Progress progress(o, norm(b));
  X r = b - detail::apply(A, x);
  constexpr bool plain = std::is_same_v<std::decay_t<Pre>, Identity>;
  X p = [&] { if constexpr (plain) return r; else return detail::apply(M, r); }();
  T rz = dot(r, p);
  if (progress.record(std::sqrt(std::abs(plain ? rz : dot(r, r)))) || progress.exhausted()) return progress.done();
  while (true) {
    const X q = detail::apply(A, p);
    const T pq = dot(p, q);
    if (pq == T(0)) return progress.breakdown();
    const T alpha = rz / pq;
    // x and r in one pass, with r's squared norm summed in it.
    const T rr = update<2>(
        [alpha](T& xi, T& ri, const T& pi, const T& qi) {
          xi += alpha * pi;
          ri -= alpha * qi;
          return tshard::detail::conj_if_complex(ri) * ri;
        },
        x, r, p, q);
    progress.next();
    if (progress.record(std::sqrt(std::abs(rr))) || progress.exhausted()) return progress.done();
    if constexpr (plain) {
      update<1>([beta = rr / rz](T& pi, const T& ri) { pi = ri + beta * pi; }, p, r);
      rz = rr;
    } else {
      const X z = detail::apply(M, r);
      const T rz_next = dot(r, z);
      update<1>([beta = rz_next / rz](T& pi, const T& zi) { pi = zi + beta * pi; }, p, z);
      rz = rz_next;
    }
  }
}

// BiCGStab (van der Vorst 1992), right-preconditioned by M: two operator applications an
// iteration. Stops with reason "breakdown" where rho or omega vanishes.
template <class X, class Op, class Pre = Identity>
Result bicgstab(Op&& A, const X& b, X& x, const Options& o = {}, Pre&& M = {}) {
  detail::require_vector(b, x, o, "bicgstab");
  using T = typename X::Scalar;
  detail::Progress progress(o, norm(b));
  X r = b - detail::apply(A, x);
  if (progress.record(norm(r)) || progress.exhausted()) return progress.done();
  const X r0 = r;  // the shadow residual
  X p = r;
  X v = T(0) * r;
  T rho = dot(r0, r), alpha = 1, omega = 1;
  for (bool first = true;; first = false) {
    if (!first) {
      const T rho_next = dot(r0, r);
      if (rho_next == T(0) || omega == T(0)) return progress.breakdown();
      update<1>([c = (rho_next / rho) * (alpha / omega), omega](T& pi, const T& ri, const T& vi) { pi = ri + c * (pi - omega * vi); },
                p, r, v);
      rho = rho_next;
    }
    const X ph = detail::apply(M, p);
    v = detail::apply(A, ph);
    const T r0v = dot(r0, v);
    if (r0v == T(0)) return progress.breakdown();
    alpha = rho / r0v;
    X s = r - alpha * v;
    progress.next();
    if (const double sn = norm(s); progress.below_tolerance(sn)) {  // converged at the half step
      x += alpha * ph;
      progress.record(sn);
      return progress.done();
    }
    const X sh = detail::apply(M, s);
    const X t = detail::apply(A, sh);
    const T tt = dot(t, t);
    omega = tt == T(0) ? T(0) : dot(t, s) / tt;
    const T rr = update<2>(
        [alpha, omega](T& xi, T& ri, const T& phi, const T& shi, const T& si, const T& ti) {
          xi += alpha * phi;
          xi += omega * shi;
          ri = si - omega * ti;
          return tshard::detail::conj_if_complex(ri) * ri;
        },
        x, r, ph, sh, s, t);
    if (progress.record(std::sqrt(std::abs(rr))) || progress.exhausted()) return progress.done();
  }
}

// Restarted GMRES(m) (Saad and Schultz 1986), right-preconditioned by M: modified Gram-Schmidt
// Arnoldi, Givens rotations on the Hessenberg matrix (every rank holds the same small one), the
// update x += M(V y) at each restart or at convergence.
template <class X, class Op, class Pre = Identity>
Result gmres(Op&& A, const X& b, X& x, const Options& o = {}, Pre&& M = {}) {
  detail::require_vector(b, x, o, "gmres");
  using T = typename X::Scalar;
  using std::abs;
  auto conj = [](const T& v) { return tshard::detail::conj_if_complex(v); };
  const int m = o.restart;
  detail::Progress progress(o, norm(b));
  X r = b - detail::apply(A, x);
  double beta = norm(r);
  if (progress.record(beta) || progress.exhausted()) return progress.done();
  std::vector<X> V;
  V.reserve(std::size_t(m) + 1);
  const std::size_t columns = std::size_t(m), rows = columns + 1;
  std::vector<T> H(rows * columns), g(rows), cs(columns), sn(columns);  // (Givens: cos, sin)
  auto h = [&](int i, int j) -> T& { return H[std::size_t(j) * rows + std::size_t(i)]; };
  while (true) {
    V.clear();
    V.push_back(T(1 / beta) * r);
    std::fill(g.begin(), g.end(), T(0));
    g[0] = T(beta);
    int k = 0;  // the columns of this cycle
    bool stop = false, broke = false;
    while (k < m && !stop) {
      X w = detail::apply(A, detail::apply(M, V[std::size_t(k)]));
      for (int i = 0; i <= k; ++i) {
        h(i, k) = dot(V[std::size_t(i)], w);
        w -= h(i, k) * V[std::size_t(i)];
      }
      const double wn = norm(w);
      h(k + 1, k) = T(wn);
      for (int i = 0; i < k; ++i) {  // the earlier rotations on the new column
        const T a = h(i, k), c = h(i + 1, k);
        h(i, k) = cs[std::size_t(i)] * a + sn[std::size_t(i)] * c;
        h(i + 1, k) = -conj(sn[std::size_t(i)]) * a + cs[std::size_t(i)] * c;
      }
      // The rotation that zeroes h(k+1, k): c real, |c|^2 + |s|^2 = 1.
      const T a = h(k, k), c = h(k + 1, k);
      const double na = abs(a), nc = abs(c), rn = std::hypot(na, nc);
      if (rn == 0) {  // column k depends on the others: keep what the k before it give
        broke = true;
        break;
      }
      cs[std::size_t(k)] = T(na / rn);
      sn[std::size_t(k)] = na == 0 ? T(1) : (a / T(na)) * conj(c) / T(rn);
      h(k, k) = na == 0 ? T(rn) : (a / T(na)) * T(rn);
      h(k + 1, k) = T(0);
      g[std::size_t(k) + 1] = -conj(sn[std::size_t(k)]) * g[std::size_t(k)];
      g[std::size_t(k)] = cs[std::size_t(k)] * g[std::size_t(k)];
      ++k;
      progress.next();
      stop = progress.record(abs(g[std::size_t(k)])) || progress.exhausted();
      if (!stop && k < m) {
        if (wn == 0) {  // (a lucky breakdown converges above; this is for rounding's sake)
          broke = true;
          break;
        }
        V.push_back(T(1 / wn) * w);
      }
    }
    // y = H^-1 g (upper triangular, k x k), then x += M(V y).
    if (k == 0) return progress.breakdown();
    std::vector<T> y(static_cast<std::size_t>(k));
    for (int i = k - 1; i >= 0; --i) {
      T s = g[std::size_t(i)];
      for (int j = i + 1; j < k; ++j) s -= h(i, j) * y[std::size_t(j)];
      y[std::size_t(i)] = s / h(i, i);
    }
    X correction = y[0] * V[0];
    for (int j = 1; j < k; ++j) correction += y[std::size_t(j)] * V[std::size_t(j)];
    x += detail::apply(M, correction);
    if (broke) return progress.breakdown();
    if (stop) return progress.done();
    // A restart: the true residual, for the recurrence's drifts, in place of the recurrence's.
    r = b - detail::apply(A, x);
    beta = norm(r);
    if (progress.revise(beta)) return progress.done();
  }
}

}  // namespace tshard::solvers
