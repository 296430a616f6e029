// Model code at hand-written speed: one Megatron MLP training step (forward, backward, SGD) written
// with tshard's public API as a user writes it, against the same step written by hand with
// cblas_sgemm (transpose flags, no copies) and MPI_Allreduce, buffers allocated once; then each
// 2-D product orientation of the step's shapes alone (tshard einsum against the matching sgemm),
// and the machine's GEMM peak (sgemm n=4096 on every rank at once) measured in the same run.
//
//   bash bench/run_mlp_step.sh [--B 256] [--D 1024] [--H 4096] [--reps 7] [--steps 3] [--peak-n 4096]
//
// The step (Megatron-LM, Shoeybi et al. 2019, section 3): x [B, D] {data, R}, W1 [D, H] {R, model},
// W2 [H, D] {model, R}, t [B, D] {data, R}; h = x W1, a = relu(h), y = a W2 (a partial sum over
// model, all-reduced where y - t needs it), loss = mean((y - t)^2); backward with the all-reduce
// of dx over model and of dW1, dW2 over data; SGD. Runs on the meshes {data, model} = {1, P} and
// {P, 1}. Samples are the slowest rank's time after a barrier, variants interleaved, figures are
// medians; GFLOP/s count 2*M*N*K per GEMM over all ranks. Ratios > 1 mean tshard is slower.
// A fourth variant writes the step with nn layers, forward only (Linear, relu, an SGD owning the
// module; the gradients derived).
#include <tshard/tshard.hpp>

#include <algorithm>
#include <cblas.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench_support.hpp"

namespace ts = tshard;
using tshard_bench::all_ranks;
using tshard_bench::blas_kernels;
using tshard_bench::interleaved;
using tshard_bench::time_once;
using tshard_bench::world_rank;
using tshard_bench::world_size;

namespace {

using M = ts::Mesh<"data", "model">;
using Rows = ts::Spec<ts::S<"data">, ts::R>;     // x, t, y, dx: the batch split over data
using ColSplit = ts::Spec<ts::R, ts::S<"model">>;  // W1 [D, H]: column-parallel
using RowSplit = ts::Spec<ts::S<"model">, ts::R>;  // W2 [H, D]: row-parallel
template <class S>
using Tensor = ts::ShardedTensor<float, M, S>;

struct Options {
  int B = 256, D = 1024, H = 4096, reps = 7, steps = 3, peak_n = 4096;
  float lr = 0.5f;
};

bool root() { return world_rank() == 0; }

// Reproducible values in [-scale, scale) from (seed, i, j): the same on every rank and layout.
float uniform(std::uint64_t seed, Eigen::Index i, Eigen::Index j, float scale) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ (std::uint64_t(i) * 0xBF58476D1CE4E5B9ull) ^
                    (std::uint64_t(j) * 0x94D049BB133111EBull + 0x2545F4914F6CDD1Dull);
  z ^= z >> 31;
  z *= 0x7FB5D329728EA185ull;
  z ^= z >> 27;
  z *= 0x81DADEF4BC2DD44Dull;
  z ^= z >> 33;
  return (float(z >> 40) * 0x1.0p-24f * 2.f - 1.f) * scale;
}

template <class S>
Tensor<S> init(const M& mesh, Eigen::Index rows, Eigen::Index cols, std::uint64_t seed, float scale) {
  return ts::from_function<float, S>(mesh, {rows, cols},
                                     [=](std::array<Eigen::Index, 2> i) { return uniform(seed, i[0], i[1], scale); });
}

