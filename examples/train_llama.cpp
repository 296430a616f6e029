// A Llama written as a user of tshard writes one: modules, forward only (the gradients are
// derived), HF's names and shapes, over any {data, stage, context, model} mesh: batch over "data";
// positions over "context" (attention passes keys and values round a ring, or reshards positions to
// heads and back, whichever its options' Auto picks); heads (a query head beside
// its key-value head), the MLP's hidden dim and the vocabulary over "model" (Megatron's layout, by
// annotation); "stage" cuts the layers into a pipeline. RMSNorm, rotary, GQA, SwiGLU.
//
//   mpirun -np 4 ./train_llama --mesh data=2,model=2 --text README.md --steps 200 --generate 80 --prompt "The "
//   mpirun -np 4 ./train_llama --mesh data=2,model=2 --double --check          # = the one-rank curve
//   mpirun -np 2 ./train_llama --hf SmolLM-135M --text notes.txt --steps 100 --save-hf tuned --generate 40 --prompt "Once"
//
// Data: synthetic, --text FILE (bytes or a tokenizer's ids; the last tenth held out for --eval-every K) or --data
// FILE (int32 .npy [N, seq + 1]). Files: --init, --save-safetensors (HF's layout), --hf DIR, --save-hf DIR (transformers'
// directories), --save DIR [--save-every K], --resume DIR (any mesh). --eod ID packs documents: a query attends only
// within its document, which ends at each ID (Megatron's --reset-attention-mask; the positions run on).
// Output: "step <n> loss <l>", sample, speed, memory.
#include <tshard/tshard.hpp>
#include <tshard/train/train.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ts = tshard;
using M = ts::Mesh<"data", "stage", "context", "model">;
using Sub = ts::Mesh<"data", "context", "model">;  // one pipeline stage
using Index = Eigen::Index;
using ts::R, ts::S;

struct Options {
  ts::train::MeshSizes<M> mesh;
  int steps = 10, layers = 2, zero = 0, microbatches = 1;
  long seed = 1, eod = -1;  // eod >= 0: the token that ends a packed document
  bool use_double = false, check = false, overlap = false, remat = false, kv_cache = true;
  Index batch = 8, seq = 16, dmodel = 32, heads = 4, kv_heads = 0, vocab = 64, hidden = 0;
  double lr = 3e-3, clip = 1.0, weight_decay = 0.1, temperature = 0, min_lr = -1;  // min_lr >= 0: cosine decay to it
  int top_k = 0, generate = 0, eval_every = 0, save_every = 0, warmup = 0;
  bool show_sharding = false;
  std::string schedule = "gpipe", attention = "fused", prompt, text, data_file, save, resume, init, save_safetensors, hf, save_hf;
  ts::train::LlamaConfig llama{.rms_norm_eps = 1e-5};  // the head dim, norm eps, rotary and tying (--hf's config.json)
  std::shared_ptr<const ts::train::HfDirectory> dir;   // --hf's
  Index head_dim() const { return llama.head_dim ? llama.head_dim : dmodel / heads; }
  const ts::train::Tokenizer* tokenizer() const { return dir && dir->tokenizer ? &*dir->tokenizer : nullptr; }
  ts::train::LlamaConfig config() const {  // HF's config of these sizes
    ts::train::LlamaConfig c = llama;
    c.hidden_size = dmodel, c.intermediate_size = hidden, c.num_hidden_layers = layers, c.num_attention_heads = heads, c.num_key_value_heads = kv_heads;
    return c.vocab_size = vocab, c.head_dim = head_dim(), c;
  }
};
template <class T, class SpecT> using Weight = ts::train::HfWeight<T, Sub, SpecT>;  // one parameter "weight" in HF's layout


using Activation = ts::Spec<S<"data">, S<"context">, R>;  // [B, T, D]: batch over data, positions over context

