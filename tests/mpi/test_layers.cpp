// nn layers and optimizers through the typed API on every {data, model} mesh of the world size:
// attention against serial loops and finite differences; Embedding, LayerNorm, Attention, MLP
// and TransformerBlock forward and derived backward against the same layer on a one-rank mesh
// (itself checked against finite differences); ZeRO stages 0-3 and gradient clipping against the
// single-rank training run. Sizes do not divide the mesh axes (3 heads, 13 words, batch 3).
#include "layer_support.hpp"

namespace ts = tshard;
using namespace tshard_test;

namespace {

// Serial causal attention over time-major [T, B, Dh, H].
T4 serial_attention(const T4& q, const T4& k, const T4& v) {
  const auto T = q.dimension(0), B = q.dimension(1), D = q.dimension(2), H = q.dimension(3);
  T4 out(T, B, D, H);
  out.setZero();
  for (Eigen::Index b = 0; b < B; ++b)
    for (Eigen::Index h = 0; h < H; ++h)
      for (Eigen::Index t = 0; t < T; ++t) {
        std::vector<double> s(std::size_t(t + 1));
        double m = -INFINITY, z = 0;
        for (Eigen::Index u = 0; u <= t; ++u) {
          double x = 0;
          for (Eigen::Index d = 0; d < D; ++d) x += q(t, b, d, h) * k(u, b, d, h);
          s[std::size_t(u)] = x / std::sqrt(double(D));
          m = std::max(m, s[std::size_t(u)]);
        }
        for (auto& x : s) z += std::exp(x - m);
        for (Eigen::Index u = 0; u <= t; ++u)
          for (Eigen::Index d = 0; d < D; ++d) out(t, b, d, h) += std::exp(s[std::size_t(u)] - m) / z * v(u, b, d, h);
      }
  return out;
}

using Heads = ts::Spec<ts::R, ts::S<"data">, ts::R, ts::S<"model">>;
using HeadDim = ts::Spec<ts::R, ts::R, ts::S<"model">, ts::R>;  // Dh split: the scores are partial
using Time = ts::Spec<ts::S<"model">, ts::S<"data">, ts::R, ts::R>;  // T split: the generic masked softmax
using Whole4 = ts::Spec<ts::R, ts::R, ts::R, ts::R>;

}  // namespace

TEST_CASE("causal attention equals serial loops with heads, head dim or batch split, and its backward equals finite differences",
          "[layers]") {
  const std::array<Eigen::Index, 4> dims{5, 3, 2, 3};
  const T4 q = random_tensor<4>(dims, 1), k = random_tensor<4>(dims, 2), v = random_tensor<4>(dims, 3), w = random_tensor<4>(dims, 4);
  const T4 want = serial_attention(q, k, v);
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    for_each_type(TypeList<Heads, HeadDim, Time, Whole4>{}, [&]<class S>(S*) {
      auto tq = ts::distribute<S>(mesh, q), tk = ts::distribute<S>(mesh, k), tv = ts::distribute<S>(mesh, v);
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ", q " << tq.describe());
      auto [context, p] = ts::nn::causal_attention(tq, tk, tv);
      TS_REQUIRE_ALL(compare(context.gather(), want, 1e-13) == "");
      auto [dq, dk, dv] = ts::nn::causal_attention_backward(tq, tk, tv, p, ts::distribute<S>(mesh, w));
      if constexpr (!std::is_same_v<S, Whole4>) {
        auto loss = [&](const T4& a, const T4& b, const T4& c) { return dot<4>(serial_attention(a, b, c), w); };
        auto fd = [&](int which) {
          T4 g(dims);
          T4 a = q, b = k, c = v;
          T4& x = which == 0 ? a : which == 1 ? b : c;
          for (Eigen::Index i = 0; i < x.size(); ++i) {
            const double keep = x.data()[i], h = 1e-6;
            x.data()[i] = keep + h;
            const double up = loss(a, b, c);
            x.data()[i] = keep - h;
            const double down = loss(a, b, c);
            x.data()[i] = keep;
            g.data()[i] = (up - down) / (2 * h);
          }
          return g;
        };
        TS_REQUIRE_ALL(compare(dq.gather(), fd(0), 1e-8) == "");
        TS_REQUIRE_ALL(compare(dk.gather(), fd(1), 1e-8) == "");
        TS_REQUIRE_ALL(compare(dv.gather(), fd(2), 1e-8) == "");
      }
    });
  });
}

TEST_CASE("LayerNorm, Attention, MLP and TransformerBlock equal their one-rank values, whose gradients equal finite differences",
          "[layers]") {
  const std::array<Eigen::Index, 3> dims{3, 4, 6};
  check_layer([](const DM& m) { return ts::nn::LayerNorm<double, DM>(m, 6); }, dims);
  check_layer([](const DM& m) { return ts::nn::LayerNorm<double, DM, ts::Spec<ts::S<"model">>>(m, 6); }, dims);
  check_layer([](const DM& m) { return ts::nn::Attention<double, DM>(m, 6, 3, 5); }, dims);
  check_layer([](const DM& m) { return ts::nn::MLP<double, DM>(m, 6, 7, 9); }, dims);
  check_layer([](const DM& m) { return ts::nn::TransformerBlock<double, DM>(m, {.dmodel = 6, .heads = 3, .hidden = 5, .seed = 4}); },
              dims);
}

TEST_CASE("RMSNorm is x / sqrt(mean(x^2) + eps) * weight over the last dim (Llama's), its one-rank values on every "
          "mesh, gradients equal finite differences",
          "[layers]") {
  const std::array<Eigen::Index, 3> dims{3, 4, 6};
  check_layer([](const DM& m) { return ts::nn::RMSNorm<double, DM>(m, 6); }, dims);
  check_layer([](const DM& m) { return ts::nn::RMSNorm<double, DM, ts::Spec<ts::S<"model">>>(m, 6, 1e-3); }, dims);
  // Against the formula, on every mesh, the hidden dim split over model (a partial mean), with
  // weights of their own.
  const T3 x = random_tensor<3>(dims, 21);
  T3 want(dims);
  for (Eigen::Index b = 0; b < dims[0]; ++b)
    for (Eigen::Index t = 0; t < dims[1]; ++t) {
      double ms = 0;
      for (Eigen::Index h = 0; h < dims[2]; ++h) ms += x(b, t, h) * x(b, t, h) / double(dims[2]);
      for (Eigen::Index h = 0; h < dims[2]; ++h) want(b, t, h) = x(b, t, h) / std::sqrt(ms + 1e-5) * (0.5 + 0.1 * double(h));
    }
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    ts::nn::RMSNorm<double, DM, ts::Spec<ts::S<"model">>> norm(mesh, 6, 1e-5);
    norm.weight() = ts::from_function<double, ts::Spec<ts::S<"model">>>(mesh, {6}, [](const auto& i) { return 0.5 + 0.1 * double(i[0]); });
    const T3 got = norm(ts::distribute<ts::Spec<ts::S<"data">, ts::R, ts::S<"model">>>(mesh, x)).gather();
    TS_REQUIRE_ALL(compare(got, want, 1e-14) == "");
  });
}

