// A decoder-only transformer language model trained with tshard's nn layer on any {data, stage,
// context, model} mesh: token and position embeddings (the vocabulary split over "model"), L
// pre-layernorm blocks (heads and the MLP's hidden dim split over "model", Megatron's pattern by
// annotation; positions over "context", the fused attention passing keys and values round a ring
// or switching the split to heads by all-to-alls, whichever its options' Auto picks),
// a final layernorm, an output projection whose logits stay split over the vocabulary,
// cross-entropy that never gathers them, AdamW with optional weight-update sharding over "data"
// and "context" (--zero 1|2|3) and global gradient-norm clipping. "stage" cuts the blocks into a pipeline
// (GPipe or 1F1B over --microbatches, optionally re-materialised); --experts makes every MLP a
// GShard mixture of experts split over "data".
//
// The task is synthetic and depends only on the seed: each sequence is a random first half
// followed by its reverse; the model predicts every next token. Initial weights, dropout masks
// and the experts' random routing depend only on (seed, global index), and expert groups are
// sequences, so the loss curve depends neither on the mesh nor on the micro-batching: with
// --double every combination prints the single-rank losses to 1e-9 relative.
//
//   mpirun -np 4 ./train_transformer --mesh data=2,model=2 --steps 20 --layers 2 --double
//   mpirun -np 4 ./train_transformer --mesh data=2,stage=2 --microbatches 4 --schedule 1f1b --experts 4
//   mpirun -np 4 ./train_transformer --mesh context=2,model=2 --seq 64 --check
//
// Output: "step <n> loss <value>" per step (%.17g), then a progress line (tokens/s, MFU against
// the sgemm peak of all ranks measured at start), the optimizer's memory next to ZeRO's
// formulas; pipelined, the bubble per stage next to (K-1)/(M+K-1) and the peak activation memory
// next to each schedule's formula; with experts, the dropped assignments and the all-to-all
// bytes next to their analytic count. --check also trains on a one-rank mesh, unpipelined, on
// every rank and compares the curves.
// Also: --dropout P, --attention-dropout P (of the attention's probabilities, GPT-2's attn_pdrop;
// the same masks on every mesh, context parallelism included), --hidden F (MLP width, default 4D), --lr, --clip, --overlap (start each
// bucket's gradient reduction during backward, non-blocking), --bucket-mb X (modules' gradients
// reduced together, DDP's bucket_cap_mb: default 25, 0 one bucket a module), --prefetch (ZeRO-3: start the next
// layer's parameter gather during this one's use, and count the gathers), --peak-n N (the peak's sgemm size),
// --remat, --capacity-factor C (default 1.25), --aux-weight W (load balancing, default 0.01),
// --activation-checkpoint full|selective (each block's activations recomputed in the backward
// instead of kept: all of them, or all but the GEMMs' outputs; the curve does not change),
// --dtype float|double|bf16 (--double is --dtype double; bf16: bfloat16 weights, activations
// and messages, float sums and products, AdamW on float master weights; --check then allows
// bf16's rounding, 3e-2; --save and --resume are float or double only).
// Files: --save DIR writes a checkpoint at the end (parameters, AdamW state, step, sizes; atomic,
// checksummed), --resume DIR goes on from one, on any mesh and ZeRO stage, with the same curve;
// --data FILE trains on a token file (.npy int32 [N, seq + 1], batch s = rows s*batch.. cycled,
// each rank reading only its rows, whole, the next micro-batch in the background); --eval FILE prints
// the loss and next-token accuracy over every row of a held-out file of that form at the end
// (and every K steps with --eval-every K): forwards alone through the pipeline, without dropout
// or random routing, summed by sharded reductions; --write-data FILE
// [--sequences N] writes the synthetic task as such a file; --trace FILE writes a Chrome trace
// of the steps; --report prints the collectives per step and operator; --profile splits each step,
// per rank, into computing, waiting for the slowest rank of a collective and moving bytes
// (min/median/max over ranks; in the trace too). --eod ID packs documents: a query attends only
// within its document, which ends at each ID (Megatron's --reset-attention-mask; positions run on,
// or restart at each document with --reset-position-ids, Megatron's flag of that name).
#include <tshard/tshard.hpp>
#include <tshard/train/train.hpp>

#include <algorithm>
#include <array>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace ts = tshard;
using M = ts::Mesh<"data", "stage", "context", "model">;
using Sub = ts::Mesh<"data", "context", "model">;  // one pipeline stage

struct Options {
  ts::train::MeshSizes<M> mesh;  // without --mesh, every rank on data; with it, a missing axis is 1
  int steps = 10, layers = 2, zero = 0;
  long seed = 1, eod = -1;  // eod >= 0: the token that ends a packed document
  bool use_double = false, check = false, overlap = false, prefetch = false;
  bool reset_position_ids = false;  // with --eod: the position embeddings restart at each document
  bool use_bf16 = false;  // --dtype bf16: bfloat16 weights, activations and messages; float master weights
  Eigen::Index batch = 8, seq = 16, dmodel = 32, heads = 4, vocab = 64, hidden = 0;
  double lr = 3e-3, clip = 1.0, dropout = 0.0, attention_dropout = 0.0, bucket_mb = 25;
  int peak_n = 384;
  int microbatches = 1;
  ts::nn::Schedule schedule = ts::nn::Schedule::GPipe;
  bool remat = false;
  std::string activation_checkpoint;  // "", "full" or "selective": each block's activations recomputed
  int experts = 0;
  double capacity_factor = 1.25, aux_weight = 0.01;
  std::string save, resume;  // checkpoint directories
  std::string trace;         // a Chrome trace JSON of the training steps
  std::string data_file;     // a token file: .npy int32 [N, seq + 1], each rank reads its rows
  std::string eval_file;     // a held-out token file of the same form: loss and accuracy over it
  int eval_every = 0;        // evaluate every K steps too (0: at the end only)
  std::string write_data;    // writes the synthetic task's first N sequences as such a file
  long sequences = 0;
  bool report = false;       // the per-step cost report: collectives, bytes and time per operator
  bool profile = false;      // per step, over ranks: computing, waiting for the slowest rank, moving bytes