// Rotary tables of positions [offset, offset + t) (HF's rotate_half, the config's theta) for q and k
// [B, T, Dh, ...]; for --attention einsum, the causal mask of those queries over keys [0, offset + t).
template <class T>
struct Positions {
  std::pair<ts::ShardedTensor<T, Sub, ts::Replicated<5>>, ts::ShardedTensor<T, Sub, ts::Replicated<5>>> q;  // [1, t, Dh, 1, 1]
  std::pair<ts::ShardedTensor<T, Sub, ts::Replicated<4>>, ts::ShardedTensor<T, Sub, ts::Replicated<4>>> k;  // [1, t, Dh, 1]
  std::optional<ts::ShardedTensor<T, Sub, ts::Replicated<5>>> mask;  // [1, t, S, 1, 1]
  std::vector<std::vector<Index>> documents;  // --eod: where each row's documents start
  Positions(const Sub& mesh, const Options& c, Index t, Index offset)
      : q(ts::nn::rotary_tables<T, 5, 1, 2>(mesh, t, c.head_dim(), offset, c.llama.rope)), k(ts::nn::rotary_tables<T, 4, 1, 2>(mesh, t, c.head_dim(), offset, c.llama.rope)) {
    if (c.attention == "einsum")
      mask.emplace(ts::from_function<T, ts::Replicated<5>>(
          mesh, {1, t, offset + t, 1, 1}, [=](const auto& i) { return i[2] > offset + i[1] ? -std::numeric_limits<T>::infinity() : T(0); }));
  }
  template <class X>
  auto rope(const X& x) const {
    if constexpr (X::rank == 5) return ts::nn::rotary<2>(x, q.first, q.second);
    else return ts::nn::rotary<2>(x, k.first, k.second);
  }
};

template <class T>
struct KvCache {  // [B, S, Dh, KV] per layer: batch over data, positions over context, key-value heads over model
  std::optional<ts::ShardedTensor<T, Sub, ts::Spec<S<"data">, S<"context">, R, S<"model">>>> k, v;
};

template <class T>
struct RmsNorm : Weight<T, ts::Spec<R>> {
  T eps;
  RmsNorm(const Sub& mesh, const Options& c, const std::string& name) : Weight<T, ts::Spec<R>>(mesh, name, {c.dmodel}, {c.dmodel}, c.seed, 0.02, true), eps(T(c.llama.rms_norm_eps)) {}
  template <class X>
  auto operator()(const X& x) {
    return x * (T(1) / ts::sqrt(ts::mean<2>(x * x, ts::keep_dims) + eps)) * this->weight;
  }
};

template <class T>
struct Attention : ts::nn::Module {  // grouped-query: query head g of group v reads key-value head v
  Weight<T, ts::Spec<R, R, S<"model">, R>> q_proj;  // [Dh, G, KV, D]
  Weight<T, ts::Spec<R, S<"model">, R>> k_proj, v_proj;  // [Dh, KV, D]
  Weight<T, ts::Spec<R, R, R, S<"model">>> o_proj;  // [D, Dh, G, KV]
  T scale;
  Attention(const Sub& mesh, const Options& c, const std::string& at)
      : q_proj(mesh, at + "q_proj.weight", {c.head_dim(), c.heads / c.kv_heads, c.kv_heads, c.dmodel}, {c.heads * c.head_dim(), c.dmodel}, c.seed),
        k_proj(mesh, at + "k_proj.weight", {c.head_dim(), c.kv_heads, c.dmodel}, {c.kv_heads * c.head_dim(), c.dmodel}, c.seed),
        v_proj(mesh, at + "v_proj.weight", {c.head_dim(), c.kv_heads, c.dmodel}, {c.kv_heads * c.head_dim(), c.dmodel}, c.seed),
        o_proj(mesh, at + "o_proj.weight", {c.dmodel, c.head_dim(), c.heads / c.kv_heads, c.kv_heads}, {c.dmodel, c.heads * c.head_dim()}, c.seed),
        scale(T(1 / std::sqrt(double(c.head_dim())))) {
    register_module("q_proj", q_proj);
    register_module("k_proj", k_proj);
    register_module("v_proj", v_proj);
    register_module("o_proj", o_proj);
  }
  template <class X>
  auto operator()(const X& x, const Positions<T>& pos, KvCache<T>* cache) {
    auto q = pos.rope(ts::einsum<"btd,kgvd->btkgv">(x, q_proj.weight));
    auto k = pos.rope(ts::einsum<"btd,kvd->btkv">(x, k_proj.weight));
    auto v = ts::einsum<"btd,kvd->btkv">(x, v_proj.weight);
    if (!cache) return attend(q, k, v, pos);
    cache->k = cache->k ? ts::concat<1>(*cache->k, k) : k;  // sampling: the positions before these too
    cache->v = cache->v ? ts::concat<1>(*cache->v, v) : v;
    return attend(q, *cache->k, *cache->v, pos);
  }
  template <class Q, class K, class V>
  auto attend(const Q& q, const K& k, const V& v, const Positions<T>& pos) {
    if (!pos.mask)  // fused, blockwise: no T x S scores (the queries are the last positions of the keys')
      return ts::einsum<"btkgv,dkgv->btd">(
          ts::nn::scaled_dot_product_attention(q, k, v, {.scale = double(scale), .document_starts = pos.documents}), o_proj.weight);
    auto p = ts::nn::softmax<2>(ts::einsum<"btkgv,bskv->btsgv">(q, k) * scale + *pos.mask);
    return ts::einsum<"btkgv,dkgv->btd">(ts::einsum<"btsgv,bskv->btkgv">(p, v), o_proj.weight);
  }
};

