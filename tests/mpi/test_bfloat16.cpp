// bfloat16 tensors (ts::bfloat16, Eigen's): data movement bitwise at half float's bytes,
// reductions and products accumulated in float and rounded once, gradients, and AdamW's float
// master weights. Every result is checked against the same computation in float on the
// bfloat16 inputs, on every 2-D mesh of the world size, with shapes that do not divide.
#include "test_support.hpp"

namespace ts = tshard;
using namespace tshard_test;

namespace {

using B = ts::bfloat16;
using M = ts::Mesh<"x", "y">;
using XR = ts::Spec<ts::S<"x">, ts::R>;
using RY = ts::Spec<ts::R, ts::S<"y">>;
using YX = ts::Spec<ts::S<"y">, ts::S<"x">>;
using RR = ts::Spec<ts::R, ts::R>;

// A global tensor of bfloat16 values in [-1, 1) from a seed, and the same values in float.
Eigen::Tensor<B, 2> random_b(Eigen::Index rows, Eigen::Index cols, unsigned seed) {
  Eigen::Tensor<B, 2> t(rows, cols);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = B(u(gen));
  return t;
}
template <int R>
Eigen::Tensor<float, R> widened(const Eigen::Tensor<B, R>& t) {
  return t.template cast<float>();
}
// The bits of every element: data movement must keep them.
template <int R>
bool same_bits(const Eigen::Tensor<B, R>& a, const Eigen::Tensor<B, R>& b) {
  if (a.size() != b.size()) return false;
  for (Eigen::Index i = 0; i < a.size(); ++i)
    if (Eigen::numext::bit_cast<std::uint16_t>(a.data()[i]) != Eigen::numext::bit_cast<std::uint16_t>(b.data()[i]))
      return false;
  return true;
}
// Every element within `rel` of the reference (relative to the reference's largest magnitude).
template <int R>
std::string close(const Eigen::Tensor<B, R>& got, const Eigen::Tensor<float, R>& want, double rel) {
  double scale = 1e-30;
  for (Eigen::Index i = 0; i < want.size(); ++i) scale = std::max(scale, double(std::abs(want.data()[i])));
  return compare(widened(got), want, rel * scale);
}

}  // namespace

TEST_CASE("bfloat16 tensors move bitwise at half float's bytes: distribute, gather, reshard between any specs",
          "[bf16]") {
  const auto g = random_b(13, 7, 1);
  for (const auto& s : mesh_shapes(world_size(), 2)) {
    const M mesh({s[0], s[1]});
    INFO("mesh " << s[0] << "x" << s[1]);
    const auto a = ts::distribute<XR>(mesh, g);
    TS_REQUIRE_ALL(same_bits(Eigen::Tensor<B, 2>(a.gather()), g));
    const auto b = ts::reshard<YX>(a);
    const auto c = ts::reshard<RY>(b);
    TS_REQUIRE_ALL(same_bits(Eigen::Tensor<B, 2>(b.gather()), g));
    TS_REQUIRE_ALL(same_bits(Eigen::Tensor<B, 2>(c.gather()), g));
    // The all-gather of a split tensor sends half the bytes of the same one in float.
    const auto af = ts::distribute<XR>(mesh, widened(g));
    ts::reset_comm_stats();
    (void)ts::reshard<RR>(a);
    const auto half = ts::comm_stats().total().bytes_sent;
    ts::reset_comm_stats();
    (void)ts::reshard<RR>(af);
    const auto full = ts::comm_stats().total().bytes_sent;
    TS_REQUIRE_ALL(2 * half == full);
  }
}

TEST_CASE("bfloat16 reductions accumulate in float: a sum of 1000 ones is 1000, on every mesh and spec", "[bf16]") {
  Eigen::Tensor<B, 2> ones(1000, 3);
  ones.setConstant(B(1.0f));
  const auto g = random_b(37, 5, 2);
  const Eigen::Tensor<float, 1> want_sum = widened(g).sum(Eigen::array<int, 1>{0});
  const Eigen::Tensor<float, 1> want_max = widened(g).maximum(Eigen::array<int, 1>{1});
  for (const auto& s : mesh_shapes(world_size(), 2)) {
    const M mesh({s[0], s[1]});
    INFO("mesh " << s[0] << "x" << s[1]);
    // Added in bfloat16 the sum would stop at 256 (256 + 1 rounds back to 256).
    const Eigen::Tensor<B, 1> n = ts::sum<0>(ts::distribute<XR>(mesh, ones)).gather();
    for (int j = 0; j < 3; ++j) TS_REQUIRE_ALL(float(n(j)) == 1000.0f);
    const Eigen::Tensor<B, 1> all = ts::sum<0>(ts::distribute<ts::Spec<ts::S<"x", "y">, ts::R>>(mesh, ones)).gather();
    TS_REQUIRE_ALL(float(all(1)) == 1000.0f);
    // Random values: the float sum rounded (a partial sum per rank rounds once more).
    const Eigen::Tensor<B, 1> sum = ts::sum<0>(ts::distribute<YX>(mesh, g)).gather();
    TS_REQUIRE_ALL(close(sum, want_sum, 2e-2) == "");
    const Eigen::Tensor<B, 1> max = ts::max<1>(ts::distribute<YX>(mesh, g)).gather();
    TS_REQUIRE_ALL(compare(widened(max), want_max, 0) == "");  // max is exact
  }
}

