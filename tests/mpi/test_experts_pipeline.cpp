// GShard's mixture of experts and the pipeline schedules through the typed API: the top-2
// gating's positions and drops against hand-worked cases, a layer whose dropped tokens give
// exactly zero and whose kept ones equal a serial loop over the experts, the layer on every
// {data, model} mesh against one rank (itself against finite differences), and the schedules'
// order and memory bound. Whole pipelined training runs are the train_transformer tests.
#include "layer_support.hpp"

#include <tshard/nn/layers/moe.hpp>
#include <tshard/parallel/pipeline.hpp>

namespace ts = tshard;
using namespace tshard_test;

namespace {

// Routes of one group, gated serially: logits [1, S, E].
struct Gated {
  std::vector<ts::nn::detail::Route> routes;
  std::vector<double> combine;  // [1, S, E, C]
  ts::nn::RoutingStats stats;
};

Gated gate(const std::vector<double>& logits, Eigen::Index s, Eigen::Index e, Eigen::Index c) {
  Gated g;
  g.routes.resize(std::size_t(s));
  g.combine.resize(std::size_t(s * e * c));
  std::vector<double> probs(static_cast<std::size_t>(s * e)), density(static_cast<std::size_t>(e));
  ts::nn::detail::top2_gating<double>(logits.data(), 1, 1, s, e, c, false, 0, 0, 0, 1, g.combine.data(), probs.data(),
                                      g.routes.data(), density.data(), g.stats);
  return g;
}

}  // namespace

TEST_CASE("top-2 gating fills each expert's slots in token order and drops what is over capacity", "[experts]") {
  // Five tokens, two experts, capacity 2; every token prefers expert 0 (logit 1 against 0).
  const Eigen::Index s = 5, e = 2, c = 2;
  std::vector<double> logits(std::size_t(s * e), 0.0);
  for (Eigen::Index t = 0; t < s; ++t) logits[std::size_t(t)] = 1.0;  // [S, E] column-major: e = 0 first
  const Gated g = gate(logits, s, e, c);
  for (Eigen::Index t = 0; t < s; ++t) {
    const auto& r = g.routes[std::size_t(t)];
    CHECK(r.e1 == 0);
    CHECK(r.e2 == 1);
    // Top-1: tokens 0 and 1 take expert 0's slots; 2, 3 and 4 are dropped there. Top-2: expert 1
    // kept no top-1 token, so tokens 0 and 1 take its slots 0 and 1 and the rest are dropped.
    CHECK(r.c1 == (t < 2 ? t : -1));
    CHECK(r.c2 == (t < 2 ? t : -1));
  }
  CHECK(g.stats.assignments == 10);
  CHECK(g.stats.dropped == 6);
  // The kept gates are normalised over the two choices: e / (e + 1) and 1 / (e + 1).
  const double w1 = std::exp(1.0) / (std::exp(1.0) + 1.0);
  CHECK(std::abs(g.combine[0 + s * (0 + e * 0)] - w1) < 1e-15);      // token 0, expert 0, slot 0
  CHECK(std::abs(g.combine[1 + s * (1 + e * 1)] - (1 - w1)) < 1e-15);  // token 1, expert 1, slot 1
  CHECK(g.combine[2 + s * (0 + e * 1)] == 0.0);                        // token 2 holds no slot

  // Second choices queue behind the first choices an expert kept: three experts, capacity 2,
  // tokens 0 and 1 prefer expert 1 then 0, token 2 prefers 0 then 1.
  std::vector<double> l3 = {0.5, 0.5, 1.0,   // expert 0
                            1.0, 1.0, 0.5,   // expert 1
                            0.0, 0.0, 0.0};  // expert 2
  const Gated h = gate(l3, 3, 3, 2);
  CHECK(h.routes[0].c1 == 0);   // expert 1, slot 0
  CHECK(h.routes[1].c1 == 1);   // expert 1, slot 1
  CHECK(h.routes[2].c1 == 0);   // expert 0, slot 0
  CHECK(h.routes[0].c2 == 1);   // expert 0 kept one first choice: its second choices start at 1
  CHECK(h.routes[1].c2 == -1);  // expert 0 is full
  CHECK(h.routes[2].c2 == -1);  // expert 1 is full
  CHECK(h.stats.dropped == 2);
}

