// A BERT-style encoder (bidirectional attention) whose sequence is split over the mesh axis
// "context", written as a user writes one: the token ids are laid out {data, context} and every
// activation follows by propagation; the blocks are the library's, with grouped-query attention
// (GroupedQuerySpecs: query heads in groups over the key-value heads, split over "model").
// --variant packed makes it causal over packed documents (one ends at each token 0, as
// --eod does in train_llama), --variant window causal with a sliding window, --variant alibi
// bidirectional with ALiBi's biases (ts::nn::alibi_slopes) on top of the learned positions; --softcap C
// soft-caps the scores (Gemma 2's). The task: predict, at each position, the token at the
// mirrored position of the row, which needs the whole row.
//
//   mpirun -np 4 ./train_encoder --mesh data=2,context=2 --check        # = the one-rank curve
//   mpirun -np 4 ./train_encoder --mesh context=4 --variant packed --context ring
//   mpirun -np 3 ./train_encoder --mesh context=3 --variant alibi --softcap 2 --check
#include <tshard/tshard.hpp>
#include <tshard/train/flags.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace ts = tshard;
using ts::R;
using ts::S;
using ts::Spec;
using M = ts::Mesh<"data", "context", "model">;
using Ids = Spec<S<"data">, S<"context">>;  // [B, T]: batch over data, positions over context

struct Options {
  int steps = 10, layers = 2;
  long batch = 6, seq = 37, dmodel = 32, heads = 4, kv_heads = 2, vocab = 11, window = 8;
  double softcap = 0;
  std::string variant = "encoder", context = "auto";
  bool check = false;
};

template <class T>
struct Encoder : ts::nn::Module {
  using Block = ts::nn::TransformerBlock<T, M, ts::nn::GroupedQuerySpecs<"model">>;
  ts::nn::Embedding<T, M> wte;                // the vocabulary split over "model"
  ts::ShardedTensor<T, M, Spec<R, R>>& wpe;  // learned positions [T, D]
  std::vector<Block> blocks;
  ts::nn::LayerNorm<T, M> ln_f;
  ts::nn::Linear<T, M, Spec<R, S<"model">>> head;

  Encoder(const M& mesh, const Options& o)
      : wte(mesh, o.vocab, o.dmodel, 1),
        wpe(register_parameter("wpe", ts::nn::init::uniform<T, Spec<R, R>>(mesh, {o.seq, o.dmodel}, 2, 0.1))),
        ln_f(mesh, o.dmodel),
        head(mesh, o.dmodel, o.vocab, 3) {
    for (int l = 0; l < o.layers; ++l)
      blocks.emplace_back(mesh, ts::nn::BlockOptions{.dmodel = o.dmodel, .heads = o.heads, .seed = std::uint64_t(4 + l),
                                                     .kv_heads = o.kv_heads});
    register_module("wte", wte);
    for (std::size_t l = 0; l < blocks.size(); ++l) register_module("h" + std::to_string(l), blocks[l]);
    register_module("ln_f", ln_f);
    register_module("head", head);
  }
  // Logits [B, T, vocab] of ids [B, T].
  template <class X>
  auto operator()(const X& ids, const ts::nn::AttentionOptions& o) {
    auto x = wte(ids) + wpe;  // [B, T, D]: {data, context, R}
    for (auto& block : blocks) x = block(x, o);
    return head(ln_f(x));
  }
};

// The losses of o.steps AdamW steps on mesh.
std::vector<double> train(const M& mesh, const Options& o, bool print) {
  auto token = [&](std::uint64_t seed, Eigen::Index b, Eigen::Index t) {
    return std::int32_t(ts::random_value<double>(seed, std::uint64_t(b * o.seq + t)) * double(o.vocab));
  };
  ts::nn::AttentionOptions attention;
  attention.context = o.context == "ring"       ? ts::nn::ContextParallel::Ring
                      : o.context == "alltoall" ? ts::nn::ContextParallel::AllToAll
                                                : ts::nn::ContextParallel::Auto;
  attention.causal = o.variant != "encoder" && o.variant != "alibi";
  if (o.variant == "window") attention.window = o.window;
  if (o.variant == "alibi") attention.alibi_slopes = ts::nn::alibi_slopes(o.heads);
  attention.softcap = o.softcap;
  Encoder<double> model(mesh, o);
  // Gradients summed over both axes the batch's tokens are split over; ZeRO would divide over them.
  ts::nn::AdamW opt({.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .data_axis = "data,context"});
  opt.add(model);
  std::vector<double> losses;
  for (int step = 0; step < o.steps; ++step) {
    const std::uint64_t seed = 1000 + std::uint64_t(step);
    auto ids = ts::from_function<std::int32_t, Ids>(mesh, {o.batch, o.seq}, [&](const auto& g) { return token(seed, g[0], g[1]); });
    auto mirrored = ts::from_function<std::int32_t, Ids>(
        mesh, {o.batch, o.seq}, [&](const auto& g) { return token(seed, g[0], o.seq - 1 - g[1]); });
    if (o.variant == "packed") attention.document_starts = ts::nn::document_starts(ids, 0);  // every rank calls it
    opt.zero_grad();
    const double loss = ts::ad::backward(model, [&] { return ts::nn::cross_entropy(model(ids, attention), mirrored); });
    opt.step();
    losses.push_back(loss);
    if (print && mesh.rank() == 0) std::printf("step %d loss %.17g\n", step, loss);
  }
  return losses;
}

// Trains on mesh and, with --check, on one rank too: the same curve (double, 1e-9 relative).
int run(const M& mesh, const Options& o) {
  if (mesh.rank() == 0) std::printf("%s\n", ts::kernels_report().c_str());  // which kernels run
  const auto losses = train(mesh, o, true);
  if (!o.check) return 0;
  const auto one_rank = train(M(MPI_COMM_SELF, {1, 1, 1}), o, false);
  double worst = 0;
  for (std::size_t i = 0; i < losses.size(); ++i) worst = std::max(worst, std::abs(losses[i] - one_rank[i]) / one_rank[i]);
  const bool ok = worst <= 1e-9 && losses.back() < losses.front();
  if (mesh.rank() == 0)
    std::printf("check: largest relative difference from one rank %.3g, loss %s: %s\n", worst,
                losses.back() < losses.front() ? "falls" : "does not fall", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Options o;
  ts::train::MeshSizes<M> sizes;
  try {
    ts::train::Flags flags("train_encoder", argc, argv);
    flags.mesh<M>("--mesh", sizes)
        .value("--steps", o.steps)
        .value("--layers", o.layers)
        .value("--batch", o.batch)
        .value("--seq", o.seq)
        .value("--dmodel", o.dmodel)
        .value("--heads", o.heads)
        .value("--kv-heads", o.kv_heads)
        .value("--vocab", o.vocab)
        .choice("--variant", o.variant, {"encoder", "packed", "window", "alibi"})
        .value("--window", o.window)
        .value("--softcap", o.softcap)
        .choice("--context", o.context, {"auto", "ring", "alltoall"})
        .flag("--check", o.check)
        .parse();
    if (!(o.softcap >= 0 && std::isfinite(o.softcap))) flags.fail("--softcap takes C >= 0 (0: none)");
    return run(sizes.make("train_encoder"), o);
  } catch (const ts::train::UsageError& e) {
    return ts::train::Flags::report(e);
  }
}