TEST_CASE("bfloat16 einsum: float products and sums, rounded once; elementwise ops against float", "[bf16]") {
  const auto ga = random_b(13, 9, 3), gb = random_b(9, 7, 4);
  const Eigen::Tensor<float, 2> want =
      widened(ga).contract(widened(gb), Eigen::array<Eigen::IndexPair<int>, 1>{Eigen::IndexPair<int>(1, 0)});
  const Eigen::Tensor<float, 2> want_ew = (widened(ga) * 2.0f).exp() * widened(ga) + 0.5f;
  INFO("bfloat16 products run " << ts::detail::bf16_gemm_kernel());
  for (const auto& s : mesh_shapes(world_size(), 2)) {
    const M mesh({s[0], s[1]});
    INFO("mesh " << s[0] << "x" << s[1]);
    const auto a = ts::distribute<XR>(mesh, ga);
    // Contracted dim split over y: a partial sum resolved by a bfloat16 all-reduce.
    const auto a2 = ts::distribute<RY>(mesh, ga);
    const auto b = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, gb);
    const auto br = ts::distribute<RR>(mesh, gb);
    TS_REQUIRE_ALL(close(Eigen::Tensor<B, 2>(ts::einsum<"ij,jk->ik">(a, br).gather()), want, 1e-2) == "");
    TS_REQUIRE_ALL(close(Eigen::Tensor<B, 2>(ts::reshard<RR>(ts::einsum<"ij,jk->ik">(a2, b)).gather()), want, 2e-2) == "");
    const auto e = ts::exp(a * 2.0f) * a + 0.5f;
    TS_REQUIRE_ALL(close(Eigen::Tensor<B, 2>(e.gather()), want_ew, 1e-2) == "");
  }
}

TEST_CASE("bfloat16 gradients equal float's within bfloat16's precision, on every mesh", "[bf16]") {
  const auto gx = random_b(11, 6, 5), gw = random_b(6, 8, 6);
  auto f = [](const auto& x) {
    return [&x](const auto& w) {
      const auto h = ts::einsum<"ij,jk->ik">(x, w);
      return ts::sum<0, 1>(ts::tanh(h) * ts::sigmoid(h * 2.0f));
    };
  };
  // The float reference on one rank, from the same bfloat16 values.
  const M single(MPI_COMM_SELF, {1, 1});
  const auto xf = ts::distribute<RR>(single, widened(gx));
  const auto wf = ts::distribute<RR>(single, widened(gw));
  auto [lf, dwf] = ts::ad::value_and_grad(f(xf), wf);
  const Eigen::Tensor<float, 2> want = dwf.gather();
  for (const auto& s : mesh_shapes(world_size(), 2)) {
    const M mesh({s[0], s[1]});
    INFO("mesh " << s[0] << "x" << s[1]);
    const auto x = ts::distribute<XR>(mesh, gx);
    const auto w = ts::distribute<RY>(mesh, gw);
    auto [l, dw] = ts::ad::value_and_grad(f(x), w);
    static_assert(std::is_same_v<decltype(dw), std::remove_const_t<decltype(w)>>, "a gradient has its primal's type");
    TS_REQUIRE_ALL(std::abs(l - lf) <= 2e-2 * std::max(1.0, std::abs(lf)));
    TS_REQUIRE_ALL(close(Eigen::Tensor<B, 2>(dw.gather()), want, 3e-2) == "");
  }
}

