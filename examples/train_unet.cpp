// A small 2-D U-Net trained on images split over space: each image's H over "h" and W over "w",
// the batch over "data" (GSPMD's spatial partitioning with halo exchange; the cross-replica batch
// norm of the MLPerf TPU work). Written forward only with modules: convolutions, batch norm,
// ReLU, two max-poolings, two upsamplings with skip connections (channel concatenation), a 1x1
// convolution to two classes and a per-pixel cross-entropy; the gradients are derived.
//
//   mpirun -np 6 ./train_unet --mesh h=2,w=3 --size 37 --width 29 --steps 10 --double
//   mpirun -np 4 ./train_unet --mesh data=2,h=2 --batch 5 --steps 10 --double --check   # = one rank
//
// The task depends only on the seed: each image holds random discs and rectangles (class 1)
// on a background (class 0), drawn in 3 channels with noise; the model labels every pixel.
// Options: --mesh data=D,h=A,w=B (a missing axis has size 1), --steps, --seed, --double,
// --batch, --size S (images S x S), --width S2 (S x S2 when given), --channels C (the first
// level's width; 2C and 4C below), --depth L (convolutions per level), --lr, --check.
// Output: "step <n> loss <%.17g>" per step, then the halo bytes per step (measured, all ranks)
// next to the count the window geometry gives, and the time per step.
#include <tshard/tshard.hpp>
#include <tshard/train/flags.hpp>
#include <tshard/train/report.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace ts = tshard;
using M = ts::Mesh<"data", "h", "w">;
using Index = Eigen::Index;
using ts::R;
using ts::S;
using Image = ts::Spec<S<"data">, R, S<"h">, S<"w">>;  // NCHW: batch over data, space over h and w
using Weights = ts::Spec<R, R, R, R>;

struct Options {
  ts::train::MeshSizes<M> mesh;  // without --mesh, every rank on data; with it, a missing axis is 1
  int steps = 10, depth = 1;
  long seed = 1;
  Index batch = 4, size = 32, width = 0, channels = 4;
  double lr = 3e-3;
  bool use_double = false, check = false;
};

// ---- the model ----

template <class T>
struct ConvBnRelu : ts::nn::Module {  // 3x3 convolution, batch norm, ReLU
  ts::ShardedTensor<T, M, Weights>& weight;
  ts::nn::BatchNorm<T, M> bn;
  ConvBnRelu(const M& mesh, Index in, Index out, std::uint64_t seed)
      : weight(register_parameter("weight", kaiming(mesh, out, in, 3, seed))), bn(mesh, out) {
    register_module("bn", bn);
  }
  static ts::ShardedTensor<T, M, Weights> kaiming(const M& mesh, Index out, Index in, Index k, std::uint64_t seed) {
    const T bound = T(std::sqrt(6.0 / double(in * k * k)));
    return ts::random<T, Weights>(mesh, {out, in, k, k}, seed) * (2 * bound) - bound;
  }
  template <class X>
  auto operator()(const X& x) {
    return ts::reshard<Image>(ts::relu(bn(ts::nn::conv2d(x, weight, ts::nn::Conv{.stride = 1, .padding = ts::Padding::Same}))));
  }
};

template <class T>
struct Level : ts::nn::Module {  // `depth` ConvBnRelu
  std::vector<std::unique_ptr<ConvBnRelu<T>>> convs;
  Level(const M& mesh, Index in, Index out, int depth, std::uint64_t seed) {
    for (int i = 0; i < depth; ++i)
      register_module(std::to_string(i), *convs.emplace_back(std::make_unique<ConvBnRelu<T>>(mesh, i ? out : in, out, seed + i)));
  }
  template <class X>
  auto operator()(const X& x) {
    ts::ShardedTensor<T, M, Image> y = ts::reshard<Image>(x);
    for (auto& c : convs) y = (*c)(y);
    return y;
  }
};