TEST_CASE("rotary embeddings of each row's own positions (HF's position_ids) equal the formula on every mesh, "
          "the sequence split; rows of offset positions equal the offset tables; bad rows are refused",
          "[layers][rotary]") {
  const Eigen::Index B = 3, T = 7, Dh = 6, H = 2;
  const std::vector<std::vector<Eigen::Index>> positions{{0, 1, 2, 0, 1, 0, 1}, {4, 5, 6, 7, 8, 9, 10}, {0, 0, 0, 0, 0, 0, 0}};
  const ts::nn::Rope rope{.theta = 500.0};
  Eigen::Tensor<double, 4> x(B, T, Dh, H), want(B, T, Dh, H);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = 2 * ts::detail::random_value<double>(31, std::uint64_t(i)) - 1;
  for (Eigen::Index b = 0; b < B; ++b)  // HF's x cos + rotate_half(x) sin
    for (Eigen::Index t = 0; t < T; ++t)
      for (Eigen::Index h = 0; h < H; ++h)
        for (Eigen::Index d = 0; d < Dh / 2; ++d) {
          const double a = double(positions[std::size_t(b)][std::size_t(t)]) * std::pow(500.0, -2.0 * double(d) / double(Dh));
          want(b, t, d, h) = x(b, t, d, h) * std::cos(a) - x(b, t, d + Dh / 2, h) * std::sin(a);
          want(b, t, d + Dh / 2, h) = x(b, t, d + Dh / 2, h) * std::cos(a) + x(b, t, d, h) * std::sin(a);
        }
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    using Seq = ts::Spec<ts::S<"data">, ts::S<"model">, ts::R, ts::R>;  // the sequence split, as over context
    const auto [cos, sin] = ts::nn::rotary_tables<double, 4, 1, 2>(mesh, positions, Dh, rope);
    const Eigen::Tensor<double, 4> got = ts::nn::rotary<2>(ts::distribute<Seq>(mesh, x), cos, sin).gather();
    TS_REQUIRE_ALL(compare(got, want, 1e-14) == "");
    // A row of positions 4.. is the offset tables' row.
    const auto [c4, s4] = ts::nn::rotary_tables<double, 4, 1, 2>(mesh, T, Dh, 4, rope);
    const Eigen::Tensor<double, 4> rows = cos.gather(), offset = c4.gather(), srows = sin.gather(), soffset = s4.gather();
    double worst = 0;
    for (Eigen::Index t = 0; t < T; ++t)
      for (Eigen::Index d = 0; d < Dh; ++d)
        worst = std::max({worst, std::abs(rows(1, t, d, 0) - offset(0, t, d, 0)), std::abs(srows(1, t, d, 0) - soffset(0, t, d, 0))});
    TS_REQUIRE_ALL(worst == 0.0);
    auto says = [&](const std::vector<std::vector<Eigen::Index>>& bad, const std::string& text) {
      std::string what;
      try {
        (void)ts::nn::rotary_tables<double, 4, 1, 2>(mesh, bad, Dh);
      } catch (const ts::ShapeError& e) {
        what = e.what();
      }
      INFO(what);
      TS_REQUIRE_ALL(what.find(text) != std::string::npos);
    };
    says({{0, 1, 2}, {0, 1}}, "positions[1] has 2 positions and positions[0] 3");
    says({{0, 1}, {0, -1}}, "positions[1] has a negative position");
    says({}, "positions has no rows");
    std::string odd;
    try {
      (void)ts::nn::rotary_tables<double, 4, 1, 2>(mesh, T, 5);
    } catch (const ts::ShapeError& e) {
      odd = e.what();
    }
    TS_REQUIRE_ALL(odd.find("the head dim 5 must be even and at least 2") != std::string::npos);
  });
}

namespace {
// A layer called with attention options, as a model calls it.
template <class Layer>
struct WithOptions : ts::nn::Module {
  Layer layer;
  ts::nn::AttentionOptions options;
  template <class... Args>
  WithOptions(ts::nn::AttentionOptions o, Args&&... args) : layer(std::forward<Args>(args)...), options(std::move(o)) {
    register_module("layer", layer);
  }
  template <class X>
  auto operator()(const X& x) {
    return layer(x, options);
  }
};
// The same, its activations recomputed in the backward: the options kept for the recomputation.
template <class Layer, ts::ad::Recompute policy>
struct CheckpointedWithOptions : WithOptions<Layer> {
  using WithOptions<Layer>::WithOptions;
  template <class X>
  auto operator()(const X& x) {
    return ts::nn::checkpoint<policy>(this->layer, x, this->options);
  }
};
}  // namespace

TEST_CASE("Attention and TransformerBlock with attention options (bidirectional, a window, packed documents) equal "
          "their one-rank values, whose gradients equal finite differences; the options change the result",
          "[layers]") {
  const std::array<Eigen::Index, 3> dims{3, 5, 6};
  using Attention = ts::nn::Attention<double, DM>;
  using Block = ts::nn::TransformerBlock<double, DM>;
  const ts::nn::BlockOptions block{.dmodel = 6, .heads = 3, .hidden = 5, .seed = 4};
  const std::vector<ts::nn::AttentionOptions> cases{
      {.causal = false}, {.causal = false, .window = 2}, {.document_starts = {{0, 2}, {0}, {0, 1, 3}}}};
  for (const auto& o : cases) {
    check_layer([&](const DM& m) { return WithOptions<Attention>(o, m, 6, 3, 5); }, dims);
    check_layer([&](const DM& m) { return WithOptions<Block>(o, m, block); }, dims);
  }
  // Checkpointed, fully and selectively: what the model recomputes sees the same documents.
  using Everything = CheckpointedWithOptions<Block, ts::ad::Recompute::Everything>;
  using AllButProducts = CheckpointedWithOptions<Block, ts::ad::Recompute::AllButProducts>;
  check_layer([&](const DM& m) { return Everything(cases[2], m, block); }, dims);
  check_layer([&](const DM& m) { return AllButProducts(cases[2], m, block); }, dims);
  // Not what the causal layer gives.
  DM mesh({1, world_size()});
  const T3 x = random_tensor<3>(dims, 11);
  for (const auto& o : cases) {
    Attention layer(mesh, 6, 3, 5);
    const auto input = ts::distribute<Acts>(mesh, x);
    TS_REQUIRE_ALL(compare(T3(layer(input, o).gather()), T3(layer(input).gather()), 1e-3) != "");
  }
  // With the model dim split the projections are partial sums and the attention is the
  // written-out causal one: options are refused on every rank, not ignored.
  using ModelDim = ts::Spec<ts::S<"data">, ts::R, ts::S<"model">>;
  ts::nn::Attention<double, DM, ts::Spec<ts::S<"model">, ts::R, ts::R>, ts::Spec<ts::R, ts::R, ts::S<"model">>> split(mesh, 6, 3, 5);
  std::string what;
  try {
    (void)split(ts::distribute<ModelDim>(mesh, x), {.causal = false});
  } catch (const ts::SpecError& e) {
    what = e.what();
  }
  INFO(what);
  TS_REQUIRE_ALL(what.find("takes no options (bidirectional, window, scale, documents, attention dropout, ALiBi, "
                           "softcap, keys packed apart): split the heads instead") != std::string::npos);
}

TEST_CASE("TransformerBlock's attention dropout gives the one-rank values on every mesh, differs from none in training, "
          "is off in eval(), and is the block's own to draw",
          "[layers][dropout]") {
  const std::array<Eigen::Index, 3> dims{3, 5, 6};
  using Block = ts::nn::TransformerBlock<double, DM>;
  const ts::nn::BlockOptions dropping{.dmodel = 6, .heads = 3, .hidden = 5, .attention_dropout = 0.3, .seed = 4};
  check_layer_on_meshes([&](const DM& m) { return Block(m, dropping); }, dims);
  check_layer_on_meshes([&](const DM& m) { return WithOptions<Block>({.document_starts = {{0, 2}, {0}, {0, 1, 3}}}, m, dropping); },
                        dims);
  DM mesh({1, world_size()});
  const auto x = ts::distribute<Acts>(mesh, random_tensor<3>(dims, 11));
  Block attending(mesh, dropping), plain(mesh, {.dmodel = 6, .heads = 3, .hidden = 5, .seed = 4});
  const T3 without = plain(x).gather();
  TS_REQUIRE_ALL(compare(T3(attending(x).gather()), without, 1e-3) != "");
  attending.eval();
  TS_REQUIRE_ALL(compare(T3(attending(x).gather()), without, 1e-13) == "");
  auto says = [&](auto&& f, const std::string& text) {
    const std::string what = error_text(f);
    INFO(what);
    TS_REQUIRE_ALL(what.find(text) != std::string::npos);
  };
  says([&] { (void)plain(x, {.dropout = {.p = 0.1}}); }, "set BlockOptions::attention_dropout, not the options' dropout");
  says([&] { Block(mesh, {.dmodel = 6, .heads = 3, .attention_dropout = 1.0}); }, "must be probabilities in [0, 1)");
}