template <class T>
struct Mlp : ts::nn::Module {  // SwiGLU
  Weight<T, ts::Spec<S<"model">, R>> gate_proj, up_proj;  // [F, D]
  Weight<T, ts::Spec<R, S<"model">>> down_proj;           // [D, F]
  Mlp(const Sub& mesh, const Options& c, const std::string& at)
      : gate_proj(mesh, at + "gate_proj.weight", {c.hidden, c.dmodel}, {c.hidden, c.dmodel}, c.seed),
        up_proj(mesh, at + "up_proj.weight", {c.hidden, c.dmodel}, {c.hidden, c.dmodel}, c.seed),
        down_proj(mesh, at + "down_proj.weight", {c.dmodel, c.hidden}, {c.dmodel, c.hidden}, c.seed) {
    register_module("gate_proj", gate_proj);
    register_module("up_proj", up_proj);
    register_module("down_proj", down_proj);
  }
  template <class X>
  auto operator()(const X& x) {
    auto g = ts::einsum<"btd,fd->btf">(x, gate_proj.weight);
    return ts::einsum<"btf,df->btd">(g * ts::sigmoid(g) * ts::einsum<"btd,fd->btf">(x, up_proj.weight), down_proj.weight);
  }
};

template <class T>
struct DecoderLayer : ts::nn::Module {
  RmsNorm<T> input_layernorm;
  Attention<T> self_attn;
  RmsNorm<T> post_attention_layernorm;
  Mlp<T> mlp;
  DecoderLayer(const Sub& mesh, const Options& c, const std::string& at)
      : input_layernorm(mesh, c, at + "input_layernorm.weight"), self_attn(mesh, c, at + "self_attn."),
        post_attention_layernorm(mesh, c, at + "post_attention_layernorm.weight"), mlp(mesh, c, at + "mlp.") {
    register_module("input_layernorm", input_layernorm);
    register_module("self_attn", self_attn);
    register_module("post_attention_layernorm", post_attention_layernorm);
    register_module("mlp", mlp);
  }
  template <class X>
  auto operator()(const X& x, const Positions<T>& pos, KvCache<T>* cache = nullptr) {
    auto h = ts::reshard<Activation>(x + self_attn(input_layernorm(x), pos, cache));
    return ts::reshard<Activation>(h + mlp(post_attention_layernorm(h)));
  }
};

// HF's LlamaModel, or a pipeline stage's part of it: the embedding on the first stage, layers
// [first, last), the final norm on the last stage.
template <class T>
struct LlamaModel : ts::nn::Module {
  std::optional<Weight<T, ts::Spec<S<"model">, R>>> embed_tokens;  // [V, D], the vocabulary over model
  ts::nn::Module layers;  // its submodules are named by their global index, "0", "1", ...
  std::vector<std::unique_ptr<DecoderLayer<T>>> list;
  std::optional<RmsNorm<T>> norm;
  LlamaModel(const Sub& mesh, const Options& c, int first, int last, bool embeds, bool norms) {
    if (embeds) register_module("embed_tokens", embed_tokens.emplace(mesh, "model.embed_tokens.weight", std::array<Index, 2>{c.vocab, c.dmodel}, std::vector<Index>{c.vocab, c.dmodel}, c.seed));
    register_module("layers", layers);
    for (int l = first; l < last; ++l)
      layers.register_module(std::to_string(l), *list.emplace_back(std::make_unique<DecoderLayer<T>>(mesh, c, "model.layers." + std::to_string(l) + ".")));
    if (norms) register_module("norm", norm.emplace(mesh, c, "model.norm.weight"));
  }
};