TEST_CASE("dispatch and combine over the routes equal GShard's one-hot einsums and their transposes, padding rows "
          "included",
          "[experts]") {
  // Two valid groups in a buffer of three (the third is padding), 7 tokens, 3 experts of 3 slots,
  // 4 features; random routing, so some second choices are not routed and some are dropped.
  const Eigen::Index gp = 3, groups = 2, s = 7, e = 3, c = 3, d = 4;
  std::uint64_t state = 12345;
  auto uniform = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return double(state >> 11) / double(1ull << 53) * 2 - 1;
  };
  std::vector<double> logits(std::size_t(gp * s * e));
  for (auto& v : logits) v = 2 * uniform();
  std::vector<double> w(std::size_t(gp * s * e * c)), mask(w.size()), probs(logits.size()), density(std::size_t(gp * e));
  std::vector<ts::nn::detail::Route> routes(std::size_t(gp * s));
  ts::nn::RoutingStats stats;
  ts::nn::detail::top2_gating<double>(logits.data(), gp, groups, s, e, c, true, 99, 0, 0, groups, w.data(), probs.data(),
                                      routes.data(), density.data(), stats);
  INFO("assignments " << stats.assignments << ", dropped " << stats.dropped);
  REQUIRE(stats.dropped > 0);
  const ts::nn::detail::RoutingShape shape{.gp = gp, .groups = groups, .s = s, .d = d, .e = e, .c = c};
  const auto token = ts::nn::detail::slot_tokens(routes.data(), shape);
  auto at_w = [&](Eigen::Index g, Eigen::Index t, Eigen::Index x, Eigen::Index k) { return g + gp * (t + s * (x + e * k)); };
  for (Eigen::Index g = 0; g < groups; ++g)  // GShard's one-hot dispatch mask: 1 at each kept slot
    for (Eigen::Index t = 0; t < s; ++t) {
      const auto& r = routes[std::size_t(g + gp * t)];
      if (r.c1 >= 0) mask[std::size_t(at_w(g, t, r.e1, r.c1))] = 1;
      if (r.c2 >= 0) mask[std::size_t(at_w(g, t, r.e2, r.c2))] = 1;
    }
  auto at_x = [&](Eigen::Index g, Eigen::Index t, Eigen::Index m) { return g + gp * (t + s * m); };
  auto at_slot = [&](Eigen::Index g, Eigen::Index k, Eigen::Index m, Eigen::Index x) { return g + gp * (k + c * (m + d * x)); };
  std::vector<double> x(std::size_t(gp * s * d)), dy(x.size()), ye(std::size_t(gp * c * d * e)), dd(ye.size());
  for (auto* v : {&x, &dy, &ye, &dd})
    for (auto& a : *v) a = uniform();
  std::vector<double> dispatched(ye.size()), dx(x.size()), y(x.size()), dye(ye.size()), dw(w.size());
  ts::nn::detail::dispatch_tokens(x.data(), token, shape, dispatched.data());
  ts::nn::detail::dispatch_tokens_transpose(dd.data(), routes.data(), shape, dx.data());
  ts::nn::detail::combine_slots(w.data(), ye.data(), routes.data(), shape, y.data());
  ts::nn::detail::combine_slots_transpose_outputs(w.data(), dy.data(), token, shape, dye.data());
  ts::nn::detail::combine_slots_transpose_weights(dy.data(), ye.data(), routes.data(), shape, dw.data());
  for (Eigen::Index g = 0; g < gp; ++g) {
    INFO("group " << g);
    const bool valid = g < groups;  // a padding row's outputs are zero, whatever its inputs
    for (Eigen::Index k = 0; k < c; ++k)
      for (Eigen::Index m = 0; m < d; ++m)
        for (Eigen::Index ex = 0; ex < e; ++ex) {
          double want_dispatched = 0, want_dye = 0;  // "gsec,gsm->gcme" with the one-hot and the gate weights
          for (Eigen::Index t = 0; t < s && valid; ++t) {
            want_dispatched += mask[std::size_t(at_w(g, t, ex, k))] * x[std::size_t(at_x(g, t, m))];
            want_dye += w[std::size_t(at_w(g, t, ex, k))] * dy[std::size_t(at_x(g, t, m))];
          }
          // One term at most: exactly the einsum's value.
          CHECK(dispatched[std::size_t(at_slot(g, k, m, ex))] == want_dispatched);
          CHECK(dye[std::size_t(at_slot(g, k, m, ex))] == want_dye);
        }
    for (Eigen::Index t = 0; t < s; ++t) {
      for (Eigen::Index m = 0; m < d; ++m) {
        double want_dx = 0, want_y = 0;  // "gsec,gcme->gsm" with the one-hot and the gate weights
        for (Eigen::Index ex = 0; ex < e && valid; ++ex)
          for (Eigen::Index k = 0; k < c; ++k) {
            want_dx += mask[std::size_t(at_w(g, t, ex, k))] * dd[std::size_t(at_slot(g, k, m, ex))];
            want_y += w[std::size_t(at_w(g, t, ex, k))] * ye[std::size_t(at_slot(g, k, m, ex))];
          }
        CHECK(dx[std::size_t(at_x(g, t, m))] == want_dx);  // two terms at most: a + b = b + a
        CHECK(std::abs(y[std::size_t(at_x(g, t, m))] - want_y) <= 1e-15);
      }
      for (Eigen::Index ex = 0; ex < e; ++ex)
        for (Eigen::Index k = 0; k < c; ++k) {
          // "gsm,gcme->gsec" where the token holds the slot; zero elsewhere (the gate reads no more).
          double want = 0;
          for (Eigen::Index m = 0; m < d && mask[std::size_t(at_w(g, t, ex, k))] != 0; ++m)
            want += dy[std::size_t(at_x(g, t, m))] * ye[std::size_t(at_slot(g, k, m, ex))];
          CHECK(std::abs(dw[std::size_t(at_w(g, t, ex, k))] - want) <= 1e-15);
        }
    }
  }
}