// ---- the step as model code writes it with tshard; returns the loss (the same on every rank) ----
// With move_grads the gradients, not needed after the update, are moved into it: a partial sum
// that expires is all-reduced in its own buffer instead of into a copy.
float tshard_step(const Tensor<Rows>& x, const Tensor<Rows>& t, Tensor<ColSplit>& w1, Tensor<RowSplit>& w2, float lr,
                  bool move_grads = false) {
  const auto [B, D] = x.global_shape();
  const float n = float(B) * float(D);
  auto h = ts::einsum<"bd,dh->bh">(x, w1);
  auto a = ts::relu(h);
  auto y = ts::einsum<"bh,hd->bd">(a, w2);  // a partial sum over model
  auto diff = y - t;                         // resolves it: Megatron's forward all-reduce
  const float loss = ts::sum<0, 1>(diff * diff).gather()() / n;
  auto dy = (2.f / n) * diff;
  auto dw2 = ts::einsum<"bh,bd->hd">(a, dy);  // a partial sum over data
  auto da = ts::einsum<"bd,hd->bh">(dy, w2);
  auto dh = ts::map([](float hv, float g) { return hv > 0.f ? g : 0.f; }, h, da);
  auto dw1 = ts::einsum<"bd,bh->dh">(x, dh);                       // a partial sum over data
  auto dx = ts::reshard<Rows>(ts::einsum<"bh,dh->bd">(dh, w1));  // Megatron's backward all-reduce
  if (move_grads) {
    w1 -= lr * std::move(dw1);
    w2 -= lr * std::move(dw2);
  } else {
    w1 -= lr * dw1;  // the data-parallel gradient sums are resolved here
    w2 -= lr * dw2;
  }
  return loss;
}

// ---- the same step written with the nn layer: two Linear layers without bias (column- and
// row-parallel by their weight specs), relu, forward only (ts::ad derives the backward), SGD
// owning the module (bucketed data-parallel gradient reduction started as each layer's
// gradients are final) ----
struct LayerMlp : ts::nn::Module {
  ts::nn::Linear<float, M, ColSplit> fc1;
  ts::nn::Linear<float, M, RowSplit> fc2;
  ts::nn::SGD opt;
  LayerMlp(const M& mesh, const Tensor<ColSplit>& w1, const Tensor<RowSplit>& w2, float lr, bool overlap)
      : fc1(mesh, w1.global_shape()[0], w1.global_shape()[1], 1, false),
        fc2(mesh, w2.global_shape()[0], w2.global_shape()[1], 2, false),
        opt({.lr = lr, .overlap = overlap}) {
    fc1.weight() = w1;
    fc2.weight() = w2;
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    opt.add(*this);
  }
  float step(const Tensor<Rows>& x, const Tensor<Rows>& t) {
    const auto [B, D] = x.global_shape();
    const float scale = 1.f / (float(B) * float(D));
    opt.zero_grad();
    const double loss = ts::ad::backward(*this, [&] {
      auto diff = fc2(ts::relu(fc1(x))) - t;  // the partial over model resolved: the forward all-reduce
      return ts::sum<0, 1>(diff * diff) * scale;
    });
    opt.step();
    return float(loss);
  }
};

// What each product of the step does on this mesh (explain_einsum), printed once per mesh.
void explain_step(const Tensor<Rows>& x, const Tensor<Rows>& t, const Tensor<ColSplit>& w1, const Tensor<RowSplit>& w2) {
  auto h = ts::einsum<"bd,dh->bh">(x, w1);
  auto a = ts::relu(h);
  auto dy = ts::einsum<"bh,hd->bd">(a, w2) - t;
  auto dh = a;
  std::vector<std::string> lines = {
      "  h  = bd,dh->bh: " + ts::explain_einsum<"bd,dh->bh">(x, w1),
      "  y  = bh,hd->bd: " + ts::explain_einsum<"bh,hd->bd">(a, w2),
      "  dW2= bh,bd->hd: " + ts::explain_einsum<"bh,bd->hd">(a, dy),
      "  da = bd,hd->bh: " + ts::explain_einsum<"bd,hd->bh">(dy, w2),
      "  dW1= bd,bh->dh: " + ts::explain_einsum<"bd,bh->dh">(x, dh),
      "  dx = bh,dh->bd: " + ts::explain_einsum<"bh,dh->bd">(dh, w1)};
  if (root())
    for (auto& l : lines) std::printf("%s\n", l.c_str());
}

