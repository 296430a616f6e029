// Modules written by users (register_parameter / register_module, forward only) trained with
// derived gradients: names, gradients equal to the one-rank ones on every mesh, an owning
// optimizer's data-parallel sum done exactly once through any depth of composites, moved
// modules, double registration refused, parameter groups.
#include "test_support.hpp"

#include <filesystem>

#include <tshard/train/train.hpp>

namespace ts = tshard;
using namespace tshard_test;

namespace {

using M = ts::Mesh<"data", "model">;

// README's module example, in double.
struct Mlp : ts::nn::Module {
  ts::nn::Linear<double, M, ts::Spec<ts::R, ts::S<"model">>> up;    // column-parallel
  ts::nn::Linear<double, M, ts::Spec<ts::S<"model">, ts::R>> down;  // row-parallel
  ts::ShardedTensor<double, M, ts::Spec<ts::R>>& scale;
  explicit Mlp(const M& mesh)
      : up(mesh, 12, 20, 1), down(mesh, 20, 12, 2),
        scale(register_parameter("scale", ts::random<double, ts::Spec<ts::R>>(mesh, {12}, 3))) {
    register_module("up", up);
    register_module("down", down);
  }
  auto operator()(const auto& x) { return down(ts::nn::gelu(up(x))) * scale; }
};

// A composite of composites: the deferral of data-parallel sums must reach the leaves.
struct Stack : ts::nn::Module {
  Mlp first, second;
  ts::nn::LayerNorm<double, M> norm;
  explicit Stack(const M& mesh) : first(mesh), second(mesh), norm(mesh, 12) {
    register_module("first", first);
    register_module("second", second);
    register_module("norm", norm);
  }
  auto operator()(const auto& x) { return norm(second(first(x) + x)); }
};

Eigen::Tensor<double, 2> inputs(Eigen::Index rows, Eigen::Index cols) {
  Eigen::Tensor<double, 2> t(rows, cols);
  for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = std::sin(0.37 * double(i) + 0.1);
  return t;
}
Eigen::Tensor<std::int32_t, 1> classes(Eigen::Index rows, int v) {
  Eigen::Tensor<std::int32_t, 1> t(rows);
  for (Eigen::Index i = 0; i < rows; ++i) t(i) = std::int32_t((i * 7 + 3) % v);
  return t;
}

template <class Model>
std::vector<Eigen::Tensor<double, 2>> gathered_gradients(Model& model) {
  std::vector<Eigen::Tensor<double, 2>> out;
  model.for_each_module([&](ts::nn::Module&, const std::string&) {});
  auto add = [&](const auto& g) {
    const auto v = g.gather();
    Eigen::Tensor<double, 2> flat(v.size(), 1);
    for (Eigen::Index i = 0; i < v.size(); ++i) flat.data()[i] = v.data()[i];
    out.push_back(flat);
  };
  if constexpr (requires { model.up; }) {
    add(model.up.weight_grad());
    add(model.up.bias_grad());
    add(model.down.weight_grad());
    add(model.down.bias_grad());
  }
  return out;
}

}  // namespace

TEST_CASE("a module's parameter names: submodules' first with their prefix, then its own", "[module]") {
  const M mesh({world_size(), 1});
  Mlp mlp(mesh);
  const std::vector<std::string> want{"up.weight", "up.bias", "down.weight", "down.bias", "scale"};
  TS_REQUIRE_ALL(mlp.parameter_names() == want);
  Stack stack(mesh);
  const auto names = stack.parameter_names();
  TS_REQUIRE_ALL(names.size() == 12);
  TS_REQUIRE_ALL(names.front() == "first.up.weight");
  TS_REQUIRE_ALL(names.back() == "norm.bias");
}

TEST_CASE("backward(model, loss) gives every parameter the one-rank gradient on every mesh", "[module]") {
  const auto gx = inputs(11, 12);
  const auto gl = classes(11, 12);
  auto run = [&](const M& mesh) {
    Mlp mlp(mesh);
    const auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, gx);
    const auto labels = ts::distribute<ts::Spec<ts::S<"data">>>(mesh, gl);
    const double loss = ts::ad::backward(mlp, [&] { return ts::nn::cross_entropy(mlp(x), labels); });
    auto g = gathered_gradients(mlp);
    const auto s = mlp.parameter_slot("scale");
    (void)s;
    // The parameters are plain again after backward: nothing is left on them.
    TS_REQUIRE_ALL(!ts::detail::tracked(mlp.up.weight()) && !ts::detail::tracked(mlp.scale));
    return std::make_pair(loss, g);
  };
  const M single(MPI_COMM_SELF, {1, 1});
  const auto [want_loss, want] = run(single);
  for (const auto& s : mesh_shapes(world_size(), 2)) {
    const M mesh({s[0], s[1]});
    INFO("mesh " << s[0] << "x" << s[1]);
    const auto [loss, got] = run(mesh);
    TS_REQUIRE_ALL(std::abs(loss - want_loss) <= 1e-13);
    for (std::size_t i = 0; i < got.size(); ++i) TS_REQUIRE_ALL(compare(got[i], want[i], 1e-12) == "");
  }
}

TEST_CASE("an owning optimizer sums data-parallel gradients exactly once through nested composites, ZeRO 0-3",
          "[module]") {
  // SGD is not scale-invariant: a gradient summed twice (the data-axis size times too large)
  // would show in the parameters after one step.
  const auto gx = inputs(10, 12);
  auto run = [&](const M& mesh, int steps, int zero) {
    Stack model(mesh);
    ts::nn::SGD opt({.lr = 0.1f, .momentum = 0.0f, .weight_decay = 0.0f, .zero_stage = zero});
    opt.add(model);
    const auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, gx);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      ts::ad::backward(model, [&] { return ts::sum<0, 1>(ts::square(model(x))) * 0.01; });
      opt.step();
    }
    opt.gather_parameters();  // ZeRO-3: present again to be read
    return std::vector<Eigen::Tensor<double, 2>>{model.first.up.weight().gather(), model.second.down.weight().gather()};
  };
  const M single(MPI_COMM_SELF, {1, 1});
  const auto want = run(single, 3, 0);
  for (int zero = 0; zero <= 3; ++zero)
    for (const auto& s : mesh_shapes(world_size(), 2)) {
      const M mesh({s[0], s[1]});
      INFO("mesh " << s[0] << "x" << s[1] << ", ZeRO stage " << zero);
      const auto got = run(mesh, 3, zero);
      for (std::size_t i = 0; i < got.size(); ++i) TS_REQUIRE_ALL(compare(got[i], want[i], 1e-12) == "");
    }
}