TEST_CASE("a mixture-of-experts layer drops tokens over capacity to zero and equals a serial loop over the experts",
          "[experts]") {
  const Eigen::Index g = 3, s = 5, d = 4, hid = 3, e = 2;
  const T3 x = random_tensor<3>({g, s, d}, 21);
  on_every_dm_mesh([&](DM& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    ts::nn::MoE<double, DM> moe(mesh, {.dmodel = d, .hidden = hid, .experts = int(e), .capacity_factor = 0.4,
                                       .random_routing = false, .seed = 5});
    REQUIRE(moe.capacity(s) == 2);
    // A router that sends every token to expert 0 first (logits 0.5 and 0).
    Eigen::Tensor<double, 2> router(d, e);
    router.setZero();
    router(3, 0) = 0.05;
    moe.router() = ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, router);
    T3 xs = x;
    for (Eigen::Index i = 0; i < g * s; ++i) xs.data()[i + g * s * 3] = 10.0;  // feature 3: logit 0.5 for expert 0
    const T3 y = moe(ts::distribute<ts::Spec<ts::S<"data">, ts::R, ts::R>>(mesh, xs)).gather();
    const Eigen::Tensor<double, 3> wi = moe.expert_in().gather(), wo = moe.expert_out().gather();
    auto expert = [&](Eigen::Index ex, Eigen::Index gg, Eigen::Index t, Eigen::Index j) {
      double out = 0;
      for (Eigen::Index k = 0; k < hid; ++k) {
        double a = 0;
        for (Eigen::Index i = 0; i < d; ++i) a += xs(gg, t, i) * wi(i, k, ex);
        const double gl = 0.5 * a * (1 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
        out += gl * wo(k, j, ex);
      }
      return out;
    };
    for (Eigen::Index gg = 0; gg < g; ++gg)
      for (Eigen::Index t = 0; t < s; ++t) {
        double l0 = 0;
        for (Eigen::Index i = 0; i < d; ++i) l0 += xs(gg, t, i) * router(i, 0);
        const double p0 = 1 / (1 + std::exp(-l0)), p1 = 1 - p0;
        for (Eigen::Index j = 0; j < d; ++j) {
          // Tokens 0 and 1 of each group hold slots of both experts; 2, 3 and 4 are dropped by both.
          const double want = t < 2 ? p0 * expert(0, gg, t, j) + p1 * expert(1, gg, t, j) : 0.0;
          INFO("group " << gg << " token " << t << " feature " << j);
          TS_REQUIRE_ALL(std::abs(y(gg, t, j) - want) < 1e-12);
        }
      }
    TS_REQUIRE_ALL(moe.routing().dropped == 6 * g);
    // The dispatch is a reshard of the expert dim, both ways an all-to-all over data.
    const std::string plan = moe.explain(g, s);
    INFO(plan);
    TS_REQUIRE_ALL(plan.find("all-to-all {data, R, R, R} -> {R, R, R, data}") != std::string::npos);
    TS_REQUIRE_ALL(plan.find("all-to-all {R, R, R, data} -> {data, R, R, R}") != std::string::npos);
    TS_REQUIRE_ALL(moe.routing().assignments == 10 * g);
  });
}