  ts::train::ReverseTask task() const { return {std::uint64_t(seed), vocab, seq, batch}; }
};

Options parse(int argc, char** argv) {
  Options o;
  ts::train::Flags f("train_transformer", argc, argv);
  std::string schedule = "gpipe";
  f.mesh<M>("--mesh", o.mesh, {"data", "model", "stage", "context"})
      .value("--steps", o.steps).value("--layers", o.layers).value("--seed", o.seed).value("--zero", o.zero)
      .flag("--double", o.use_double)
      .custom("--dtype", [&](const std::string& v) {
        if (v != "float" && v != "double" && v != "bf16") f.fail("--dtype takes float, double or bf16, not '" + v + "'");
        o.use_double = v == "double";
        o.use_bf16 = v == "bf16";
      })
      .value("--batch", o.batch).value("--seq", o.seq).value("--dmodel", o.dmodel).value("--heads", o.heads)
      .value("--vocab", o.vocab).value("--hidden", o.hidden).value("--lr", o.lr).value("--clip", o.clip)
      .value("--dropout", o.dropout).value("--attention-dropout", o.attention_dropout).value("--peak-n", o.peak_n)
      .flag("--check", o.check)
      .flag("--overlap", o.overlap).flag("--no-overlap", o.overlap, false).flag("--prefetch", o.prefetch)
      .value("--bucket-mb", o.bucket_mb).value("--microbatches", o.microbatches).flag("--remat", o.remat)
      .choice("--activation-checkpoint", o.activation_checkpoint, {"full", "selective"})
      .value("--experts", o.experts).value("--save", o.save).value("--trace", o.trace).value("--data", o.data_file)
      .value("--eval", o.eval_file).value("--eval-every", o.eval_every).value("--write-data", o.write_data)
      .value("--sequences", o.sequences).flag("--report", o.report).flag("--profile", o.profile).value("--resume", o.resume)
      .value("--capacity-factor", o.capacity_factor).value("--aux-weight", o.aux_weight).value("--eod", o.eod)
      .flag("--reset-position-ids", o.reset_position_ids)
      .choice("--schedule", schedule, {"gpipe", "1f1b"})
      .parse();
  o.schedule = schedule == "1f1b" ? ts::nn::Schedule::OneFOneB : ts::nn::Schedule::GPipe;
  if (o.zero < 0 || o.zero > 3) f.fail("--zero takes 0, 1, 2 or 3");
  if (o.use_bf16 && (!o.save.empty() || !o.resume.empty()))
    f.fail("--save and --resume write and read float or double checkpoints (.npy has no bfloat16), not --dtype bf16");
  if (o.batch < 1 || o.seq < 1 || o.dmodel < 1 || o.heads < 1 || o.vocab < 2 || o.layers < 0 || o.steps < 0)
    f.fail("sizes must be positive (and --vocab at least 2)");
  if (o.microbatches < 1) f.fail("--microbatches must be at least 1");
  if (!(o.dropout >= 0 && o.dropout < 1) || !(o.attention_dropout >= 0 && o.attention_dropout < 1))
    f.fail("--dropout and --attention-dropout take a probability in [0, 1)");
  if (!(o.bucket_mb >= 0)) f.fail("--bucket-mb takes 0 (one bucket a module) or more");
  if (o.experts < 0) f.fail("--experts takes 0 (a dense MLP) or more");
  if (o.eval_every < 0) f.fail("--eval-every takes 0 (at the end only) or more steps");
  if (o.eval_every > 0 && o.eval_file.empty()) f.fail("--eval-every needs --eval FILE");
  if (!(o.capacity_factor > 0)) f.fail("--capacity-factor must be positive");
  if (o.eod >= o.vocab || (f.given("--eod") && o.eod < 0)) f.fail("--eod takes a token id below the vocabulary of " + std::to_string(o.vocab));
  if (o.reset_position_ids && o.eod < 0) f.fail("--reset-position-ids restarts the positions at each document: it needs --eod ID");
  if (o.batch % o.microbatches != 0)
    f.fail("a batch of " + std::to_string(o.batch) + " sequences does not divide into " + std::to_string(o.microbatches) +
           " micro-batches of equal size");
  return o;
}

// The model as a pipeline stage: stage s of K holds its share of the blocks, the first stage the
// embeddings, the last the final layernorm, the output projection and the loss. Every layer lives
// on the stage's {data, context, model} mesh; seeds depend on the global layer index, so the stages hold
// exactly the layers of the unpipelined model. It is written forward only (a ts::nn::Module with
// forward and loss): the pipeline derives its gradients, micro-batch by micro-batch.
template <class T>
class LanguageModel : public ts::nn::Module {
  using Rows = ts::Spec<ts::S<"data">, ts::S<"context">>;  // [B, T] ids: batch over data, positions over context
  using Ids = ts::ShardedTensor<std::int32_t, Sub, Rows>;
  using Acc = ts::accumulator_t<T>;             // the loss's sums (float for bfloat16)
  using ActivationSpec = ts::Spec<ts::S<"data">, ts::S<"context">, ts::R>;