TEST_CASE("a gradient read while an owning optimizer defers the data-parallel sum is the reduced one, ZeRO 0-3",
          "[module]") {
  // Once opt.add(model) owns the gradients, each rank adds only its share of the batch; a
  // gradient read before step() once gave that share ([2 2 2] for [4 4 4] on 2 ranks).
  const auto gx = inputs(11, 12);
  const auto gl = classes(11, 12);
  auto flat = [](const auto& t) {
    Eigen::Tensor<double, 2> f(t.size(), 1);
    for (Eigen::Index i = 0; i < t.size(); ++i) f.data()[i] = t.data()[i];
    return f;
  };
  auto read = [&](Mlp& mlp) {
    // (a submodule's parameter through its parent first, as p.grad is read from anywhere)
    return std::vector<Eigen::Tensor<double, 2>>{flat(mlp.gradient_of(mlp.down.bias()).gather()),
                                                 flat(mlp.gradient_of(mlp.scale).gather()),
                                                 flat(mlp.up.gradient_of(mlp.up.weight()).gather()),
                                                 flat(mlp.down.gradient_of(mlp.down.bias()).gather())};
  };
  auto run = [&](const M& mesh, int zero, bool overlap, bool own) {
    Mlp mlp(mesh);
    ts::nn::SGD opt({.lr = 0.1f, .zero_stage = zero, .overlap = overlap});
    if (own) opt.add(mlp);
    const auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, gx);
    const auto labels = ts::distribute<ts::Spec<ts::S<"data">>>(mesh, gl);
    ts::ad::backward(mlp, [&] { return ts::nn::cross_entropy(mlp(x), labels); });
    auto before = read(mlp);
    auto again = read(mlp);  // read twice: reduced once
    opt.step();
    auto after = read(mlp);  // after the update too (ZeRO-2/3: from the reduced chunks)
    opt.gather_parameters();
    before.insert(before.end(), again.begin(), again.end());
    before.insert(before.end(), after.begin(), after.end());
    before.push_back(flat(mlp.up.weight().gather()));
    return before;
  };
  const M single(MPI_COMM_SELF, {1, 1});
  const auto want = run(single, 0, false, true);
  for (int zero = 0; zero <= 3; ++zero)
    for (bool overlap : {false, true})
      for (const auto& s : mesh_shapes(world_size(), 2)) {
        const M mesh({s[0], s[1]});
        INFO("mesh " << s[0] << "x" << s[1] << ", ZeRO stage " << zero << (overlap ? ", overlapped" : ""));
        const auto got = run(mesh, zero, overlap, true);
        for (std::size_t i = 0; i < got.size(); ++i) TS_REQUIRE_ALL(compare(got[i], want[i], 1e-12) == "");
      }
  // Under no_sync the gradient is this rank's share by request: reading it then is an error.
  const M mesh({world_size(), 1});
  Mlp mlp(mesh);
  ts::nn::SGD opt({.lr = 0.1f});
  opt.add(mlp);
  opt.no_sync(true);
  const auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, gx);
  ts::ad::backward(mlp, [&] { return ts::sum<0, 1>(mlp(x)); });
  bool refused = false;
  try {
    (void)mlp.gradient_of(mlp.scale);
  } catch (const ts::SpecError& e) {
    refused = std::string(e.what()).find("no_sync") != std::string::npos;
  }
  TS_REQUIRE_ALL(refused);
}

namespace {
using DC = ts::Mesh<"data", "context">;
// Replicated everywhere: with the batch split over both axes, each parameter's gradient is a
// sum over both.
struct Replicated : ts::nn::Module {
  ts::nn::Linear<double, DC, ts::Spec<ts::R, ts::R>> up, down;
  ts::nn::LayerNorm<double, DC> norm;
  ts::ShardedTensor<double, DC, ts::Spec<ts::R>>& scale;
  explicit Replicated(const DC& mesh)
      : up(mesh, 12, 17, 1), down(mesh, 17, 12, 2), norm(mesh, 12),
        scale(register_parameter("scale", ts::random<double, ts::Spec<ts::R>>(mesh, {12}, 3))) {
    register_module("up", up);
    register_module("down", down);
    register_module("norm", norm);
  }
  auto operator()(const auto& x) { return norm(down(ts::nn::gelu(up(x))) * scale + x); }
};
}  // namespace

TEST_CASE("data_axis names several axes: one bucket group sums over all of them and ZeRO shards over all, 0-3",
          "[module]") {
  const auto gx = inputs(11, 12);
  auto run = [&](const DC& mesh, int zero, bool overlap, const char* axes) {
    Replicated model(mesh);
    const auto options = [&] {  // (the options own the names: the string they came from is gone before add())
      const std::string names(axes);
      return ts::nn::SGDOptions{.lr = 0.1f, .momentum = 0.5f, .zero_stage = zero, .data_axis = names.c_str(), .overlap = overlap};
    }();
    ts::nn::SGD opt(options);
    opt.add(model);
    const auto x = ts::distribute<ts::Spec<ts::S<"data", "context">, ts::R>>(mesh, gx);
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      ts::ad::backward(model, [&] { return ts::sum<0, 1>(ts::square(model(x))) * 0.01; });
      opt.step();
    }
    const auto state = opt.memory().state;
    opt.gather_parameters();
    std::vector<Eigen::Tensor<double, 2>> got{model.up.weight().gather(), model.down.weight().gather()};
    for (const auto& v : {model.norm.gamma().gather(), model.scale.gather(), model.down.bias().gather()}) {
      Eigen::Tensor<double, 2> flat(v.size(), 1);
      for (Eigen::Index i = 0; i < v.size(); ++i) flat.data()[i] = v.data()[i];
      got.push_back(flat);
    }
    return std::make_pair(got, state);
  };
  const DC single(MPI_COMM_SELF, {1, 1});
  const auto want = run(single, 0, false, "data").first;
  for (int zero = 0; zero <= 3; ++zero)
    for (bool overlap : {false, true})
      for (const auto& s : mesh_shapes(world_size(), 2)) {
        const DC mesh({s[0], s[1]});
        INFO("mesh " << s[0] << "x" << s[1] << ", ZeRO stage " << zero << (overlap ? ", overlapped" : ""));
        const auto [both, both_state] = run(mesh, zero, overlap, "data,context");
        const auto [one, one_state] = run(mesh, zero, overlap, "data");  // context's sum left to ts::ad
        for (std::size_t i = 0; i < want.size(); ++i) {
          TS_REQUIRE_ALL(compare(both[i], want[i], 1e-12) == "");
          TS_REQUIRE_ALL(compare(one[i], want[i], 1e-12) == "");
        }
        // ZeRO's state is partitioned over both axes: 1/(data x context) of it on each rank,
        // against 1/data with the data axis alone.
        if (zero >= 1 && s[1] > 1) TS_REQUIRE_ALL(both_state < one_state);
        if (zero == 0) TS_REQUIRE_ALL(both_state == one_state);
      }
}

namespace {
// Collectives and bytes of the data-parallel gradient reductions in the stats since the last reset.
std::pair<std::uint64_t, std::uint64_t> gradient_reductions() {
  std::uint64_t calls = 0, bytes = 0;
  for (auto& [name, op] : ts::comm_stats().operators())
    if (name.find("gradient_reduction") != std::string::npos) {
      calls += op.total().calls;
      bytes += op.total().bytes_sent;
    }
  return {calls, bytes};
}
}  // namespace

