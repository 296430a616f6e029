// A small vision transformer, as a new user writes one with tshard's public layers: the program
// scripts/compile_times.sh compiles (against this tree and an older one) to measure what a
// model costs to compile. It also trains: images of noise with a bright square in one of four
// quadrants, the class being the quadrant.
//
//   mpirun -np 4 ./vit --mesh data=2,model=2 --steps 10
#include <tshard/tshard.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace ts = tshard;
using M = ts::Mesh<"data", "model">;
using ts::R;
using ts::S;

template <class T>
struct SelfAttention : ts::nn::Module {  // not causal: every patch sees every patch
  ts::ShardedTensor<T, M, ts::Spec<R, R, S<"model">>>&wq, &wk, &wv;  // [D, Dh, H]: heads over "model"
  ts::ShardedTensor<T, M, ts::Spec<R, S<"model">, R>>& wo;          // [Dh, H, D]
  SelfAttention(const M& mesh, Eigen::Index d, Eigen::Index heads, std::uint64_t seed)
      : wq(register_parameter("wq", init<ts::Spec<R, R, S<"model">>>(mesh, {d, d / heads, heads}, seed))),
        wk(register_parameter("wk", init<ts::Spec<R, R, S<"model">>>(mesh, {d, d / heads, heads}, seed + 1))),
        wv(register_parameter("wv", init<ts::Spec<R, R, S<"model">>>(mesh, {d, d / heads, heads}, seed + 2))),
        wo(register_parameter("wo", init<ts::Spec<R, S<"model">, R>>(mesh, {d / heads, heads, d}, seed + 3))) {}
  template <class Spec>
  static auto init(const M& mesh, const Eigen::Index (&shape)[3], std::uint64_t seed) {
    const T bound = T(1) / T(std::sqrt(double(shape[0])));  // 1 / sqrt(fan_in)
    return ts::random<T, Spec>(mesh, shape, seed) * (2 * bound) - bound;
  }
  auto operator()(const auto& x) {  // x [B, P, D]
    auto q = ts::einsum<"bpd,dkh->bhpk">(x, wq);
    auto k = ts::einsum<"bpd,dkh->bhpk">(x, wk);
    auto v = ts::einsum<"bpd,dkh->bhpk">(x, wv);
    const T scale = T(1) / T(std::sqrt(double(wq.global_shape()[1])));
    auto p = ts::nn::softmax<3>(ts::einsum<"bhpk,bhqk->bhpq">(q, k) * scale);
    return ts::einsum<"bhpk,khd->bpd">(ts::einsum<"bhpq,bhqk->bhpk">(p, v), wo);
  }
};

template <class T>
struct Block : ts::nn::Module {
  ts::nn::LayerNorm<T, M> ln1, ln2;
  SelfAttention<T> attn;
  ts::nn::MLP<T, M> mlp;  // hidden dim over "model"
  Block(const M& mesh, Eigen::Index d, Eigen::Index heads, std::uint64_t seed)
      : ln1(mesh, d), ln2(mesh, d), attn(mesh, d, heads, seed), mlp(mesh, d, 4 * d, seed + 10) {
    register_module("ln1", ln1);
    register_module("attn", attn);
    register_module("ln2", ln2);
    register_module("mlp", mlp);
  }
  auto operator()(const auto& x) {
    auto h = x + attn(ln1(x));
    return h + mlp(ln2(h));
  }
};

template <class T>
struct ViT : ts::nn::Module {
  using Image = ts::Spec<S<"data">, R, R, R>;  // [B, C, H, W]: batch over "data"
  ts::ShardedTensor<T, M, ts::Spec<R, R, R, R>>& patch;  // [D, C, p, p]: a convolution of stride p
  ts::ShardedTensor<T, M, ts::Spec<R, R>>& position;    // [P, D]
  std::vector<Block<T>> blocks;
  ts::nn::LayerNorm<T, M> ln;
  ts::nn::Linear<T, M, ts::Spec<R, R>> head;
  Eigen::Index p_;
  ViT(const M& mesh, Eigen::Index channels, Eigen::Index size, Eigen::Index p, Eigen::Index d, Eigen::Index heads, int layers,
      Eigen::Index classes)
      : patch(register_parameter("patch", ts::random<T, ts::Spec<R, R, R, R>>(mesh, {d, channels, p, p}, 1) * T(0.2) - T(0.1))),
        position(register_parameter("position", ts::random<T, ts::Spec<R, R>>(mesh, {(size / p) * (size / p), d}, 2) * T(0.02))),
        ln(mesh, d), head(mesh, d, classes, 3), p_(p) {
    blocks.reserve(std::size_t(layers));
    for (int l = 0; l < layers; ++l) register_module("block" + std::to_string(l), blocks.emplace_back(mesh, d, heads, 100 + 20 * l));
    register_module("ln", ln);
    register_module("head", head);
  }
  auto operator()(const ts::ShardedTensor<T, M, Image>& images) {  // -> logits [B, classes]
    auto f = ts::nn::conv2d(images, patch, ts::nn::Conv{.stride = p_, .padding = ts::Padding::Valid});  // [B, D, h, w]
    const auto s = f.global_shape();
    auto x = ts::reshard<ts::Spec<S<"data">, R, R>>(ts::transpose<0, 2, 1>(ts::reshape<ts::Spec<S<"data">, R, R>>(f, {s[0], s[1], s[2] * s[3]})) + position);
    for (auto& b : blocks) x = b(x);
    return head(ts::mean<1>(ln(x)));
  }
};

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  int steps = 10, data = -1, model = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--steps") steps = std::atoi(v.c_str());
    if (a == "--mesh" && v.find("model=") != std::string::npos) model = std::atoi(v.c_str() + v.find("model=") + 6);
    if (a == "--mesh" && v.find("data=") != std::string::npos) data = std::atoi(v.c_str() + v.find("data=") + 5);
  }
  const M mesh({data, model});
  const Eigen::Index batch = 8, size = 16, p = 4, classes = 4;
  ViT<double> vit(mesh, 3, size, p, 32, 4, 2, classes);
  ts::nn::AdamW opt({.lr = 1e-3f});
  opt.add(vit);
  for (int step = 0; step < steps; ++step) {
    auto label = [&](Eigen::Index b) { return std::int32_t((b * 7 + step * 3) % classes); };
    auto images = ts::from_function<double, ViT<double>::Image>(mesh, {batch, 3, size, size}, [&](auto i) {
      const auto q = label(i[0]);
      const bool lit = (i[2] < size / 2) == (q / 2 == 0) && (i[3] < size / 2) == (q % 2 == 0);
      return (lit ? 1.0 : 0.0) + 0.3 * std::sin(double(i[0] * 131 + i[1] * 31 + i[2] * 17 + i[3] * 7 + step));
    });
    auto labels = ts::from_function<std::int32_t, ts::Spec<S<"data">>>(mesh, {batch}, [&](auto i) { return label(i[0]); });
    opt.zero_grad();
    const double loss = ts::ad::backward(vit, [&] { return ts::nn::cross_entropy(vit(images), labels); });
    opt.step();
    if (mesh.rank() == 0) std::printf("step %d loss %.17g\n", step, loss);
  }
}