 public:
  using Activation = ts::ShardedTensor<T, Sub, ActivationSpec>;  // [b, T, D] between stages

  LanguageModel(const M& mesh, const Options& o, const ts::nn::Pipeline<M>& pipe)
      : mesh_(mesh), sub_(mesh.submesh<"data", "context", "model">()), o_(o), first_(pipe.first()), last_(pipe.last()) {
    if (first_) {
      tokens_.emplace(sub_, o.vocab, o.dmodel, std::uint64_t(o.seed) * 1000 + 1);
      positions_.emplace(sub_, o.seq, o.dmodel, std::uint64_t(o.seed) * 1000 + 2);
    }
    const auto [begin, end] = pipe.partition(o.layers);
    for (int l = begin; l < end; ++l)
      blocks_.push_back(std::make_unique<Block>(
          sub_, ts::nn::BlockOptions{.dmodel = o.dmodel, .heads = o.heads, .hidden = o.hidden, .dropout = o.dropout,
                                     .attention_dropout = o.attention_dropout,
                                     .seed = std::uint64_t(o.seed) * 1000 + 10 + std::uint64_t(l), .experts = o.experts,
                                     .capacity_factor = o.capacity_factor, .aux_weight = o.aux_weight}));
    if (last_) {
      norm_.emplace(sub_, o.dmodel);
      head_.emplace(sub_, o.dmodel, o.vocab, std::uint64_t(o.seed) * 1000 + 3);
    }
    if (first_) {
      register_module("tokens", *tokens_);
      register_module("positions", *positions_);
    }
    for (std::size_t b = 0; b < blocks_.size(); ++b) register_module("block" + std::to_string(begin + int(b)), *blocks_[b]);
    if (last_) {
      register_module("norm", *norm_);
      register_module("head", *head_);
    }
    // The stages that need tokens read them (every stage knows the held-out file's rows; with
    // --eod every stage reads them, for the documents).
    if (!o.data_file.empty() && (first_ || last_ || o.eod >= 0))
      data_.emplace(sub_.comm(), o.data_file, o.seq, o.batch, "train_transformer: --data");
    if (!o.eval_file.empty()) eval_.emplace(sub_.comm(), o.eval_file, o.seq, 1, "train_transformer: --eval");
  }

  // Loss and accuracy (the next token's argmax) over every position of the held-out file, in
  // batches of --batch rows (the last one shorter), forwards alone through the pipeline. The
  // sums are sharded reductions; the result is the same on every rank.
  struct Evaluation {
    double loss = 0, accuracy = 0, sequences = 0, seconds = 0;
  };
  Evaluation evaluate(ts::nn::Pipeline<M>& pipe) {
    const auto t0 = ts::Clock::now();
    const Eigen::Index rows = eval_->rows();
    eval_loss_ = eval_hits_ = 0;
    for (Eigen::Index first = 0; first < rows; first += o_.batch) {
      const Eigen::Index count = std::min(o_.batch, rows - first);
      eval_first_ = first;
      (void)pipe.evaluate(*this, count, count % o_.microbatches == 0 ? o_.microbatches : 1);
    }
    std::array<double, 2> sums = {eval_loss_, eval_hits_};  // the last stage's, 0 elsewhere
    ts::all_reduce<"stage">(mesh_, std::span<double>(sums));
    const double tokens = double(rows) * double(o_.seq);
    return {sums[0] / tokens, sums[1] / tokens, double(rows), ts::train::seconds_since(t0)};
  }

  // The steps seen by the layers whose masks and routing depend on it (a resumed run).
  void resume(long steps) {
    for (auto& b : blocks_) b->resume(std::uint64_t(steps));
  }

  // This stage's parameters that the 6N FLOP rule counts (not the embeddings); of the experts'
  // weights [.., E], the two a token is routed to.
  double dense_parameters() const {
    double n = 0;
    for (const auto& [name, shape] : parameter_shapes()) {
      if (name.starts_with("tokens.") || name.starts_with("positions.")) continue;
      const bool expert = name.find(".moe.expert_") != std::string::npos;
      double e = expert ? std::min(2.0, double(o_.experts)) / double(o_.experts) : 1.0;
      for (auto d : shape) e *= double(d);
      n += e;
    }
    return n;
  }

  void start_step(long step) {
    step_ = step;
    loss_ = 0;
  }
  // (token, expert) assignments the gates made and those dropped over capacity, on this stage.
  std::int64_t assignments() const { return assignments_; }
  std::int64_t dropped() const { return dropped_; }
  Acc loss() const { return loss_; }  // this stage's share of the step's loss

  // ---- the pipeline stage, forward only ----
  Activation boundary(const ts::nn::MicroBatch& mb) const { return Activation(sub_, {rows(mb), o_.seq, o_.dmodel}); }

  // The stage's input (the embeddings on the first stage) through its blocks.
  Activation forward(const ts::nn::MicroBatch& mb, const Activation* in) {
    ts::nn::AttentionOptions attend;  // causal; with --eod, within each document
    if (o_.eod >= 0 && (!blocks_.empty() || (first_ && o_.reset_position_ids)))
      attend.document_starts = ts::nn::document_starts(ids(mb, 0), o_.eod);
    std::optional<Activation> x;
    if (first_) x.emplace(embed(mb, attend.document_starts));
    const Activation* cur = first_ ? &*x : in;
    for (auto& b : blocks_) {
      x.emplace(activation(block(*b, *cur, attend)));
      cur = &*x;
      if (b->has_experts() && !mb.recompute && !mb.inference) {  // the load-balancing term, and what was dropped
        loss_ += Acc(b->auxiliary_loss());
        assignments_ += b->moe().routing().assignments;
        dropped_ += b->moe().routing().dropped;
      }
    }
    if (!x) x.emplace(*cur);  // a stage without layers passes its input on
    return std::move(*x);
  }