TEST_CASE("consecutive modules' gradients are reduced together up to bucket_bytes, as soon as all of them are ready",
          "[module]") {
  const auto gx = inputs(11, 12);
  const Eigen::Tensor<double, 2> gy = inputs(11, 12) * 0.5;
  // Each module's own parameters' bytes, in the order opt.add(model) meets them (parents first).
  auto module_bytes = [](Stack& model) {
    std::vector<std::int64_t> bytes;
    model.for_each_module([&](ts::nn::Module& m, const std::string&) {
      if (!m.has_own_parameters()) return;
      std::int64_t b = 0;
      m.for_each_own_slot([&](const std::string&, ts::nn::detail::ParameterSlot& p) { b += p.padded_size() * 8; });
      bytes.push_back(b);
    });
    return bytes;
  };
  // Two micro-batches a step (no_sync on the first): a bucket reports ready in each, and
  // starts only in the second.
  auto run = [&](const M& mesh, int zero, bool overlap, std::int64_t cap) {
    Stack model(mesh);
    ts::nn::AdamW opt({.lr = 0.05, .zero_stage = zero, .overlap = overlap, .bucket_bytes = cap});
    opt.add(model);
    const auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, gx);
    const auto y = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, gy);
    std::uint64_t calls = 0, bytes = 0;
    int reduced_at_step = 0;
    for (int s = 0; s < 2; ++s) {
      opt.zero_grad();
      ts::reset_comm_stats();
      for (int k = 0; k < 2; ++k) {
        opt.no_sync(k == 0);
        ts::ad::backward(model, [&] { return ts::sum<0, 1>(ts::square(model(k == 0 ? x : y))) * 0.01; });
      }
      opt.step();
      std::tie(calls, bytes) = gradient_reductions();
      reduced_at_step = opt.last_reduction().buckets;
    }
    opt.gather_parameters();
    std::vector<Eigen::Tensor<double, 2>> got{model.first.up.weight().gather(), model.second.down.weight().gather()};
    for (const auto& v : {model.norm.gamma().gather(), model.first.scale.gather(), model.second.up.bias().gather()}) {
      Eigen::Tensor<double, 2> flat(v.size(), 1);
      for (Eigen::Index i = 0; i < v.size(); ++i) flat.data()[i] = v.data()[i];
      got.push_back(flat);
    }
    return std::make_tuple(got, calls, bytes, reduced_at_step);
  };
  const M single(MPI_COMM_SELF, {1, 1});
  const auto want = std::get<0>(run(single, 0, false, 0));
  for (const auto& s : mesh_shapes(world_size(), 2)) {
    const M mesh({s[0], s[1]});
    Stack probe(mesh);  // (the sizes of this rank's blocks)
    const auto bytes = module_bytes(probe);
    const std::int64_t one_mlp = bytes[0] + bytes[1] + bytes[2];
    for (int zero : {0, 1, 2, 3})
      for (bool overlap : {false, true})
        for (std::int64_t cap : {std::int64_t(0), one_mlp, std::int64_t(25) << 20}) {
          INFO("mesh " << s[0] << "x" << s[1] << ", ZeRO " << zero << (overlap ? ", overlapped" : "") << ", cap " << cap);
          const auto [got, calls, sent, at_step] = run(mesh, zero, overlap, cap);
          for (std::size_t i = 0; i < want.size(); ++i) TS_REQUIRE_ALL(compare(got[i], want[i], 1e-12) == "");
          if (s[0] == 1) continue;
          // The buckets: consecutive modules while their bytes fit the cap (one each under ZeRO-3).
          int buckets = 0;
          std::int64_t open = -1;
          for (auto b : bytes) {
            if (open >= 0 && zero != 3 && open + b <= cap) {
              open += b;
            } else {
              ++buckets;
              open = b;
            }
          }
          // One collective each (all small: packed), and with overlap every one started during
          // the second micro-batch's backward, none left for step().
          TS_REQUIRE_ALL(calls == std::uint64_t(buckets));
          TS_REQUIRE_ALL(at_step == (overlap ? 0 : buckets));
          if (cap == one_mlp && zero != 3) TS_REQUIRE_ALL(buckets == 3);
          if (cap > one_mlp && zero != 3) TS_REQUIRE_ALL(buckets == 1);
          if (cap == 0) TS_REQUIRE_ALL(buckets == int(bytes.size()));
          // The bytes do not depend on how the gradients are grouped (beyond each all-reduce's
          // rounding of its 2 (p - 1) / p share).
          const auto [g0, calls0, sent0, at0] = run(mesh, zero, overlap, 0);
          TS_REQUIRE_ALL(sent <= sent0 + calls0 && sent0 <= sent + calls0);
        }
      }
}

TEST_CASE("an optimizer keeps updating a layer that moved after opt.add; moved layers keep their parameters",
          "[module]") {
  const M mesh({world_size(), 1});
  using Fc = ts::nn::Linear<double, M, ts::Spec<ts::R, ts::R>>;
  std::vector<Fc> layers;
  layers.emplace_back(mesh, 6, 4, 7);
  ts::nn::SGD opt({.lr = 0.5f});
  opt.add(layers[0]);
  for (int i = 0; i < 8; ++i) layers.emplace_back(mesh, 6, 4, std::uint64_t(8 + i));  // reallocates: moves
  const auto before = Eigen::Tensor<double, 2>(layers[0].weight().gather());
  const auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, inputs(5, 6));
  ts::ad::backward(layers[0], [&] { return ts::sum<0, 1>(layers[0](x)); });
  opt.step();
  const Eigen::Tensor<double, 2> after = layers[0].weight().gather();
  // d sum(x W + b) / dW = column sums of x, the same for every output.
  const auto gx = inputs(5, 6);
  Eigen::Tensor<double, 2> want = before;
  for (int i = 0; i < 6; ++i) {
    double c = 0;
    for (int b = 0; b < 5; ++b) c += gx(b, i);
    for (int o = 0; o < 4; ++o) want(i, o) -= 0.5 * c;
  }
  TS_REQUIRE_ALL(compare(after, want, 1e-12) == "");
  TS_REQUIRE_ALL(layers[0].parameter_names() == std::vector<std::string>{"weight", "bias"});
}

TEST_CASE("registering a parameter, a name or a module twice is an error, not a double update", "[module]") {
  const M mesh({world_size(), 1});
  Mlp mlp(mesh);
  auto refused = [](auto&& f) {
    try {
      f();
    } catch (const ts::SpecError&) {
      return true;
    }
    return false;
  };
  TS_REQUIRE_ALL(refused([&] { mlp.register_module("up", mlp.down); }));           // a name again
  TS_REQUIRE_ALL(refused([&] { mlp.register_module("again", mlp.up); }));          // a module again
  TS_REQUIRE_ALL(refused([&] { mlp.register_parameter("scale", ts::zeros<double, ts::Spec<ts::R>>(mesh, {3})); }));
  ts::nn::AdamW opt({.lr = 1e-3f});
  opt.add(mlp);
  TS_REQUIRE_ALL(refused([&] { opt.add(mlp); }));                                    // the model again
  TS_REQUIRE_ALL(refused([&] { opt.add(mlp.up.weight(), mlp.up.weight_grad()); }));  // one of its tensors
  // A registered parameter assigned anew with another shape or on another mesh than its gradient's:
  // the optimizer refuses it, naming both, instead of updating past the gradient's buffer.
  Mlp other(mesh);
  other.scale = ts::zeros<double, ts::Spec<ts::R>>(mesh, {13});
  ts::nn::AdamW opt2({.lr = 1e-3f});
  std::string said;
  try {
    opt2.add(other);
  } catch (const ts::ShapeError& e) {
    said = e.what();
  }
  TS_REQUIRE_ALL(said.find("does not match the parameter [13] {R}") != std::string::npos);
  Mlp moved(mesh);
  const M elsewhere({world_size(), 1});
  moved.scale = ts::zeros<double, ts::Spec<ts::R>>(elsewhere, {12});
  ts::nn::AdamW opt3({.lr = 1e-3f});
  bool mesh_error = false;
  try {
    opt3.add(moved);
  } catch (const ts::MeshError&) {
    mesh_error = true;
  }
  TS_REQUIRE_ALL(mesh_error);
}