// ---- the same step by hand: cblas_sgemm with transpose flags on the shards, MPI_Allreduce ----
class HandMlp {
 public:
  // Shards of the {data, model} mesh: b = B/dp rows of x, h = H/mp columns of W1 (rows of W2).
  HandMlp(const Options& o, int dp, int mp, int data_coord, int model_coord)
      : B_(o.B), D_(o.D), b_(o.B / dp), h_(o.H / mp), dp_(dp), mp_(mp) {
    MPI_Comm_split(MPI_COMM_WORLD, model_coord, data_coord, &data_comm_);  // ranks of one model coord
    MPI_Comm_split(MPI_COMM_WORLD, data_coord, model_coord, &model_comm_);
    const auto bd = std::size_t(b_) * D_, bh = std::size_t(b_) * h_, dh = std::size_t(D_) * h_;
    w1.resize(dh), w2.resize(dh), dw1_.resize(dh), dw2_.resize(dh);
    act_.resize(bh), da_.resize(bh), y_.resize(bd), dy_.resize(bd), dx_.resize(bd);
  }
  HandMlp(const HandMlp&) = delete;
  HandMlp& operator=(const HandMlp&) = delete;
  ~HandMlp() {
    MPI_Comm_free(&data_comm_);
    MPI_Comm_free(&model_comm_);
  }

  // x, t: [b, D] column-major (ld b). Returns the loss, the same on every rank.
  float step(const float* x, const float* t, float lr) {
    const int b = b_, D = D_, h = h_;
    const auto CM = CblasColMajor;
    const auto N = CblasNoTrans, T = CblasTrans;
    float* a = act_.data();
    cblas_sgemm(CM, N, N, b, h, D, 1.f, x, b, w1.data(), D, 0.f, a, b);  // h = x W1
    for (std::size_t i = 0; i < act_.size(); ++i) a[i] = std::max(a[i], 0.f);  // a = relu(h), in place
    cblas_sgemm(CM, N, N, b, D, h, 1.f, a, b, w2.data(), h, 0.f, y_.data(), b);  // y = a W2, partial
    if (mp_ > 1) MPI_Allreduce(MPI_IN_PLACE, y_.data(), b * D, MPI_FLOAT, MPI_SUM, model_comm_);
    const float n = float(B_) * float(D_), scale = 2.f / n;
    double sq = 0;  // loss and dy in one pass
    for (std::size_t i = 0; i < y_.size(); ++i) {
      const float d = y_[i] - t[i];
      sq += double(d) * d;
      dy_[i] = scale * d;
    }
    if (dp_ > 1) MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, data_comm_);
    cblas_sgemm(CM, T, N, h, D, b, 1.f, a, b, dy_.data(), b, 0.f, dw2_.data(), h);          // dW2 = a^T dy
    cblas_sgemm(CM, N, T, b, h, D, 1.f, dy_.data(), b, w2.data(), h, 0.f, da_.data(), b);  // da = dy W2^T
    for (std::size_t i = 0; i < da_.size(); ++i) da_[i] = a[i] > 0.f ? da_[i] : 0.f;       // dh, in place
    cblas_sgemm(CM, T, N, D, h, b, 1.f, x, b, da_.data(), b, 0.f, dw1_.data(), D);         // dW1 = x^T dh
    cblas_sgemm(CM, N, T, b, D, h, 1.f, da_.data(), b, w1.data(), D, 0.f, dx_.data(), b);  // dx = dh W1^T
    if (mp_ > 1) MPI_Allreduce(MPI_IN_PLACE, dx_.data(), b * D, MPI_FLOAT, MPI_SUM, model_comm_);
    if (dp_ > 1) {
      MPI_Allreduce(MPI_IN_PLACE, dw1_.data(), int(dw1_.size()), MPI_FLOAT, MPI_SUM, data_comm_);
      MPI_Allreduce(MPI_IN_PLACE, dw2_.data(), int(dw2_.size()), MPI_FLOAT, MPI_SUM, data_comm_);
    }
    cblas_saxpy(int(w1.size()), -lr, dw1_.data(), 1, w1.data(), 1);
    cblas_saxpy(int(w2.size()), -lr, dw2_.data(), 1, w2.data(), 1);
    return float(sq / n);
  }

  // Bytes each rank sends per step, by comm_stats' convention (all-reduce of n bytes over p
  // ranks: 2n(p-1)/p), and the number of all-reduces.
  double bytes_per_step(int& calls) const {
    auto ar = [](double bytes, int p) { return p > 1 ? 2 * bytes * (p - 1) / p : 0.0; };
    calls = (mp_ > 1 ? 2 : 0) + (dp_ > 1 ? 3 : 0);
    return 2 * ar(4.0 * b_ * D_, mp_) + ar(8.0, dp_) + 2 * ar(4.0 * D_ * h_, dp_);
  }

  std::vector<float> w1, w2;  // [D, h] and [h, D], column-major

 private:
  int B_, D_, b_, h_, dp_, mp_;
  MPI_Comm data_comm_ = MPI_COMM_NULL, model_comm_ = MPI_COMM_NULL;
  std::vector<float> act_, da_, y_, dy_, dx_, dw1_, dw2_;
};