TEST_CASE("a mixture-of-experts layer equals its one-rank values on every mesh, with drops, and its gradients equal finite differences",
          "[experts]") {
  const std::array<Eigen::Index, 3> dims{3, 4, 6};  // 3 groups of 4 tokens
  // Three experts over data (uneven on 2 and 4 ranks), capacity 2 of 4 tokens: some are dropped.
  // Without the random routing and the auxiliary loss the objective is sum(w * y): finite
  // differences see every gradient term.
  check_layer([](const DM& m) {
    return ts::nn::MoE<double, DM>(m, {.dmodel = 6, .hidden = 5, .experts = 3, .capacity_factor = 0.6,
                                       .aux_weight = 0.0, .random_routing = false, .seed = 7});
  }, dims);
  // With GShard's random routing of the second expert and the load-balancing loss.
  check_layer_on_meshes([](const DM& m) {
    return ts::nn::MoE<double, DM>(m, {.dmodel = 6, .hidden = 5, .experts = 3, .capacity_factor = 0.6,
                                       .aux_weight = 0.1, .random_routing = true, .seed = 7});
  }, dims);
}

TEST_CASE("the load-balancing loss's router gradient equals finite differences of the loss", "[experts]") {
  DM self(MPI_COMM_SELF, {1, 1});
  const Eigen::Index g = 2, s = 6, d = 4;
  const T3 x = random_tensor<3>({g, s, d}, 31);
  ts::nn::MoE<double, DM> moe(self, {.dmodel = d, .hidden = 3, .experts = 3, .capacity_factor = 1.0, .aux_weight = 1.0,
                                     .random_routing = false, .seed = 3});
  using A = ts::Spec<ts::S<"data">, ts::R, ts::R>;
  const auto xt = ts::distribute<A>(self, x);
  moe.zero_grad();
  auto [y, pullback] = ts::ad::vjp(moe, [&](const auto& v) { return moe(v); }, xt);
  pullback(ts::zeros<double, A>(self, {g, s, d}));  // only the auxiliary loss has a gradient
  const Eigen::Tensor<double, 2> grad = moe.router_grad().gather();
  double* r = moe.router().data();
  for (Eigen::Index i = 0; i < grad.size(); ++i) {
    const double keep = r[i], h = 1e-6;
    r[i] = keep + h;
    (void)moe(xt);
    const double up = moe.auxiliary_loss();
    r[i] = keep - h;
    (void)moe(xt);
    const double down = moe.auxiliary_loss();
    r[i] = keep;
    INFO("router element " << i);
    CHECK(std::abs((up - down) / (2 * h) - grad.data()[i]) < 1e-7);
  }
  CHECK(moe.routing().aux_loss > 0.9);  // 1 when perfectly balanced, more otherwise
}

TEST_CASE("pipeline schedules run each micro-batch's forward before its backward, and 1F1B keeps at most K - s in flight",
          "[pipeline]") {
  for (auto schedule : {ts::nn::Schedule::GPipe, ts::nn::Schedule::OneFOneB})
    for (int k = 1; k <= 4; ++k)
      for (int m = 1; m <= 6; ++m)
        for (int s = 0; s < k; ++s) {
          INFO(ts::nn::to_string(schedule) << " K=" << k << " M=" << m << " stage " << s);
          const auto order = ts::nn::pipeline_order(schedule, k, s, m);
          REQUIRE(order.size() == std::size_t(2 * m));
          std::vector<int> forward_at(std::size_t(m), -1), backward_at(std::size_t(m), -1);
          int live = 0, most = 0;
          for (std::size_t i = 0; i < order.size(); ++i) {
            auto& at = order[i].forward ? forward_at : backward_at;
            REQUIRE(at[std::size_t(order[i].microbatch)] == -1);
            at[std::size_t(order[i].microbatch)] = int(i);
            live += order[i].forward ? 1 : -1;
            most = std::max(most, live);
          }
          for (int j = 0; j < m; ++j) REQUIRE(forward_at[std::size_t(j)] < backward_at[std::size_t(j)]);
          REQUIRE(most == (schedule == ts::nn::Schedule::GPipe ? m : std::min(k - s, m)));
        }
  CHECK(ts::nn::Pipeline<DM, "data">::partition(5, 2, 0) == std::pair{0, 3});
  CHECK(ts::nn::Pipeline<DM, "data">::partition(5, 2, 1) == std::pair{3, 5});
  CHECK(ts::nn::Pipeline<DM, "data">::partition(1, 3, 2) == std::pair{1, 1});
}