TEST_CASE("AdamW on bfloat16 parameters updates float master weights: steps below a bfloat16 ulp add up; ZeRO 0-3",
          "[bf16]") {
  // Parameters at 1 (bfloat16's spacing there is 2^-7), gradient 1: Adam moves each by lr per
  // step, 1e-4, which rounds back to 1 in bfloat16; the master copy takes 100 steps to 0.99.
  Eigen::Tensor<B, 2> one(9, 5);
  one.setConstant(B(1.0f));
  for (int zero : {0, 1, 2, 3}) {
    const M mesh({world_size(), 1});
    INFO("ZeRO-" << zero);
    auto p = ts::distribute<XR>(mesh, one);
    auto g = ts::distribute<XR>(mesh, one);
    auto pf = ts::distribute<XR>(mesh, widened(one));
    auto gf = ts::distribute<XR>(mesh, widened(one));
    // The parameters replicated over the data axis (x), so ZeRO shards their state.
    using Data = ts::Spec<ts::R, ts::R>;
    auto pr = ts::reshard<Data>(p);
    auto gr = ts::reshard<Data>(g);
    auto pfr = ts::reshard<Data>(pf);
    auto gfr = ts::reshard<Data>(gf);
    ts::nn::AdamW opt({.lr = 1e-4, .weight_decay = 0.0, .zero_stage = zero, .data_axis = "x"});
    ts::nn::AdamW optf({.lr = 1e-4, .weight_decay = 0.0, .zero_stage = zero, .data_axis = "x"});
    opt.add(pr, gr);
    optf.add(pfr, gfr);
    for (int step = 0; step < 100; ++step) {
      opt.step();
      optf.step();
    }
    const Eigen::Tensor<B, 2> got = pr.gather();
    const Eigen::Tensor<float, 2> master = pfr.gather();
    TS_REQUIRE_ALL(float(got(0, 0)) < 0.995f);
    // The bfloat16 parameters are the float run's, rounded.
    Eigen::Tensor<B, 2> rounded = master.cast<B>();
    TS_REQUIRE_ALL(same_bits(got, rounded));
    // Optimizer state and master copy in float: 12 bytes per element this rank updates.
    const auto mem = opt.memory(), memf = optf.memory();
    TS_REQUIRE_ALL(mem.state == memf.state / 2 * 3);
  }
}

TEST_CASE("a transformer block in bfloat16 computes the float block's loss and gradients within bfloat16's "
          "precision on every mesh; with experts, finite ones",
          "[bf16]") {
  using MM = ts::Mesh<"data", "model">;
  using X = ts::Spec<ts::S<"data">, ts::R, ts::R>;
  Eigen::Tensor<float, 3> gx(3, 5, 8), gw(3, 5, 8);
  for (Eigen::Index i = 0; i < gx.size(); ++i)
    gx.data()[i] = float(B(std::sin(0.3f * float(i)))), gw.data()[i] = float(B(std::cos(0.7f * float(i))));
  for (int experts : {0, 3})
    for (const auto& s : mesh_shapes(world_size(), 2)) {
      const MM mesh({s[0], s[1]});
      INFO("mesh " << s[0] << "x" << s[1] << ", " << experts << " experts");
      const ts::nn::BlockOptions o{.dmodel = 8, .heads = 2, .hidden = 12, .dropout = 0.0, .seed = 5,
                                   .experts = experts, .capacity_factor = 2.0};
      ts::nn::TransformerBlock<float, MM> f(mesh, o);
      ts::nn::TransformerBlock<B, MM> h(mesh, o);
      // The bfloat16 block starts from the float block's weights, rounded.
      const auto fs = ts::nn::state_dict(f), hs = ts::nn::state_dict(h);
      for (const auto& [name, t] : hs) t->set_values(fs.at(name).values());
      const auto xf = ts::distribute<X>(mesh, gx), wf = ts::distribute<X>(mesh, gw);
      const auto xh = ts::distribute<X>(mesh, Eigen::Tensor<B, 3>(gx.cast<B>()));
      const auto wh = ts::distribute<X>(mesh, Eigen::Tensor<B, 3>(gw.cast<B>()));
      const double lf = ts::ad::backward(f, [&] { return ts::sum<0, 1, 2>(f(xf) * wf); });
      const double lh = ts::ad::backward(h, [&] { return ts::sum<0, 1, 2>(h(xh) * wh); });
      if (!experts) TS_REQUIRE_ALL(std::abs(lh - lf) <= 3e-2 * std::max(1.0, std::abs(lf)));
      TS_REQUIRE_ALL(std::isfinite(lh));
      std::vector<Eigen::Tensor<float, 1>> gf, gh;
      auto gradients = [](const ts::nn::Module& m, std::vector<Eigen::Tensor<float, 1>>& out) {
        m.for_each_slot([&](const std::string&, ts::nn::detail::ParameterSlot& slot, const ts::nn::Module&) {
          const auto v = slot.gradient_state()->values();
          Eigen::Tensor<float, 1> t(Eigen::Index(v.size()));
          for (std::size_t i = 0; i < v.size(); ++i) t(Eigen::Index(i)) = float(v[i]);
          out.push_back(t);
        });
      };
      gradients(f, gf);
      gradients(h, gh);
      TS_REQUIRE_ALL(gf.size() == gh.size());
      if (experts) {
        // The top-2 gate's choices are discrete: bfloat16's probabilities may route a token
        // elsewhere, so only finiteness is required of the experts' gradients.
        for (const auto& g : gh)
          for (Eigen::Index j = 0; j < g.size(); ++j) TS_REQUIRE_ALL(std::isfinite(g(j)));
        continue;
      }
      for (std::size_t i = 0; i < gf.size(); ++i) {
        double scale = 1e-3;
        for (Eigen::Index j = 0; j < gf[i].size(); ++j) scale = std::max(scale, double(std::abs(gf[i](j))));
        INFO("parameter " << i);
        TS_REQUIRE_ALL(compare(gh[i], gf[i], 5e-2 * scale) == "");
      }
    }
}