template <class T>
struct UNet : ts::nn::Module {
  Level<T> down0, down1, bottom, up1, up0;
  ts::ShardedTensor<T, M, Weights>& head;  // 1x1 convolution to two classes
  UNet(const M& mesh, Index c, int depth, std::uint64_t seed)
      : down0(mesh, 3, c, depth, seed + 10), down1(mesh, c, 2 * c, depth, seed + 20), bottom(mesh, 2 * c, 4 * c, depth, seed + 30),
        up1(mesh, 6 * c, 2 * c, depth, seed + 40), up0(mesh, 3 * c, c, depth, seed + 50),
        head(register_parameter("head", ConvBnRelu<T>::kaiming(mesh, 2, c, 1, seed + 60))) {
    register_module("down0", down0);
    register_module("down1", down1);
    register_module("bottom", bottom);
    register_module("up1", up1);
    register_module("up0", up0);
  }
  // x upsampled by 2 and padded with zeros at the end to `like`'s H and W (odd sizes), then
  // joined to it along the channels: the skip connection.
  template <class X, class L>
  static auto skip(const X& x, const L& like) {
    auto u = ts::nn::upsample2d(x, 2);
    const auto a = u.global_shape(), b = like.global_shape();
    return ts::concat<1>(like, ts::reshard<Image>(ts::pad(u, {0, 0, 0, 0}, {0, 0, b[2] - a[2], b[3] - a[3]})));
  }
  template <class X>
  auto operator()(const X& x) {  // x [N, 3, H, W] -> logits [N, 2, H, W]
    auto s0 = down0(x);
    auto s1 = down1(ts::nn::max_pool2d(s0, 2));
    auto b = bottom(ts::nn::max_pool2d(s1, 2));
    auto u1 = up1(skip(b, s1));
    auto u0 = up0(skip(u1, s0));
    return ts::nn::conv2d(u0, head, ts::nn::Conv{.stride = 1, .padding = ts::Padding::Valid});
  }
};

// ---- the task: discs and rectangles ----

// The uniform value in [0, 1) of (seed, index), as ts::random draws element `index`.
double uniform(std::uint64_t seed, std::uint64_t i) { return ts::random_value<double>(seed, i); }

struct Shape {
  bool disc;
  double cy, cx, ry, rx;
};
std::vector<Shape> shapes_of(const Options& o, long step, Index n, Index H, Index W) {
  std::vector<Shape> out;
  auto u = [&](std::uint64_t k) {
    return uniform(std::uint64_t(o.seed) * 131 + 7, (std::uint64_t(step) * 4096 + std::uint64_t(n)) * 64 + k);
  };
  const int count = 1 + int(u(0) * 3);
  for (int i = 0; i < count; ++i)
    out.push_back({u(8 * i + 1) < 0.5, u(8 * i + 2) * double(H), u(8 * i + 3) * double(W), 2 + u(8 * i + 4) * double(H) / 4,
                   2 + u(8 * i + 5) * double(W) / 4});
  return out;
}
bool inside(const std::vector<Shape>& shapes, Index y, Index x) {
  for (const auto& s : shapes) {
    const double dy = (double(y) - s.cy) / s.ry, dx = (double(x) - s.cx) / s.rx;
    if (s.disc ? dy * dy + dx * dx <= 1 : std::abs(dy) <= 1 && std::abs(dx) <= 1) return true;
  }
  return false;
}

// ---- training ----