namespace {

// A stage of Linear layers [B, D] -> [B, D] for a pipeline test on {data, stage, model}.
using DSM = ts::Mesh<"data", "stage", "model">;
using Rows = ts::Spec<ts::S<"data">, ts::R>;

// Rows [offset, offset + b) of t, the micro-batch's, with rows split over data.
ts::ShardedTensor<double, DM, Rows> micro_batch_rows(const DM& mesh, const Eigen::Tensor<double, 2>& t,
                                                     const ts::nn::MicroBatch& mb) {
  const Eigen::Index b = t.dimension(0) / mb.count;
  return ts::from_function<double, Rows>(mesh, {b, t.dimension(1)},
                                         [&](const auto& i) { return t(i[0] + mb.row_offset, i[1]); });
}

}  // namespace

namespace {

// A chain written forward only, as a ts::nn::Module: Linear layers with gelu between
// them, the last stage's loss half the mean squared error over its micro-batch, plus a scale
// of the last stage's own. The pipeline derives every gradient (ts::ad::vjp per micro-batch).
struct ForwardOnlyStage : ts::nn::Module {
  using Activation = ts::ShardedTensor<double, DM, Rows>;
  using Layer = ts::nn::Linear<double, DM, ts::Spec<ts::R, ts::S<"model">>>;
  DM mesh;
  Eigen::Tensor<double, 2> input, target;
  bool first, last;
  std::vector<std::unique_ptr<Layer>> layers;
  ts::ShardedTensor<double, DM, ts::Spec<ts::R>>* scale = nullptr;