// max |a - b| / max |b|
double rel_diff(const Eigen::Tensor<float, 2>& a, const Eigen::Tensor<float, 2>& b) {
  double num = 0, den = 0;
  for (Eigen::Index i = 0; i < b.size(); ++i) {
    num = std::max(num, double(std::abs(a.data()[i] - b.data()[i])));
    den = std::max(den, double(std::abs(b.data()[i])));
  }
  return den > 0 ? num / den : num;
}

constexpr double kTolerance = 1e-3;

// Every rank runs sgemm n x n x n at once: the machine's GEMM throughput, summed over ranks.
double measure_peak(int n, int reps) {
  std::vector<float> a(std::size_t(n) * n), b(std::size_t(n) * n), c(std::size_t(n) * n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = uniform(1, Eigen::Index(i), 0, 1.f), b[i] = uniform(2, Eigen::Index(i), 0, 1.f);
  auto gemm = [&] { cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); };
  const double t = interleaved({gemm}, std::max(3, std::min(reps, 5)), 1)[0];
  return world_size() * 2.0 * double(n) * n * n * 1e-9 / t;
}

struct Ratio {
  std::string what;
  double value;
};

// One mesh: correctness of the tshard step against the hand-written one, then interleaved timing.
bool run_mesh(const Options& o, int dp, int mp, double peak, std::vector<Ratio>& ratios) {
  M mesh({dp, mp});
  const Eigen::Index B = o.B, D = o.D, H = o.H;
  auto x = init<Rows>(mesh, B, D, 11, 1.f);
  auto t = init<Rows>(mesh, B, D, 12, 1.f);
  auto w1 = init<ColSplit>(mesh, D, H, 13, 1.f / std::sqrt(float(D)));
  auto w2 = init<RowSplit>(mesh, H, D, 14, 1.f / std::sqrt(float(H)));
  const std::string name = "{data, model} = {" + std::to_string(dp) + ", " + std::to_string(mp) + "}";
  if (root()) std::printf("\n== MLP step, mesh %s: x %s, W1 %s, W2 %s\n", name.c_str(), x.describe().c_str(),
                          w1.describe().c_str(), w2.describe().c_str());
  explain_step(x, t, w1, w2);

  // The hand-written variant starts from the same shards (dims divide evenly: no padding).
  HandMlp hand(o, dp, mp, mesh.coord<"data">(), mesh.coord<"model">());
  const Tensor<ColSplit>& cw1 = w1;
  const Tensor<RowSplit>& cw2 = w2;
  std::copy(cw1.data(), cw1.data() + hand.w1.size(), hand.w1.begin());
  std::copy(cw2.data(), cw2.data() + hand.w2.size(), hand.w2.begin());
  const Tensor<Rows>& cx = x;
  const Tensor<Rows>& ct = t;
  const float* x_local = cx.data();
  const float* t_local = ct.data();

  LayerMlp layers(mesh, w1, w2, o.lr, false), layers_overlapped(mesh, w1, w2, o.lr, true);
  // ---- correctness: a few steps of both from the same weights ----
  const Eigen::Tensor<float, 2> w1_0 = w1.gather(), w2_0 = w2.gather();
  double worst_loss = 0;
  std::string losses;
  for (int s = 0; s < o.steps; ++s) {
    const float lt = tshard_step(x, t, w1, w2, o.lr);
    const float lh = hand.step(x_local, t_local, o.lr);
    const float ll = layers.step(x, t);
    worst_loss = std::max(worst_loss, std::abs(double(lt) - lh) / std::max(1e-30, std::abs(double(lh))));
    worst_loss = std::max(worst_loss, std::abs(double(ll) - lh) / std::max(1e-30, std::abs(double(lh))));
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%.6g/%.6g", s ? " " : "", lt, lh);
    losses += buf;
  }
  auto hw1 = ts::from_local<ColSplit>(mesh, {D, H}, hand.w1.data()).gather();
  auto hw2 = ts::from_local<RowSplit>(mesh, {H, D}, hand.w2.data()).gather();
  const Eigen::Tensor<float, 2> tw1 = w1.gather(), tw2 = w2.gather();
  const Eigen::Tensor<float, 2> lw1 = layers.fc1.weight().gather(), lw2 = layers.fc2.weight().gather();
  const double d1 = std::max(rel_diff(tw1, hw1), rel_diff(lw1, hw1)), d2 = std::max(rel_diff(tw2, hw2), rel_diff(lw2, hw2));
  const Eigen::Tensor<float, 2> tu1 = tw1 - w1_0, hu1 = hw1 - w1_0, tu2 = tw2 - w2_0, hu2 = hw2 - w2_0;
  const double u1 = rel_diff(tu1, hu1), u2 = rel_diff(tu2, hu2);
  const bool ok = all_ranks(worst_loss <= kTolerance && d1 <= kTolerance && d2 <= kTolerance && u1 <= kTolerance &&
                            u2 <= kTolerance && std::isfinite(worst_loss));
  if (root())
    std::printf("check (%d steps, lr %g): losses tshard/hand %s; rel diff loss %.2e, W1 %.2e, W2 %.2e, "
                "W1 update %.2e, W2 update %.2e (tolerance %.0e): %s\n",
                o.steps, o.lr, losses.c_str(), worst_loss, d1, d2, u1, u2, kTolerance, ok ? "PASSED" : "FAILED");
  if (!ok) return false;

  // ---- what one warm step communicates and allocates ----
  tshard_step(x, t, w1, w2, o.lr);
  ts::reset_comm_stats();
  const auto fresh = ts::pool_stats().fresh_allocations;
  tshard_step(x, t, w1, w2, o.lr);
  const auto fresh_after = ts::pool_stats().fresh_allocations;
  const auto total = ts::comm_stats().total();
  int hand_calls = 0;
  const double hand_bytes = hand.bytes_per_step(hand_calls);
  if (root()) {
    std::printf("per step and rank: tshard %llu collective calls, %.3f MB sent; hand %d all-reduces, %.3f MB sent; "
                "tshard fresh pool allocations in a warm step: %llu\n",
                (unsigned long long)total.calls, total.bytes_sent * 1e-6, hand_calls, hand_bytes * 1e-6,
                (unsigned long long)(fresh_after - fresh));
    std::printf("%s", ts::comm_stats().report().c_str());
  }

  // ---- timing ----
  auto tm = interleaved({[&] { tshard_step(x, t, w1, w2, o.lr); }, [&] { hand.step(x_local, t_local, o.lr); },
                         [&] { tshard_step(x, t, w1, w2, o.lr, true); }, [&] { layers.step(x, t); }, [&] { layers_overlapped.step(x, t); }},
                        o.reps);
  const double gflop = 6 * 2.0 * double(B) * D * H * 1e-9;
  if (root()) {
    std::printf("step %s: tshard %8.2f ms %7.1f GFLOP/s (%4.1f %% of peak) | hand %8.2f ms %7.1f GFLOP/s (%4.1f %% of peak) "
                "| ratio tshard/hand %.3f\n",
                name.c_str(), tm[0] * 1e3, gflop / tm[0], 100 * gflop / tm[0] / peak, tm[1] * 1e3, gflop / tm[1],
                100 * gflop / tm[1] / peak, tm[0] / tm[1]);
    std::printf("step %s, gradients moved into the update (w -= lr * std::move(g)): tshard %8.2f ms %7.1f GFLOP/s "
                "(%4.1f %% of peak) | ratio tshard/hand %.3f\n",
                name.c_str(), tm[2] * 1e3, gflop / tm[2], 100 * gflop / tm[2] / peak, tm[2] / tm[1]);
  }
  if (root())
    std::printf("step %s with nn layers (Linear, relu, derived backward, SGD owning them): tshard %8.2f ms %7.1f GFLOP/s "
                "(%4.1f %% of peak) | ratio tshard/hand %.3f\n",
                name.c_str(), tm[3] * 1e3, gflop / tm[3], 100 * gflop / tm[3] / peak, tm[3] / tm[1]);
  if (root())
    std::printf("step %s with nn layers, gradient reduction overlapped with backward: tshard %8.2f ms %7.1f GFLOP/s "
                "(%4.1f %% of peak) | ratio tshard/hand %.3f\n",
                name.c_str(), tm[4] * 1e3, gflop / tm[4], 100 * gflop / tm[4] / peak, tm[4] / tm[1]);
  ratios.push_back({"step " + name, tm[0] / tm[1]});
  ratios.push_back({"step with nn layers " + name, tm[3] / tm[1]});
  ratios.push_back({"step with nn layers, overlapped " + name, tm[4] / tm[1]});
  ratios.push_back({"step (moved grads) " + name, tm[2] / tm[1]});
  return true;
}