template <class T>
std::vector<double> train(const M& mesh, const Options& o, bool print, double* halo_bytes, double* seconds = nullptr) {
  const Index H = o.size, W = o.width > 0 ? o.width : o.size;
  UNet<T> net(mesh, o.channels, o.depth, std::uint64_t(o.seed) * 1000);
  ts::nn::AdamW opt({.lr = o.lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0});
  opt.add(net);
  std::vector<double> losses;
  ts::reset_comm_stats();
  double timed = 0;
  for (int step = 0; step < o.steps; ++step) {
    const auto t0 = ts::train::synchronized_now(mesh);
    std::vector<std::vector<Shape>> shapes;
    for (Index n = 0; n < o.batch; ++n) shapes.push_back(shapes_of(o, step, n, H, W));
    auto noise = [&](Index n, Index c, Index y, Index x) {
      const std::uint64_t i = ((std::uint64_t(step) * 4096 + std::uint64_t(n)) * 4 + std::uint64_t(c)) * 1048576 + std::uint64_t(y * W + x);
      return uniform(std::uint64_t(o.seed) * 977 + 3, i) - 0.5;
    };
    auto image = ts::from_function<T, Image>(mesh, {o.batch, 3, H, W}, [&](const auto& i) {
      const bool in = inside(shapes[std::size_t(i[0])], i[2], i[3]);
      return T((in ? 0.6 + 0.2 * double(i[1]) : -0.3) + 0.5 * noise(i[0], i[1], i[2], i[3]));
    });
    auto labels = ts::from_function<std::int32_t, ts::Spec<S<"data">, S<"h">, S<"w">>>(
        mesh, {o.batch, H, W}, [&](const auto& i) { return std::int32_t(inside(shapes[std::size_t(i[0])], i[1], i[2])); });
    opt.zero_grad();
    const double loss = ts::ad::backward(net, [&] {
      return ts::nn::cross_entropy(ts::transpose<0, 2, 3, 1>(net(image)), labels);  // classes last
    });
    opt.step();
    if (step > 0 || o.steps == 1) timed += ts::train::seconds_since(t0);
    losses.push_back(loss);
    if (print && mesh.rank() == 0) std::printf("step %d loss %.17g\n", step, loss), std::fflush(stdout);
  }
  double mine = 0;
  for (const auto& [name, op] : ts::comm_stats().operators())
    for (const auto& [kind, c] : op.collectives)
      if (kind == "halo") mine += double(c.bytes_sent);
  *halo_bytes = ts::all_reduce(mesh, mine) / std::max(1, o.steps);
  if (seconds) *seconds = timed / std::max(1, o.steps - 1);
  return losses;
}

// The halo bytes of one step by the window geometry: every windowed operator's input window per
// rank (its output block widened by the kernel, clipped to the image) less what the rank holds,
// over all ranks; once forward and once back (the transpose sends what was received).
double analytic_halo_bytes(const M& mesh, const Options& o, std::size_t element) {
  const Index H = o.size, W = o.width > 0 ? o.width : o.size, c = o.channels;
  const int ph = mesh.size<"h">(), pw = mesh.size<"w">(), pd = mesh.size<"data">();
  auto shard = [](Index n, int parts, int i, Index& lo, Index& len) {
    const Index chunk = (n + parts - 1) / parts;
    lo = std::min(n, i * chunk);
    len = std::clamp<Index>(n - i * chunk, 0, chunk);
  };
  // One op: input H x W with C channels, output Ho x Wo, output row i reads input rows
  // [first(i), first(i) + reach), as a function of the output index.
  double total = 0;
  auto op = [&](Index Hi, Index Wi, Index C, Index Ho, Index Wo, auto first, Index reach) {
    for (int d = 0; d < pd; ++d) {
      Index n0, nn;
      shard(o.batch, pd, d, n0, nn);
      for (int a = 0; a < ph; ++a)
        for (int b = 0; b < pw; ++b) {
          Index oh0, ohn, ow0, own, ih0, ihn, iw0, iwn;
          shard(Ho, ph, a, oh0, ohn);
          shard(Wo, pw, b, ow0, own);
          shard(Hi, ph, a, ih0, ihn);
          shard(Wi, pw, b, iw0, iwn);
          if (nn == 0 || ohn == 0 || own == 0) continue;
          auto span = [](Index lo, Index hi, Index n, Index own_lo, Index own_len, Index& all, Index& mine) {
            lo = std::max<Index>(lo, 0);
            hi = std::min(hi, n);
            all = std::max<Index>(hi - lo, 0);
            mine = std::max<Index>(std::min(hi, own_lo + own_len) - std::max(lo, own_lo), 0);
          };
          Index hall, hmine, wall, wmine;
          span(first(oh0), first(oh0 + ohn - 1) + reach, Hi, ih0, ihn, hall, hmine);
          span(first(ow0), first(ow0 + own - 1) + reach, Wi, iw0, iwn, wall, wmine);
          total += double(nn * C) * double(hall * wall - hmine * wmine) * double(element);
        }
    }
  };
  auto conv = [&](Index Hi, Index Wi, Index C, Index k) {
    const Index p = (k - 1) / 2;
    op(Hi, Wi, C, Hi, Wi, [p](Index i) { return i - p; }, k);
  };
  auto level = [&](Index Hi, Index Wi, Index in, Index out) {
    for (int i = 0; i < o.depth; ++i) conv(Hi, Wi, i ? out : in, 3);
  };
  auto pool = [&](Index Hi, Index Wi, Index C) { op(Hi, Wi, C, (Hi - 2) / 2 + 1, (Wi - 2) / 2 + 1, [](Index i) { return 2 * i; }, 2); };
  auto up = [&](Index Hi, Index Wi, Index C) { op(Hi, Wi, C, 2 * Hi, 2 * Wi, [](Index i) { return i / 2; }, 1); };
  const Index H1 = (H - 2) / 2 + 1, W1 = (W - 2) / 2 + 1, H2 = (H1 - 2) / 2 + 1, W2 = (W1 - 2) / 2 + 1;
  level(H, W, 3, c);
  pool(H, W, c);
  level(H1, W1, c, 2 * c);
  pool(H1, W1, 2 * c);
  level(H2, W2, 2 * c, 4 * c);
  up(H2, W2, 4 * c);
  level(H1, W1, 6 * c, 2 * c);
  up(H1, W1, 2 * c);
  level(H, W, 3 * c, c);
  conv(H, W, c, 1);
  return 2 * total;
}

