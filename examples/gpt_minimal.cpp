// A GPT in about 100 lines, written forward only with tshard's modules: the gradients are
// derived (ts::ad), the layers are data-parallel over "data" and tensor-parallel over "model"
// (heads, the MLP's hidden dim and the vocabulary split), by annotation alone.
//
//   mpirun -np 4 ./gpt_minimal --mesh data=2,model=2 --steps 50
//   mpirun -np 4 ./gpt_minimal --mesh data=2,model=2 --double --check   # = the one-rank curve
//
// The task is synthetic: each row counts up from its own start with its own stride, modulo the
// vocabulary, so the next token is learnable from the context.
#include <tshard/tshard.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ts = tshard;
using M = ts::Mesh<"data", "model">;

template <class T>
struct Block : ts::nn::Module {
  ts::nn::LayerNorm<T, M> ln_1, ln_2;
  ts::nn::Attention<T, M> attn;  // heads split over "model"
  ts::nn::MLP<T, M> mlp;         // hidden dim split over "model": one all-reduce per MLP
  Block(const M& mesh, int d, int heads, std::uint64_t seed)
      : ln_1(mesh, d), ln_2(mesh, d), attn(mesh, d, heads, seed), mlp(mesh, d, 4 * d, seed + 1) {
    register_module("ln_1", ln_1);
    register_module("attn", attn);
    register_module("ln_2", ln_2);
    register_module("mlp", mlp);
  }
  auto operator()(const auto& x) {
    auto h = x + attn(ln_1(x));
    return h + mlp(ln_2(h));
  }
};

template <class T>
struct Gpt : ts::nn::Module {
  ts::nn::Embedding<T, M> wte;  // vocabulary split over "model": a lookup moves nothing of it
  ts::ShardedTensor<T, M, ts::Spec<ts::R, ts::R>>& wpe;
  std::vector<Block<T>> h;
  ts::nn::LayerNorm<T, M> ln_f;
  ts::nn::Linear<T, M, ts::Spec<ts::R, ts::S<"model">>> lm_head;  // logits split over the vocabulary
  Gpt(const M& mesh, int vocab, int seq, int d, int heads, int layers)
      : wte(mesh, vocab, d, 1),
        wpe(register_parameter("wpe", ts::random<T, ts::Spec<ts::R, ts::R>>(mesh, {seq, d}, 2) * T(0.1))),
        ln_f(mesh, d), lm_head(mesh, d, vocab, 3, /*bias*/ false) {
    register_module("wte", wte);
    h.reserve(std::size_t(layers));
    for (int l = 0; l < layers; ++l) register_module("h" + std::to_string(l), h.emplace_back(mesh, d, heads, 10 + 2 * l));
    register_module("ln_f", ln_f);
    register_module("lm_head", lm_head);
  }
  auto operator()(const auto& ids) {  // ids [B, T] -> logits [B, T, V]
    auto x = wte(ids) + wpe;
    for (auto& block : h) x = block(x);
    return lm_head(ln_f(x));
  }
};

struct Options {
  int data = -1, model = 1, steps = 20, batch = 8, seq = 16, dmodel = 32, heads = 4, layers = 2, vocab = 32;
  float lr = 3e-3f;
  bool use_double = false, check = false;
};

// The losses of `steps` AdamW steps on `mesh`.
template <class T>
std::vector<double> train(const M& mesh, const Options& o, bool print) {
  Gpt<T> gpt(mesh, o.vocab, o.seq, o.dmodel, o.heads, o.layers);
  ts::nn::AdamW opt({.lr = o.lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f});
  opt.add(gpt, ts::nn::decay_matrices_only(0.1f));  // matrices decay; biases and norms do not (nanoGPT)
  std::vector<double> losses;
  for (int step = 0; step < o.steps; ++step) {
    // Row b of step s counts up from start(b, s) by stride(b, s): token t+1 follows token t.
    auto token = [&](Eigen::Index b, Eigen::Index t) {
      const long r = long(step) * o.batch + long(b);
      return std::int32_t((r * 7 + t * (1 + r % 3)) % o.vocab);
    };
    using Rows = ts::Spec<ts::S<"data">, ts::R>;
    auto ids = ts::from_function<std::int32_t, Rows>(mesh, {o.batch, o.seq}, [&](auto i) { return token(i[0], i[1]); });
    auto next = ts::from_function<std::int32_t, Rows>(mesh, {o.batch, o.seq}, [&](auto i) { return token(i[0], i[1] + 1); });
    opt.zero_grad();
    const double loss = ts::ad::backward(gpt, [&] { return ts::nn::cross_entropy(gpt(ids), next); });
    opt.step();
    losses.push_back(loss);
    if (print && mesh.rank() == 0) std::printf("step %d loss %.17g\n", step, loss);
  }
  return losses;
}

template <class T>
int run(const Options& o) {
  const M mesh({o.data, o.model});
  if (mesh.rank() == 0) std::printf("%s\n", ts::kernels_report().c_str());  // which kernels run
  const auto losses = train<T>(mesh, o, true);
  if (!o.check) return 0;
  const auto one_rank = train<T>(M(MPI_COMM_SELF, {1, 1}), o, false);
  double worst = 0;
  for (std::size_t i = 0; i < losses.size(); ++i) worst = std::max(worst, std::abs(losses[i] - one_rank[i]) / one_rank[i]);
  const bool ok = worst <= (sizeof(T) == 8 ? 1e-9 : 1e-4) && losses.back() < losses.front();
  if (mesh.rank() == 0) std::printf("check: largest relative difference from one rank %.3g, loss %s: %s\n", worst,
                                    losses.back() < losses.front() ? "falls" : "does not fall", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--mesh" && i + 1 < argc) {
      const std::string m = argv[++i];
      if (auto p = m.find("data="); p != std::string::npos) o.data = std::atoi(m.c_str() + p + 5);
      if (auto p = m.find("model="); p != std::string::npos) o.model = std::atoi(m.c_str() + p + 6);
    } else if (a == "--steps") o.steps = next();
    else if (a == "--batch") o.batch = next();
    else if (a == "--seq") o.seq = next();
    else if (a == "--dmodel") o.dmodel = next();
    else if (a == "--heads") o.heads = next();
    else if (a == "--layers") o.layers = next();
    else if (a == "--vocab") o.vocab = next();
    else if (a == "--lr" && i + 1 < argc) o.lr = float(std::atof(argv[++i]));
    else if (a == "--double") o.use_double = true;
    else if (a == "--check") o.check = true;
    else if (a == "--help" || a == "-h") {
      if (ts::Environment::world_rank() == 0)
        std::printf("usage: gpt_minimal [--mesh data=N,model=N] [--steps N] [--batch N] [--seq N] [--dmodel N] [--heads N]\n"
                    "                   [--layers N] [--vocab N] [--lr X] [--double] [--check]\n");
      return 0;
    } else {
      if (ts::Environment::world_rank() == 0) std::fprintf(stderr, "gpt_minimal: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  return o.use_double ? run<double>(o) : run<float>(o);
}