  // The last stage: the micro-batch's mean next-token cross-entropy (logits [b, T, V] split over
  // the vocabulary, never gathered). Evaluating, it adds to the held-out sums instead.
  auto loss(const ts::nn::MicroBatch& mb, const Activation* in) {
    const Activation x = forward(mb, in);
    auto labels = ids(mb, 1);
    auto logits = (*head_)((*norm_)(x));
    auto loss = ts::nn::cross_entropy(logits, labels);
    if (mb.inference) {  // sums over the held-out tokens
      const double tokens = double(rows(mb)) * double(o_.seq);
      eval_loss_ += double(loss.value()) * tokens;
      eval_hits_ += double(ts::nn::accuracy(logits, labels)) * tokens;
    } else if (!mb.recompute) {
      loss_ += Acc(loss.value()) * Acc(share(mb));  // the mean over the whole batch
    }
    return loss;
  }

 private:
  using Block = ts::nn::TransformerBlock<T, Sub>;

  Eigen::Index rows(const ts::nn::MicroBatch& mb) const { return mb.rows_total / mb.count; }

  // A block's forward, its activations kept for the backward or recomputed in it.
  auto block(Block& b, const Activation& x, const ts::nn::AttentionOptions& attend) {
    if (o_.activation_checkpoint == "full") return activation(ts::nn::checkpoint(b, x, attend));
    if (o_.activation_checkpoint == "selective")
      return activation(ts::nn::checkpoint<ts::ad::Recompute::AllButProducts>(b, x, attend));
    return activation(b(x, attend));
  }
  T share(const ts::nn::MicroBatch& mb) const { return mb.count > 1 ? T(1) / T(mb.count) : T(1); }

  template <class X>
  static Activation activation(X&& x) {
    if constexpr (std::is_same_v<std::remove_cvref_t<X>, Activation>)
      return std::forward<X>(x);
    else
      return ts::reshard<ActivationSpec>(x);
  }

  // The micro-batch's ids (shift 0) or labels (shift 1): rows [offset, offset + b) of the batch,
  // from the synthetic task, from --data or, evaluating, from --eval (each rank reads only its
  // rows, once for ids and labels; the rows that follow are read in the background).
  Ids ids(const ts::nn::MicroBatch& mb, Eigen::Index shift) {
    const Eigen::Index b = rows(mb);
    if (mb.inference) {  // the held-out file in order; a shorter last batch
      const Eigen::Index first = eval_first_ + mb.row_offset;
      return eval_->ids<Rows>(sub_, first, b, shift, first + b,
                              std::min(o_.batch / std::max(1, mb.count), eval_->rows() - first - b));
    }
    if (data_) return data_->batch_ids<Rows>(sub_, step_, o_.batch, mb.row_offset, b, shift);
    return o_.task().ids<Rows>(sub_, step_, mb.row_offset, b, shift);
  }

  // Token plus position embeddings; with --reset-position-ids, positions count from each document's start.
  Activation embed(const ts::nn::MicroBatch& mb, const std::vector<std::vector<Eigen::Index>>& documents) {
    const bool reset = o_.reset_position_ids;
    auto positions = ts::from_function<std::int32_t, Rows>(sub_, {rows(mb), o_.seq}, [&](const auto& i) {
      return std::int32_t(reset ? ts::nn::position_in_document(documents[std::size_t(i[0])], i[1]) : i[1]);
    });
    return activation((*tokens_)(ids(mb, 0)) + (*positions_)(positions));  // the vocab's partial resolved
  }

  const M& mesh_;
  Sub sub_;
  Options o_;
  bool first_, last_;
  long step_ = 0;
  Acc loss_ = 0;
  std::int64_t assignments_ = 0, dropped_ = 0;
  std::optional<ts::nn::Embedding<T, Sub, ts::Spec<ts::S<"model">, ts::R>>> tokens_;
  std::optional<ts::nn::Embedding<T, Sub, ts::Spec<ts::R, ts::R>>> positions_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::optional<ts::nn::LayerNorm<T, Sub>> norm_;
  std::optional<ts::nn::Linear<T, Sub, ts::Spec<ts::R, ts::S<"model">>>> head_;
  std::optional<ts::train::TokenFile> data_, eval_;
  Eigen::Index eval_first_ = 0;   // the evaluated batch's first row in the held-out file
  double eval_loss_ = 0, eval_hits_ = 0;  // summed over the held-out tokens (the last stage)
};

// --write-data: the synthetic task's first N sequences (row step * batch + b) as int32
// [N, seq + 1], written by every rank's block; training on it gives the synthetic curve.
int write_data(const M& mesh, const Options& o) {
  const long n = o.sequences > 0 ? o.sequences : long(o.steps) * o.batch;
  const auto task = o.task();
  auto tokens = ts::from_function<std::int32_t, ts::Spec<ts::S<"data", "stage", "context", "model">, ts::R>>(
      mesh, {Eigen::Index(n), o.seq + 1},
      [&](const auto& i) { return task.token(long(i[0] / o.batch), i[0] % o.batch, i[1]); });
  ts::io::save_npy(o.write_data, tokens);
  if (mesh.rank() == 0) std::printf("wrote %ld sequences of %lld tokens to %s\n", n, (long long)(o.seq + 1), o.write_data.c_str());
  return 0;
}

