// A decoder-only transformer language model trained with tshard's nn layer on any {data, model}
// mesh: token and position embeddings (the vocabulary split over "model"), L pre-layernorm
// blocks (heads and the MLP's hidden dim split over "model", Megatron's pattern by
// annotation), a final layernorm, an output projection whose logits stay split over the
// vocabulary, cross-entropy that never gathers them, AdamW with optional weight-update sharding
// over "data" (--zero 1|2|3) and global gradient-norm clipping.
//
// The task is synthetic and depends only on the seed: each sequence is a random first half
// followed by its reverse; the model predicts every next token. Initial weights and dropout
// masks depend only on (seed, global index), so the loss curve does not depend on the mesh:
// with --double every mesh and ZeRO stage prints the single-rank losses to 1e-9 relative.
//
//   mpirun -np 4 ./train_transformer --mesh data=2,model=2 --steps 20 --layers 2 --double
//
// Output: "step <n> loss <value>" per step (%.17g), then a progress line (tokens/s, MFU against
// the sgemm peak of all ranks measured at start) and the optimizer's memory next to ZeRO's
// formulas. --check also trains on a one-rank mesh on every rank and compares the curves.
// Also: --dropout P, --hidden F (MLP width, default 4D), --lr, --clip, --overlap (start each
// layer's gradient reduction during backward, non-blocking), --peak-n N (the peak's sgemm size).
#include <tshard/tshard.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ts = tshard;
using M = ts::Mesh<"data", "stage", "model">;

struct Options {
  int data = 0, stage = 1, model = 1;  // without --mesh, every rank on data; with it, a missing axis is 1
  int steps = 10, layers = 2, zero = 0;
  long seed = 1;
  bool use_double = false, check = false, overlap = false;
  Eigen::Index batch = 8, seq = 16, dmodel = 32, heads = 4, vocab = 64, hidden = 0;
  double lr = 3e-3, clip = 1.0, dropout = 0.0;
  int peak_n = 384;
};

[[noreturn]] void usage_error(const std::string& what) {
  throw std::invalid_argument("train_transformer: " + what);
}

void parse_mesh(const std::string& s, Options& o) {
  o.data = 1;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::size_t comma = s.find(',', at);
    const std::string item = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) usage_error("--mesh takes axis=size items, e.g. data=2,model=2, not '" + item + "'");
    const std::string axis = item.substr(0, eq);
    const int size = std::atoi(item.c_str() + eq + 1);
    if (size < 1) usage_error("--mesh: the size of " + axis + " must be a positive integer");
    if (axis == "data") o.data = size;
    else if (axis == "model") o.model = size;
    else if (axis == "stage") o.stage = size;
    else usage_error("--mesh: unknown axis '" + axis + "' (data, model or stage)");
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    auto integer = [&] { return std::atol(value().c_str()); };
    if (a == "--mesh") parse_mesh(value(), o);
    else if (a == "--steps") o.steps = int(integer());
    else if (a == "--layers") o.layers = int(integer());
    else if (a == "--seed") o.seed = integer();
    else if (a == "--zero") o.zero = int(integer());
    else if (a == "--double") o.use_double = true;
    else if (a == "--batch") o.batch = integer();
    else if (a == "--seq") o.seq = integer();
    else if (a == "--dmodel") o.dmodel = integer();
    else if (a == "--heads") o.heads = integer();
    else if (a == "--vocab") o.vocab = integer();
    else if (a == "--hidden") o.hidden = integer();
    else if (a == "--lr") o.lr = std::atof(value().c_str());
    else if (a == "--clip") o.clip = std::atof(value().c_str());
    else if (a == "--dropout") o.dropout = std::atof(value().c_str());
    else if (a == "--peak-n") o.peak_n = int(integer());
    else if (a == "--check") o.check = true;
    else if (a == "--overlap") o.overlap = true;
    else if (a == "--no-overlap") o.overlap = false;
    else usage_error("unknown option " + a);
  }
  if (o.zero < 0 || o.zero > 3) usage_error("--zero takes 0, 1, 2 or 3");
  if (o.batch < 1 || o.seq < 1 || o.dmodel < 1 || o.heads < 1 || o.vocab < 2 || o.layers < 0 || o.steps < 0)
    usage_error("sizes must be positive (and --vocab at least 2)");
  if (o.stage != 1) usage_error("pipeline stages (--mesh stage=K) are not supported yet");
  return o;
}

// Token t of sequence b at step `step`: a random first half, then its reverse.
std::int32_t token(const Options& o, long step, Eigen::Index b, Eigen::Index t) {
  const Eigen::Index len = o.seq + 1, half = (len + 1) / 2;
  const Eigen::Index src = t < half ? t : len - 1 - t;
  const std::uint64_t index = (std::uint64_t(step) * std::uint64_t(o.batch) + std::uint64_t(b)) * std::uint64_t(len) + std::uint64_t(src);
  return std::int32_t(ts::detail::random_bits(std::uint64_t(o.seed) * 7919 + 17, index) % std::uint64_t(o.vocab));
}