TEST_CASE("parameter groups: decay_matrices_only keeps biases, norms and vectors out of weight decay", "[module]") {
  const M mesh({world_size(), 1});
  Mlp mlp(mesh);
  ts::nn::AdamW opt({.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.5f});
  opt.add(mlp, ts::nn::decay_matrices_only(0.5f));
  const Eigen::Tensor<double, 2> w = mlp.up.weight().gather();
  const Eigen::Tensor<double, 1> b = mlp.up.bias().gather(), s = mlp.scale.gather();
  mlp.zero_grad();  // zero gradients: AdamW's step is the decay alone
  opt.step();
  const Eigen::Tensor<double, 2> w_want = w * (1.0 - double(0.1f) * double(0.5f));
  TS_REQUIRE_ALL(compare(Eigen::Tensor<double, 2>(mlp.up.weight().gather()), w_want, 1e-15) == "");
  TS_REQUIRE_ALL(compare(Eigen::Tensor<double, 1>(mlp.up.bias().gather()), b, 0) == "");
  TS_REQUIRE_ALL(compare(Eigen::Tensor<double, 1>(mlp.scale.gather()), s, 0) == "");
}

TEST_CASE("train and eval reach every submodule; zero_grad clears every gradient", "[module]") {
  const M mesh({world_size(), 1});
  Stack stack(mesh);
  stack.eval();
  bool all_eval = true;
  stack.for_each_module([&](const ts::nn::Module& m, const std::string&) { all_eval = all_eval && !m.is_training(); });
  TS_REQUIRE_ALL(all_eval);
  stack.train();
  TS_REQUIRE_ALL(stack.second.up.is_training());
  const auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, inputs(4, 12));
  ts::ad::backward(stack, [&] { return ts::sum<0, 1>(stack(x)); });
  stack.zero_grad();
  const Eigen::Tensor<double, 0> total = stack.first.up.weight_grad().gather().abs().sum();
  TS_REQUIRE_ALL(total() == 0);
}

TEST_CASE("a transformer block's gradients, experts dropping tokens included, equal the one-rank gradients on every mesh",
          "[module]") {
  Eigen::Tensor<double, 3> gx(3, 5, 8), gw(3, 5, 8);
  for (Eigen::Index i = 0; i < gx.size(); ++i) gx.data()[i] = std::sin(0.3 * double(i)), gw.data()[i] = std::cos(0.7 * double(i));
  using Block = ts::nn::TransformerBlock<double, M>;
  using X = ts::Spec<ts::S<"data">, ts::R, ts::R>;
  for (int experts : {0, 3}) {
    // (A capacity factor under 1 drops tokens: the gate's custom VJP skips them.)
    const ts::nn::BlockOptions o{.dmodel = 8, .heads = 2, .hidden = 12, .dropout = 0.0, .seed = 5, .experts = experts,
                                 .capacity_factor = 0.8, .aux_weight = 0.05};
    struct Result {
      double loss, aux;
      std::int64_t assignments = 0, dropped = 0;
      std::vector<std::vector<double>> grads;
    };
    auto run = [&](const M& mesh) {
      Block block(mesh, o);
      const auto x = ts::distribute<X>(mesh, gx);
      const auto w = ts::distribute<X>(mesh, gw);
      Result r;
      r.loss = ts::ad::backward(block, [&] { return ts::sum<0, 1, 2>(block(x) * w); });
      r.aux = double(block.auxiliary_loss());
      if (experts) r.assignments = block.moe().routing().assignments, r.dropped = block.moe().routing().dropped;
      block.for_each_slot([&](const std::string&, ts::nn::detail::ParameterSlot& slot, const ts::nn::Module&) {
        r.grads.push_back(slot.gradient_state()->values());
      });
      TS_REQUIRE_ALL(block.parameter_names().front() == "ln1.weight");
      if (experts) TS_REQUIRE_ALL(block.parameter_names().back() == "moe.expert_out");
      return r;
    };
    const Result want = run(M(MPI_COMM_SELF, {1, 1}));
    if (experts) REQUIRE(want.dropped > 0);
    for (const auto& s : mesh_shapes(world_size(), 2)) {
      INFO("mesh " << s[0] << "x" << s[1] << ", " << experts << " experts");
      const Result got = run(M({s[0], s[1]}));
      TS_REQUIRE_ALL(std::abs(got.loss - want.loss) <= 1e-12 * std::abs(want.loss) && std::abs(got.aux - want.aux) <= 1e-14);
      TS_REQUIRE_ALL(got.assignments == want.assignments && got.dropped == want.dropped);
      TS_REQUIRE_ALL(got.grads.size() == (experts ? 12u : 13u) && got.grads.size() == want.grads.size());
      for (std::size_t i = 0; i < got.grads.size(); ++i)
        for (std::size_t j = 0; j < got.grads[i].size(); ++j)
          TS_REQUIRE_ALL(std::abs(got.grads[i][j] - want.grads[i][j]) <= 1e-12 * (1 + std::abs(want.grads[i][j])));
    }
  }
}

namespace {
// A layer of a given weight spec and a batch norm (whose running statistics are buffers).
template <class WSpec>
struct Normed : ts::nn::Module {
  ts::nn::Linear<double, M, WSpec> fc;
  ts::nn::BatchNorm<double, M> bn;
  explicit Normed(const M& mesh) : fc(mesh, 12, 7, 4), bn(mesh, 7) {
    register_module("fc", fc);
    register_module("bn", bn);
  }
  auto operator()(const auto& x) { return bn(fc(x)); }
};
using Columns = ts::Spec<ts::R, ts::S<"model">>;
using Rows2 = ts::Spec<ts::S<"model">, ts::R>;
using XRows = ts::Spec<ts::S<"data">, ts::R>;

std::vector<std::vector<double>> state_values(const ts::nn::StateDict& sd) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, t] : sd) out.push_back(t->values());
  return out;
}
// What f throws as an E ("" where it throws none).
template <class E, class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("state_dict names every parameter and buffer; load_state_dict copies by name across specs, strict about names",
          "[module][state]") {
  const auto gx = inputs(9, 12);
  for (const auto& s : mesh_shapes(world_size(), 2)) {
    const M mesh({s[0], s[1]});
    INFO("mesh " << s[0] << "x" << s[1]);
    Normed<Columns> a(mesh);
    const auto x = ts::distribute<XRows>(mesh, gx);
    (void)a(x);  // the running statistics move
    const auto sd = ts::nn::state_dict(a);
    TS_REQUIRE_ALL((sd.names() == std::vector<std::string>{"fc.weight", "fc.bias", "bn.weight", "bn.bias", "bn.running_mean",
                                                           "bn.running_var"}));
    TS_REQUIRE_ALL(a.buffer_names() == (std::vector<std::string>{"bn.running_mean", "bn.running_var"}));
    TS_REQUIRE_ALL(&sd.at("fc.weight").as<ts::ShardedTensor<double, M, Columns>>() == &a.fc.weight());  // the model's own
    bool wrong_type = false;
    try {
      (void)sd.at("fc.weight").as<ts::ShardedTensor<double, M, Rows2>>();
    } catch (const ts::SpecError&) {
      wrong_type = true;
    }
    TS_REQUIRE_ALL(wrong_type);
    // Into a model of other specs (and other initial values): every value by name.
    Normed<Rows2> b(mesh);
    ts::nn::load_state_dict(b, sd);
    TS_REQUIRE_ALL(state_values(ts::nn::state_dict(b)) == state_values(sd));
    TS_REQUIRE_ALL(compare(b(x).gather(), a(x).gather(), 1e-13) == "");
    // Names that do not match: both lists in one error, before anything is copied.
    ts::nn::StateDict partial;
    for (const auto& [name, t] : sd) {
      if (name == "fc.weight") partial.add(name, t);
      if (name == "bn.running_mean") partial.add("extra", t);
    }
    std::string said = thrown<ts::SpecError>([&] { ts::nn::load_state_dict(b, partial); });
    INFO(said);
    TS_REQUIRE_ALL(said.find("missing fc.bias, bn.weight") != std::string::npos && said.find("unexpected extra") != std::string::npos);
    // A tensor of another shape under a right name: the error names the entry.
    ts::nn::StateDict misshapen;
    for (const auto& [name, t] : sd) misshapen.add(name, name == "fc.bias" ? sd.begin()->second : t);
    said = thrown<ts::ShapeError>([&] { ts::nn::load_state_dict(b, misshapen); });
    INFO(said);
    TS_REQUIRE_ALL(said.find("\"fc.bias\": the shapes differ") != std::string::npos);
    // Into a model on another Mesh object of the same axes and ranks: refused, saying why.
    const M twin({s[0], s[1]});
    Normed<Columns> c(twin);
    said = thrown<ts::MeshError>([&] { ts::nn::load_state_dict(c, sd); });
    INFO(said);
    TS_REQUIRE_ALL(said.find("lives on another mesh than") != std::string::npos &&
                   said.find("two Mesh objects constructed separately") != std::string::npos);
  }
}

