// Matrix products at BLAS speed: tshard::matmul against what an HPC code would write by hand
// (MPI + BLAS, buffers allocated once) and against ScaLAPACK's p?gemm on a 1 x P grid, as
// Debian ships it (PBLAS k-panel PILAENV = 32) and with the panel raised to 256.
//
//   bash bench/run_matmul.sh [--n 2048] [--reps 7]        (2 ranks)
//
// Runs interleave the variants (A B C A B C ...), each preceded by a barrier; a sample is the
// slowest rank's time; figures are medians. Ratios > 1 mean tshard is slower.
#include <tshard/tshard.hpp>

#include <algorithm>
#include <cblas.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace ts = tshard;
using tshard_bench::blas_kernels;
using tshard_bench::interleaved;
using tshard_bench::world_rank;
using tshard_bench::world_size;

// ScaLAPACK and BLACS, C interfaces as Debian's libscalapack-openmpi exports them.
extern "C" {
void Cblacs_pinfo(int* me, int* procs);
void Cblacs_get(int ctxt, int what, int* val);
void Cblacs_gridinit(int* ctxt, const char* order, int rows, int cols);
void Cblacs_gridinfo(int ctxt, int* rows, int* cols, int* row, int* col);
void Cblacs_gridexit(int ctxt);
int numroc_(const int* n, const int* nb, const int* iproc, const int* isrc, const int* nprocs);
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb, const int* irsrc,
               const int* icsrc, const int* ctxt, const int* lld, int* info);
void pdgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
             const double* a, const int* ia, const int* ja, const int* desca, const double* b, const int* ib,
             const int* jb, const int* descb, const double* beta, double* c, const int* ic, const int* jc,
             const int* descc);
void psgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
             const float* a, const int* ia, const int* ja, const int* desca, const float* b, const int* ib,
             const int* jb, const int* descb, const float* beta, float* c, const int* ic, const int* jc,
             const int* descc);
// The PBLAS panel width. Defined here so the run can set it: 32 is the reference value Debian
// ships, 256 what tuned builds use.
int g_pilaenv = 32;
int pilaenv_(int*, char*) { return g_pilaenv; }
}