struct Run {
  std::vector<double> losses;
  ts::train::MemoryMeter meter;  // resident memory above that before the model; the buffer pool
  double seconds = 0;
  ts::nn::OptimizerMemory memory;
  double blocked = 0;
  ts::nn::ParameterGatherStats gathers;  // ZeRO-3's, in the last step
  double dense = 0;
  ts::nn::PipelineStats pipeline;  // times summed over the timed steps; bytes of the last step
  double moe_bytes = 0;                    // bytes sent by the experts' layers, all ranks, per step
  double moe_all_to_all_bytes = 0;         // of those, by the all-to-alls
  std::int64_t assignments = 0, dropped = 0;  // all stages, all steps
  int first_step = 0;                          // > 0 where the run resumed
  struct Eval {
    int step;  // after how many steps
    double loss, accuracy, sequences, seconds;
  };
  std::vector<Eval> evals;  // --eval: over the held-out file
  ts::StepTimes split;       // --profile: the timed steps' split summed (min, median, max over ranks)
};

// What a checkpoint must agree on with the run that resumes it: the model and the data.
ts::train::RunSettings checkpoint_settings(const Options& o) {
  return {{"seed", std::to_string(o.seed)},     {"layers", std::to_string(o.layers)},   {"dmodel", std::to_string(o.dmodel)},
          {"heads", std::to_string(o.heads)},   {"vocab", std::to_string(o.vocab)},     {"hidden", std::to_string(o.hidden)},
          {"experts", std::to_string(o.experts)}, {"seq", std::to_string(o.seq)},      {"batch", std::to_string(o.batch)}};
}

// The whole training state: parameters, AdamW's moments (ZeRO chunks gathered into each
// parameter's layout), the step (which is also the data position: batches and dropout masks
// are functions of (seed, step)), and what the model and data are. Each stage writes its own
// layers; every tensor is the global one, so any mesh and ZeRO stage can load it.
template <class T, class Optimizer>
void save_checkpoint(const M& mesh, const Options& o, LanguageModel<T>& model, Optimizer& opt, long step) {
  ts::train::SaveOptions save;
  if (const char* kill = std::getenv("TRAIN_TRANSFORMER_KILL_DURING_SAVE"))  // the atomicity test
    save.after_each = [n = std::atoi(kill)](int written) {
      if (written == n) std::raise(SIGKILL);
    };
  ts::train::save_checkpoint(mesh, o.save, model, opt, step, checkpoint_settings(o), save);
}

// Checkpoints written before parameters had one name everywhere called the k-th parameter of a
// top-level layer "<layer>/<k>" (and its AdamW moments "<layer>/<k>/adam0" and "/adam1").
std::function<std::string(const std::string&)> older_names(const ts::nn::Module& model, const ts::io::CheckpointReader& in) {
  std::map<std::string, std::string> older;
  std::map<std::string, int> count;
  for (const auto& name : model.parameter_names()) {
    const std::string layer = name.substr(0, name.find('.'));
    older[name] = layer + "/" + std::to_string(count[layer]++);
  }
  if (older.empty() || !in.has(older.begin()->second)) return {};
  return [older](const std::string& name) {
    const auto it = older.find(name);
    return it == older.end() ? name : it->second;
  };
}

// Returns the step to go on from.
template <class T, class Optimizer>
long load_checkpoint(const M& mesh, const Options& o, LanguageModel<T>& model, Optimizer& opt) {
  const auto rename = older_names(model, ts::io::CheckpointReader(mesh.comm(), o.resume));
  const long step = ts::train::load_checkpoint(mesh, o.resume, model, opt, checkpoint_settings(o), "train_transformer", rename);
  model.resume(step);
  return step;
}

// --profile: a step's split on rank 0's line, and summed over the timed steps into `sum`.
void report_profile(const M& mesh, int step, const ts::StepTimes& t, ts::StepTimes& sum, bool timed) {
  if (mesh.rank() == 0)
    std::printf("profile step %d: compute %.1f/%.1f/%.1f ms, waiting for the slowest rank %.1f/%.1f/%.1f ms, moving bytes "
                "%.1f/%.1f/%.1f ms (min/median/max over %d ranks)\n", step, 1e3 * t.min.compute, 1e3 * t.median.compute,
                1e3 * t.max.compute, 1e3 * t.min.skew, 1e3 * t.median.skew, 1e3 * t.max.skew, 1e3 * t.min.transfer,
                1e3 * t.median.transfer, 1e3 * t.max.transfer, t.ranks);
  if (!timed) return;
  for (auto [to, from] : {std::pair{&sum.min, &t.min}, {&sum.median, &t.median}, {&sum.max, &t.max}})
    to->compute += from->compute, to->skew += from->skew, to->transfer += from->transfer;
  sum.ranks = t.ranks, sum.seconds += 1;  // (seconds counts the steps summed)
}