TEST_CASE("a module saved on one mesh loads on another with other specs: parameters, buffers, bfloat16 exactly",
          "[module][state]") {
  const std::string dir = "tshard_test_module_state";
  const auto gx = inputs(9, 12);
  const M one(MPI_COMM_SELF, {1, 1});
  Normed<Columns> source(one);
  (void)source(ts::distribute<XRows>(one, gx));
  const auto want = state_values(ts::nn::state_dict(source));
  const M world({world_size(), 1});
  {  // written from the world mesh, with the one-rank model's values
    Normed<Columns> w(world);
    const auto from = ts::nn::state_dict(source);
    for (const auto& [name, t] : ts::nn::state_dict(w)) t->set_values(from.at(name).values());
    ts::nn::save(world, dir, w);
  }
  for (const auto& s : mesh_shapes(world_size(), 2)) {
    const M mesh({s[0], s[1]});
    INFO("mesh " << s[0] << "x" << s[1]);
    Normed<Rows2> b(mesh);
    ts::nn::load(mesh, dir, b);
    TS_REQUIRE_ALL(state_values(ts::nn::state_dict(b)) == want);
  }
  // bfloat16 goes through the float32 it widens to: the same bits back.
  struct Half : ts::nn::Module {
    ts::nn::Linear<ts::bfloat16, M, Columns> fc;
    explicit Half(const M& mesh, int seed) : fc(mesh, 5, 6, std::uint64_t(seed)) { register_module("fc", fc); }
  };
  Half h(world, 3), back(world, 4);
  ts::nn::save(world, dir, h);
  ts::nn::load(world, dir, back);
  TS_REQUIRE_ALL(state_values(ts::nn::state_dict(back)) == state_values(ts::nn::state_dict(h)));
  // A model of other sizes: the checkpoint's tensor of another shape is an IoError naming it and both shapes.
  struct Wide : ts::nn::Module {
    ts::nn::Linear<ts::bfloat16, M, Columns> fc;
    explicit Wide(const M& mesh) : fc(mesh, 5, 7, 1) { register_module("fc", fc); }
  } wide(world);
  const std::string said = thrown<ts::IoError>([&] { ts::nn::load(world, dir, wide); });
  INFO(said);
  TS_REQUIRE_ALL(said.find("\"fc.weight\": the checkpoint's tensor is [5, 6], the model's [5, 7]") != std::string::npos);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a run saved with train::save_checkpoint resumes on another mesh and ZeRO stage on the one-rank curve",
          "[module][state]") {
  const std::string dir = "tshard_test_module_resume";
  const auto gx = inputs(10, 12);
  const auto gl = classes(10, 12);
  // Losses of `steps` AdamW steps from `from` (a checkpoint to resume, or none), saving at the end.
  auto run = [&](const M& mesh, int zero, int first, int last, bool resume, bool save) {
    Mlp mlp(mesh);
    ts::nn::AdamW opt({.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1, .zero_stage = zero});
    opt.add(mlp);
    const auto x = ts::distribute<XRows>(mesh, gx);
    const auto labels = ts::distribute<ts::Spec<ts::S<"data">>>(mesh, gl);
    const ts::train::RunSettings settings{{"layers", "1"}};
    if (resume) TS_REQUIRE_ALL(ts::train::load_checkpoint(mesh, dir, mlp, opt, settings) == first);
    std::vector<double> losses;
    for (int step = first; step < last; ++step) {
      opt.zero_grad();
      losses.push_back(ts::ad::backward(mlp, [&] { return ts::nn::cross_entropy(mlp(x), labels); }));
      opt.step();
    }
    if (save) ts::train::save_checkpoint(mesh, dir, mlp, opt, last, settings);
    return losses;
  };
  const auto want = run(M(MPI_COMM_SELF, {1, 1}), 0, 0, 4, false, false);
  const auto shapes = mesh_shapes(world_size(), 2);
  for (int zero : {0, 3}) {
    const auto& a = shapes.front();
    const auto& b = shapes.back();
    INFO("saved on " << a[0] << "x" << a[1] << " ZeRO " << zero << ", resumed on " << b[0] << "x" << b[1] << " ZeRO "
                     << 3 - zero);
    auto got = run(M({a[0], a[1]}), zero, 0, 2, false, true);
    const auto rest = run(M({b[0], b[1]}), 3 - zero, 2, 4, true, false);
    got.insert(got.end(), rest.begin(), rest.end());
    for (std::size_t i = 0; i < want.size(); ++i) TS_REQUIRE_ALL(std::abs(got[i] - want[i]) <= 1e-12 * std::abs(want[i]));
  }
  // Another run's settings are refused by name on every rank.
  Mlp mlp(M({world_size(), 1}));
  ts::nn::AdamW opt({});
  opt.add(mlp);
  std::string said;
  try {
    ts::train::load_checkpoint(M({world_size(), 1}), dir, mlp, opt, {{"layers", "2"}}, "my_program");
  } catch (const ts::IoError& e) {
    said = e.what();
  }
  TS_REQUIRE_ALL(said == "my_program: the checkpoint '" + dir + "' was written with --layers 1, this run has 2");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir), std::filesystem::remove_all(dir + ".tmp");
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("vjp(model, f, x): forwards pending at once add their parameter gradients when their pullbacks run", "[module][vjp]") {
  const auto gx = inputs(11, 12);
  const Eigen::Tensor<double, 2> gx2 = inputs(11, 12) * 0.5;
  const auto gl = classes(11, 12);
  auto run = [&](const M& mesh) {
    Mlp mlp(mesh);
    const auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, gx);
    const auto x2 = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, gx2);
    const auto labels = ts::distribute<ts::Spec<ts::S<"data">>>(mesh, gl);
    // backward over the two losses is the reference.
    const double both = ts::ad::backward(mlp, [&] {
      return ts::nn::cross_entropy(mlp(x), labels) + ts::nn::cross_entropy(mlp(x2), labels) * 0.5;
    });
    auto want = gathered_gradients(mlp);
    mlp.zero_grad();
    // Two forwards recorded before either backward, the second through the input's gradient too.
    auto [l1, pb1] = ts::ad::vjp(mlp, [&](const auto& in) { return ts::nn::cross_entropy(mlp(in), labels); }, x);
    auto [l2, pb2] = ts::ad::vjp(mlp, [&](const auto& in) { return ts::nn::cross_entropy(mlp(in), labels); }, x2);
    TS_REQUIRE_ALL(!ts::detail::tracked(mlp.up.weight()));  // parameters are plain between forwards
    auto [dx2] = pb2(0.5);
    auto [dx1] = pb1();
    TS_REQUIRE_ALL(std::abs(double(l1) + 0.5 * double(l2) - both) <= 1e-13);
    const auto got = gathered_gradients(mlp);
    for (std::size_t i = 0; i < got.size(); ++i) TS_REQUIRE_ALL(compare(got[i], want[i], 1e-12) == "");
    // The input's gradient is value_and_grad's.
    auto [l, dx] = ts::ad::value_and_grad(
        [&](const auto& in) { return ts::nn::cross_entropy(mlp(in), labels) * 0.5; }, x2);
    (void)l;
    TS_REQUIRE_ALL(compare(Eigen::Tensor<double, 2>(dx2.gather()), Eigen::Tensor<double, 2>(dx.gather()), 1e-12) == "");
    return got;
  };
  const M single(MPI_COMM_SELF, {1, 1});
  const auto want = run(single);
  for (const auto& s : mesh_shapes(world_size(), 2)) {
    const M mesh({s[0], s[1]});
    INFO("mesh " << s[0] << "x" << s[1]);
    const auto got = run(mesh);
    for (std::size_t i = 0; i < got.size(); ++i) TS_REQUIRE_ALL(compare(got[i], want[i], 1e-12) == "");
  }
}