template <class T>
class LanguageModel {
  using Rows = ts::Spec<ts::S<"data">, ts::R>;  // [B, T] ids: batch over data

 public:
  LanguageModel(const M& mesh, const Options& o)
      : mesh_(mesh), o_(o),
        tokens_(mesh, o.vocab, o.dmodel, std::uint64_t(o.seed) * 1000 + 1),
        positions_(mesh, o.seq, o.dmodel, std::uint64_t(o.seed) * 1000 + 2),
        norm_(mesh, o.dmodel),
        head_(mesh, o.dmodel, o.vocab, std::uint64_t(o.seed) * 1000 + 3) {
    for (int l = 0; l < o.layers; ++l)
      blocks_.push_back(std::make_unique<Block>(
          mesh, ts::nn::BlockOptions{.dmodel = o.dmodel, .heads = o.heads, .hidden = o.hidden, .dropout = o.dropout,
                                     .seed = std::uint64_t(o.seed) * 1000 + 10 + std::uint64_t(l)}));
  }

  template <class Optimizer>
  void register_with(Optimizer& opt) {
    opt.add(tokens_);
    opt.add(positions_);
    for (auto& b : blocks_) opt.add(*b);
    opt.add(norm_);
    opt.add(head_);
  }

  // Parameters of the model: the embeddings, and those the 6N FLOP rule counts (not embeddings).
  double dense_parameters() {
    double n = 0;
    auto count = [&](auto& p, auto&) {
      double e = 1;
      for (auto d : p.global_shape()) e *= double(d);
      n += e;
    };
    for (auto& b : blocks_) b->for_each_parameter(count);
    norm_.for_each_parameter(count);
    head_.for_each_parameter(count);
    return n;
  }

  auto batch(long step) const {
    auto ids = ts::from_function<std::int32_t, Rows>(mesh_, {o_.batch, o_.seq},
                                                     [&](const auto& i) { return token(o_, step, i[0], i[1]); });
    auto labels = ts::from_function<std::int32_t, Rows>(mesh_, {o_.batch, o_.seq},
                                                        [&](const auto& i) { return token(o_, step, i[0], i[1] + 1); });
    return std::pair{std::move(ids), std::move(labels)};
  }

  // One training step's forward and backward; returns the loss.
  T forward_backward(long step) {
    auto [ids, labels] = batch(step);
    auto positions = ts::from_function<std::int32_t, Rows>(mesh_, {o_.batch, o_.seq},
                                                           [](const auto& i) { return std::int32_t(i[1]); });
    auto x = tokens_.forward(ids) + positions_.forward(positions);  // [B, T, D], the vocab's partial resolved
    for (auto& b : blocks_) x = b->forward(x);
    auto logits = head_.forward(norm_.forward(x));                   // [B, T, V], V split over model
    const T loss = ts::nn::cross_entropy(logits, labels);
    auto dx = norm_.backward(head_.backward(ts::nn::cross_entropy_backward(logits, labels)));
    for (auto b = blocks_.rbegin(); b != blocks_.rend(); ++b) dx = (*b)->backward(dx);
    tokens_.backward(dx);
    positions_.backward(dx);
    return loss;
  }

 private:
  using Block = ts::nn::TransformerBlock<T, M>;
  M mesh_;
  Options o_;
  ts::nn::Embedding<T, M, ts::Spec<ts::S<"model">, ts::R>> tokens_;
  ts::nn::Embedding<T, M, ts::Spec<ts::R, ts::R>> positions_;
  std::vector<std::unique_ptr<Block>> blocks_;
  ts::nn::LayerNorm<T, M> norm_;
  ts::nn::Linear<T, M, ts::Spec<ts::R, ts::S<"model">>> head_;
};