template <class T>
Run train(const M& mesh, const Options& o, int zero, int microbatches) {
  Run run;
  run.meter.start();  // (the sgemm peak's matrices, a --check run before, are not this run's)
  ts::nn::Pipeline<M> pipe(mesh, {.microbatches = microbatches, .schedule = o.schedule, .remat = o.remat});
  LanguageModel<T> model(mesh, o, pipe);
  ts::nn::AdamW opt({.lr = float(o.lr), .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f,
                     .zero_stage = zero, .data_axis = "data,context", .overlap = o.overlap, .prefetch = o.prefetch,
                     .bucket_bytes = std::int64_t(o.bucket_mb * double(1 << 20))});
  opt.add(model);
  opt.set_norm_mesh(mesh);  // the gradient norm sums over every stage
  run.dense = ts::all_reduce<"stage">(mesh, model.dense_parameters());
  const bool checkpoints = mesh.size() == ts::Environment::world_size();  // not the --check run
  if constexpr (!std::is_same_v<T, ts::bfloat16>)  // (.npy has no bfloat16: refused by parse)
    if (checkpoints && !o.resume.empty()) run.first_step = int(load_checkpoint(mesh, o, model, opt));
  ts::reset_comm_stats();
  if (checkpoints && !o.trace.empty()) ts::start_trace(mesh.comm());
  std::optional<ts::StepProfiler> profile;
  if (checkpoints && o.profile) profile.emplace(mesh.comm());
  for (int step = run.first_step; step < o.steps; ++step) {
    const auto t0 = ts::train::synchronized_now(mesh);
    if (profile) profile->begin_step();
    opt.zero_grad();
    opt.no_sync(microbatches > 1);  // gradients add up over the micro-batches; reduced once, by step()
    model.start_step(step);
    const ts::nn::PipelineStats ps = pipe.run(model, o.batch);
    // The last stage's cross-entropy (and every stage's auxiliary losses).
    const double loss = ts::all_reduce<"stage">(mesh, double(model.loss()));
    opt.clip_grad_norm(o.clip);
    run.memory = opt.memory();  // reduced gradients present, state updated next
    run.meter.sample_pool();
    opt.step();
    if (profile) report_profile(mesh, step, profile->end_step(), run.split, step > run.first_step || o.steps == run.first_step + 1);
    if (step > run.first_step || o.steps == run.first_step + 1) {
      run.seconds += ts::train::seconds_since(t0);
      run.pipeline.seconds += ps.seconds;
      run.pipeline.idle_seconds += ps.idle_seconds;
      run.pipeline.busy_seconds += ps.busy_seconds;
    }
    run.pipeline.peak_activation_bytes = ps.peak_activation_bytes;  // the last step's: steady state
    run.pipeline.microbatch_activation_bytes = ps.microbatch_activation_bytes;
    run.pipeline.kept_bytes = ps.kept_bytes;
    run.pipeline.boundary_bytes = ps.boundary_bytes;
    run.pipeline.in_flight = std::max(run.pipeline.in_flight, ps.in_flight);
    run.blocked += opt.last_reduction().blocked_seconds;
    run.gathers = opt.last_parameter_gathers();  // the last step's: steady state
    run.losses.push_back(loss);
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0) {
      const auto e = model.evaluate(pipe);
      run.evals.push_back({step + 1, e.loss, e.accuracy, e.sequences, e.seconds});
    }
  }
  // Everything the model and its training took, as PyTorch's RSS growth is measured in
  // tests/reference/gpt_reference.py (before the held-out evaluation).
  run.meter.measure(mesh);
  if (!o.eval_file.empty() && (run.evals.empty() || run.evals.back().step != o.steps)) {
    const auto e = model.evaluate(pipe);
    run.evals.push_back({std::max(run.first_step, o.steps), e.loss, e.accuracy, e.sequences, e.seconds});
  }
  if (checkpoints && !o.trace.empty()) ts::write_trace(o.trace, mesh.comm());
  if (checkpoints && o.report) {  // rank 0's collectives, per step
    const double steps = std::max(1, o.steps - run.first_step);
    if (mesh.rank() == 0) {
      std::printf("cost per step on rank 0 (operator, collective: calls, bytes sent, ms):\n");
      for (const auto& [name, op] : ts::comm_stats().operators())
        for (const auto& [kind, c] : op.collectives)
          std::printf("  %s, %s: %.1f calls, %.0f B, %.3f ms\n", name.c_str(), kind.c_str(), double(c.calls) / steps,
                      double(c.bytes_sent) / steps, 1e3 * c.seconds / steps);
    }
  }
  if constexpr (!std::is_same_v<T, ts::bfloat16>)
    if (checkpoints && !o.save.empty()) save_checkpoint(mesh, o, model, opt, std::max(run.first_step, o.steps));
  std::array<double, 4> moe = {0, 0, double(model.assignments()), double(model.dropped())};
  for (const auto& [name, op] : ts::comm_stats().operators()) {
    if (name.find("moe") == std::string::npos) continue;
    for (const auto& [kind, c] : op.collectives) {
      moe[0] += double(c.bytes_sent);
      if (kind == "all_to_all") moe[1] += double(c.bytes_sent);
    }
  }
  ts::all_reduce(mesh, std::span<double>(moe));
  const double per_stage_line = double(mesh.size<"data">()) * mesh.size<"context">() * mesh.size<"model">();  // ranks that counted each stage's routing
  run.moe_bytes = moe[0] / std::max(1, o.steps);
  run.moe_all_to_all_bytes = moe[1] / std::max(1, o.steps);
  run.assignments = std::int64_t(moe[2] / per_stage_line);
  run.dropped = std::int64_t(moe[3] / per_stage_line);
  return run;
}