namespace {
// A user's module: a Linear and a parameter of its own, in T.
template <class T>
struct ScaledLinear : ts::nn::Module {
  ts::nn::Linear<T, M, RR> fc;
  ts::ShardedTensor<T, M, ts::Spec<ts::R>>& scale;
  explicit ScaledLinear(const M& mesh)
      : fc(mesh, 6, 5, 3),
        scale(register_parameter("scale", ts::from_function<T, ts::Spec<ts::R>>(mesh, {5}, [](const auto& i) {
                return T(1.0f + 0.125f * float(i[0]));  // exact in bfloat16
              }))) {
    register_module("fc", fc);
  }
  auto operator()(const auto& x) { return fc(x) * scale; }
};
}  // namespace

TEST_CASE("a bfloat16 module's parameters register with AdamW by module and step as float's do, rounded; ZeRO 0-3",
          "[bf16]") {
  const Eigen::Tensor<B, 2> gx = random_b(4, 6, 11), gw = random_b(6, 5, 12);
  for (int zero : {0, 1, 2, 3}) {
    const M mesh({world_size(), 1});
    INFO("ZeRO-" << zero);
    ScaledLinear<B> h(mesh);
    ScaledLinear<float> f(mesh);
    h.fc.weight() = ts::distribute<RR>(mesh, gw);
    f.fc.weight() = ts::distribute<RR>(mesh, widened(gw));
    REQUIRE(h.parameter_names() == f.parameter_names());
    ts::nn::AdamW opt({.lr = 1e-2, .weight_decay = 0.0, .zero_stage = zero, .data_axis = "x"});
    ts::nn::AdamW optf({.lr = 1e-2, .weight_decay = 0.0, .zero_stage = zero, .data_axis = "x"});
    opt.add(h);  // threw "not float or double" before bfloat16 slots were visited
    optf.add(f);
    // The optimizer state: float moments and a float master copy, 12 bytes an element against 8.
    TS_REQUIRE_ALL(opt.memory().state == optf.memory().state / 2 * 3);
    const auto xh = ts::distribute<XR>(mesh, gx);
    const auto xf = ts::distribute<XR>(mesh, widened(gx));
    const double lh = ts::ad::backward(h, [&] { return ts::sum<0, 1>(h(xh)); });
    const double lf = ts::ad::backward(f, [&] { return ts::sum<0, 1>(f(xf)); });
    TS_REQUIRE_ALL(std::abs(lh - lf) <= 2e-2 * std::max(1.0, std::abs(lf)));
    opt.step();
    optf.step();
    if (zero == 3) {  // the layers' parameters are present only around their uses
      opt.gather_parameters();
      optf.gather_parameters();
    }
    // Adam's first step moves each element by lr (its sign the gradient's): 0.01, more than a
    // bfloat16 ulp of these weights, so the step is seen, and equals float's within one ulp.
    const Eigen::Tensor<float, 2> w1 = widened(Eigen::Tensor<B, 2>(h.fc.weight().gather()));
    const Eigen::Tensor<float, 2> wf = f.fc.weight().gather();
    const Eigen::Tensor<float, 2> w0 = widened(gw);
    for (Eigen::Index i = 0; i < w1.size(); ++i) {
      INFO("weight element " << i << ": " << w0.data()[i] << " -> " << w1.data()[i] << ", float " << wf.data()[i]);
      TS_REQUIRE_ALL(std::abs(w1.data()[i] - w0.data()[i]) > 4e-3f);
      TS_REQUIRE_ALL(std::abs(w1.data()[i] - wf.data()[i]) <= std::abs(wf.data()[i]) * 0x1p-7f + 1e-6f);
    }
    const Eigen::Tensor<B, 1> s1 = h.scale.gather();
    const Eigen::Tensor<float, 1> sf = f.scale.gather();
    for (Eigen::Index i = 0; i < s1.size(); ++i) TS_REQUIRE_ALL(std::abs(float(s1(i)) - sf(i)) <= sf(i) * 0x1p-7f);
  }
}