TEST_CASE("Attention and GroupedQueryAttention apply the attention dropout they are given in training only", "[layers][dropout]") {
  const std::array<Eigen::Index, 3> dims{3, 5, 6};
  DM mesh({1, world_size()});
  const auto x = ts::distribute<Acts>(mesh, random_tensor<3>(dims, 13));
  const ts::nn::AttentionOptions dropping{.dropout = {.p = 0.3, .seed = 7}};
  auto drops_in_training_only = [&](auto layer) {
    const T3 without = layer(x).gather();
    TS_REQUIRE_ALL(compare(T3(layer(x, dropping).gather()), without, 1e-3) != "");
    layer.eval();
    TS_REQUIRE_ALL(compare(T3(layer(x, dropping).gather()), without, 1e-15) == "");
    layer.train();
    TS_REQUIRE_ALL(compare(T3(layer(x, dropping).gather()), without, 1e-3) != "");
  };
  drops_in_training_only(ts::nn::Attention<double, DM>(mesh, 6, 3, 4));
  drops_in_training_only(ts::nn::GroupedQueryAttention<double, DM>(mesh, 6, 4, 2, 5));
}

namespace {
// A user's own attention layer in a block's specs, callable as layer(x) only (it takes no
// attention options): here the library's Attention without its options argument.
template <class T, class M>
struct OptionlessAttention : ts::nn::Attention<T, M> {
  using ts::nn::Attention<T, M>::Attention;
  template <class X>
  auto operator()(const X& x) {
    return ts::nn::Attention<T, M>::operator()(x);
  }
};
struct OptionlessAttentionSpecs : ts::nn::MegatronSpecs<"model"> {
  template <class T, class M>
  using attention_layer = OptionlessAttention<T, M>;
};
}  // namespace

TEST_CASE("a block's specs may give an attention layer callable as layer(x): the block calls it so, and refuses "
          "attention options and attention dropout it cannot pass",
          "[layers]") {
  const std::array<Eigen::Index, 3> dims{3, 5, 6};
  using Own = ts::nn::TransformerBlock<double, DM, OptionlessAttentionSpecs>;
  static_assert(std::is_same_v<Own::SelfAttention, OptionlessAttention<double, DM>>);
  const ts::nn::BlockOptions options{.dmodel = 6, .heads = 3, .hidden = 5, .seed = 4};
  check_layer_on_meshes([&](const DM& m) { return Own(m, options); }, dims);
  DM mesh({1, world_size()});
  const auto x = ts::distribute<Acts>(mesh, random_tensor<3>(dims, 12));
  Own own(mesh, options);
  ts::nn::TransformerBlock<double, DM> library(mesh, options);
  TS_REQUIRE_ALL(compare(T3(own(x).gather()), T3(library(x).gather()), 1e-13) == "");
  const std::string what = error_text([&] { (void)own(x, {.causal = false}); });
  INFO(what);
  TS_REQUIRE_ALL(what.find("its specs' attention_layer takes no AttentionOptions") != std::string::npos);
  Own dropping(mesh, {.dmodel = 6, .heads = 3, .hidden = 5, .attention_dropout = 0.1});
  TS_REQUIRE_ALL(error_text([&] { (void)dropping(x); }).find("cannot pass attention options or attention_dropout") !=
                 std::string::npos);
}

namespace {
struct GroupedSequenceSpecs : ts::nn::GroupedQuerySpecs<"model"> {
  using activation = ts::Spec<ts::S<"data">, ts::S<"model">, ts::R>;  // tokens over model
};
}  // namespace

TEST_CASE("GroupedQueryAttention: query head (g, kv) reads key-value head kv, as Attention with each key-value head "
          "repeated over its group; the one-rank values on every mesh, gradients equal finite differences; a block "
          "of GroupedQuerySpecs takes BlockOptions::kv_heads",
          "[layers]") {
  const std::array<Eigen::Index, 3> dims{3, 5, 6};
  using GQA = ts::nn::GroupedQueryAttention<double, DM>;
  {  // Against Attention whose key and value weights repeat each key-value head for its group.
    DM self(MPI_COMM_SELF, {1, 1});
    const Eigen::Index D = 6, H = 4, G = 2;
    GQA grouped(self, D, H, H / G, 5);
    ts::nn::Attention<double, DM> repeated(self, D, H, 9);
    const Eigen::Index Dh = grouped.head_dim(), slab = D * Dh;
    REQUIRE(grouped.groups() == G);
    std::copy_n(grouped.wq().data(), slab * H, repeated.wq().data());  // [D, Dh, G, KV] is [D, Dh, H]
    for (Eigen::Index h = 0; h < H; ++h) {
      std::copy_n(grouped.wk().data() + (h / G) * slab, slab, repeated.wk().data() + h * slab);
      std::copy_n(grouped.wv().data() + (h / G) * slab, slab, repeated.wv().data() + h * slab);
    }
    std::copy_n(grouped.wo().data(), Dh * H * D, repeated.wo().data());  // [Dh, G, KV, D] is [Dh, H, D]
    std::copy_n(grouped.bo().data(), D, repeated.bo().data());
    const auto x = ts::distribute<Acts>(self, random_tensor<3>(dims, 13));
    for (const auto& o : std::vector<ts::nn::AttentionOptions>{{}, {.causal = false, .window = 2}})
      REQUIRE(compare(T3(grouped(x, o).gather()), T3(repeated(x, o).gather()), 1e-13) == "");
  }
  check_layer([](const DM& m) { return GQA(m, 6, 4, 2, 5); }, dims);
  check_layer_on_meshes([](const DM& m) { return GQA(m, 6, 3, 1, 5); }, dims);  // one key-value head (MQA)
  check_layer_on_meshes([](const DM& m) { return WithOptions<GQA>({.causal = false, .window = 2}, m, 6, 6, 3, 5); }, dims);
  using Block = ts::nn::TransformerBlock<double, DM, ts::nn::GroupedQuerySpecs<"model">>;
  check_layer([](const DM& m) { return Block(m, {.dmodel = 6, .heads = 4, .hidden = 5, .seed = 4, .kv_heads = 2}); }, dims);
  DM mesh({1, world_size()});
  {  // The block's attention has the key-value heads asked for (and as many as heads by default).
    Block grouped(mesh, {.dmodel = 6, .heads = 4, .hidden = 5, .kv_heads = 2}), plain(mesh, {.dmodel = 6, .heads = 4});
    REQUIRE(grouped.attention().groups() == 2);
    REQUIRE(grouped.attention().wk().global_shape()[2] == 2);
    REQUIRE(plain.attention().groups() == 1);
  }
  // Sequence parallelism: a struct derived from GroupedQuerySpecs pins the residual stream's layout.
  check_layer([](const DM& m) {
    return ts::nn::TransformerBlock<double, DM, GroupedSequenceSpecs>(m, {.dmodel = 6, .heads = 4, .hidden = 5, .seed = 4, .kv_heads = 2});
  }, dims);
  {
    ts::nn::TransformerBlock<double, DM, GroupedSequenceSpecs> pinned(mesh, {.dmodel = 6, .heads = 4, .hidden = 5, .kv_heads = 2});
    auto y = pinned(ts::distribute<Acts>(mesh, random_tensor<3>(dims, 1)));
    static_assert(std::is_same_v<decltype(y), ts::ShardedTensor<double, DM, GroupedSequenceSpecs::activation>>);
  }
  // With as many key-value heads as heads it is Attention, from the same seed.
  const auto x = ts::distribute<Acts>(mesh, random_tensor<3>(dims, 14));
  GQA same(mesh, 6, 3, 3, 5);
  ts::nn::Attention<double, DM> attention(mesh, 6, 3, 5);
  TS_REQUIRE_ALL(compare(T3(same(x).gather()), T3(attention(x).gather()), 1e-13) == "");
  auto says = [&](auto&& f, const std::string& text) {
    const std::string what = error_text(f);
    INFO(what);
    TS_REQUIRE_ALL(what.find(text) != std::string::npos);
  };
  says([&] { ts::nn::TransformerBlock<double, DM>(mesh, {.dmodel = 6, .heads = 4, .kv_heads = 2}); },
       "give the block specs with grouped-query attention (ts::nn::GroupedQuerySpecs)");
  says([&] { GQA(mesh, 6, 4, 3, 5); }, "the heads a multiple of the key-value heads");
}