// Per stage: the bubble measured next to GPipe's (K-1)/(M+K-1), and the peak memory above the
// step's start next to each schedule's activation formula in A (what one micro-batch's forward
// keeps on the stage) plus the gradients the step leaves allocated.
void report_pipeline(const M& mesh, const Options& o, const Run& run) {
  const int k = mesh.size<"stage">(), s = mesh.coord<"stage">(), mbs = o.microbatches;
  const auto& p = run.pipeline;
  const double a = double(p.microbatch_activation_bytes), in = double(p.boundary_bytes);
  const double formula = o.remat ? mbs * in + a : (o.schedule == ts::nn::Schedule::GPipe ? mbs : std::min(k - s, mbs)) * a;
  constexpr int n = 8;
  const std::array<double, n> mine = {p.busy_seconds, double(p.peak_activation_bytes), formula, a, double(p.in_flight),
                                      double(p.kept_bytes), p.seconds, p.idle_seconds};
  const std::vector<double> all = ts::gather<"stage">(mesh, std::span<const double>(mine));  // n per stage
  if (mesh.rank() != 0) return;
  // The bubble of stage s: the part of the step (the slowest stage's) it spends not computing.
  double step = 0;
  for (int i = 0; i < k; ++i) step = std::max(step, all[std::size_t(n * i + 6)]);
  std::printf("pipeline: %d stages, %d micro-batches, %s%s; bubble (1 - busy / step) per stage:", k, mbs,
              ts::nn::to_string(o.schedule), o.remat ? " with remat" : "");
  for (int i = 0; i < k; ++i) std::printf(" %.1f%%", 100 * (1 - all[std::size_t(n * i)] / step));
  std::printf(" (blocked in receives and sends");
  for (int i = 0; i < k; ++i) std::printf(" %.1f%%", 100 * all[std::size_t(n * i + 7)] / step);
  std::printf("); GPipe's (K-1)/(M+K-1) = %.1f%%\n", 100.0 * (k - 1) / (mbs + k - 1));
  std::printf("memory per stage, MiB (peak above the step's start | activations by %s + gradients):",
              o.remat ? "M*input + A" : (o.schedule == ts::nn::Schedule::GPipe ? "M*A" : "min(K-s,M)*A"));
  for (int i = 0; i < k; ++i) {
    const double* v = &all[std::size_t(n * i)];
    std::printf(" [%d] %.1f | %.1f + %.1f (A %.1f, %d in flight)", i, v[1] / 1048576, v[2] / 1048576, v[5] / 1048576,
                v[3] / 1048576, int(v[4]));
  }
  std::printf("\n");
}