  ForwardOnlyStage(const DM& m, const Eigen::Tensor<double, 2>& x, const Eigen::Tensor<double, 2>& y, bool f, bool l,
                   int begin, int end)
      : mesh(m), input(x), target(y), first(f), last(l) {
    for (int i = begin; i < end; ++i) {
      layers.push_back(std::make_unique<Layer>(mesh, x.dimension(1), x.dimension(1), std::uint64_t(40 + i)));
      register_module("layer" + std::to_string(i), *layers.back());
    }
    if (last) scale = &register_parameter("scale", ts::random<double, ts::Spec<ts::R>>(mesh, {x.dimension(1)}, 7));
  }
  Activation boundary(const ts::nn::MicroBatch& mb) const {
    return Activation(mesh, {input.dimension(0) / mb.count, input.dimension(1)});
  }
  Activation rows_of(const Eigen::Tensor<double, 2>& t, const ts::nn::MicroBatch& mb) const {
    return micro_batch_rows(mesh, t, mb);
  }
  Activation forward(const ts::nn::MicroBatch& mb, const Activation* in) {
    Activation x = first ? rows_of(input, mb) : *in;
    for (auto& l : layers) x = ts::reshard<Rows>(ts::nn::gelu((*l)(x)));
    return x;
  }
  auto loss(const ts::nn::MicroBatch& mb, const Activation* in) {
    auto r = forward(mb, in) * *scale - rows_of(target, mb);
    return ts::sum<0, 1>(ts::square(r)) * (0.5 / double(input.dimension(0) / mb.count));
  }
};

// The step's loss (from the run and from forwards alone) and what an owning SGD step with lr 1
// changed in each parameter (its reduced gradient), gathered in parameter order on every rank.
struct DerivedStep {
  double loss = 0, evaluated = 0;
  std::vector<std::vector<double>> steps;
  std::uint64_t kept = 0;
};
DerivedStep derived_pipelined(const DSM& mesh, int n, const ts::nn::PipelineOptions& o, int zero,
                              const Eigen::Tensor<double, 2>& x, const Eigen::Tensor<double, 2>& y) {
  ts::nn::Pipeline<DSM> pipe(mesh, o);
  const auto [begin, end] = pipe.partition(n);
  ForwardOnlyStage st(mesh.submesh<"data", "model">(), x, y, pipe.first(), pipe.last(), begin, end);
  ts::nn::SGD opt({.lr = 1.0f, .momentum = 0.0f, .weight_decay = 0.0f, .zero_stage = zero});
  opt.add(st);
  DerivedStep out;
  out.evaluated = pipe.evaluate(st, x.dimension(0)).loss;
  opt.gather_parameters();
  std::vector<std::vector<double>> before;
  auto flat = [](const auto& t) {
    const auto g = t.gather();
    return std::vector<double>(g.data(), g.data() + g.size());
  };
  auto parameters = [&] {
    std::vector<std::vector<double>> p;
    for (auto& l : st.layers) {
      p.push_back(flat(l->weight()));
      p.push_back(flat(l->bias()));
    }
    if (st.scale) p.push_back(flat(*st.scale));
    return p;
  };
  before = parameters();
  opt.zero_grad();
  const auto stats = pipe.run(st, x.dimension(0));
  out.loss = stats.loss;
  out.kept = stats.kept_bytes;
  opt.step();
  opt.gather_parameters();
  const auto after = parameters();
  // Every stage's changes, in stage order, onto every rank of the stage line.
  for (int s = 0; s < pipe.stages(); ++s) {
    const auto [b, e] = ts::nn::Pipeline<DSM>::partition(n, pipe.stages(), s);
    const int count = 2 * (e - b) + (s == pipe.stages() - 1 ? 1 : 0);
    for (int k = 0; k < count; ++k) {
      long size = s == pipe.stage() ? long(after[std::size_t(k)].size()) : 0;
      ts::detail::broadcast(pipe.stage_comm(), &size, 1, s);
      std::vector<double> d(static_cast<std::size_t>(size));
      if (s == pipe.stage())
        for (std::size_t i = 0; i < d.size(); ++i) d[i] = before[std::size_t(k)][i] - after[std::size_t(k)][i];
      ts::detail::broadcast(pipe.stage_comm(), d.data(), size, s);
      out.steps.push_back(std::move(d));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("a pipeline of stages written forward only derives the unpipelined gradients under GPipe, 1F1B and remat, "
          "with an owning optimizer at ZeRO 0 and 3",
          "[pipeline][ad]") {
  const Eigen::Index b = 4, d = 5;
  const auto x = random_tensor<2>({b, d}, 53), y = random_tensor<2>({b, d}, 54);
  DSM self(MPI_COMM_SELF, {1, 1, 1});
  const auto want = derived_pipelined(self, 3, {}, 0, x, y);
  REQUIRE(std::abs(want.evaluated - want.loss) <= 1e-14 * want.loss);
  for (auto sizes : mesh_shapes(world_size(), 3)) {
    DSM mesh({sizes[0], sizes[1], sizes[2]});
    for (auto schedule : {ts::nn::Schedule::GPipe, ts::nn::Schedule::OneFOneB})
      for (int m : {1, 2, 4})
        for (bool remat : {false, true})
          for (int zero : {0, 3}) {
            INFO("mesh " << sizes[0] << "x" << sizes[1] << "x" << sizes[2] << " " << ts::nn::to_string(schedule)
                         << " M=" << m << (remat ? " remat" : "") << " ZeRO " << zero);
            const auto got = derived_pipelined(mesh, 3, {.microbatches = m, .schedule = schedule, .remat = remat}, zero, x, y);
            TS_REQUIRE_ALL(std::abs(got.loss - want.loss) < 1e-12 * (1 + std::abs(want.loss)));
            TS_REQUIRE_ALL(std::abs(got.evaluated - want.loss) < 1e-12 * (1 + std::abs(want.loss)));
            TS_REQUIRE_ALL(close(got.steps, want.steps, 1e-12));
          }
  }
  // A batch that does not divide into the micro-batches fails on every rank before any message.
  DSM mesh({1, world_size(), 1});
  REQUIRE_THROWS_AS(derived_pipelined(mesh, 2, {.microbatches = 3}, 0, x, y), ts::ShapeError);
}