TEST_CASE("pinned output specs (Megatron's sequence parallelism) give the one-rank values, whose gradients equal finite "
          "differences",
          "[layers]") {
  // Tokens split over "model" in the residual stream: a column-parallel Linear all-gathers them, a
  // row-parallel one reduce-scatters its partial into them; MLP, Attention and the block take the
  // activation spec from their template argument or specs struct. 4 tokens on 3, 4 or 6 ranks.
  using Tokens = ts::Spec<ts::S<"data">, ts::S<"model">, ts::R>;
  using Hidden = ts::Spec<ts::S<"data">, ts::R, ts::S<"model">>;
  using Column = ts::Spec<ts::R, ts::S<"model">>;
  using Row = ts::Spec<ts::S<"model">, ts::R>;
  const std::array<Eigen::Index, 3> dims{3, 4, 6};
  check_layer([](const DM& m) { return ts::nn::Linear<double, DM, Column, Hidden>(m, 6, 6, 3); }, dims);
  check_layer([](const DM& m) { return ts::nn::Linear<double, DM, Row, Tokens>(m, 6, 6, 3); }, dims);
  check_layer([](const DM& m) { return ts::nn::Linear<double, DM, Row, Tokens>(m, 6, 6, 3, false); }, dims);
  check_layer_on_meshes([](const DM& m) { return ts::nn::MLP<double, DM, Column, Row, Tokens>(m, 6, 7, 9); }, dims);
  check_layer_on_meshes(
      [](const DM& m) { return ts::nn::Attention<double, DM, ts::Spec<ts::R, ts::R, ts::S<"model">>, ts::Spec<ts::R, ts::S<"model">, ts::R>, Tokens>(m, 6, 3, 5); },
      dims);
  using Sequence = ts::nn::MegatronSequenceParallelSpecs<"model", "data">;
  static_assert(std::is_same_v<Sequence::activation, Tokens>);
  check_layer([](const DM& m) {
    return ts::nn::TransformerBlock<double, DM, Sequence>(m, {.dmodel = 6, .heads = 3, .hidden = 5, .seed = 4});
  }, dims);
  // The pinned layouts hold in the types: the block's output is the residual stream's.
  DM mesh({1, world_size()});
  ts::nn::TransformerBlock<double, DM, Sequence> block(mesh, {.dmodel = 6, .heads = 3, .hidden = 5});
  auto y = block(ts::distribute<Acts>(mesh, random_tensor<3>(dims, 1)));
  static_assert(std::is_same_v<decltype(y), ts::ShardedTensor<double, DM, Tokens>>);
}

namespace {
using DCM = ts::Mesh<"data", "context", "model">;

// make(mesh) on every {data, context, model} mesh of the world size equals it on one rank, whose
// gradients equal central differences. The input is laid out as In.
template <class In, class Make>
void check_layer_on_context_meshes(Make&& make, const std::array<Eigen::Index, 3>& dims) {
  const T3 x = random_tensor<3>(dims, 21), w = random_tensor<3>(dims, 22);
  DCM self(MPI_COMM_SELF, {1, 1, 1});
  auto serial = make(self);
  check_parameter_gradients<In>(serial, self, x, w);
  const auto [y0, dx0, g0] = run_layer<In>(serial, self, x, w);
  for (auto sizes : mesh_shapes(world_size(), 3)) {
    INFO("mesh " << sizes[0] << "x" << sizes[1] << "x" << sizes[2]);
    DCM mesh({sizes[0], sizes[1], sizes[2]});
    auto layer = make(mesh);
    const auto [y, dx, g] = run_layer<In>(layer, mesh, x, w);
    TS_REQUIRE_ALL(compare(y, y0, 1e-12) == "");
    TS_REQUIRE_ALL(compare(dx, dx0, 1e-12) == "");
    TS_REQUIRE_ALL(close(g, g0, 1e-12));
  }
}

// Megatron's sequence parallelism beside context parallelism: the residual stream's tokens split
// over context and model together; attention and the MLP gather them over model only.
struct ContextSequenceSpecs : ts::nn::MegatronSpecs<"model"> {
  using activation = ts::Spec<ts::S<"data">, ts::S<"context", "model">, ts::R>;
};
}  // namespace

TEST_CASE("Attention, GroupedQueryAttention, MLP and TransformerBlock on {data, context, model} meshes, tokens split over context (and over "
          "context and model together), give the one-rank values and gradients",
          "[layers][context]") {
  // 7 positions: not divisible by 2 x context on any mesh here, so the ring falls back where it
  // must, and some shards of 6 ranks are empty.
  using Context = ts::Spec<ts::S<"data">, ts::S<"context">, ts::R>;
  using Both = ContextSequenceSpecs::activation;
  using Column = ts::Spec<ts::R, ts::S<"model">>;
  using Row = ts::Spec<ts::S<"model">, ts::R>;
  const std::array<Eigen::Index, 3> dims{3, 7, 6};
  check_layer_on_context_meshes<Context>([](const DCM& m) { return ts::nn::Attention<double, DCM>(m, 6, 3, 5); }, dims);
  check_layer_on_context_meshes<Context>(
      [](const DCM& m) { return ts::nn::TransformerBlock<double, DCM>(m, {.dmodel = 6, .heads = 3, .hidden = 5, .seed = 4}); },
      dims);
  check_layer_on_context_meshes<Context>([](const DCM& m) { return ts::nn::GroupedQueryAttention<double, DCM>(m, 6, 4, 2, 5); },
                                         dims);
  check_layer_on_context_meshes<Context>(
      [](const DCM& m) {
        return ts::nn::TransformerBlock<double, DCM, ts::nn::GroupedQuerySpecs<"model">>(
            m, {.dmodel = 6, .heads = 4, .hidden = 5, .seed = 4, .kv_heads = 1});
      },
      dims);
  check_layer_on_context_meshes<Both>([](const DCM& m) { return ts::nn::MLP<double, DCM, Column, Row, Both>(m, 6, 7, 9); },
                                      dims);
  check_layer_on_context_meshes<Both>(
      [](const DCM& m) {
        return ts::nn::Attention<double, DCM, ts::Spec<ts::R, ts::R, ts::S<"model">>, ts::Spec<ts::R, ts::S<"model">, ts::R>,
                                 Both>(m, 6, 3, 5);
      },
      dims);
  check_layer_on_context_meshes<Both>(
      [](const DCM& m) {
        return ts::nn::TransformerBlock<double, DCM, ContextSequenceSpecs>(m, {.dmodel = 6, .heads = 3, .hidden = 5, .seed = 4});
      },
      dims);
  // The pinned layout holds in the types: the block's output is the residual stream's.
  DCM mesh({1, 1, world_size()});
  ts::nn::TransformerBlock<double, DCM, ContextSequenceSpecs> block(mesh, {.dmodel = 6, .heads = 3, .hidden = 5});
  auto y = block(ts::distribute<Both>(mesh, random_tensor<3>(dims, 1)));
  static_assert(std::is_same_v<decltype(y), ts::ShardedTensor<double, DCM, Both>>);
}

