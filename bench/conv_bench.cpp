// conv2d forward + backward, spatially partitioned: ts::nn::conv2d under ts::ad::vjp with H split
// over the ranks, against the same layer written by hand with MPI + Eigen (halo rows by
// MPI_Sendrecv, the same direct kernel: kw GEMMs of (N x C kh) by (C kh x O) per output pixel
// column; the input gradient's halo rows sent back and added; the weight gradient all-reduced),
// side by side (interleaved medians). 3x3 kernel, Same padding, float; NCHW [N, C, H, W], W whole.
//   mpirun -np 2 ./tshard_bench_conv [--n 8] [--c 64] [--o 64] [--h 64] [--w 64] [--reps 7]
#include <tshard/tshard.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace ts = tshard;
using M = ts::Mesh<"h">;
using Index = Eigen::Index;
using Mat = Eigen::MatrixXf;

// The hand-written layer on this rank's rows [h0, h0 + hl) of the image, W whole.
struct HandConv {
  Index N, C, O, H, W, h0, hl;
  int rank, size;
  std::vector<float> xwin, dwin, y, dy, w, dw, sendbuf, recvbuf;
  std::vector<Mat> wb, dwb;
  HandConv(Index n, Index c, Index o, Index h, Index wd, int r, int p) : N(n), C(c), O(o), H(h), W(wd), rank(r), size(p) {
    const Index chunk = (H + p - 1) / p;
    h0 = std::min(H, r * chunk);
    hl = std::clamp<Index>(H - r * chunk, 0, chunk);
    xwin.assign(std::size_t(N * C * (hl + 2) * (W + 2)), 0.f);
    dwin = xwin;
    y.assign(std::size_t(N * O * hl * W), 0.f);
    dy.assign(y.size(), 1.f);
    for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = float(i % 7) * 0.1f;
    if (hl > 0)
      for (Index i = 0; i < N * C * hl * W; ++i) xwin[std::size_t(at(i % N, (i / N) % C, 1 + (i / (N * C)) % hl, 1 + i / (N * C * hl)))] = float(i % 5) * 0.2f;
    w.assign(std::size_t(O * C * 9), 0.01f);
    dw = w;
    wb.assign(3, Mat(C * 3, O));
    dwb.assign(3, Mat::Zero(C * 3, O));
    sendbuf.resize(std::size_t(N * C * W));
    recvbuf.resize(sendbuf.size());
  }
  Index at(Index n, Index c, Index h, Index x) const { return n + N * (c + C * (h + (hl + 2) * x)); }
  // Row h of the window (all n, c, interior columns) into or out of a contiguous buffer.
  void pack(const std::vector<float>& from, Index h, float* to) const {
    for (Index x = 0; x < W; ++x) std::copy_n(from.data() + at(0, 0, h, x + 1), N * C, to + N * C * x);
  }
  void halo_rows(std::vector<float>& buf, bool add_back) {
    // forward: my first row goes up, my last down; back: the halo rows go to their owners.
    const int up = rank > 0 ? rank - 1 : MPI_PROC_NULL, down = rank + 1 < size && hl > 0 ? rank + 1 : MPI_PROC_NULL;
    const int n = int(N * C * W);
    for (int dir = 0; dir < 2; ++dir) {
      const int to = dir == 0 ? up : down, from = dir == 0 ? down : up;
      const Index send_row = add_back ? (dir == 0 ? 0 : hl + 1) : (dir == 0 ? 1 : hl);
      const Index recv_row = add_back ? (dir == 0 ? hl : 1) : (dir == 0 ? hl + 1 : 0);
      pack(buf, send_row, sendbuf.data());
      MPI_Sendrecv(sendbuf.data(), n, MPI_FLOAT, to, 11, recvbuf.data(), n, MPI_FLOAT, from, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (from == MPI_PROC_NULL) continue;
      for (Index x = 0; x < W; ++x) {
        float* row = buf.data() + at(0, 0, recv_row, x + 1);
        for (Index k = 0; k < N * C; ++k) row[k] = add_back ? row[k] + recvbuf[std::size_t(N * C * x + k)] : recvbuf[std::size_t(N * C * x + k)];
      }
    }
  }
  void step() {
    halo_rows(xwin, false);
    for (Index b = 0; b < 3; ++b)
      for (Index a = 0; a < 3; ++a)
        for (Index c = 0; c < C; ++c)
          for (Index o = 0; o < O; ++o) wb[std::size_t(b)](c + C * a, o) = w[std::size_t(o + O * (c + C * (a + 3 * b)))];
    std::fill(dwin.begin(), dwin.end(), 0.f);
    for (auto& m : dwb) m.setZero();
    for (Index j = 0; j < W; ++j)
      for (Index i = 0; i < hl; ++i) {
        Eigen::Map<Mat> yo(y.data() + N * O * (i + hl * j), N, O);
        Eigen::Map<const Mat> g(dy.data() + N * O * (i + hl * j), N, O);
        yo.setZero();
        for (Index b = 0; b < 3; ++b) {
          const Index off = at(0, 0, i, j + b);
          Eigen::Map<const Mat> xb(xwin.data() + off, N, C * 3);
          yo.noalias() += xb * wb[std::size_t(b)];
          Eigen::Map<Mat>(dwin.data() + off, N, C * 3).noalias() += g * wb[std::size_t(b)].transpose();
          dwb[std::size_t(b)].noalias() += xb.transpose() * g;
        }
      }
    halo_rows(dwin, true);
    for (Index b = 0; b < 3; ++b)
      for (Index a = 0; a < 3; ++a)
        for (Index c = 0; c < C; ++c)
          for (Index o = 0; o < O; ++o) dw[std::size_t(o + O * (c + C * (a + 3 * b)))] = dwb[std::size_t(b)](c + C * a, o);
    MPI_Allreduce(MPI_IN_PLACE, dw.data(), int(dw.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
};

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Index n = 8, c = 64, o = 64, h = 64, wd = 64;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (a == "--n") n = v;
    else if (a == "--c") c = v;
    else if (a == "--o") o = v;
    else if (a == "--h") h = v;
    else if (a == "--w") wd = v;
    else if (a == "--reps") reps = int(v);
  }
  M mesh({-1});
  using Image = ts::Spec<ts::R, ts::R, ts::S<"h">, ts::R>;
  auto x = ts::random<float, Image>(mesh, {n, c, h, wd}, 1);
  auto w = ts::random<float, ts::Spec<ts::R, ts::R, ts::R, ts::R>>(mesh, {o, c, 3, 3}, 2) * 0.1f;
  auto dy = ts::random<float, Image>(mesh, {n, o, h, wd}, 3);
  HandConv hand(n, c, o, h, wd, mesh.rank(), mesh.size());
  auto ours = [&] {
    auto [y, pullback] = ts::ad::vjp([](const auto& xv, const auto& wv) { return ts::nn::conv2d(xv, wv); }, x, w);
    auto [dx, dw] = pullback(dy);
    (void)dx;
    (void)dw;
  };
  const auto t = tshard_bench::interleaved({[&] { hand.step(); }, ours}, reps);
  const double flops = 3 * 2.0 * double(n * o * h * wd) * double(c * 9);  // forward, input and weight gradients
  if (mesh.rank() == 0) {
    std::printf("conv2d 3x3 forward + backward, [%ld, %ld, %ld, %ld] -> %ld channels, H split over %d ranks, float, medians of %d\n",
                long(n), long(c), long(h), long(wd), long(o), mesh.size(), reps);
    std::printf("hand-written MPI + Eigen: %.2f ms (%.1f GFLOP/s); tshard ts::nn::conv2d under ts::ad::vjp: %.2f ms (%.1f GFLOP/s); "
                "ratio %.2f\n",
                1e3 * t[0], flops / t[0] / 1e9, 1e3 * t[1], flops / t[1] / 1e9, t[1] / t[0]);
    std::printf("reproduce: bash bench/run_conv.sh --n %ld --c %ld --o %ld --h %ld --w %ld --reps %d\n", long(n), long(c), long(o),
                long(h), long(wd), reps);
  }
  return 0;
}