// The machine's GEMM rate: sgemm of n^3 on every rank at the same moment, summed over ranks.
double gemm_peak(const M& mesh, int n) {
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    MPI_Barrier(mesh.comm());
    const auto t0 = std::chrono::steady_clock::now();
    ts::detail::gemm<float>(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double rate = 2.0 * n * n * n / best, total = 0;
  MPI_Allreduce(&rate, &total, 1, MPI_DOUBLE, MPI_SUM, mesh.comm());
  return total;
}

struct Run {
  std::vector<double> losses;
  double seconds = 0;
  ts::nn::OptimizerMemory memory;
  std::uint64_t pool_now = 0, pool_peak = 0;  // the buffer pool's counters: everything, activations included
  double blocked = 0;
  double dense = 0;
};

template <class T>
Run train(const M& mesh, const Options& o, int zero) {
  LanguageModel<T> model(mesh, o);
  ts::nn::AdamW opt({.lr = float(o.lr), .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f,
                     .zero_stage = zero, .overlap = o.overlap});
  model.register_with(opt);
  Run run;
  run.dense = model.dense_parameters();
  for (int step = 0; step < o.steps; ++step) {
    MPI_Barrier(mesh.comm());
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    const T loss = model.forward_backward(step);
    opt.clip_grad_norm(o.clip);
    run.memory = opt.memory();  // reduced gradients present, state updated next
    run.pool_now = ts::pool_stats().bytes_in_use;
    run.pool_peak = ts::pool_stats().peak_bytes_in_use;
    opt.step();
    if (step > 0 || o.steps == 1) run.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    run.blocked += opt.last_reduction().blocked_seconds;
    run.losses.push_back(double(loss));
  }
  return run;
}

template <class T>
int run_all(const M& mesh, const Options& o) {
  const double peak = gemm_peak(mesh, o.peak_n);
  const Run run = train<T>(mesh, o, o.zero);
  bool ok = true;
  double worst = 0;
  if (o.check) {  // the single-rank curve, on every rank alone
    M self(MPI_COMM_SELF, {1, 1, 1});
    const Run serial = train<T>(self, o, 0);
    for (std::size_t s = 0; s < run.losses.size(); ++s)
      worst = std::max(worst, std::abs(run.losses[s] - serial.losses[s]) / std::abs(serial.losses[s]));
    ok = worst < (sizeof(T) == 8 ? 1e-9 : 1e-4);
  }
  ok = ts::agree(ok);
  if (mesh.rank() == 0) {
    for (std::size_t s = 0; s < run.losses.size(); ++s) std::printf("step %zu loss %.17g\n", s, run.losses[s]);
    const int timed = std::max(1, o.steps - 1);
    const double tokens = double(o.batch * o.seq);
    // 6 N per token for the dense weights, plus attention's scores and context (12 L T D).
    const double flops = tokens * (6 * run.dense + 12.0 * o.layers * double(o.seq) * double(o.dmodel));
    const double per_step = run.seconds / timed;
    std::printf("mesh {data, model} = {%d, %d}, zero %d%s, %s: %.0f tokens/s, %.2f GFLOP/s, MFU %.1f%% of %.2f GFLOP/s "
                "(sgemm n=%d on every rank), gradient reduction not hidden %.1f ms/step\n",
                mesh.size<"data">(), mesh.size<"model">(), o.zero, o.overlap ? " (overlapped)" : "", sizeof(T) == 8 ? "double" : "float",
                tokens / per_step, flops / per_step / 1e9, 100 * flops / per_step / peak, peak / 1e9, o.peak_n,
                1e3 * run.blocked / std::max(1, o.steps));
    const double psi = double(run.memory.model_elements) * sizeof(T), n = mesh.size<"data">();
    const double expect[4] = {4 * psi, 2 * psi + 2 * psi / n, psi + 3 * psi / n, 4 * psi / n};
    std::printf("memory per rank before the update: parameters %.1f KiB, gradients %.1f KiB, optimizer state %.1f KiB, "
                "total %.1f KiB; ZeRO-%d formula %.1f KiB (Psi = %.1f KiB of local parameters, N = %d)\n",
                run.memory.parameters / 1024.0, run.memory.gradients / 1024.0, run.memory.state / 1024.0,
                run.memory.total() / 1024.0, o.zero, expect[o.zero] / 1024.0, psi / 1024.0, int(n));
    std::printf("buffer pool on rank 0: %.1f KiB in use there, peak %.1f KiB (activations included)\n",
                run.pool_now / 1024.0, run.pool_peak / 1024.0);
    if (o.check) std::printf("largest relative difference from the single-rank curve %.2e%s\n", worst, ok ? "" : " (FAILED)");
  }
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {  // every rank parses the same line: all report and leave
    if (ts::Environment::world_size() == 1 || ts::Environment::world_rank() == 0) std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  const int p = ts::Environment::world_size();
  const int fixed = o.stage * o.model * (o.data > 0 ? o.data : 1);
  if (p % fixed != 0 || (o.data > 0 && fixed != p)) {
    if (ts::Environment::world_rank() == 0)
      std::fprintf(stderr, "train_transformer: --mesh data=%d,stage=%d,model=%d does not match %d ranks\n", o.data,
                   o.stage, o.model, p);
    return 2;
  }
  M mesh({o.data > 0 ? o.data : p / (o.stage * o.model), o.stage, o.model});
  ts::nn::flush_denormals();  // tiny probabilities would otherwise slow float GEMMs many times
  return o.use_double ? run_all<double>(mesh, o) : run_all<float>(mesh, o);
}