namespace {
// Three Linear layers in a chain.
struct Chain : ts::nn::Module {
  ts::nn::Linear<double, M, ts::Spec<ts::R, ts::S<"model">>> a, b, c;
  explicit Chain(const M& mesh) : a(mesh, 6, 6, 1), b(mesh, 6, 6, 2), c(mesh, 6, 6, 3) {
    register_module("a", a);
    register_module("b", b);
    register_module("c", c);
  }
  auto operator()(const auto& x) { return c(ts::nn::gelu(b(ts::nn::gelu(a(x))))); }
};
}  // namespace

TEST_CASE("each module is reported ready as soon as its gradients are final, while the backward still runs", "[module]") {
  // Three Linear layers in a chain: the backward reaches the last one first. Its owner hears of it
  // then (to start reducing, as DDP overlaps), while the first layer's gradient is still zero.
  const M mesh({world_size(), 1});
  Chain chain(mesh);
  std::vector<std::string> order;
  bool first_still_zero_when_last_ready = false;
  auto zero = [](const auto& g) {
    const auto v = g.gather();
    for (Eigen::Index i = 0; i < v.size(); ++i)
      if (v.data()[i] != 0) return false;
    return true;
  };
  chain.a.attach_hooks({.gradients_ready = [&] { order.push_back("a"); }});
  chain.b.attach_hooks({.gradients_ready = [&] { order.push_back("b"); }});
  chain.c.attach_hooks({.gradients_ready = [&] {
    order.push_back("c");
    first_still_zero_when_last_ready = zero(chain.a.weight_grad());
  }});
  const auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, inputs(5, 6));
  ts::ad::backward(chain, [&] { return ts::sum<0, 1>(ts::square(chain(x))); });
  TS_REQUIRE_ALL((order == std::vector<std::string>{"c", "b", "a"}));
  TS_REQUIRE_ALL(first_still_zero_when_last_ready);
  TS_REQUIRE_ALL(!zero(chain.a.weight_grad()));
  // The same through vjp's pullback.
  order.clear();
  chain.zero_grad();
  auto [y, pullback] = ts::ad::vjp(chain, [&](const auto& in) { return ts::sum<0, 1>(ts::square(chain(in))); }, x);
  (void)pullback();
  TS_REQUIRE_ALL((order == std::vector<std::string>{"c", "b", "a"}));
  TS_REQUIRE_ALL(first_still_zero_when_last_ready);
}

TEST_CASE("a model's micro-batch context is its own, set by its owner through its tree: dropout sees rows at their place",
          "[module]") {
  // Dropout masks depend on a row's place in the whole batch: a block told that its input is rows
  // [2, 4) of a batch of 4 drops what the whole batch's forward drops there. Another model in the
  // same process keeps the default context (the whole batch).
  Eigen::Tensor<double, 3> gx(4, 5, 8);
  for (Eigen::Index i = 0; i < gx.size(); ++i) gx.data()[i] = std::sin(0.3 * double(i));
  Eigen::Tensor<double, 3> rows = gx.slice(Eigen::array<Eigen::Index, 3>{2, 0, 0}, Eigen::array<Eigen::Index, 3>{2, 5, 8});
  using Block = ts::nn::TransformerBlock<double, M>;
  const M mesh({world_size(), 1});
  const ts::nn::BlockOptions o{.dmodel = 8, .heads = 2, .hidden = 12, .dropout = 0.3, .seed = 9};
  Block whole(mesh, o), part(mesh, o), other(mesh, o);
  using X = ts::Spec<ts::S<"data">, ts::R, ts::R>;
  const Eigen::Tensor<double, 3> yw = whole(ts::distribute<X>(mesh, gx)).gather();
  part.set_micro_batch({.index = 0, .count = 2, .row_offset = 2, .rows_total = 4});
  TS_REQUIRE_ALL(part.attention().micro_batch().row_offset == 2);  // through the whole tree
  const Eigen::Tensor<double, 3> yp = part(ts::distribute<X>(mesh, rows)).gather();
  const Eigen::Tensor<double, 3> yo = other(ts::distribute<X>(mesh, gx)).gather();
  const Eigen::Tensor<double, 3> want = yw.slice(Eigen::array<Eigen::Index, 3>{2, 0, 0}, Eigen::array<Eigen::Index, 3>{2, 5, 8});
  TS_REQUIRE_ALL(compare(yp, want, 1e-13) == "");
  TS_REQUIRE_ALL(compare(yo, yw, 0) == "");
  TS_REQUIRE_ALL(other.micro_batch().rows_total == 0);
  // Without the context the part's masks are those of a batch of its own 2 rows: different.
  Block alone(mesh, o);
  const Eigen::Tensor<double, 3> ya = alone(ts::distribute<X>(mesh, rows)).gather();
  TS_REQUIRE_ALL(compare(ya, want, 1e-13) != "");
}