namespace {

template <class T>
void blas_gemm(int m, int n, int k, const T* a, int lda, const T* b, int ldb, T* c, int ldc, T beta = T(0)) {
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}

template <class T>
MPI_Datatype mpi_type() {
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}

template <class T>
void p_gemm(int n, const T* a, const int* da, const T* b, const int* db, T* c, const int* dc) {
  const int one = 1;
  const T alpha = 1, beta = 0;
  if constexpr (std::is_same_v<T, float>)
    psgemm_("N", "N", &n, &n, &n, &alpha, a, &one, &one, da, b, &one, &one, db, &beta, c, &one, &one, dc);
  else
    pdgemm_("N", "N", &n, &n, &n, &alpha, a, &one, &one, da, b, &one, &one, db, &beta, c, &one, &one, dc);
}

void line(const char* what, int n, const char* type, double gflop, double t_ts, double t_ref, const char* ref) {
  if (world_rank() == 0)
    std::printf("%-34s n=%-5d %-6s tshard %8.1f GFLOP/s  %-22s %8.1f GFLOP/s  ratio(time) %.3f\n", what, n, type,
                gflop / t_ts, ref, gflop / t_ref, t_ts / t_ref);
}

template <class T>
void run(int n, int reps) {
  const char* type = std::is_same_v<T, float> ? "fp32" : "fp64";
  const int p = world_size(), me = world_rank();
  const double gflop = 2.0 * double(n) * n * n * 1e-9;
  using M = ts::Mesh<"x">;
  M mesh({-1});
  const Eigen::Index N = n;

  // ---- local: one rank's ts::matmul against one BLAS call on the same data ----
  {
    ts::Mesh<"x"> self(MPI_COMM_SELF, {1});
    auto a = ts::random<T, ts::Spec<ts::R, ts::R>>(self, {N, N}, 1);
    auto b = ts::random<T, ts::Spec<ts::R, ts::R>>(self, {N, N}, 2);
    std::vector<T> c(std::size_t(n) * n);
    auto t = interleaved({[&] { auto r = ts::matmul(a, b); }, [&] { blas_gemm<T>(n, n, n, a.data(), n, b.data(), n, c.data(), n); }},
                         reps);
    line("local matmul (every rank alone)", n, type, gflop, t[0], t[1], "BLAS gemm");
  }
  if (p == 1) return;
  const int b = (n + p - 1) / p;  // rows/cols per rank (n divisible by p here)

  // ---- row split: a {x, R}, w {R, x} -> {x, R}: all-gather w, local product ----
  {
    auto a = ts::random<T, ts::Spec<ts::S<"x">, ts::R>>(mesh, {N, N}, 1);
    auto w = ts::random<T, ts::Spec<ts::R, ts::S<"x">>>(mesh, {N, N}, 2);
    std::vector<T> wfull(std::size_t(n) * b * p), c(std::size_t(b) * n), ring0(std::size_t(n) * b), ring1(std::size_t(n) * b);
    auto hand_gather = [&] {
      MPI_Allgather(w.data(), n * b, mpi_type<T>(), wfull.data(), n * b, mpi_type<T>(), MPI_COMM_WORLD);
      blas_gemm<T>(b, n, n, a.data(), b, wfull.data(), n, c.data(), b);
    };
    auto hand_ring = [&] {  // the windowed algorithm by hand: rotate w's column blocks, overlap
      std::copy(w.data(), w.data() + std::size_t(n) * b, ring0.data());
      T* cur = ring0.data();
      T* next = ring1.data();
      for (int s = 0; s < p; ++s) {
        MPI_Request rq[2];
        if (s + 1 < p) {
          MPI_Irecv(next, n * b, mpi_type<T>(), (me + 1) % p, 9, MPI_COMM_WORLD, &rq[0]);
          MPI_Isend(cur, n * b, mpi_type<T>(), (me - 1 + p) % p, 9, MPI_COMM_WORLD, &rq[1]);
        }
        const int q = (me + s) % p;
        blas_gemm<T>(b, b, n, a.data(), b, cur, n, c.data() + std::size_t(q) * b * b, b);
        if (s + 1 < p) MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
        std::swap(cur, next);
      }
    };
    auto t = interleaved({[&] { auto r = ts::matmul(a, w, ts::EinsumStrategy::GatherRight); }, hand_gather,
                          [&] { auto r = ts::matmul(a, w, ts::EinsumStrategy::Windowed); }, hand_ring},
                         reps);
    line("row split + all-gather", n, type, gflop, t[0], t[1], "hand MPI+BLAS");
    line("windowed (ring, overlapped)", n, type, gflop, t[2], t[3], "hand ring MPI+BLAS");
  }

  // ---- contracting split: a {R, x}, w {x, R} -> partial, all-reduced ----
  {
    auto a = ts::random<T, ts::Spec<ts::R, ts::S<"x">>>(mesh, {N, N}, 1);
    auto w = ts::random<T, ts::Spec<ts::S<"x">, ts::R>>(mesh, {N, N}, 2);
    std::vector<T> c(std::size_t(n) * n);
    auto hand = [&] {
      blas_gemm<T>(n, n, b, a.data(), n, w.data(), b, c.data(), n);
      MPI_Allreduce(MPI_IN_PLACE, c.data(), n * n, mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    };
    auto t = interleaved({[&] { auto r = ts::reshard<ts::Spec<ts::R, ts::R>>(ts::matmul(a, w)); }, hand}, reps);
    line("contracting split + all-reduce", n, type, gflop, t[0], t[1], "hand MPI+BLAS");
  }

  // ---- ScaLAPACK p?gemm on a 1 x P grid, block-cyclic with nb = n/P (one block per rank) ----
  {
    int ctxt = 0;
    Cblacs_get(0, 0, &ctxt);
    Cblacs_gridinit(&ctxt, "Row", 1, p);
    const int zero = 0, nb = b, lld = n;
    int info = 0, da[9], db[9], dc[9];
    const int cols = numroc_(&n, &nb, &me, &zero, &p);
    descinit_(da, &n, &n, &n, &nb, &zero, &zero, &ctxt, &lld, &info);
    descinit_(db, &n, &n, &n, &nb, &zero, &zero, &ctxt, &lld, &info);
    descinit_(dc, &n, &n, &n, &nb, &zero, &zero, &ctxt, &lld, &info);
    std::vector<T> sa(std::size_t(n) * cols, T(0.5)), sb(std::size_t(n) * cols, T(0.25)), sc(std::size_t(n) * cols);
    auto a = ts::random<T, ts::Spec<ts::S<"x">, ts::R>>(mesh, {N, N}, 1);
    auto w = ts::random<T, ts::Spec<ts::R, ts::S<"x">>>(mesh, {N, N}, 2);
    auto best = [&] { auto r = ts::matmul(a, w); };
    g_pilaenv = 32;
    auto t32 = interleaved({best, [&] { p_gemm<T>(n, sa.data(), da, sb.data(), db, sc.data(), dc); }}, reps);
    g_pilaenv = 256;
    auto t256 = interleaved({best, [&] { p_gemm<T>(n, sa.data(), da, sb.data(), db, sc.data(), dc); }}, reps);
    line("tshard matmul (auto) vs p?gemm", n, type, gflop, t32[0], t32[1], "ScaLAPACK PILAENV 32");
    line("tshard matmul (auto) vs p?gemm", n, type, gflop, t256[0], t256[1], "ScaLAPACK PILAENV 256");
    Cblacs_gridexit(ctxt);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  int n = 2048, reps = 7;
  std::string types = "both";
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--n")) n = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(5, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--type")) types = argv[i + 1];
  }
  if (n % world_size() != 0) {
    if (world_rank() == 0) std::fprintf(stderr, "--n must be divisible by the rank count\n");
    return 1;
  }
  if (world_rank() == 0)
    std::printf("matmul benchmark, %d ranks, n = %d, median of %d interleaved runs (BLAS: %s)\n",
                world_size(), n, reps, blas_kernels());
  if (types != "fp32") run<double>(n, reps);
  if (types != "fp64") run<float>(n, reps);
  return 0;
}