TEST_CASE("a pinned Linear takes rank-2 inputs and partial sums: the one-rank values and gradients", "[layers]") {
  // x [B, F] = sum over z's last dim, a partial over "model" where z splits it; the layer moves
  // it into its input layout (the partial resolved on the way) and its product into OutSpec.
  using Z = ts::Spec<ts::S<"data">, ts::R, ts::S<"model">>;
  using Features = ts::Spec<ts::S<"data">, ts::S<"model">>;  // [B, F]: features over model
  using Tokens = ts::Spec<ts::S<"model">, ts::R>;            // [B, F]: rows over model
  const Eigen::Tensor<double, 3> z = random_tensor<3>({5, 6, 3}, 31);
  const Eigen::Tensor<double, 2> w = random_tensor<2>({5, 7}, 32);
  auto check = [&](auto make, const char* what) {
    auto run = [&](auto& lin, const DM& mesh) {
      lin.zero_grad();
      auto [y, pullback] = ts::ad::vjp(lin, [&](const auto& zz) { return lin(ts::sum<2>(zz)); }, ts::distribute<Z>(mesh, z));
      using Y = std::remove_cvref_t<decltype(y)>;
      auto [dz] = pullback(ts::distribute<typename Y::SpecType>(mesh, w));
      return std::tuple{Eigen::Tensor<double, 2>(y.gather()), Eigen::Tensor<double, 3>(dz.gather()), parameters_of(lin, true)};
    };
    DM self(MPI_COMM_SELF, {1, 1});
    auto serial = make(self);
    const auto [y0, dz0, g0] = run(serial, self);
    on_every_dm_mesh([&](DM& mesh, auto sizes) {
      INFO(what << " on mesh " << sizes[0] << "x" << sizes[1]);
      auto lin = make(mesh);
      const auto [y, dz, g] = run(lin, mesh);
      TS_REQUIRE_ALL(compare(y, y0, 1e-12) == "");
      TS_REQUIRE_ALL(compare(dz, dz0, 1e-12) == "");
      TS_REQUIRE_ALL(close(g, g0, 1e-12));
    });
  };
  using Column = ts::Spec<ts::R, ts::S<"model">>;
  using Row = ts::Spec<ts::S<"model">, ts::R>;
  check([](const DM& m) { return ts::nn::Linear<double, DM, Column, Features>(m, 6, 7, 3); }, "column-parallel into features");
  check([](const DM& m) { return ts::nn::Linear<double, DM, Row, Tokens>(m, 6, 7, 3); }, "row-parallel into rows");
  check([](const DM& m) { return ts::nn::Linear<double, DM, Column, Tokens>(m, 6, 7, 3, false); }, "column-parallel into rows");
  // Rows over {data, model} beside a weight over model: the input keeps its rows over data.
  check([](const DM& m) { return ts::nn::Linear<double, DM, Column, ts::Spec<ts::S<"data", "model">, ts::R>>(m, 6, 7, 3); },
        "column-parallel into rows over data and model");
  check([](const DM& m) { return ts::nn::Linear<double, DM, Row, ts::Spec<ts::S<"data", "model">, ts::R>>(m, 6, 7, 3); },
        "row-parallel into rows over data and model");
  // The pinned spec is the result's type.
  DM mesh({1, world_size()});
  ts::nn::Linear<double, DM, Row, Tokens> lin(mesh, 6, 7, 3);
  static_assert(std::is_same_v<decltype(lin(ts::sum<2>(ts::distribute<Z>(mesh, z)))), ts::ShardedTensor<double, DM, Tokens>>);
}

TEST_CASE("eval(): forwards without dropout or a counted step; an evaluation between a recorded forward and its pullback "
          "leaves it as it was",
          "[layers]") {
  const T3 x = random_tensor<3>({5, 4, 6}, 21), other = random_tensor<3>({3, 4, 6}, 22), w = random_tensor<3>({5, 4, 6}, 23);
  auto block = [](const DM& m, double dropout) {
    return ts::nn::TransformerBlock<double, DM>(m, {.dmodel = 6, .heads = 3, .hidden = 7, .dropout = dropout, .seed = 2});
  };
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    auto dropping = block(mesh, 0.3), plain = block(mesh, 0.0);
    dropping.eval();
    const T3 evaluated = dropping(ts::distribute<Acts>(mesh, x)).gather();
    dropping.train();
    TS_REQUIRE_ALL(compare(evaluated, T3(plain(ts::distribute<Acts>(mesh, x)).gather()), 1e-13) == "");
    TS_REQUIRE_ALL(dropping.steps_seen() == 0);
    // A recorded forward, an evaluation of other rows, then the pullback: what the same block gives
    // without the evaluation (the dropout mask of step 1, the activations of x).
    auto reference = block(mesh, 0.3);
    const auto [y0, dx0, g0] = run_layer(reference, mesh, x, w);
    dropping.zero_grad();
    auto [y1, pullback] = ts::ad::vjp(dropping, [&](const auto& v) { return dropping(v); }, ts::distribute<Acts>(mesh, x));
    dropping.eval();
    (void)dropping(ts::distribute<Acts>(mesh, other));
    dropping.train();
    auto [dx1] = pullback(ts::distribute<Acts>(mesh, w));
    TS_REQUIRE_ALL(compare(T3(y1.gather()), y0, 1e-13) == "");
    TS_REQUIRE_ALL(compare(T3(dx1.gather()), dx0, 1e-13) == "");
    TS_REQUIRE_ALL(close(parameters_of(dropping, true), g0, 1e-13));
    TS_REQUIRE_ALL(dropping.steps_seen() == 1);
  });
}

TEST_CASE("Embedding with a split vocabulary looks up and scatter-adds as the serial table does", "[layers]") {
  const Eigen::Index V = 13, D = 5, B = 3, T = 4;
  Eigen::Tensor<std::int32_t, 2> ids(B, T);
  for (Eigen::Index i = 0; i < ids.size(); ++i) ids.data()[i] = std::int32_t((i * 5 + 3) % V);
  ids(0, 0) = ids(2, 3);  // a repeated id adds up
  const T3 dy = random_tensor<3>({B, T, D}, 7);
  DM self(MPI_COMM_SELF, {1, 1});
  ts::nn::Embedding<double, DM> serial(self, V, D, 3);
  const Eigen::Tensor<double, 2> table = serial.weight().gather();
  T3 want(B, T, D);
  Eigen::Tensor<double, 2> want_grad(V, D);
  want_grad.setZero();
  for (Eigen::Index b = 0; b < B; ++b)
    for (Eigen::Index t = 0; t < T; ++t)
      for (Eigen::Index d = 0; d < D; ++d) {
        want(b, t, d) = table(ids(b, t), d);
        want_grad(ids(b, t), d) += dy(b, t, d);
      }
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    ts::nn::Embedding<double, DM> e(mesh, V, D, 3);
    ts::nn::Embedding<double, DM, ts::Spec<ts::R, ts::S<"model">>> columns(mesh, V, D, 3);
    auto tid = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, ids);
    auto [y, pullback] = ts::ad::vjp(e, [&] { return e(tid); });
    auto [yc, pullback_c] = ts::ad::vjp(columns, [&] { return columns(tid); });
    TS_REQUIRE_ALL(compare(T3(y.gather()), want, 0) == "");
    TS_REQUIRE_ALL(compare(T3(yc.gather()), want, 0) == "");
    pullback(ts::distribute<Acts>(mesh, dy));
    pullback_c(ts::distribute<Acts>(mesh, dy));
    TS_REQUIRE_ALL(compare(e.weight_grad().gather(), want_grad, 1e-14) == "");
    TS_REQUIRE_ALL(compare(columns.weight_grad().gather(), want_grad, 1e-14) == "");
    // An id outside [0, V) is an IndexError on every rank.
    Eigen::Tensor<std::int32_t, 2> bad = ids;
    bad(B - 1, T - 1) = std::int32_t(V);
    bool threw = false;
    try {
      (void)e(ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, bad));
    } catch (const ts::IndexError&) {
      threw = true;
    }
    TS_REQUIRE_ALL(threw);
  });
}

namespace {

// A small language model: embeddings, one block, a layernorm and a vocab-split head.
struct TinyLM : ts::nn::Module {
  static constexpr Eigen::Index V = 11, D = 6, B = 3, T = 4;
  ts::nn::Embedding<double, DM> tokens;
  ts::nn::TransformerBlock<double, DM> block;
  ts::nn::LayerNorm<double, DM> norm;
  ts::nn::Linear<double, DM, ts::Spec<ts::R, ts::S<"model">>> head;
  DM mesh;
  explicit TinyLM(const DM& m)
      : tokens(m, V, D, 1), block(m, {.dmodel = D, .heads = 3, .hidden = 7, .dropout = 0.1, .seed = 2}), norm(m, D),
        head(m, D, V, 3), mesh(m) {
    register_module("tokens", tokens);
    register_module("block", block);
    register_module("norm", norm);
    register_module("head", head);
  }
  double step(long s) {
    using Rows = ts::Spec<ts::S<"data">, ts::R>;
    auto ids = ts::from_function<std::int32_t, Rows>(mesh, {B, T}, [&](const auto& i) { return std::int32_t((i[0] * 7 + i[1] * 3 + s) % V); });
    auto labels = ts::from_function<std::int32_t, Rows>(mesh, {B, T}, [&](const auto& i) { return std::int32_t((i[0] + i[1] * 5 + s) % V); });
    return ts::ad::backward(*this, [&] { return ts::nn::cross_entropy(head(norm(block(tokens(ids)))), labels); });
  }
};

struct Trained {
  std::vector<double> losses, norms;
  std::vector<std::vector<double>> parameters;
};

Trained train_tiny(const DM& mesh, int zero, bool overlap, double clip, bool prefetch = false) {
  TinyLM lm(mesh);
  ts::nn::AdamW opt({.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f, .zero_stage = zero,
                     .overlap = overlap, .prefetch = prefetch});
  opt.add(lm);
  Trained t;
  for (long s = 0; s < 3; ++s) {
    opt.zero_grad();
    t.losses.push_back(lm.step(s));
    t.norms.push_back(opt.clip_grad_norm(clip));
    opt.step();
  }
  opt.gather_parameters();
  t.parameters = parameters_of(lm, false);
  return t;
}

}  // namespace