namespace {
// Two transformer blocks, each unchecked (mode 0), checkpointed (1) or selectively so (2).
struct Tower : ts::nn::Module {
  using Block = ts::nn::TransformerBlock<double, M>;
  Block a, b;
  int mode;
  Tower(const M& mesh, const ts::nn::BlockOptions& o, int m)
      : a(mesh, o), b(mesh, [&] {
          auto p = o;
          p.seed += 1;
          return p;
        }()), mode(m) {
    register_module("a", a);
    register_module("b", b);
  }
  template <class X>
  X step(Block& block, const X& x) {
    if (mode == 0) return X(block(x));
    if (mode == 1) return X(ts::nn::checkpoint(block, x));
    return X(ts::nn::checkpoint<ts::ad::Recompute::AllButProducts>(block, x));
  }
  auto operator()(const auto& x) { return step(b, step(a, x)); }
};
}  // namespace

TEST_CASE("nn::checkpoint of transformer blocks gives the unchecked gradients, through backward and through pending "
          "pullbacks of micro-batches, with dropout and experts",
          "[module][checkpoint]") {
  Eigen::Tensor<double, 3> gx(4, 5, 8), gw(4, 5, 8);
  for (Eigen::Index i = 0; i < gx.size(); ++i) gx.data()[i] = std::sin(0.3 * double(i)), gw.data()[i] = std::cos(0.7 * double(i));
  using X = ts::Spec<ts::S<"data">, ts::R, ts::R>;
  auto half = [](const Eigen::Tensor<double, 3>& t, Eigen::Index first) {
    return Eigen::Tensor<double, 3>(
        t.slice(Eigen::array<Eigen::Index, 3>{first, 0, 0}, Eigen::array<Eigen::Index, 3>{2, 5, 8}));
  };
  for (int experts : {0, 3})
    for (const auto& s : mesh_shapes(world_size(), 2)) {
      const M mesh({s[0], s[1]});
      const ts::nn::BlockOptions o{.dmodel = 8, .heads = 2, .hidden = 12, .dropout = 0.25, .seed = 5,
                                   .experts = experts, .capacity_factor = 1.5, .aux_weight = 0.05};
      const auto x = ts::distribute<X>(mesh, gx);
      const auto w = ts::distribute<X>(mesh, gw);
      std::vector<std::vector<Eigen::Tensor<double, 1>>> grads(3);
      for (int mode = 0; mode < 3; ++mode) {
        INFO("mesh " << s[0] << "x" << s[1] << ", " << experts << " experts, mode " << mode);
        Tower tower(mesh, o, mode);
        // Two steps of backward over the whole batch (the second step draws new masks) ...
        for (int step = 0; step < 2; ++step) {
          tower.zero_grad();
          const double loss = ts::ad::backward(tower, [&] { return ts::sum<0, 1, 2>(tower(x) * w); });
          TS_REQUIRE_ALL(std::isfinite(loss));
        }
        // ... then two micro-batches recorded before either pullback runs, the second pulled first,
        // with another context set in between: each recomputation uses its own forward's context.
        auto forward = [&](int index) {
          tower.set_micro_batch({.index = index, .count = 2, .row_offset = 2 * index, .rows_total = 4});
          const auto xi = ts::distribute<X>(mesh, half(gx, 2 * index));
          const auto wi = ts::distribute<X>(mesh, half(gw, 2 * index));
          return ts::ad::vjp(tower, [&, wi](const auto& in) { return ts::sum<0, 1, 2>(tower(in) * wi); }, xi);
        };
        auto [l0, pb0] = forward(0);
        auto [l1, pb1] = forward(1);
        tower.set_micro_batch({.index = 0, .count = 1});
        auto [dx1] = pb1();
        auto [dx0] = pb0();
        tower.for_each_slot([&](const std::string&, ts::nn::detail::ParameterSlot& slot, const ts::nn::Module&) {
          const auto v = slot.gradient_state()->values();
          grads[std::size_t(mode)].push_back(Eigen::TensorMap<const Eigen::Tensor<double, 1>>(v.data(), Eigen::Index(v.size())));
        });
        grads[std::size_t(mode)].push_back(Eigen::TensorMap<const Eigen::Tensor<double, 1>>(dx0.gather().data(), 10 * 8));
        (void)l0, (void)l1, (void)dx1;
      }
      for (int mode = 1; mode < 3; ++mode) {
        INFO("mesh " << s[0] << "x" << s[1] << ", " << experts << " experts, mode " << mode);
        TS_REQUIRE_ALL(grads[std::size_t(mode)].size() == grads[0].size());
        for (std::size_t i = 0; i < grads[0].size(); ++i)
          TS_REQUIRE_ALL(compare(grads[std::size_t(mode)][i], grads[0][i], 1e-13) == "");
      }
    }
}

TEST_CASE("ts::scope names a block's collectives, and its backward's under the same path", "[module][scope]") {
  const int p = world_size();
  ts::Mesh<"x"> mesh({p});
  // A softmax over a split dim: its max and sum are all-reduced in the forward, and its backward's
  // sum too, inside the rule (under attention/softmax/backward).
  auto x = ts::random<double, ts::Spec<ts::R, ts::S<"x">>>(mesh, {5, 7}, 1);
  auto w = ts::random<double, ts::Spec<ts::R, ts::S<"x">>>(mesh, {5, 7}, 2);
  ts::reset_comm_stats();
  auto [gx] = ts::ad::grad(
      [&](const auto& xv) {
        auto s = ts::scope("attention");
        return ts::sum<0, 1>(ts::nn::softmax<1>(xv) * w);
      },
      x);
  (void)gx;
  bool forward = false, backward = false;
  for (const auto& [name, stats] : ts::comm_stats().operators()) {
    INFO(name);
    // Nothing escaped the scope, the backward included, but the loss: a partial sum the scope
    // returned, resolved when grad reads it.
    CHECK((name.rfind("attention/", 0) == 0 || name == "gather"));
    CHECK(name.find("backward/backward") == std::string::npos);
    (name.find("/backward") != std::string::npos ? backward : forward) = true;
  }
  if (p > 1) {
    CHECK(forward);
    CHECK(backward);
  }
}

TEST_CASE("public initialisers: PyTorch's default and Kaiming bounds, the same values on every mesh", "[module][init]") {
  const int p = world_size();
  using Spec = ts::Spec<ts::R, ts::S<"model">>;
  const auto one = [&] {
    M mesh(MPI_COMM_SELF, {1, 1});
    return ts::nn::init::pytorch_default<double, Spec>(mesh, {9, 5}, 9, 4).gather();
  }();
  for (auto sizes : mesh_shapes(p, 2)) {
    M mesh({sizes[0], sizes[1]});
    const auto w = ts::nn::init::pytorch_default<double, Spec>(mesh, {9, 5}, 9, 4).gather();
    for (Eigen::Index i = 0; i < 45; ++i) CHECK(w.data()[i] == one.data()[i]);
    const auto k = ts::nn::init::kaiming_uniform<float, Spec>(mesh, {9, 5}, 9, 4).gather();
    const auto u = ts::nn::init::uniform<double, Spec>(mesh, {9, 5}, 4, 0.25).gather();
    for (Eigen::Index i = 0; i < 45; ++i) {
      CHECK(std::abs(one.data()[i]) < 1.0 / 3.0);
      CHECK(std::abs(k.data()[i]) < std::sqrt(6.0f / 9.0f));
      CHECK(std::abs(u.data()[i]) < 0.25);
      CHECK(one.data()[i] == (2 * ts::random_value<double>(4, std::uint64_t(i)) - 1) * (1.0 / std::sqrt(9.0)));
    }
  }
  CHECK(ts::nn::init::default_bound(16) == 0.25);
  CHECK(ts::nn::init::kaiming_bound(6) == 1.0);
  // The host form of ts::random: element i of random() is random_value(seed, i).
  M mesh({1, -1});
  const auto r = ts::random<float, Spec>(mesh, {4, 6}, 11).gather();
  for (Eigen::Index i = 0; i < 24; ++i) CHECK(r.data()[i] == ts::random_value<float>(11, std::uint64_t(i)));
  CHECK(ts::random_bits(11, 3) != ts::random_bits(11, 4));
}