template <class T>
int run_all(const M& mesh, const Options& o) {
  const double peak = ts::train::gemm_rate(mesh, o.peak_n);
  const Run run = train<T>(mesh, o, o.zero, o.microbatches);
  bool ok = true;
  double worst = 0;
  if (o.check) {  // the single-rank curve, unpipelined, on every rank alone
    M self(MPI_COMM_SELF, {1, 1, 1, 1});
    Options plain = o;  // the plain model: activation checkpointing must not change the curve
    plain.activation_checkpoint.clear();
    const Run serial = train<T>(self, plain, 0, 1);
    worst = ts::train::largest_relative_difference(run.losses, serial.losses, std::size_t(run.first_step));
    // The held-out loss alike; the accuracy to one token (an argmax tie broken by rounding).
    bool same_accuracy = serial.evals.size() >= run.evals.size();
    for (std::size_t e = 0; same_accuracy && e < run.evals.size(); ++e) {
      const auto& want = serial.evals[serial.evals.size() - run.evals.size() + e];
      worst = std::max(worst, std::abs(run.evals[e].loss - want.loss) / std::abs(want.loss));
      same_accuracy = std::abs(run.evals[e].accuracy - want.accuracy) * want.sequences * double(o.seq) <= 1.0 + 1e-9;
    }
    // bfloat16: sums split over ranks round at other places than one rank's (8 bits of mantissa).
    ok = worst < (sizeof(T) == 8 ? 1e-9 : sizeof(T) == 4 ? 1e-4 : 3e-2) && same_accuracy;
  }
  ok = ts::agree(ok);
  if (mesh.size<"stage">() > 1 || o.microbatches > 1) report_pipeline(mesh, o, run);
  if (mesh.rank() == 0) {
    for (std::size_t s = 0; s < run.losses.size(); ++s)
      std::printf("step %zu loss %.17g\n", s + std::size_t(run.first_step), run.losses[s]);
    for (const auto& e : run.evals)
      std::printf("eval after step %d: loss %.17g accuracy %.6f over %.0f held-out sequences (%.0f tokens, %.0f tokens/s)\n",
                  e.step, e.loss, e.accuracy, e.sequences, e.sequences * double(o.seq),
                  e.sequences * double(o.seq) / std::max(e.seconds, 1e-9));
    const int timed = std::max(1, o.steps - run.first_step - 1);
    const double tokens = double(o.batch * o.seq);
    // 6 N per token for the dense weights, plus attention's scores and context (12 L T D).
    const double flops = tokens * (6 * run.dense + 12.0 * o.layers * double(o.seq) * double(o.dmodel));
    const double per_step = run.seconds / timed;
    std::printf("mesh %s, zero %d%s, %s: %.0f tokens/s, %.2f GFLOP/s, MFU %.1f%% of %.2f GFLOP/s "
                "(sgemm n=%d on every rank), gradient reduction not hidden %.1f ms/step\n",
                ts::train::mesh_sizes_text(mesh, {"context"}).c_str(), o.zero, o.overlap ? " (overlapped)" : "",
                sizeof(T) == 8 ? "double" : sizeof(T) == 4 ? "float" : "bf16", tokens / per_step, flops / per_step / 1e9, 100 * flops / per_step / peak,
                peak / 1e9, o.peak_n, 1e3 * run.blocked / std::max(1, o.steps));
    if (o.profile && run.split.seconds > 0) {
      const auto& p = run.split;
      const double k = 1e3 / p.seconds;
      std::printf("time per step (min/median/max over %d ranks): compute %.1f/%.1f/%.1f ms, waiting for the slowest rank "
                  "%.1f/%.1f/%.1f ms, moving bytes %.1f/%.1f/%.1f ms\n", p.ranks, k * p.min.compute, k * p.median.compute,
                  k * p.max.compute, k * p.min.skew, k * p.median.skew, k * p.max.skew, k * p.min.transfer, k * p.median.transfer,
                  k * p.max.transfer);
    }
    if (o.zero == 3 && o.prefetch)
      std::printf("ZeRO-3 parameter gathers in the last step: %d prefetched, %d kept from the use before, %d waited for, "
                  "%d prefetched in vain\n",
                  run.gathers.prefetched, run.gathers.kept, run.gathers.blocking, run.gathers.discarded);
    // ZeRO's formulas over the parameters replicated on data and context, with p, g and k bytes per element
    // of parameters, gradients and optimizer state (4, 4, 8 in float; in bf16 2, 2 and 12: the
    // moments and a master copy in float, as the ZeRO paper's mixed precision); the experts'
    // (split over data) are held whole at every stage: (p + g + k) Psi_split more.
    using Acc = ts::accumulator_t<T>;
    const double pb = sizeof(T), gb = sizeof(T), kb = 2.0 * sizeof(Acc) + (std::is_same_v<T, Acc> ? 0 : sizeof(Acc));
    const double psi = double(run.memory.model_elements) * sizeof(T), n = double(mesh.size<"data">()) * mesh.size<"context">();
    const double split = double(run.memory.data_split_elements) * sizeof(T), r = (psi - split) / sizeof(T);
    const double expect[4] = {(pb + gb + kb) * r, (pb + gb) * r + kb * r / n, pb * r + (gb + kb) * r / n,
                              (pb + gb + kb) * r / n};
    const double whole = (pb + gb + kb) * split / sizeof(T);
    char experts_part[96] = "";
    if (split > 0) std::snprintf(experts_part, sizeof experts_part, ", %.1f KiB of them experts' split over data, held whole", split / 1024.0);
    std::printf("memory per rank before the update: parameters %.1f KiB, gradients %.1f KiB, optimizer state %.1f KiB, "
                "total %.1f KiB; ZeRO-%d formula %.1f KiB (Psi = %.1f KiB of local parameters%s, N = %d)\n",
                run.memory.parameters / 1024.0, run.memory.gradients / 1024.0, run.memory.state / 1024.0,
                run.memory.total() / 1024.0, o.zero, (expect[o.zero] + whole) / 1024.0, psi / 1024.0,
                experts_part, int(n));
    run.meter.print(mesh);
    if (o.experts > 0) {
      // GShard's all-to-alls: [G, C, D, E] per MoE layer and micro-batch, twice forward, twice backward
      // (once more forward under remat, and again under activation checkpointing), on every context and model rank. Data rank i holds experts E_i and
      // groups G_i (the chunk rule) and sends rank j the block [G_i, C, D, E_j]: over all ranks,
      // (E G - sum_i E_i G_i) C D elements.
      const int pd = mesh.size<"data">();
      const double pm = double(mesh.size<"context">()) * mesh.size<"model">(), mbs = o.microbatches, groups = double(o.batch) / mbs;
      auto shard = [&](double n, int i) {
        const double chunk = std::ceil(n / pd);
        return std::clamp(n - i * chunk, 0.0, chunk);
      };
      double diagonal = 0;
      for (int i = 0; i < pd; ++i) diagonal += shard(o.experts, i) * shard(groups, i);
      const double c = std::max(1.0, std::min(double(o.seq), std::ceil(o.capacity_factor * 2.0 * double(o.seq) / o.experts)));
      // Two per forward and two per backward; each recomputation of the forward adds two.
      const int forwards = 1 + (o.remat ? 1 : 0) + (o.activation_checkpoint.empty() ? 0 : 1);
      const double analytic = o.layers * (2 * forwards + 2) * mbs * pm * (o.experts * groups - diagonal) * c *
                              double(o.dmodel) * sizeof(T);
      std::printf("experts: %d per block, capacity %.0f per group of %lld tokens; dropped %lld of %lld assignments (%.2f%%); "
                  "all-to-all bytes per step over all ranks %.0f, analytic %.0f; all bytes of the expert layers %.0f\n",
                  o.experts, c, (long long)o.seq, (long long)run.dropped, (long long)run.assignments,
                  100.0 * double(run.dropped) / double(std::max<std::int64_t>(1, run.assignments)), run.moe_all_to_all_bytes,
                  analytic, run.moe_bytes);
    }
    if (o.check) std::printf("largest relative difference from the single-rank curve %.2e%s\n", worst, ok ? "" : " (FAILED)");
  }
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  try {
    const Options o = parse(argc, argv);
    const M mesh = o.mesh.make("train_transformer");
    if (mesh.rank() == 0) std::printf("%s\n", ts::kernels_report().c_str());  // which kernels run
    ts::io::require_writable(mesh.comm(), {o.save, o.trace, o.write_data});  // before training, not after
    if (!o.write_data.empty()) return write_data(mesh, o);
    ts::flush_denormals();  // tiny probabilities would otherwise slow float GEMMs many times
    if (o.use_bf16) return run_all<ts::bfloat16>(mesh, o);
    return o.use_double ? run_all<double>(mesh, o) : run_all<float>(mesh, o);
  } catch (const ts::train::UsageError& e) {  // every rank parses the same line: all report and leave
    return ts::train::Flags::report(e);
  } catch (const ts::IoError& e) {  // a file's error, thrown on every rank alike
    return ts::train::Flags::report(e, 1);
  }
}
