// Derived gradients against a backward written by hand, side by side in one run:
//  1. a stack of transformer blocks (TransformerBlock: layer norms, attention, MLP), one training
//     step's forward and backward: the chain rule written out with the public functions and their
//     fused backwards (layer_norm_backward, causal_attention_backward, gelu_backward, einsums),
//     activations kept by hand, against ts::ad::backward over the blocks called forward only;
//     time (median of interleaved reps) and the buffer pool's peak bytes in use (activations,
//     gradients, temporaries);
//  2. the tape's overhead per recorded operator on a chain of small elementwise ops.
//   mpirun -np 2 ./tshard_bench_ad --mesh model=2 [--dmodel 1024 --heads 16 --batch 8 --seq 256 --layers 2]
#include <tshard/tshard.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace ts = tshard;
using M = ts::Mesh<"data", "model">;
using Block = ts::nn::TransformerBlock<float, M>;

namespace {

struct Options {
  int data = -1, model = 1, dmodel = 1024, heads = 16, batch = 8, seq = 256, layers = 2, reps = 5, chain = 2000;
};

struct Stack : ts::nn::Module {
  std::vector<Block> blocks;
  Stack(const M& mesh, const Options& o) {
    blocks.reserve(std::size_t(o.layers));
    for (int l = 0; l < o.layers; ++l)
      register_module("h" + std::to_string(l),
                      blocks.emplace_back(mesh, ts::nn::BlockOptions{.dmodel = o.dmodel, .heads = o.heads, .seed = std::uint64_t(l + 1)}));
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

using X = ts::Spec<ts::S<"data">, ts::R, ts::R>;
template <class A>
auto as_x(A&& a) {
  return ts::reshard<X>(std::forward<A>(a));
}

// One block's forward with what its backward needs kept, and that backward written out: dL/dx for
// dL/dy, every parameter's gradient resolved into its parameter's layout (the data-parallel sum),
// as the layers' own backwards once did by hand.
struct HandBlock {
  Block& b;
  using In = ts::ShardedTensor<float, M, X>;
  std::optional<In> x, h, n1, n2;
  using QKV = decltype(ts::einsum<"btd,dkh->tbkh">(std::declval<const In&>(), std::declval<Block&>().attention().wq()));
  std::optional<QKV> q, k, v, context;
  using P = decltype(ts::nn::causal_attention(*q, *k, *v).second);
  std::optional<P> p;
  using F = decltype(ts::einsum<"btd,df->btf">(std::declval<const In&>(), std::declval<Block&>().mlp().fc1().weight()));
  std::optional<F> f1;

  In forward(const In& in) {
    auto& at = b.attention();
    auto& mlp = b.mlp();
    x = in;
    n1 = as_x(ts::nn::layer_norm<2>(in, b.ln1().gamma(), b.ln1().beta(), 1e-5f));
    q = ts::einsum<"btd,dkh->tbkh">(*n1, at.wq());
    k = ts::einsum<"btd,dkh->tbkh">(*n1, at.wk());
    v = ts::einsum<"btd,dkh->tbkh">(*n1, at.wv());
    auto [c, probabilities] = ts::nn::causal_attention(*q, *k, *v);
    context = std::move(c);
    p = std::move(probabilities);
    h = as_x(in + (ts::einsum<"tbkh,khd->btd">(*context, at.wo()) + at.bo()));
    n2 = as_x(ts::nn::layer_norm<2>(*h, b.ln2().gamma(), b.ln2().beta(), 1e-5f));
    f1 = ts::einsum<"btd,df->btf">(*n2, mlp.fc1().weight()) + mlp.fc1().bias();
    return as_x(*h + (ts::einsum<"btf,fd->btd">(ts::nn::gelu(*f1), mlp.fc2().weight()) + mlp.fc2().bias()));
  }
  template <class G, class C>
  static void add(G& grad, const C& contribution) {
    grad += ts::reshard<typename G::SpecType>(contribution);
  }
  In backward(const In& dy) {
    auto& at = b.attention();
    auto& mlp = b.mlp();
    add(mlp.fc2().weight_grad(), ts::einsum<"btf,btd->fd">(ts::nn::gelu(*f1), dy));
    add(mlp.fc2().bias_grad(), ts::sum<0, 1>(dy));
    auto df1 = ts::nn::gelu_backward(*f1, ts::einsum<"btd,fd->btf">(dy, mlp.fc2().weight()));
    add(mlp.fc1().weight_grad(), ts::einsum<"btd,btf->df">(*n2, df1));
    add(mlp.fc1().bias_grad(), ts::sum<0, 1>(df1));
    auto [dh_norm, dg2, db2] = ts::nn::layer_norm_backward<2>(*h, b.ln2().gamma(), as_x(ts::einsum<"btf,df->btd">(df1, mlp.fc1().weight())), 1e-5f);
    add(b.ln2().gamma_grad(), dg2);
    add(b.ln2().beta_grad(), db2);
    const In dh = as_x(dy + dh_norm);
    add(at.gradient_of(at.wo()), ts::einsum<"tbkh,btd->khd">(*context, dh));
    add(at.gradient_of(at.bo()), ts::sum<0, 1>(dh));
    auto [dq, dk, dv] = ts::nn::causal_attention_backward(*q, *k, *v, *p, ts::einsum<"btd,khd->tbkh">(dh, at.wo()));
    add(at.gradient_of(at.wq()), ts::einsum<"btd,tbkh->dkh">(*n1, dq));
    add(at.gradient_of(at.wk()), ts::einsum<"btd,tbkh->dkh">(*n1, dk));
    add(at.gradient_of(at.wv()), ts::einsum<"btd,tbkh->dkh">(*n1, dv));
    auto dn1 = as_x(ts::einsum<"tbkh,dkh->btd">(dq, at.wq()) + ts::einsum<"tbkh,dkh->btd">(dk, at.wk()) +
                    ts::einsum<"tbkh,dkh->btd">(dv, at.wv()));
    auto [dx_norm, dg1, db1] = ts::nn::layer_norm_backward<2>(*x, b.ln1().gamma(), dn1, 1e-5f);
    add(b.ln1().gamma_grad(), dg1);
    add(b.ln1().beta_grad(), db1);
    release();
    return as_x(dh + dx_norm);
  }
  void release() { x.reset(), h.reset(), n1.reset(), n2.reset(), q.reset(), k.reset(), v.reset(), context.reset(), p.reset(), f1.reset(); }
};

}  // namespace

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--mesh") {
      const std::string m = argv[i + 1];
      if (auto p = m.find("data="); p != std::string::npos) o.data = std::atoi(m.c_str() + p + 5);
      if (auto p = m.find("model="); p != std::string::npos) o.model = std::atoi(m.c_str() + p + 6);
    } else if (a == "--dmodel") o.dmodel = v;
    else if (a == "--heads") o.heads = v;
    else if (a == "--batch") o.batch = v;
    else if (a == "--seq") o.seq = v;
    else if (a == "--layers") o.layers = v;
    else if (a == "--reps") o.reps = v;
    else if (a == "--chain") o.chain = v;
  }
  const M mesh({o.data, o.model});
  const bool root = mesh.rank() == 0;
  auto x = ts::random<float, X>(mesh, {o.batch, o.seq, o.dmodel}, 1);
  auto w = ts::random<float, X>(mesh, {o.batch, o.seq, o.dmodel}, 2);
  Stack hand(mesh, o), derived(mesh, o);

  // Bytes in use after the forward (activations kept for backward), above the step's start.
  std::uint64_t start_bytes = 0, kept_hand = 0, kept_derived = 0;
  std::vector<HandBlock> steps;
  for (auto& b : hand.blocks) steps.push_back(HandBlock{b});
  auto run_hand = [&] {
    hand.zero_grad();
    auto y = x;
    for (auto& s : steps) y = s.forward(y);
    kept_hand = ts::pool_stats().bytes_in_use - start_bytes;
    auto dy = w;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) dy = it->backward(dy);
  };
  auto run_derived = [&] {
    derived.zero_grad();
    ts::ad::backward(derived, [&] {
      auto y = x;
      for (auto& b : derived.blocks) y = b(y);
      kept_derived = ts::pool_stats().bytes_in_use - start_bytes;
      return ts::sum<0, 1, 2>(y * w);
    });
  };
  run_hand();
  run_derived();
  // Same gradients (float: the same kernels, summed in another order only where the tape adds).
  // Relative to each layer's largest gradient: an element's own magnitude would make an entry
  // near zero, where float sums in another order differ most, fail a correct gradient.
  double worst = 0;
  for (int l = 0; l < o.layers; ++l) {
    const Eigen::Tensor<float, 2> a = derived.blocks[std::size_t(l)].mlp().fc1().weight_grad().gather();
    const Eigen::Tensor<float, 2> b = hand.blocks[std::size_t(l)].mlp().fc1().weight_grad().gather();
    double difference = 0, largest = 0;
    for (Eigen::Index i = 0; i < b.size(); ++i) {
      difference = std::max(difference, double(std::abs(a.data()[i] - b.data()[i])));
      largest = std::max(largest, double(std::abs(b.data()[i])));
    }
    worst = std::max(worst, difference / std::max(largest, 1e-30));
  }
  std::vector<double> t_hand, t_derived;
  std::uint64_t peak_hand = 0, peak_derived = 0;
  for (int r = 0; r < o.reps; ++r) {
    for (int variant = 0; variant < 2; ++variant) {
      MPI_Barrier(mesh.comm());
      ts::reset_pool_peak();
      const auto base = ts::pool_stats().bytes_in_use;
      start_bytes = base;
      const auto t0 = std::chrono::steady_clock::now();
      if (variant == 0) run_hand();
      else run_derived();
      const double t = tshard_bench::max_over_ranks(seconds_since(t0), mesh.comm());
      const std::uint64_t peak = ts::pool_stats().peak_bytes_in_use - base;
      (variant == 0 ? t_hand : t_derived).push_back(t);
      auto& p = variant == 0 ? peak_hand : peak_derived;
      p = std::max(p, peak);
    }
  }
  const double mh = tshard_bench::median(t_hand), md = tshard_bench::median(t_derived);
  if (root) {
    std::printf("blocks: %d layers, dmodel %d, heads %d, batch %d, seq %d, mesh data=%d,model=%d, float\n", o.layers, o.dmodel,
                o.heads, o.batch, o.seq, mesh.size<"data">(), mesh.size<"model">());
    std::printf("check: fc1 weight gradients, largest relative difference derived vs hand-written %.3g\n", worst);
    std::printf("step hand-written %.1f ms, derived %.1f ms, ratio %.3f\n", 1e3 * mh, 1e3 * md, md / mh);
    std::printf("peak pool bytes above the step's start: hand-written %.1f MiB, derived %.1f MiB, ratio %.3f\n",
                double(peak_hand) / 1048576.0, double(peak_derived) / 1048576.0, double(peak_derived) / double(peak_hand));
    std::printf("kept for backward after the forward: hand-written %.1f MiB, derived %.1f MiB\n",
                double(kept_hand) / 1048576.0, double(kept_derived) / 1048576.0);
  }

  // The tape's cost per operator: a chain of small ops, untracked and recorded.
  auto v = ts::random<double, ts::Spec<ts::R>>(mesh, {8}, 3);
  auto chain = [&](const auto& start) {
    auto y = start;
    for (int i = 0; i < o.chain; ++i) y = y * 1.0001 + 0.0001;
    return ts::sum<0>(y);
  };
  std::vector<double> plain, forward_recorded, with_backward;
  for (int r = 0; r < o.reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    (void)chain(v);
    plain.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    (void)ts::ad::value_and_grad(chain, v);
    with_backward.push_back(seconds_since(t0));
  }
  const double per_plain = tshard_bench::median(plain) / (2.0 * o.chain);
  const double per_grad = tshard_bench::median(with_backward) / (2.0 * o.chain);
  if (root)
    std::printf("tape: %d small ops, %.2f us per op untracked, %.2f us per op recorded with its backward run (%.2f us of tape and rule)\n",
                2 * o.chain, 1e6 * per_plain, 1e6 * per_grad, 1e6 * (per_grad - per_plain));
  return tshard_bench::all_ranks(worst < 1e-4, mesh.comm()) ? 0 : 1;
}