TEST_CASE("ZeRO stages 0-3 give the single-rank parameters, losses and gradient norms after several steps", "[layers]") {
  DM self(MPI_COMM_SELF, {1, 1});
  const Trained want = train_tiny(self, 0, true, 0.5);
  REQUIRE(want.norms[0] > 0.5);  // clipping is active
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    for (int zero = 0; zero <= 3; ++zero)
      for (int variant = 0; variant < 5; ++variant) {
        // variants 3 and 4: every bucket through tshard's all-reduce, in two levels where the
        // data group's ranks make nodes of two (TSHARD_RANKS_PER_NODE, read when the buckets are
        // made), blocking (3) and in flight during backward (4)
        const bool overlap = variant == 0 || variant == 2 || variant == 4, prefetch = variant == 2,
                   own = variant >= 3;
        if ((!overlap && zero % 2 && !own) || (prefetch && zero != 3)) continue;
        INFO("mesh " << sizes[0] << "x" << sizes[1] << ", zero " << zero << ", overlap " << overlap << ", prefetch " << prefetch
                     << ", tshard's all-reduce in two levels " << own);
        Trained got;
        if (own) {
          setenv("TSHARD_RANKS_PER_NODE", "2", 1);
          ts::detail::own_all_reduce_bytes() = 0;
          DM fresh({sizes[0], sizes[1]});  // (its node groups made under that setting)
          got = train_tiny(fresh, zero, overlap, 0.5, prefetch);
          unsetenv("TSHARD_RANKS_PER_NODE");
          ts::detail::own_all_reduce_bytes() = std::uint64_t(1) << 20;
        } else {
          got = train_tiny(mesh, zero, overlap, 0.5, prefetch);
        }
        TS_REQUIRE_ALL(close({got.losses}, {want.losses}, 1e-12));
        TS_REQUIRE_ALL(close({got.norms}, {want.norms}, 1e-12));
        TS_REQUIRE_ALL(close(got.parameters, want.parameters, 1e-11));
      }
  });
}

namespace {

// Two square layers (column- then row-parallel) under ZeRO-3, used in an order that changes:
// fc2(fc1(x)) on steps 0-2 and 5, fc1(fc1(x)) on steps 3 and 4 (a layer used twice in a row).
// Loss 0.5 |y|^2. Returns the losses, the parameters after the run and each step's ZeRO-3
// gather counts (one use per layer call: the backward reads what the forward's tape kept).
struct ReorderedRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> parameters;
  std::vector<ts::nn::ParameterGatherStats> gathers;
  bool read_after_step_refused = false;
};
struct Pair : ts::nn::Module {
  static constexpr Eigen::Index D = 7;
  ts::nn::Linear<double, DM, ts::Spec<ts::R, ts::S<"model">>> fc1;
  ts::nn::Linear<double, DM, ts::Spec<ts::S<"model">, ts::R>> fc2;
  explicit Pair(const DM& mesh) : fc1(mesh, D, D, 1), fc2(mesh, D, D, 2) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
};
ReorderedRun train_reordered(const DM& mesh, bool prefetch) {
  Pair pair(mesh);
  ts::nn::SGD opt({.lr = 0.05f, .momentum = 0.5f, .zero_stage = 3, .prefetch = prefetch});
  opt.add(pair);
  ReorderedRun run;
  for (int s = 0; s < 6; ++s) {
    opt.zero_grad();
    auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, values(5, Pair::D, s + 1));
    run.losses.push_back(ts::ad::backward(pair, [&] {
      auto y = s == 3 || s == 4 ? ts::reshard<ts::Spec<ts::S<"data">, ts::R>>(pair.fc1(pair.fc1(x))) : pair.fc2(pair.fc1(x));
      return ts::sum<0, 1>(ts::square(y)) * 0.5;
    }));
    opt.step();
    run.gathers.push_back(opt.last_parameter_gathers());
  }
  try {
    (void)pair.fc1.weight().gather();
  } catch (const ts::SpecError&) {
    run.read_after_step_refused = true;
  }
  opt.gather_parameters();
  run.parameters = parameters_of(pair, false);
  return run;
}

bool gathers_are(const ts::nn::ParameterGatherStats& g, int blocking, int prefetched, int kept, int discarded) {
  return g.blocking == blocking && g.prefetched == prefetched && g.kept == kept && g.discarded == discarded;
}

}  // namespace

TEST_CASE("ZeRO-3's prefetch follows the last step's order of layers, keeps a layer used twice in a row, survives a "
          "changed order, and computes bitwise what gathering at each use does",
          "[layers]") {
  DM self(MPI_COMM_SELF, {1, 1});
  const ReorderedRun want = train_reordered(self, false);
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    const ReorderedRun plain = train_reordered(mesh, false), got = train_reordered(mesh, true);
    TS_REQUIRE_ALL(got.losses == plain.losses && got.parameters == plain.parameters);
    TS_REQUIRE_ALL(close({got.losses}, {want.losses}, 1e-12) && close(got.parameters, want.parameters, 1e-12));
    // Uses per step: fc1 fc2, on steps 3 and 4 fc1 fc1. Step 0 has no order to follow; steps 1-2
    // prefetch fc2 during fc1; step 3 prefetches fc2 in vain (it left the order); step 4 follows
    // step 3 and keeps fc1 between its two uses; step 5 leaves that order again (fc1 was kept
    // for a second use that did not come).
    const auto& g = got.gathers;
    const bool split = sizes[0] > 1;  // (one data rank: nothing is sharded, nothing to prefetch)
    TS_REQUIRE_ALL(gathers_are(g[0], 2, 0, 0, 0) && gathers_are(g[3], 2, 0, 0, split ? 1 : 0) && gathers_are(g[4], 1, 0, 1, 0));
    TS_REQUIRE_ALL(gathers_are(g[1], split ? 1 : 2, split ? 1 : 0, 0, 0) && gathers_are(g[2], split ? 1 : 2, split ? 1 : 0, 0, 0));
    TS_REQUIRE_ALL(gathers_are(g[5], 2, 0, 0, 0) && gathers_are(plain.gathers[2], 2, 0, 0, 0));
    // After step() nothing is left present, kept or prefetched: a read is refused, not stale.
    TS_REQUIRE_ALL(got.read_after_step_refused == split && plain.read_after_step_refused == split);
  });
}

TEST_CASE("ZeRO divides optimizer state, gradients and parameters by the data axis' size", "[layers]") {
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    const int n = sizes[0];
    std::uint64_t state[4] = {}, grads[4] = {}, params[4] = {}, psi = 0;
    for (int zero = 0; zero <= 3; ++zero) {
      ts::nn::Linear<double, DM, ts::Spec<ts::R, ts::S<"model">>> fc(mesh, 30, 20, 1);
      ts::nn::AdamW opt({.zero_stage = zero});
      opt.add(fc);
      opt.zero_grad();
      auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, values(5, 30, 1));
      ts::ad::backward(fc, [&] { return ts::sum<0, 1>(fc(x)); });
      opt.clip_grad_norm(1e9);
      const auto m = opt.memory();
      state[zero] = m.state, grads[zero] = m.gradients, params[zero] = m.parameters;
      psi = m.model_elements * sizeof(double);
    }
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    auto about = [&](std::uint64_t got, double want) { return std::abs(double(got) - want) <= 64.0 * sizeof(double); };
    TS_REQUIRE_ALL(about(state[0], 2.0 * psi) && about(grads[0], double(psi)) && about(params[0], double(psi)));
    TS_REQUIRE_ALL(about(state[1], 2.0 * psi / n) && about(grads[1], double(psi)));
    TS_REQUIRE_ALL(about(state[2], 2.0 * psi / n) && about(grads[2], double(psi) / n) && about(params[2], double(psi)));
    TS_REQUIRE_ALL(about(state[3], 2.0 * psi / n) && about(grads[3], double(psi) / n) && about(params[3], double(psi) / n));
  });
}