// Each 2-D product orientation alone, the batch dim split over data (a local product on every
// rank), tshard einsum against cblas_sgemm with the matching flags on the same shards.
bool run_orientations(const Options& o, double peak, std::vector<Ratio>& ratios) {
  M mesh({-1, 1});
  const int p = world_size(), b = o.B / p, D = o.D, H = o.H;
  const Eigen::Index B = o.B;
  auto x_bd = init<Rows>(mesh, B, D, 21, 1.f);
  auto x_db = init<ts::Spec<ts::R, ts::S<"data">>>(mesh, D, B, 22, 1.f);
  auto w_dh = init<ts::Spec<ts::R, ts::R>>(mesh, D, H, 23, 1.f);
  auto w_hd = init<ts::Spec<ts::R, ts::R>>(mesh, H, D, 24, 1.f);
  const float* xbd = std::as_const(x_bd).data();
  const float* xdb = std::as_const(x_db).data();
  const float* wdh = std::as_const(w_dh).data();
  const float* whd = std::as_const(w_hd).data();
  std::vector<float> c(std::size_t(b) * H);
  const auto CM = CblasColMajor;
  const auto N = CblasNoTrans, T = CblasTrans;
  constexpr int kInner = 6;  // products per sample, as many as in one step

  struct Case {
    std::string name, explain;
    std::function<const float*()> ts_once;  // runs the product once, returns its local result
    std::function<void()> hand_once;
  };
  // Results are kept so the check below can read them.
  ts::ShardedTensor<float, M, ts::Spec<ts::S<"data">, ts::R>> r_bh(mesh, {B, Eigen::Index(H)});
  ts::ShardedTensor<float, M, ts::Spec<ts::R, ts::S<"data">>> r_hb(mesh, {Eigen::Index(H), B});
  std::vector<Case> cases = {
      {"bd,dh->bh NN", ts::explain_einsum<"bd,dh->bh">(x_bd, w_dh),
       [&] { r_bh = ts::einsum<"bd,dh->bh">(x_bd, w_dh); return std::as_const(r_bh).data(); },
       [&] { cblas_sgemm(CM, N, N, b, H, D, 1.f, xbd, b, wdh, D, 0.f, c.data(), b); }},
      {"bd,hd->bh NT", ts::explain_einsum<"bd,hd->bh">(x_bd, w_hd),
       [&] { r_bh = ts::einsum<"bd,hd->bh">(x_bd, w_hd); return std::as_const(r_bh).data(); },
       [&] { cblas_sgemm(CM, N, T, b, H, D, 1.f, xbd, b, whd, H, 0.f, c.data(), b); }},
      {"db,dh->bh TN", ts::explain_einsum<"db,dh->bh">(x_db, w_dh),
       [&] { r_bh = ts::einsum<"db,dh->bh">(x_db, w_dh); return std::as_const(r_bh).data(); },
       [&] { cblas_sgemm(CM, T, N, b, H, D, 1.f, xdb, D, wdh, D, 0.f, c.data(), b); }},
      {"db,hd->bh TT", ts::explain_einsum<"db,hd->bh">(x_db, w_hd),
       [&] { r_bh = ts::einsum<"db,hd->bh">(x_db, w_hd); return std::as_const(r_bh).data(); },
       [&] { cblas_sgemm(CM, T, T, b, H, D, 1.f, xdb, D, whd, H, 0.f, c.data(), b); }},
      {"bd,dh->hb out^T", ts::explain_einsum<"bd,dh->hb">(x_bd, w_dh),
       [&] { r_hb = ts::einsum<"bd,dh->hb">(x_bd, w_dh); return std::as_const(r_hb).data(); },
       [&] { cblas_sgemm(CM, T, T, H, b, D, 1.f, wdh, D, xbd, b, 0.f, c.data(), H); }},
  };
  if (root()) std::printf("\n== product orientations, mesh {data, model} = {%d, 1}, [B, D] x [D, H] with B split over data\n", p);
  // Check each against its sgemm (the same local product: results should agree to rounding).
  bool ok = true;
  for (auto& k : cases) {
    const float* r = k.ts_once();
    k.hand_once();
    double num = 0, den = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      num = std::max(num, double(std::abs(r[i] - c[i])));
      den = std::max(den, double(std::abs(c[i])));
    }
    const bool good = all_ranks(num <= kTolerance * den);
    ok &= good;
    if (root()) std::printf("  %-16s check %s (rel diff %.1e); %s\n", k.name.c_str(), good ? "PASSED" : "FAILED", num / den, k.explain.c_str());
  }
  if (!ok) return false;
  std::vector<std::function<void()>> fs;
  for (auto& k : cases) {
    fs.push_back([&k] { for (int i = 0; i < kInner; ++i) k.ts_once(); });
    fs.push_back([&k] { for (int i = 0; i < kInner; ++i) k.hand_once(); });
  }
  const auto tm = interleaved(fs, o.reps);
  const double gflop = kInner * 2.0 * double(B) * D * H * 1e-9;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const double tt = tm[2 * i], th = tm[2 * i + 1];
    if (root())
      std::printf("  %-16s tshard %7.1f GFLOP/s (%4.1f %% of peak) | sgemm %7.1f GFLOP/s (%4.1f %% of peak) | ratio tshard/hand %.3f\n",
                  cases[i].name.c_str(), gflop / tt, 100 * gflop / tt / peak, gflop / th, 100 * gflop / th / peak, tt / th);
    ratios.push_back({cases[i].name, tt / th});
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Options o;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--B") o.B = v;
    if (a == "--D") o.D = v;
    if (a == "--H") o.H = v;
    if (a == "--reps") o.reps = std::max(1, v);
    if (a == "--steps") o.steps = std::max(1, v);
    if (a == "--peak-n") o.peak_n = std::max(64, v);
  }
  const int p = world_size();
  if (o.B % p || o.H % p || o.B <= 0 || o.D <= 0 || o.H <= 0) {
    if (root()) std::fprintf(stderr, "--B and --H must be positive multiples of the rank count (%d)\n", p);
    return 1;
  }
  if (root()) {
    std::printf("MLP training step benchmark, %d ranks, float, B=%d D=%d H=%d, median of %d interleaved runs "
                "(BLAS: %s, local products: %s)\n",
                p, o.B, o.D, o.H, o.reps, blas_kernels(), ts::local_gemm_backend());
    std::printf("reproduce: bash bench/run_mlp_step.sh --B %d --D %d --H %d --reps %d --steps %d --peak-n %d\n", o.B, o.D,
                o.H, o.reps, o.steps, o.peak_n);
  }
  const double peak = measure_peak(o.peak_n, o.reps);
  if (root())
    std::printf("GEMM peak: sgemm n=%d on all %d ranks at once: %.1f GFLOP/s summed over ranks\n", o.peak_n, p, peak);

  std::vector<Ratio> ratios;
  bool ok = run_mesh(o, 1, p, peak, ratios);
  if (ok && p > 1) ok = run_mesh(o, p, 1, peak, ratios);
  if (ok) ok = run_orientations(o, peak, ratios);
  if (!ok) {
    if (root()) std::printf("CORRECTNESS CHECK FAILED\n");
    return 1;
  }
  if (root()) {
    std::printf("\nratios tshard/hand (time; goal <= 1.03):");
    for (auto& r : ratios) std::printf("  %s %.3f", r.what.c_str(), r.value);
    std::printf("\n");
  }
  return 0;
}