TEST_CASE("train::Flags binds flags to variables and names the program in every error", "[train]") {
  using M3 = ts::Mesh<"data", "stage", "model">;
  auto parse = [](std::vector<std::string> words, long& steps, double& lr, bool& dbl, std::string& sched,
                  ts::train::MeshSizes<M3>& mesh) {
    std::vector<char*> argv{const_cast<char*>("prog")};
    for (auto& w : words) argv.push_back(w.data());
    ts::train::Flags f("prog", int(argv.size()), argv.data());
    f.value("--steps", steps).value("--lr", lr).flag("--double", dbl).choice("--schedule", sched, {"gpipe", "1f1b"})
        .mesh("--mesh", mesh, {"data", "model", "stage"});
    f.parse();
  };
  long steps = 0;
  double lr = 0;
  bool dbl = false;
  std::string sched = "gpipe";
  ts::train::MeshSizes<M3> mesh;
  parse({"--steps", "12", "--lr", "0.5", "--double", "--schedule", "1f1b", "--mesh", "model=2,stage=3"}, steps, lr, dbl,
        sched, mesh);
  CHECK(steps == 12);
  CHECK(lr == 0.5);
  CHECK(dbl);
  CHECK(sched == "1f1b");
  CHECK(mesh.given);
  CHECK(mesh.resolve("prog", 6) == std::array<int, 3>{1, 3, 2});  // axes --mesh leaves out are 1
  CHECK_THROWS_WITH(mesh.resolve("prog", 7), "prog: --mesh data=1,stage=3,model=2 does not match 7 ranks");
  ts::train::MeshSizes<M3> none;
  CHECK(none.resolve("prog", 5) == std::array<int, 3>{5, 1, 1});
  const auto fails = [&](std::vector<std::string> words, const std::string& text) {
    CHECK_THROWS_AS(parse(words, steps, lr, dbl, sched, mesh), ts::train::UsageError);
    CHECK_THROWS_WITH(parse(words, steps, lr, dbl, sched, mesh), text);
  };
  fails({"--nonsense"}, "prog: unknown option --nonsense");
  fails({"--steps"}, "prog: --steps needs a value");
  fails({"--schedule", "zz"}, "prog: --schedule takes gpipe or 1f1b, not 'zz'");
  fails({"--mesh", "bogus=2"}, "prog: --mesh: unknown axis 'bogus' (data, model or stage)");
  fails({"--mesh", "data=0"}, "prog: --mesh: the size of data must be a positive integer, not '0'");
  fails({"--mesh", "data=2x"}, "prog: --mesh: the size of data must be a positive integer, not '2x'");
  fails({"--mesh", "model=2,model=1"}, "prog: --mesh names model twice");
  fails({"--mesh", "data"}, "prog: --mesh takes axis=size items, e.g. data=2,model=2, not 'data'");
  // A number is all of its value: not the prefix atol/atof would read.
  fails({"--steps", "2x"}, "prog: --steps takes an integer, not '2x'");
  fails({"--steps", ""}, "prog: --steps takes an integer, not ''");
  fails({"--steps", "1.5"}, "prog: --steps takes an integer, not '1.5'");
  fails({"--steps", "99999999999999999999"}, "prog: --steps takes an integer in range, not '99999999999999999999'");
  fails({"--lr", "fast"}, "prog: --lr takes a number, not 'fast'");
  fails({"--lr", "1e-3x"}, "prog: --lr takes a number, not '1e-3x'");
  fails({"--lr", "1e400"}, "prog: --lr takes a number, not '1e400'");
  parse({"--steps", "+7", "--lr", "-2.5e-1"}, steps, lr, dbl, sched, mesh);
  CHECK(steps == 7);
  CHECK(lr == -0.25);
  // --help anywhere: the usage, each flag with the value its variable had when bound, and
  // nothing applied.
  steps = 100;
  lr = 0.001;
  sched = "gpipe";
  std::string text;
  try {
    parse({"--steps", "3", "--nonsense", "--help"}, steps, lr, dbl, sched, mesh);
  } catch (const ts::train::HelpRequested& h) {
    text = h.what();
  }
  CHECK(text.rfind("usage: prog [options]\n", 0) == 0);
  for (const char* line : {"  --steps N                       (default 100)\n", "  --lr X                          (default 0.001)\n",
                           "  --double\n", "  --schedule gpipe|1f1b           (default gpipe)\n",
                           "  --mesh data=N,model=N,stage=N   (default every rank on data)\n"}) {
    INFO(line);
    CHECK(text.find(line) != std::string::npos);
  }
  CHECK(steps == 100);
}

TEST_CASE("train: token windows, the reverse task's batches and sampling are the same on every mesh", "[train]") {
  const int p = world_size();
  std::vector<std::int32_t> tokens(230);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = std::int32_t(i % 97);
  const ts::train::TokenWindows w(tokens, 9);
  CHECK(w.training_windows() == 20);  // 230 - 23 held out = 207 tokens, windows of 10
  CHECK(w.held_out_windows() == 2);
  CHECK_THROWS_AS(ts::train::TokenWindows(std::vector<std::int32_t>(99), 9), ts::IoError);
  const ts::train::ReverseTask task{.seed = 3, .vocab = 11, .seq = 6, .batch = 5};
  for (auto sizes : mesh_shapes(p, 2)) {
    M mesh({sizes[0], sizes[1]});
    using Rows = ts::Spec<ts::S<"data">, ts::R>;
    const auto ids = w.batch_ids<Rows>(mesh, 3, 4, 1, 3, 1).gather();  // step 3, batch 4, rows 1..3, shifted by 1
    for (Eigen::Index r = 0; r < 3; ++r)
      for (Eigen::Index t = 0; t < 9; ++t) CHECK(ids(r, t) == tokens[std::size_t(((3 * 4 + 1 + r) % 20) * 10 + t + 1)]);
    const auto held = w.held_out_ids<Rows>(mesh, 1, 1, 0).gather();
    CHECK(held(0, 0) == tokens[207 + 10]);
    const auto in = task.ids<Rows>(mesh, 2, 0, 5, 0).gather(), out = task.ids<Rows>(mesh, 2, 0, 5, 1).gather();
    for (Eigen::Index b = 0; b < 5; ++b) {
      for (Eigen::Index t = 0; t + 1 < 6; ++t) CHECK(out(b, t) == in(b, t + 1));  // targets are the inputs shifted
      CHECK(task.token(2, b, 0) == task.token(2, b, 6));                         // the sequence reads back reversed
    }
  }
  const std::vector<double> logits{0.1, 2.0, -1.0, 1.5, 0.3};
  CHECK(ts::train::pick_token(logits, {.temperature = 0}, 0) == 1);
  for (std::uint64_t d = 0; d < 200; ++d) {
    const auto t = ts::train::pick_token(logits, {.temperature = 1.0, .top_k = 2, .seed = 5}, d);
    CHECK((t == 1 || t == 3));  // only the two largest
  }
}