TEST_CASE("a ZeRO-3 parameter read between its layer's uses is a SpecError on every rank that says how to bring it back",
          "[layers]") {
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    ts::nn::Linear<double, DM, ts::Spec<ts::R, ts::S<"model">>> fc(mesh, 7, 5, 1);
    ts::nn::AdamW opt({.zero_stage = 3});
    opt.add(fc);
    auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, values(4, 7, 1));
    opt.zero_grad();
    ts::ad::backward(fc, [&] { return ts::sum<0, 1>(fc(x)); });
    opt.step();
    if (sizes[0] == 1) return;  // nothing to shard over one data rank: nothing is released
    std::string said;
    try {
      (void)fc.weight().gather();
    } catch (const ts::SpecError& e) {
      said = e.what();
    }
    INFO(said);
    TS_REQUIRE_ALL(said.find("gather") != std::string::npos && said.find("opt.gather_parameters()") != std::string::npos &&
                   said.find("[7, 5]") != std::string::npos);
    // Brought back, the values are there, and the mesh still works.
    opt.gather_parameters();
    const Eigen::Tensor<double, 2> w = fc.weight().gather();
    TS_REQUIRE_ALL(w.size() == 35 && std::isfinite(w(6, 4)));
  });
}

TEST_CASE("ZeRO leaves a parameter split over the data axis (an expert's) whole, and memory() counts its elements apart",
          "[layers]") {
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    const double n = sizes[0];
    for (int zero = 0; zero <= 3; ++zero) {
      ts::nn::Linear<double, DM, ts::Spec<ts::R, ts::S<"model">>> replicated(mesh, 30, 20, 1);
      ts::nn::Linear<double, DM, ts::Spec<ts::S<"data">, ts::R>> split_over_data(mesh, 30, 20, 2);
      ts::nn::AdamW opt({.zero_stage = zero});
      opt.add(replicated);
      opt.add(split_over_data);
      opt.zero_grad();
      auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, values(5, 30, 1));
      ts::ad::backward(replicated, [&] { return ts::sum<0, 1>(replicated(x)); });
      ts::ad::backward(split_over_data, [&] { return ts::sum<0, 1>(split_over_data(x)); });
      opt.clip_grad_norm(1e9);
      const auto m = opt.memory();
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ", zero " << zero);
      // The split weight's local block (its bias is replicated on data, so ZeRO divides it).
      const auto split = std::uint64_t(n > 1 ? split_over_data.weight().padded_size() : 0);
      TS_REQUIRE_ALL(m.data_split_elements == split);
      const double r = double(m.model_elements - split) * sizeof(double), e = double(split) * sizeof(double);
      const double formula[4] = {4 * r, 2 * r + 2 * r / n, r + 3 * r / n, 4 * r / n};
      TS_REQUIRE_ALL(std::abs(double(m.total()) - (formula[zero] + 4 * e)) <= 128.0 * sizeof(double));
    }
  });
}

TEST_CASE("clip_grad_norm counts a replicated parameter once and equals the serial norm", "[layers]") {
  const Eigen::Tensor<double, 2> g = values(7, 5, 3);
  const Eigen::Tensor<double, 0> sq = (g * g).sum();
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    for (int zero : {0, 2}) {
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ", zero " << zero);
      auto p1 = ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, g);
      auto g1 = ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, g);
      auto p2 = ts::distribute<ts::Spec<ts::S<"model">, ts::S<"data">>>(mesh, g);
      auto g2 = ts::distribute<ts::Spec<ts::S<"model">, ts::S<"data">>>(mesh, g);
      ts::nn::SGD opt({.lr = 0.125f, .zero_stage = zero});
      opt.add(p1, g1);
      opt.add(p2, g2);
      const double norm = opt.clip_grad_norm(1.0);
      TS_REQUIRE_ALL(std::abs(norm - std::sqrt(2 * sq())) < 1e-12 * norm);
      opt.step();  // clipped to norm 1: each parameter moved by lr g / norm
      const Eigen::Tensor<double, 2> want = g - g * (0.125 / (norm + 1e-6));
      TS_REQUIRE_ALL(compare(p1.gather(), want, 1e-12) == "" && compare(p2.gather(), want, 1e-12) == "");
    }
  });
}

TEST_CASE("Optimizer::tie: two copies of a parameter on the ends of a line take the update of their summed gradient, "
          "counted once in the norm", "[layers]") {
  // The "model" axis stands for a pipeline's stages: its first and last coordinates hold the
  // twins (a tied embedding and head), the ones between other parameters; each data line its own.
  const Eigen::Tensor<double, 2> start = values(7, 5, 3);
  auto grad_of = [](int c) { return Eigen::Tensor<double, 2>(values(7, 5, 10 + c) * 4.0); };
  using Line = ts::Mesh<"data">;
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    const int k = sizes[1], m = mesh.coord<"model">();
    if (k < 2) return;  // (no two ends)
    MPI_Comm line;
    MPI_Comm_split(mesh.comm(), mesh.coord<"data">(), m, &line);
    const bool twin = m == 0 || m == k - 1;
    const Eigen::Tensor<double, 2> mine = twin ? Eigen::Tensor<double, 2>(grad_of(0) + grad_of(k - 1)) : grad_of(m);
    double sq = 0;  // the serial norm: the twins' sum once, the others each
    for (int c = 0; c < k - 1; ++c) {
      const Eigen::Tensor<double, 2> g = c == 0 ? Eigen::Tensor<double, 2>(grad_of(0) + grad_of(k - 1)) : grad_of(c);
      sq += Eigen::Tensor<double, 0>((g * g).sum())();
    }
    for (int zero : {0, 2, 3}) {
      INFO("mesh " << sizes[0] << "x" << k << ", zero " << zero);
      const ts::nn::AdamWOptions options{.lr = 0.05f, .weight_decay = 0.1f, .zero_stage = zero};
      const Line sub = mesh.submesh<"data">();
      auto p = ts::distribute<ts::Spec<ts::R, ts::R>>(sub, start);
      auto g = ts::distribute<ts::Spec<ts::R, ts::R>>(sub, grad_of(m));
      ts::nn::AdamW opt(options);
      opt.add(p, g);
      opt.set_norm_mesh(mesh);
      if (twin) opt.tie(p, line, m == 0 ? k - 1 : 0, m == 0);
      const double norm = opt.clip_grad_norm(0.5);
      opt.step();
      // One rank: this coordinate's parameter with the gradient it should have seen, clipped alike.
      const Line self(MPI_COMM_SELF, {1});
      auto p1 = ts::distribute<ts::Spec<ts::R, ts::R>>(self, start);
      auto g1 = ts::distribute<ts::Spec<ts::R, ts::R>>(self, Eigen::Tensor<double, 2>(mine * (0.5 / (std::sqrt(sq) + 1e-6))));
      ts::nn::AdamW serial(options);
      serial.add(p1, g1);
      serial.step();
      TS_REQUIRE_ALL(std::abs(norm - std::sqrt(sq)) < 1e-12 * norm);
      TS_REQUIRE_ALL(compare(p.gather(), p1.gather(), 1e-12) == "");
    }
    MPI_Comm_free(&line);
  });
}