template <class T>
class LlamaStage : public ts::nn::Module {
  using Rows = ts::Spec<S<"data">, S<"context">>;  // [B, T] ids
  M mesh_;  // (declared first: the modules below are built from them)
  Sub sub_;
  Options c_;
  bool first_, last_;
  const ts::train::TokenWindows* text_;
  std::optional<ts::train::TokenFile> data_;

 public:
  using Activation = ts::ShardedTensor<T, Sub, ::Activation>;
  long step = 0;
  double eval_sum = 0;   // held-out loss summed over the evaluated tokens
  Index eval_first = 0;  // the evaluated batch's first held-out window

  LlamaStage(const M& mesh, const Options& o, const ts::nn::Pipeline<M>& pipe, const ts::train::TokenWindows* text)
      : mesh_(mesh), sub_(mesh.submesh<"data", "context", "model">()), c_(o), first_(pipe.first()), last_(pipe.last()), text_(text),
        model(sub_, o, pipe.partition(o.layers).first, pipe.partition(o.layers).second, first_, last_) {
    register_module("model", model);
    if (last_ && !(o.llama.tie_word_embeddings && first_)) register_module("lm_head", lm_head.emplace(sub_, o.llama.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", std::array<Index, 2>{o.vocab, o.dmodel}, std::vector<Index>{o.vocab, o.dmodel}, o.seed));
    if (lm_head && o.llama.tie_word_embeddings) lm_head->tied_to = "model.embed_tokens.weight";  // a tied head on another stage than the embedding: its copy
    if (!o.data_file.empty() && (first_ || last_ || o.eod >= 0)) data_.emplace(sub_.comm(), o.data_file, o.seq, o.batch, "train_llama: --data");
  }

  LlamaModel<T> model;
  std::optional<Weight<T, ts::Spec<S<"model">, R>>> lm_head;

  // ---- the stage's forward (first: ids -> embeddings; each: its layers) and loss (last) ----
  Activation boundary(const ts::nn::MicroBatch& mb) const { return Activation(sub_, {rows(mb), c_.seq, c_.dmodel}); }
  Activation forward(const ts::nn::MicroBatch& mb, const Activation* in) {
    Positions<T> pos(sub_, c_, c_.seq, 0);
    if (c_.eod >= 0) pos.documents = ts::nn::document_starts(ids(mb, 0), c_.eod);
    Activation x = first_ ? ts::reshard<::Activation>(ts::nn::embedding(model.embed_tokens->weight, ids(mb, 0))) : *in;
    for (auto& layer : model.list) x = (*layer)(x, pos);
    return x;
  }
  auto logits(const Activation& x) { return ts::einsum<"btd,vd->btv">((*model.norm)(x), lm_head ? lm_head->weight : model.embed_tokens->weight); }
  auto loss(const ts::nn::MicroBatch& mb, const Activation* in) {
    auto z = logits(forward(mb, in));
    auto loss = ts::nn::cross_entropy(z, ids(mb, 1));
    if (mb.inference) eval_sum += double(T(loss)) * double(rows(mb) * c_.seq);
    return loss;
  }

  // Sampling: positions [offset, offset + t) through this stage's layers and their KV caches, the
  // activations on to the next stage; the last stage returns the last position's logits.
  std::vector<double> cached_logits(const std::vector<std::int32_t>& seq, Index offset, std::vector<KvCache<T>>& caches) {
    const Index t = Index(seq.size()) - offset;
    const Positions<T> pos(sub_, c_, t, offset);
    const int s = mesh_.coord<"stage">();
    Activation x(sub_, {1, t, c_.dmodel});
    if (first_)
      x = ts::reshard<::Activation>(ts::nn::embedding(model.embed_tokens->weight, ts::from_function<std::int32_t, Rows>(
          sub_, {1, t}, [&](const auto& i) { return seq[std::size_t(offset + i[1])]; })));
    else
      ts::receive<"stage">(mesh_, x, s - 1);
    for (std::size_t l = 0; l < model.list.size(); ++l) x = (*model.list[l])(x, pos, &caches[l]);
    if (!last_) return ts::send<"stage">(mesh_, x, s + 1), std::vector<double>();
    Index at[3] = {0, t - 1, 0}, one[3] = {1, 1, c_.vocab};
    const Eigen::Tensor<T, 3> z = ts::slice(logits(x), at, one).gather();
    return std::vector<double>(z.data(), z.data() + z.size());
  }

 private:
  Index rows(const ts::nn::MicroBatch& mb) const { return mb.rows_total / mb.count; }

  // Token t of row b of the micro-batch (shift 1: the labels).
  ts::ShardedTensor<std::int32_t, Sub, Rows> ids(const ts::nn::MicroBatch& mb, Index shift) {
    const Index b = mb.rows_total / mb.count;
    if (text_ && mb.inference) return text_->held_out_ids<Rows>(sub_, eval_first + mb.row_offset, b, shift);
    if (text_) return text_->batch_ids<Rows>(sub_, step, c_.batch, mb.row_offset, b, shift);
    if (data_) return data_->batch_ids<Rows>(sub_, step, c_.batch, mb.row_offset, b, shift);
    const ts::train::ReverseTask task{std::uint64_t(c_.seed), c_.vocab, c_.seq, c_.batch};
    return task.ids<Rows>(sub_, step, mb.row_offset, b, shift);
  }
};


Options parse(int argc, char** argv) {
  Options o;
  ts::train::Flags f("train_llama", argc, argv);
  f.mesh<M>("--mesh", o.mesh, {"data", "model", "stage", "context"})
      .value("--steps", o.steps).value("--layers", o.layers).value("--seed", o.seed).value("--zero", o.zero)
      .flag("--double", o.use_double).value("--batch", o.batch).value("--seq", o.seq).value("--dmodel", o.dmodel)
      .value("--heads", o.heads).value("--kv-heads", o.kv_heads).value("--hidden", o.hidden).value("--lr", o.lr)
      .value("--vocab", o.vocab)
      .value("--clip", o.clip).value("--weight-decay", o.weight_decay).value("--microbatches", o.microbatches)
      .flag("--remat", o.remat).flag("--overlap", o.overlap).flag("--check", o.check).value("--data", o.data_file)
      .value("--text", o.text).value("--eval-every", o.eval_every).value("--save", o.save).value("--save-every", o.save_every)
      .value("--resume", o.resume).value("--init", o.init).value("--save-safetensors", o.save_safetensors)
      .value("--generate", o.generate).value("--prompt", o.prompt).value("--temperature", o.temperature)
      .value("--top-k", o.top_k).flag("--no-kv-cache", o.kv_cache, false).flag("--show-sharding", o.show_sharding)
      .choice("--schedule", o.schedule, {"gpipe", "1f1b"}).choice("--attention", o.attention, {"fused", "einsum"})
      .value("--eod", o.eod).value("--hf", o.hf).value("--save-hf", o.save_hf).value("--warmup", o.warmup).value("--min-lr", o.min_lr).parse();
  if (!o.hf.empty()) {  // the sizes, norm, rotary, tying, weights and tokenizer of a transformers directory
    for (const char* size : {"--dmodel", "--heads", "--kv-heads", "--hidden", "--layers", "--vocab", "--init"})
      if (f.given(size)) f.fail(std::string(size) + " comes from " + o.hf + " with --hf");
    o.dir = std::make_shared<const ts::train::HfDirectory>(ts::train::HfDirectory::open(MPI_COMM_WORLD, o.hf));
    const auto& c = o.llama = o.dir->config;
    o.dmodel = c.hidden_size, o.hidden = c.intermediate_size, o.layers = int(c.num_hidden_layers), o.heads = c.num_attention_heads, o.init = o.hf;
    o.kv_heads = c.kv_heads(), o.vocab = c.vocab_size;
    if (!o.text.empty() && !o.tokenizer()) f.fail("--text with --hf needs " + o.hf + "/tokenizer.json");
    if (o.tokenizer() && Index(o.tokenizer()->vocab_size()) > o.vocab) f.fail("tokenizer.json's ids reach past config.json's vocab_size");
  } else if (!o.text.empty() && f.given("--vocab") && o.vocab != 256)
    f.fail("--text trains on bytes: the vocabulary is 256, not --vocab " + std::to_string(o.vocab));
  o.vocab = o.text.empty() || o.dir ? o.vocab : 256, o.kv_heads = o.kv_heads ? o.kv_heads : o.heads, o.hidden = o.hidden ? o.hidden : 4 * o.dmodel;
  if (o.zero < 0 || o.zero > 3) f.fail("--zero takes 0, 1, 2 or 3");
  if (o.batch < 1 || o.seq < 1 || o.dmodel < 1 || o.heads < 1 || o.kv_heads < 1 || o.hidden < 1 || o.vocab < 2 || o.layers < 0 ||
      o.steps < 0 || o.generate < 0 || o.top_k < 0 || o.temperature < 0)
    f.fail("sizes must be positive (and --vocab at least 2)");
  if (o.heads % o.kv_heads != 0) f.fail("--kv-heads " + std::to_string(o.kv_heads) + " must divide --heads " + std::to_string(o.heads));
  if (!o.dir && (o.dmodel % o.heads != 0 || (o.dmodel / o.heads) % 2 != 0))
    f.fail("--heads must divide --dmodel into an even head dim (rotary pairs i with i + Dh/2)");
  if (o.microbatches < 1 || o.batch % o.microbatches != 0) f.fail("--microbatches must divide --batch");
  if (o.warmup < 0 || (f.given("--min-lr") && (o.min_lr < 0 || o.min_lr > o.lr))) f.fail("--warmup takes N >= 0 steps and --min-lr a rate from 0 to --lr");
  if (o.save_every < 0 || (o.save_every > 0 && o.save.empty() && o.save_hf.empty())) f.fail("--save-every K needs --save DIR or --save-hf DIR");
  if (o.eval_every < 0 || (o.eval_every > 0 && o.text.empty())) f.fail("--eval-every K needs --text FILE (its held-out tail)");
  if (!o.data_file.empty() && !o.text.empty()) f.fail("--data and --text are two sources: give one");
  if (o.eod >= o.vocab || (f.given("--eod") && o.eod < 0)) f.fail("--eod takes a token id below the vocabulary of " + std::to_string(o.vocab));
  if (o.eod >= 0 && o.attention == "einsum") f.fail("--eod packs documents in the fused attention: not with --attention einsum");
  return o;
}


ts::train::RunSettings checkpoint_settings(const Options& o) {
  return {{"seed", std::to_string(o.seed)}, {"layers", std::to_string(o.layers)}, {"dmodel", std::to_string(o.dmodel)},
          {"heads", std::to_string(o.heads)}, {"kv-heads", std::to_string(o.kv_heads)}, {"hidden", std::to_string(o.hidden)},
          {"vocab", std::to_string(o.vocab)}, {"seq", std::to_string(o.seq)}, {"batch", std::to_string(o.batch)}};
}

// N tokens after the prompt: through the KV caches (each stage its layers'), or with
// --no-kv-cache by a forward of the whole sequence through the stages for each token.
template <class T>
std::vector<std::int32_t> generate(const M& mesh, const Options& o, LlamaStage<T>& stage) {
  std::vector<std::int32_t> prompt = ts::train::prompt_ids(o.prompt, o.tokenizer(), o.vocab);
  if (prompt.empty()) prompt.push_back(0);
  std::vector<KvCache<T>> caches(stage.model.list.size());
  const int root = (mesh.size<"stage">() - 1) * mesh.size<"context">() * mesh.size<"model">();  // coordinates (0, K-1, 0, 0)
  const std::vector<std::int32_t> eos = o.dir ? o.dir->config.eos_token_ids : std::vector<std::int32_t>();
  return ts::train::generate(mesh, prompt, o.generate, {o.temperature, o.top_k, std::uint64_t(o.seed), eos}, root,
                             [&](const std::vector<std::int32_t>& seq, int n) {
    if (!o.kv_cache) caches.assign(caches.size(), {});  // the whole sequence every time
    return stage.cached_logits(seq, o.kv_cache && n > 0 ? Index(seq.size()) - 1 : 0, caches);  // (the last stage's)
  });
}

template <class T>
ts::train::RunLog train(const M& mesh, const Options& o, int zero, int microbatches, const ts::train::TokenWindows* text, bool files) {
  ts::train::RunLog run;
  run.memory.start();
  ts::nn::Pipeline<M> pipe(mesh, {.microbatches = microbatches,
                                  .schedule = o.schedule == "1f1b" ? ts::nn::Schedule::OneFOneB : ts::nn::Schedule::GPipe,
                                  .remat = o.remat});
  LlamaStage<T> stage(mesh, o, pipe, text);
  if (!o.init.empty()) ts::train::load_hf_weights(mesh.submesh<"data", "context", "model">().comm(), o.init, stage);  // each stage its own
  ts::nn::AdamW opt({.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = o.weight_decay,
                     .zero_stage = zero, .data_axis = "data,context", .overlap = o.overlap});
  opt.add(stage, ts::nn::decay_matrices_only(o.weight_decay));
  opt.set_norm_mesh(mesh);
  if (o.llama.tie_word_embeddings && (pipe.first() || pipe.last())) pipe.tie_ends(opt, pipe.first() ? stage.model.embed_tokens->weight : stage.lm_head->weight);
  if (files && o.show_sharding && pipe.first() && pipe.last()) {  // how a few weights lie on the {data, model} ranks
    ts::visualize(stage.model.embed_tokens->weight, "model.embed_tokens.weight");
    ts::visualize(stage.model.list.at(0)->mlp.up_proj.weight, "model.layers.0.mlp.up_proj.weight");
    ts::visualize(stage.model.list.at(0)->mlp.down_proj.weight, "model.layers.0.mlp.down_proj.weight");
    if (mesh.rank() == 0)
      std::printf("model.layers.0.self_attn.q_proj.weight %s (held as [Dh, G, KV, D]: key-value groups over model)\n",
                  stage.model.list.at(0)->self_attn.q_proj.weight.describe().c_str());
  }
  auto save = [&](long step) {  // a checkpoint (--save) and a directory transformers loads (--save-hf)
    if (!o.save.empty()) ts::train::save_checkpoint(mesh, o.save, stage, opt, step, checkpoint_settings(o));
    if (!o.save_hf.empty()) opt.gather_parameters(), ts::train::save_hf_directory(mesh.comm(), o.save_hf, stage, o.config(), o.dir.get(), o.dir ? o.dir->dtype : "F32");
  };
  if (files && !o.resume.empty())
    run.first_step = int(ts::train::load_checkpoint(mesh, o.resume, stage, opt, checkpoint_settings(o), "train_llama"));
  auto evaluate = [&](int after) {
    const Index held = text->held_out_windows();
    for (stage.eval_first = 0; stage.eval_first < held; stage.eval_first += o.batch)
      (void)pipe.evaluate(stage, std::min(o.batch, held - stage.eval_first), 1);
    run.evals.emplace_back(after, ts::all_reduce<"stage">(mesh, std::exchange(stage.eval_sum, 0.0)) / double(std::max<Index>(held, 1) * o.seq));
  };
  for (int step = run.first_step; step < o.steps; ++step) {
    const auto t0 = ts::train::synchronized_now(mesh);
    if (o.warmup > 0 || o.min_lr >= 0) ts::optim::set_lr(opt, ts::optim::WarmupCosine{o.lr, o.warmup, o.steps, o.min_lr < 0 ? o.lr : o.min_lr}, step);
    opt.zero_grad();
    opt.no_sync(microbatches > 1);
    stage.step = step;
    const ts::nn::PipelineStats ps = pipe.run(stage, o.batch);
    if (o.clip > 0) opt.clip_grad_norm(o.clip);
    run.memory.sample_pool();
    opt.step();
    if (step > run.first_step || o.steps == run.first_step + 1) run.seconds += ts::train::seconds_since(t0);
    run.losses.push_back(ps.loss);
    if (files && mesh.rank() == 0) std::printf("step %d loss %.17g\n", step, ps.loss), std::fflush(stdout);
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0) evaluate(step + 1);
    if (files && o.save_every > 0 && (step + 1) % o.save_every == 0 && step + 1 < o.steps) save(step + 1);
  }
  run.memory.measure(mesh);
  if (files && (!o.save.empty() || !o.save_hf.empty())) save(std::max(run.first_step, o.steps));
  if (files && !o.save_safetensors.empty()) opt.gather_parameters(), ts::train::save_hf_weights(mesh.comm(), o.save_safetensors, stage);  // (ZeRO-3: present)
  if (o.generate > 0) {
    opt.gather_parameters();
    const auto t0 = ts::train::synchronized_now(mesh);
    run.sample = generate(mesh, o, stage);
    run.sampling_seconds = ts::train::seconds_since(t0);
  }
  return run;
}

template <class T>
int run_all(const M& mesh, const Options& o, const ts::train::TokenWindows* text) {
  const ts::train::RunLog run = train<T>(mesh, o, o.zero, o.microbatches, text, true);
  std::optional<ts::train::CurveCheck> check;  // the one-rank curve (and sample), unpipelined, on every rank alone
  if (o.check) check.emplace(run, train<T>(M(MPI_COMM_SELF, {1, 1, 1, 1}), o, 0, 1, text, false), sizeof(T) == 8 ? 1e-9 : 1e-4, o.temperature == 0);
  const bool ok = ts::agree(!check || check->ok);
  if (mesh.rank() == 0) {
    for (const auto& [after, loss] : run.evals) std::printf("eval after step %d: loss %.17g\n", after, loss);
    if (!run.sample.empty())
      ts::train::print_generation(run.sample, o.tokenizer(), o.vocab == 256, run.sampling_seconds, o.kv_cache ? "KV cache" : "a whole forward per token");
    const int timed = std::max(1, o.steps - run.first_step - 1);
    const double tokens = double(o.batch * o.seq), per_step = run.seconds / timed, flops = tokens * o.config().training_flops_per_token(o.seq);
    if (o.steps > run.first_step)  // (context named where it is used)
      std::printf("mesh %s, zero %d, %s: %.0f tokens/s, %.2f GFLOP/s\n", ts::train::mesh_sizes_text(mesh, {"context"}).c_str(), o.zero,
                  sizeof(T) == 8 ? "double" : "float", tokens / per_step, flops / per_step / 1e9);
  }
  run.memory.print(mesh);
  if (check && mesh.rank() == 0) check->print(ok);
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  try {
    const Options o = parse(argc, argv);
    const M mesh = o.mesh.make("train_llama");
    if (mesh.rank() == 0) std::printf("%s\n", ts::kernels_report().c_str());  // which kernels run
    ts::io::require_writable(mesh.comm(), {o.save, o.save_safetensors}), ts::io::require_writable_directory(mesh.comm(), o.save_hf);  // now, not after training
    const auto prompt = ts::train::prompt_ids(o.prompt, o.tokenizer(), o.vocab);  // (on every rank: an error is every rank's)
    if (o.tokenizer() && !o.prompt.empty() && mesh.rank() == 0) ts::train::print_ids("prompt ids", prompt);
    std::optional<ts::train::TokenWindows> text;  // every rank holds the text: its windows are read by index
    if (!o.text.empty()) text.emplace(ts::train::TokenWindows::text_of("train_llama", o.text, o.seq, o.tokenizer()));
    ts::nn::flush_denormals();
    return o.use_double ? run_all<double>(mesh, o, text ? &*text : nullptr) : run_all<float>(mesh, o, text ? &*text : nullptr);
  } catch (const ts::train::UsageError& e) {  // every rank parses the same line: all report and leave
    return ts::train::Flags::report(e);
  } catch (const ts::IoError& e) {  // thrown on every rank alike
    return ts::train::Flags::report(e, 1);
  }
}