template <class T>
int run(const M& mesh, const Options& o) {
  double halo = 0, seconds = 0;
  const auto losses = train<T>(mesh, o, true, &halo, &seconds);
  const double analytic = analytic_halo_bytes(mesh, o, sizeof(T));
  bool ok = true;
  double worst = 0;
  if (o.check) {
    double unused = 0;
    const auto one = train<T>(M(MPI_COMM_SELF, {1, 1, 1}), o, false, &unused);
    worst = ts::train::largest_relative_difference(losses, one);
    ok = worst < (sizeof(T) == 8 ? 1e-9 : 1e-4);
  }
  ok = ts::agree(ok);
  if (mesh.rank() == 0) {
    std::printf("halo bytes per step over all ranks: %.0f measured, %.0f by the window geometry\n", halo, analytic);
    std::printf("mesh {data, h, w} = {%d, %d, %d}, %s: %.1f ms per step, %.1f images/s\n", mesh.size<"data">(), mesh.size<"h">(),
                mesh.size<"w">(), sizeof(T) == 8 ? "double" : "float", 1e3 * seconds, double(o.batch) / std::max(seconds, 1e-12));
    if (o.check) std::printf("largest relative difference from the single-rank curve %.2e%s\n", worst, ok ? "" : " (FAILED)");
  }
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Options o;
  try {  // every rank parses the same line: all report and leave
    ts::train::Flags("train_unet", argc, argv)
        .mesh<M>("--mesh", o.mesh).value("--steps", o.steps).value("--seed", o.seed).flag("--double", o.use_double)
        .value("--batch", o.batch).value("--size", o.size).value("--width", o.width).value("--channels", o.channels)
        .value("--depth", o.depth).value("--lr", o.lr).flag("--check", o.check)
        .parse();
  } catch (const ts::train::UsageError& e) {
    return ts::train::Flags::report(e);
  }
  const int p = ts::Environment::world_size();
  std::array<int, 3> sizes = o.mesh.sizes;
  if (!o.mesh.given) sizes[0] = p;
  if (sizes[0] * sizes[1] * sizes[2] != p || o.batch < 1 || o.size < 4 || o.width < 0 || (o.width > 0 && o.width < 4) ||
      o.channels < 1 || o.depth < 1 || o.steps < 0) {
    if (ts::Environment::world_rank() == 0)
      std::fprintf(stderr, "train_unet: --mesh data=%d,h=%d,w=%d must use all %d ranks, and sizes be positive (images at least 4 x 4)\n",
                   sizes[0], sizes[1], sizes[2], p);
    return 2;
  }
  const M mesh({sizes[0], sizes[1], sizes[2]});
  if (mesh.rank() == 0) std::printf("%s\n", ts::kernels_report().c_str());  // which kernels run
  ts::flush_denormals();
  return o.use_double ? run<double>(mesh, o) : run<float>(mesh, o);
}