TEST_CASE("cross_entropy over [B, T, V] logits equals the mean over every position", "[layers]") {
  const Eigen::Index B = 3, T = 4, V = 13;
  const T3 z = random_tensor<3>({B, T, V}, 5) * 3.0;
  Eigen::Tensor<std::int32_t, 2> labels(B, T);
  for (Eigen::Index i = 0; i < labels.size(); ++i) labels.data()[i] = std::int32_t((i * 4 + 1) % V);
  double want = 0;
  T3 grad(B, T, V);
  for (Eigen::Index b = 0; b < B; ++b)
    for (Eigen::Index t = 0; t < T; ++t) {
      double m = -INFINITY, s = 0;
      for (Eigen::Index v = 0; v < V; ++v) m = std::max(m, z(b, t, v));
      for (Eigen::Index v = 0; v < V; ++v) s += std::exp(z(b, t, v) - m);
      want += (std::log(s) + m - z(b, t, labels(b, t))) / double(B * T);
      for (Eigen::Index v = 0; v < V; ++v) grad(b, t, v) = (std::exp(z(b, t, v) - m) / s - (v == labels(b, t))) / double(B * T);
    }
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    auto logits = ts::distribute<ts::Spec<ts::S<"data">, ts::R, ts::S<"model">>>(mesh, z);
    auto lab = ts::distribute<ts::Spec<ts::R, ts::S<"data">>>(mesh, labels);
    TS_REQUIRE_ALL(std::abs(ts::nn::cross_entropy(logits, lab) - want) < 1e-12 * want);
    TS_REQUIRE_ALL(compare(T3(ts::nn::cross_entropy_backward(logits, lab).gather()), grad, 1e-14) == "");
  });
}

namespace {
// Bytes sent under every operator whose name contains `part` ("a/gradient_reduction" included).
std::uint64_t sent_under(const ts::CommStats& stats, const std::string& part) {
  std::uint64_t n = 0;
  for (auto& [name, op] : stats.operators())
    if (name.find(part) != std::string::npos) n += op.total().bytes_sent;
  return n;
}
}  // namespace

TEST_CASE("a Megatron block moves the analytic bytes: 2 activation all-reduces forward, 2 backward, and one gradient reduction",
          "[layers]") {
  const Eigen::Index B = 5, T = 4, D = 6;
  const T3 x = random_tensor<3>({B, T, D}, 1);
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    const int d = sizes[0], m = sizes[1];
    for (int zero : {0, 2}) {
      INFO("mesh " << d << "x" << m << ", zero " << zero);
      ts::nn::TransformerBlock<double, DM> block(mesh, {.dmodel = D, .heads = 3, .hidden = 7, .seed = 2});
      ts::nn::AdamW opt({.zero_stage = zero});
      opt.add(block);
      auto in = ts::distribute<Acts>(mesh, x);
      opt.zero_grad();
      ts::reset_comm_stats();
      auto [y, pullback] = ts::ad::vjp(block, [&](const auto& v) { return block(v); }, in);
      const auto forward = ts::comm_stats().total();
      ts::reset_comm_stats();
      auto [dx] = pullback(y);
      opt.step();
      const auto backward = ts::comm_stats();
      // Activations [ceil(B/d), T, D] per rank; an all-reduce over m ranks moves 2 (m-1)/m of them.
      const std::uint64_t act = std::uint64_t((B + d - 1) / d * T * D) * sizeof(double);
      const std::uint64_t all_reduce = 2 * act * std::uint64_t(m - 1) / std::uint64_t(m);
      TS_REQUIRE_ALL(forward.calls == (m > 1 ? 2u : 0u) && forward.bytes_sent == 2 * all_reduce);
      const auto grads = sent_under(backward, "gradient_reduction"), gathers = sent_under(backward, "parameter_gather");
      const auto activations = backward.total().bytes_sent - grads - gathers;
      TS_REQUIRE_ALL(activations == 2 * all_reduce);
      // Gradients: this rank's parameter elements, all-reduced over d ranks, or reduce-scattered
      // (stage 2: each chunk of ceil(n/d) once to each other rank) and the parameters all-gathered.
      std::uint64_t elements = 0, chunks = 0;
      block.for_each_slot([&](const std::string&, ts::nn::detail::ParameterSlot& p, const ts::nn::Module&) {
        elements += std::uint64_t(p.padded_size());
        chunks += std::uint64_t((p.padded_size() + d - 1) / d);
      });
      if (zero == 0)
        TS_REQUIRE_ALL(grads == 2 * elements * sizeof(double) * std::uint64_t(d - 1) / std::uint64_t(d));
      else
        TS_REQUIRE_ALL(grads == chunks * sizeof(double) * std::uint64_t(d - 1) &&
                       gathers == chunks * sizeof(double) * std::uint64_t(d - 1));
    }
  });
}

TEST_CASE("a sequence-parallel Megatron block moves tensor parallelism's bytes in all-gathers and reduce-scatters",
          "[layers]") {
  // Korthikanti et al.: per block, forward, an all-gather before attention and before the MLP and a
  // reduce-scatter after each; backward, their transposes; the layer norms' and the row-parallel
  // biases' gradients (sums over the split tokens) all-reduced over "model".
  const Eigen::Index B = 5, T = 12, D = 6;  // T divides every model size of 1-6 ranks
  const T3 x = random_tensor<3>({B, T, D}, 1);
  using Sequence = ts::nn::MegatronSequenceParallelSpecs<"model", "data">;
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    const int d = sizes[0], m = sizes[1];
    INFO("mesh " << d << "x" << m);
    ts::nn::TransformerBlock<double, DM, Sequence> block(mesh, {.dmodel = D, .heads = 3, .hidden = 7, .seed = 2});
    ts::nn::TransformerBlock<double, DM> plain(mesh, {.dmodel = D, .heads = 3, .hidden = 7, .seed = 2});
    ts::nn::AdamW opt({});
    opt.add(block);
    auto in = ts::distribute<Sequence::activation>(mesh, x);
    opt.zero_grad();
    ts::reset_comm_stats();
    auto [y, pullback] = ts::ad::vjp(block, [&](const auto& v) { return block(v); }, in);
    const auto forward = ts::comm_stats();
    ts::reset_comm_stats();
    auto [dx] = pullback(y);
    opt.step();
    const auto backward = ts::comm_stats();
    auto count = [](const ts::CommStats& s, const char* kind) {
      std::uint64_t n = 0;
      for (auto& [name, op] : s.operators()) n += op.calls(kind);
      return n;
    };
    // Activations [ceil(B/d), T, D] per rank; an all-gather or a reduce-scatter over m ranks sends
    // (m-1)/m of them: the four move what Megatron's two all-reduces move.
    const std::uint64_t act = std::uint64_t((B + d - 1) / d * T * D) * sizeof(double);
    const std::uint64_t one = act * std::uint64_t(m - 1) / std::uint64_t(m);
    const std::uint64_t k = m > 1 ? 2u : 0u;
    TS_REQUIRE_ALL(count(forward, "all_gather") == k && count(forward, "reduce_scatter") == k &&
                   count(forward, "all_reduce") == 0);
    TS_REQUIRE_ALL(forward.total().bytes_sent == 4 * one);
    TS_REQUIRE_ALL(count(backward, "all_gather") == k && count(backward, "reduce_scatter") == k);
    // Gradients over "model": ln1, ln2 (weight and bias), bo and fc2's bias, D elements each, one
    // all-reduce each; over "data": every parameter element of this rank, as the plain block.
    const std::uint64_t norms = 6 * std::uint64_t(D) * sizeof(double) * 2 * std::uint64_t(m - 1) / std::uint64_t(m);
    std::uint64_t elements = 0;
    block.for_each_slot([&](const std::string&, ts::nn::detail::ParameterSlot& p, const ts::nn::Module&) {
      elements += std::uint64_t(p.padded_size());
    });
    const auto grads = sent_under(backward, "gradient_reduction");
    TS_REQUIRE_ALL(grads == 2 * elements * sizeof(double) * std::uint64_t(d - 1) / std::uint64_t(d));
    TS_REQUIRE_ALL(backward.total().bytes_sent - grads == 4 * one + norms);
    // The same values and updated parameters as tensor parallelism's block (whose gradients
    // are checked against one rank above): the sums kept partial over "data" for the optimizer
    // are complete after its step.
    ts::nn::AdamW plain_opt({});
    plain_opt.add(plain);
    plain_opt.zero_grad();
    auto [y_plain, plain_pullback] = ts::ad::vjp(plain, [&](const auto& v) { return plain(v); }, ts::distribute<Acts>(mesh, x));
    plain_pullback(y_plain);
    plain_opt.step();
    TS_REQUIRE_ALL(compare(T3(y.gather()), T3(y_plain.gather()), 1e-12) == "");
    TS_REQUIRE_ALL(close(parameters_of(block, false), parameters_of(plain, false), 1e-12));
  });
}
