// A differential fuzzer through the typed API: random chains of operators on random specs,
// shapes (0, 1, primes, dims smaller than the mesh axis) and meshes, every step compared with the
// same operation on serial Eigen tensors. The value a chain carries is one of the rank-2 specs
// below, chosen at run time; partial results (sums over a split dim, contractions, take) meet
// scalars on both sides before they are stored.
//
//   mpirun -np 4 ./tshard_differential [--chains N] [--seed S] [--first I] [--length L] [--verbose]
//
// Every rank draws the same choices from (seed, chain index). A failure prints the chain's steps
// and the command that replays it alone; the exit status is the number of failed chains (max 100).
//
// --grad differentiates each chain (without its "fresh value" step) as a function of its start
// tensor, under ts::ad::value_and_grad, of the loss <chain(w), D> for a random D. The gradient
// must equal (1) the one-rank gradient of the same chain (MPI_COMM_SELF) to 1e-10, and (2) the
// central differences along a random direction (at h and h / 2, extrapolated) to 1e-6. Where the chain replayed at w +- h v takes
// another decision (a division avoided, a taming step) or its one-sided differences disagree (a
// kink of abs, relu, max or where within h), the finite-difference check of that chain is skipped
// and counted; the one-rank check never is.
#include <tshard/tshard.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

namespace ts = tshard;

namespace {

using M2 = ts::Mesh<"x", "y">;
using E2 = Eigen::Tensor<double, 2>;
using ts::R;
template <ts::FixedString... A>
using S = ts::S<A...>;
template <class... D>
using Spec = ts::Spec<D...>;

template <class... T>
struct List {};
// The specs a chain's value moves through, and the (fewer) specs of second operands: each pair
// is instantiated once per operator.
using Specs = List<Spec<R, R>, Spec<S<"x">, R>, Spec<R, S<"x">>, Spec<S<"y">, R>, Spec<R, S<"y">>, Spec<S<"x">, S<"y">>,
                   Spec<S<"y">, S<"x">>, Spec<S<"x", "y">, R>, Spec<R, S<"y", "x">>>;
using OtherSpecs = List<Spec<R, R>, Spec<S<"x">, R>, Spec<R, S<"y">>, Spec<S<"y">, S<"x">>>;
using IdSpecs = List<Spec<R>, Spec<S<"x">>, Spec<S<"y">>>;

template <class L>
struct ValueOf;
template <class... Sp>
struct ValueOf<List<Sp...>> {
  using type = std::variant<ts::ShardedTensor<double, M2, Sp>...>;
  template <class X>
  static constexpr bool holds = (std::is_same_v<X, ts::ShardedTensor<double, M2, Sp>> || ...);
};
using Value = ValueOf<Specs>::type;

template <class... Sp>
constexpr int size_of(List<Sp...>) {
  return int(sizeof...(Sp));
}
// f((Spec*)nullptr) for the i-th spec of the list.
template <class... Sp, class F>
void with_spec(List<Sp...>, int i, F&& f) {
  int k = 0;
  ((k++ == i ? (f(static_cast<Sp*>(nullptr)), 0) : 0), ...);
}

// The chain's random choices: the same sequence on every rank.
struct Draw {
  std::mt19937_64 rng;
  int below(int n) { return n <= 1 ? 0 : int(rng() % std::uint64_t(n)); }
  bool chance(int percent) { return below(100) < percent; }
  double real(double lo, double hi) { return lo + (hi - lo) * double(rng() >> 11) * (1.0 / 9007199254740992.0); }
  Eigen::Index extent() {  // 0, 1, primes, small and a little larger
    static const Eigen::Index choices[] = {0, 1, 1, 2, 3, 3, 4, 5, 5, 6, 7, 7, 8, 11, 13, 17};
    const Eigen::Index e = choices[below(int(std::size(choices)))];
    return e == 0 && !chance(30) ? 2 : e;  // empty tensors, but not too often
  }
  Eigen::Index positive_extent() {
    const Eigen::Index e = extent();
    return e == 0 ? 1 : e;
  }
  E2 tensor(Eigen::Index rows, Eigen::Index cols) {
    E2 t(rows, cols);
    for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = real(-2, 2);
    return t;
  }
};

// A value stored in the chain: as it is when its type is one of the chain's specs, else
// resolved into a replicated tensor.
template <class X>
Value store(X&& x) {
  using D = std::remove_cvref_t<X>;
  if constexpr (ValueOf<Specs>::holds<D>) {
    Value v(std::in_place_type<D>, std::forward<X>(x));
    return v;
  } else {
    return Value(ts::reshard<Spec<R, R>>(x));
  }
}

Value distribute_as(int spec, const M2& mesh, const E2& t) {
  std::optional<Value> v;  // (tensors have no default value)
  with_spec(Specs{}, spec, [&]<class Sp>(Sp*) { v.emplace(ts::distribute<Sp>(mesh, t)); });
  return std::move(*v);
}

std::string spec_name(int spec, const M2& mesh) {
  std::string s;
  with_spec(Specs{}, spec, [&]<class Sp>(Sp*) {
    s = ts::ShardedTensor<double, M2, Sp>::spec_desc.to_string(tshard::detail::state_of(mesh)->shape());
  });
  return s;
}

// ---- serial references ----
template <class F>
E2 map(const E2& a, F&& f) {
  E2 out(a.dimensions());
  for (Eigen::Index i = 0; i < a.size(); ++i) out.data()[i] = f(a.data()[i]);
  return out;
}
// a op b with numpy broadcasting of extent-1 dims.
template <class F>
E2 broadcast(const E2& a, const E2& b, F&& f) {
  auto both = [](Eigen::Index x, Eigen::Index y) { return x == 1 ? y : x; };  // numpy: 1 stretches, 0 stays
  const Eigen::Index r = both(a.dimension(0), b.dimension(0)), c = both(a.dimension(1), b.dimension(1));
  E2 out(r, c);
  for (Eigen::Index j = 0; j < c; ++j)
    for (Eigen::Index i = 0; i < r; ++i)
      out(i, j) = f(a(a.dimension(0) == 1 ? 0 : i, a.dimension(1) == 1 ? 0 : j), b(b.dimension(0) == 1 ? 0 : i, b.dimension(1) == 1 ? 0 : j));
  return out;
}
// kind 0 sum, 1 max, 2 min, 3 mean over dim d, kept at extent 1.
E2 reduce(const E2& a, int kind, int d) {
  E2 out(d == 0 ? 1 : a.dimension(0), d == 1 ? 1 : a.dimension(1));
  for (Eigen::Index k = 0; k < out.size(); ++k) {
    const Eigen::Index i0 = d == 0 ? 0 : k % out.dimension(0), j0 = d == 1 ? 0 : k / out.dimension(0);
    const Eigen::Index n = a.dimension(d);
    double acc = kind == 1 ? -INFINITY : kind == 2 ? INFINITY : 0.0;
    for (Eigen::Index t = 0; t < n; ++t) {
      const double v = d == 0 ? a(t, j0) : a(i0, t);
      acc = kind == 1 ? std::max(acc, v) : kind == 2 ? std::min(acc, v) : acc + v;
    }
    out(i0, j0) = kind == 3 ? acc / double(n) : acc;
  }
  return out;
}
E2 product(const E2& a, const E2& b, bool ta, bool tb) {
  const Eigen::Index n = ta ? a.dimension(1) : a.dimension(0), k = ta ? a.dimension(0) : a.dimension(1);
  const Eigen::Index m = tb ? b.dimension(0) : b.dimension(1);
  E2 out(n, m);
  out.setZero();
  for (Eigen::Index i = 0; i < n; ++i)
    for (Eigen::Index j = 0; j < m; ++j)
      for (Eigen::Index q = 0; q < k; ++q) out(i, j) += (ta ? a(q, i) : a(i, q)) * (tb ? b(j, q) : b(q, j));
  return out;
}
double gelu(double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }

// Scalars with a tensor, both sides; kinds 0-9. Division is by a tensor only when no element is
// near zero (the choice is made from the serial values, the same on every rank).
constexpr int kScalarKinds = 10;
const char* const kScalarNames[kScalarKinds] = {"x + c", "c + x", "x - c", "c - x", "x * c", "c * x", "x / c", "c / x", "-x", "x"};
template <class X>
Value with_scalar(const X& x, int kind, double c) {
  switch (kind) {
    case 0: return store(x + c);
    case 1: return store(c + x);
    case 2: return store(x - c);
    case 3: return store(c - x);
    case 4: return store(x * c);
    case 5: return store(c * x);
    case 6: return store(x / c);
    case 7: return store(c / x);
    case 8: return store(-x);
    default: return store(x);
  }
}
E2 with_scalar(const E2& x, int kind, double c) {
  switch (kind) {
    case 0: case 1: return map(x, [&](double v) { return v + c; });
    case 2: return map(x, [&](double v) { return v - c; });
    case 3: return map(x, [&](double v) { return c - v; });
    case 4: case 5: return map(x, [&](double v) { return v * c; });
    case 6: return map(x, [&](double v) { return v / c; });
    case 7: return map(x, [&](double v) { return c / v; });
    case 8: return map(x, [](double v) { return -v; });
    default: return x;
  }
}
int scalar_kind(Draw& draw, const E2& x) {
  int kind = draw.below(kScalarKinds);
  if (kind == 7)
    for (Eigen::Index i = 0; i < x.size(); ++i)
      if (std::abs(x.data()[i]) < 1e-3) return 5;
  return kind;
}

struct Chain {
  const M2& mesh;
  Draw& draw;
  E2 serial;
  std::optional<Value> value;
  std::vector<std::string> steps;

  void note(const std::string& s) { steps.push_back(s); }

  template <class F>
  void visit(F&& f) {
    Value next = std::visit([&](const auto& x) { return f(x); }, *value);
    value = std::move(next);
  }
  // A second operand of the given shape with a spec of OtherSpecs; f(y) with it.
  template <class F>
  void with_other(const E2& data, F&& f) {
    const int s = draw.below(size_of(OtherSpecs{}));
    with_spec(OtherSpecs{}, s, [&]<class Sp>(Sp*) {
      const auto y = ts::distribute<Sp>(mesh, data);
      note("  other operand " + y.describe());
      f(y);
    });
  }

  bool differentiable = false;  // no "fresh value" step: the chain stays a function of its start

  void step() {
    const Eigen::Index n0 = serial.dimension(0), n1 = serial.dimension(1);
    switch (draw.below(differentiable ? 11 : 12)) {
      case 0: {  // reshard
        const int to = draw.below(size_of(Specs{}));
        note("reshard to " + spec_name(to, mesh));
        with_spec(Specs{}, to, [&]<class Sp>(Sp*) { visit([&](const auto& x) { return Value(ts::reshard<Sp>(x)); }); });
        break;
      }
      case 1: {  // scalars on either side
        const int kind = scalar_kind(draw, serial);
        const double c = draw.chance(50) ? draw.real(0.5, 2) : -draw.real(0.5, 2);
        note(std::string(kScalarNames[kind]) + " with c = " + std::to_string(c));
        visit([&](const auto& x) { return with_scalar(x, kind, c); });
        serial = with_scalar(serial, kind, c);
        break;
      }
      case 2: {  // unary functions
        const int kind = draw.below(7);
        static const char* const names[] = {"tanh", "abs", "sqrt(abs)", "exp(tanh)", "square", "sigmoid", "relu"};
        note(names[kind]);
        visit([&](const auto& x) -> Value {
          switch (kind) {
            case 0: return store(ts::tanh(x));
            case 1: return store(ts::abs(x));
            case 2: return store(ts::sqrt(ts::abs(x)));
            case 3: return store(ts::exp(ts::tanh(x)));
            case 4: return store(ts::square(x));
            case 5: return store(ts::sigmoid(x));
            default: return store(ts::relu(x));
          }
        });
        serial = map(serial, [&](double v) {
          switch (kind) {
            case 0: return std::tanh(v);
            case 1: return std::abs(v);
            case 2: return std::sqrt(std::abs(v));
            case 3: return std::exp(std::tanh(v));
            case 4: return v * v;
            case 5: return 1 / (1 + std::exp(-v));
            default: return v > 0 ? v : 0.0;
          }
        });
        break;
      }
      case 3: {  // a binary operator with another tensor, maybe broadcast along one dim
        const int shape = draw.below(4), kind = draw.below(4);
        const E2 other = draw.tensor(shape == 1 ? 1 : n0, shape == 2 ? 1 : n1);
        static const char* const names[] = {"x + y", "x - y", "x * y", "x / (y * y + 1)"};
        note(std::string(names[kind]) + " with y [" + std::to_string(other.dimension(0)) + ", " +
             std::to_string(other.dimension(1)) + "]");
        with_other(other, [&](const auto& y) {
          visit([&](const auto& x) -> Value {
            switch (kind) {
              case 0: return store(x + y);
              case 1: return store(x - y);
              case 2: return store(x * y);
              default: return store(x / (y * y + 1.0));
            }
          });
        });
        serial = broadcast(serial, other, [&](double a, double b) {
          return kind == 0 ? a + b : kind == 1 ? a - b : kind == 2 ? a * b : a / (b * b + 1);
        });
        break;
      }
      case 4: {  // a reduction kept at extent 1 (partial where the dim is split), scalars with it, broadcast back
        const int d = draw.below(2), kind = (d == 0 ? n0 : n1) == 0 ? 0 : draw.below(4);
        E2 r = reduce(serial, kind, d);
        const int sk = scalar_kind(draw, r);
        const double c = draw.real(0.5, 2);
        const bool times = draw.chance(50);
        static const char* const names[] = {"sum", "max", "min", "mean"};
        note(std::string(names[kind]) + " over dim " + std::to_string(d) + ", then " + kScalarNames[sk] + " with c = " +
             std::to_string(c) + ", then x " + (times ? "*" : "-") + " that");
        visit([&](const auto& x) -> Value {
          auto partial_then = [&](const auto& red) {
            const Value s = with_scalar(red, sk, c);
            return std::visit([&](const auto& z) { return times ? store(x * z) : store(x - z); }, s);
          };
          if (d == 0) {
            switch (kind) {
              case 0: return partial_then(ts::sum<0>(x, ts::keep_dims));
              case 1: return partial_then(ts::max<0>(x, ts::keep_dims));
              case 2: return partial_then(ts::min<0>(x, ts::keep_dims));
              default: return partial_then(ts::mean<0>(x, ts::keep_dims));
            }
          }
          switch (kind) {
            case 0: return partial_then(ts::sum<1>(x, ts::keep_dims));
            case 1: return partial_then(ts::max<1>(x, ts::keep_dims));
            case 2: return partial_then(ts::min<1>(x, ts::keep_dims));
            default: return partial_then(ts::mean<1>(x, ts::keep_dims));
          }
        });
        r = with_scalar(r, sk, c);
        serial = broadcast(serial, r, [&](double a, double b) { return times ? a * b : a - b; });
        break;
      }
      case 5: {  // a product (partial where the contracted dim is split), scalars with it
        const int form = draw.below(3), strategy = draw.chance(70) ? 0 : draw.below(4);
        const Eigen::Index k = draw.extent();
        const E2 other = form == 0 ? draw.tensor(n1, k) : form == 1 ? draw.tensor(k, n1) : draw.tensor(n0, k);
        const E2 p = product(serial, other, form == 2, form == 1);
        const int sk = scalar_kind(draw, p);
        const double c = draw.real(0.5, 2);
        static const char* const forms[] = {"ij,jk->ik", "ij,kj->ik", "ji,jk->ik"};
        static const char* const strategies[] = {"Auto", "GatherRight", "GatherLeft", "Windowed"};
        note(std::string("einsum ") + forms[form] + " (" + strategies[strategy] + ") with k = " + std::to_string(k) + ", then " +
             kScalarNames[sk] + " with c = " + std::to_string(c));
        const auto st = ts::EinsumStrategy(strategy);
        with_other(other, [&](const auto& y) {
          visit([&](const auto& x) -> Value {
            if (form == 0) return with_scalar(ts::einsum<"ij,jk->ik">(x, y, st), sk, c);
            if (form == 1) return with_scalar(ts::einsum<"ij,kj->ik">(x, y, st), sk, c);
            return with_scalar(ts::einsum<"ji,jk->ik">(x, y, st), sk, c);
          });
        });
        serial = with_scalar(p, sk, c);
        break;
      }
      case 6: {  // slice, pad, concat
        const int kind = draw.below(4);
        if (kind == 0) {
          const Eigen::Index o0 = draw.below(int(n0) + 1), o1 = draw.below(int(n1) + 1);
          const Eigen::Index e0 = draw.below(int(n0 - o0) + 1), e1 = draw.below(int(n1 - o1) + 1);
          note("slice at (" + std::to_string(o0) + ", " + std::to_string(o1) + ") of extent (" + std::to_string(e0) + ", " +
               std::to_string(e1) + ")");
          visit([&](const auto& x) { return store(ts::slice(x, {o0, o1}, {e0, e1})); });
          E2 s(e0, e1);
          for (Eigen::Index j = 0; j < e1; ++j)
            for (Eigen::Index i = 0; i < e0; ++i) s(i, j) = serial(o0 + i, o1 + j);
          serial = s;
        } else if (kind == 1) {
          const Eigen::Index b0 = draw.below(3), a0 = draw.below(3), b1 = draw.below(3), a1 = draw.below(3);
          const double fill = draw.real(-1, 1);
          note("pad (" + std::to_string(b0) + ", " + std::to_string(b1) + ") before, (" + std::to_string(a0) + ", " +
               std::to_string(a1) + ") after with " + std::to_string(fill));
          visit([&](const auto& x) { return store(ts::pad(x, {b0, b1}, {a0, a1}, fill)); });
          E2 s(n0 + b0 + a0, n1 + b1 + a1);
          s.setConstant(fill);
          for (Eigen::Index j = 0; j < n1; ++j)
            for (Eigen::Index i = 0; i < n0; ++i) s(b0 + i, b1 + j) = serial(i, j);
          serial = s;
        } else {
          const int d = kind - 2;
          const Eigen::Index m = draw.extent();
          const E2 other = d == 0 ? draw.tensor(m, n1) : draw.tensor(n0, m);
          note("concat along dim " + std::to_string(d) + " with " + std::to_string(m));
          with_other(other, [&](const auto& y) {
            visit([&](const auto& x) { return d == 0 ? store(ts::concat<0>(x, y)) : store(ts::concat<1>(x, y)); });
          });
          E2 s(d == 0 ? n0 + m : n0, d == 1 ? n1 + m : n1);
          for (Eigen::Index j = 0; j < s.dimension(1); ++j)
            for (Eigen::Index i = 0; i < s.dimension(0); ++i)
              s(i, j) = (d == 0 ? i < n0 : j < n1) ? serial(i, j) : other(d == 0 ? i - n0 : i, d == 1 ? j - n1 : j);
          serial = s;
        }
        break;
      }
      case 7: {  // where: a mask from a comparison with a scalar or a tensor; scalars on either side
        const int kind = draw.below(4);
        const double c = draw.real(-1, 1), d = draw.real(-1, 1);
        const E2 other = draw.tensor(n0, n1);
        static const char* const names[] = {"where(x > c, x, y)", "where(x > y, x, d)", "where(x < c, d, y)",
                                            "where(y >= x, y, x)"};
        note(std::string(names[kind]) + " with c = " + std::to_string(c) + ", d = " + std::to_string(d));
        with_other(other, [&](const auto& y) {
          visit([&](const auto& x) -> Value {
            switch (kind) {
              case 0: return store(ts::where(x > c, x, y));
              case 1: return store(ts::where(x > y, x, d));
              case 2: return store(ts::where(x < c, d, y));
              default: return store(ts::where(y >= x, y, x));
            }
          });
        });
        serial = broadcast(serial, other, [&](double a, double b) {
          switch (kind) {
            case 0: return a > c ? a : b;
            case 1: return a > b ? a : d;
            case 2: return a < c ? d : b;
            default: return b >= a ? b : a;
          }
        });
        break;
      }
      case 8: {  // take rows by ids (partial over the axes splitting the rows), scalars with it
        if (n0 == 0) return step();
        const Eigen::Index count = draw.extent();
        Eigen::Tensor<std::int32_t, 1> ids(count);
        for (Eigen::Index i = 0; i < count; ++i) ids(i) = std::int32_t(draw.below(int(n0)));
        E2 t(count, n1);
        for (Eigen::Index j = 0; j < n1; ++j)
          for (Eigen::Index i = 0; i < count; ++i) t(i, j) = serial(ids(i), j);
        const int sk = scalar_kind(draw, t), spec = draw.below(size_of(IdSpecs{}));
        const double c = draw.real(0.5, 2);
        note("take<0> of " + std::to_string(count) + " ids (spec " + std::to_string(spec) + "), then " + kScalarNames[sk] +
             " with c = " + std::to_string(c));
        with_spec(IdSpecs{}, spec, [&]<class Sp>(Sp*) {
          const auto id = ts::distribute<Sp>(mesh, ids);
          visit([&](const auto& x) { return with_scalar(ts::take<0>(x, id), sk, c); });
        });
        serial = with_scalar(t, sk, c);
        break;
      }
      case 9: {  // the nn functions
        const int kind = draw.below(4);
        static const char* const names[] = {"softmax<0>", "softmax<1>", "log_softmax<1>", "gelu"};
        note(names[kind]);
        visit([&](const auto& x) -> Value {
          switch (kind) {
            case 0: return store(ts::nn::softmax<0>(x));
            case 1: return store(ts::nn::softmax<1>(x));
            case 2: return store(ts::nn::log_softmax<1>(x));
            default: return store(ts::nn::gelu(x));
          }
        });
        if (kind == 3) {
          serial = map(serial, gelu);
        } else {
          const int d = kind == 0 ? 0 : 1;
          const E2 m = reduce(serial, 1, d);
          const E2 z = broadcast(serial, m, [](double a, double b) { return a - b; });
          const E2 s = reduce(map(z, [](double v) { return std::exp(v); }), 0, d);
          serial = broadcast(z, s, [&](double a, double b) { return kind == 2 ? a - std::log(b) : std::exp(a) / b; });
        }
        break;
      }
      case 10: {  // transpose
        note("transpose<1, 0>");
        visit([&](const auto& x) { return store(ts::transpose<1, 0>(x)); });
        serial = E2(serial.shuffle(Eigen::array<int, 2>{1, 0}));
        break;
      }
      default: {  // a fresh value: new shape and spec
        const Eigen::Index a = draw.extent(), b = draw.extent();
        const int spec = draw.below(size_of(Specs{}));
        serial = draw.tensor(a, b);
        note("fresh [" + std::to_string(a) + ", " + std::to_string(b) + "] " + spec_name(spec, mesh));
        value = distribute_as(spec, mesh, serial);
      }
    }
  }

  // Keeps values bounded and shapes small: large values through tanh, large tensors sliced.
  void tame() {
    double largest = 0;
    for (Eigen::Index i = 0; i < serial.size(); ++i) largest = std::max(largest, std::abs(serial.data()[i]));
    if (largest > 50) {
      note("tanh (taming)");
      visit([](const auto& x) { return store(ts::tanh(x)); });
      serial = map(serial, [](double v) { return std::tanh(v); });
    }
    if (serial.dimension(0) > 40 || serial.dimension(1) > 40) {
      const Eigen::Index e0 = std::min<Eigen::Index>(serial.dimension(0), 20), e1 = std::min<Eigen::Index>(serial.dimension(1), 20);
      note("slice to " + std::to_string(e0) + " x " + std::to_string(e1) + " (taming)");
      visit([&](const auto& x) { return store(ts::slice(x, {0, 0}, {e0, e1})); });
      serial = E2(serial.slice(Eigen::array<Eigen::Index, 2>{0, 0}, Eigen::array<Eigen::Index, 2>{e0, e1}));
    }
  }

  // "" where the gathered value equals the serial one, else what differs.
  std::string mismatch() const {
    const E2 got = std::visit([](const auto& x) { return E2(x.gather()); }, *value);
    std::ostringstream why;
    if (got.dimension(0) != serial.dimension(0) || got.dimension(1) != serial.dimension(1)) {
      why << "shape [" << got.dimension(0) << ", " << got.dimension(1) << "], serial [" << serial.dimension(0) << ", "
          << serial.dimension(1) << "]";
      return why.str();
    }
    for (Eigen::Index j = 0; j < got.dimension(1); ++j)
      for (Eigen::Index i = 0; i < got.dimension(0); ++i) {
        const double a = got(i, j), b = serial(i, j);
        if (std::isnan(a) && std::isnan(b)) continue;
        if (!(std::abs(a - b) <= 1e-10 * (1 + std::abs(b)))) {
          why << "element (" << i << ", " << j << ") is " << a << ", serial " << b;
          return why.str();
        }
      }
    return "";
  }
};

struct Options {
  long chains = 100, first = 0, length = 6;
  std::uint64_t seed = 1;
  bool verbose = false, grad = false;
};

// ---- --grad: the chain as a differentiable function of its start tensor ----

// What one replay of a chain gave: its loss <value, D> (resolved, the same type for any spec),
// its steps, and "" or what differed from the serial reference.
struct Replay {
  std::vector<std::string> steps;
  std::string mismatch;
};

// The chain's start drawn from `draw`: its spec and serial value.
struct Start {
  int spec = 0;
  E2 serial;
};
Start draw_start(Draw& draw) {
  Start st;
  const Eigen::Index a = draw.positive_extent(), b = draw.positive_extent();
  st.spec = draw.below(size_of(Specs{}));
  st.serial = draw.tensor(a, b);
  return st;
}

// The chain from w (a tensor of the start's spec on `mesh`, tracked or not) with the choices of
// `draw` as it was after the start, then <value, D> for a D drawn from (seed, chain, shape).
template <class W>
auto replay_loss(const M2& mesh, Draw draw, long length, const E2& start, const W& w, std::uint64_t dir_seed, Replay& out) {
  Chain chain{mesh, draw, start, Value(w), {}};
  chain.differentiable = true;
  for (long s = 0; s < length; ++s) {
    chain.step();
    chain.tame();
  }
  out.steps = chain.steps;
  out.mismatch = chain.mismatch();
  Draw dir{std::mt19937_64(dir_seed + 31 * std::uint64_t(chain.serial.dimension(0)) + std::uint64_t(chain.serial.dimension(1)))};
  const auto d = ts::distribute<Spec<R, R>>(mesh, dir.tensor(chain.serial.dimension(0), chain.serial.dimension(1)));
  return std::visit([&](const auto& x) { return ts::reshard<Spec<>>(ts::sum<0, 1>(x * d)); }, *chain.value);
}

double number(const ts::ShardedTensor<double, M2, Spec<>>& t) { return Eigen::Tensor<double, 0>(t.gather())(); }

struct GradOutcome {
  std::string why;             // "" when the chain passed
  bool fd_skipped = false;     // the finite-difference check did not apply (a decision or a kink within h)
  std::vector<std::string> steps;
};

// Chain c under value_and_grad on `mesh`, against one rank and against central differences.
GradOutcome check_gradient(const M2& mesh, const M2& single, const Options& o, long c) {
  Draw draw{std::mt19937_64(o.seed * 1000003ULL + std::uint64_t(c) + 0x9e3779b9ULL)};
  const Start start = draw_start(draw);
  const long length = 1 + draw.below(int(o.length));
  const std::uint64_t dir_seed = o.seed * 7919ULL + std::uint64_t(c);
  GradOutcome out;
  with_spec(Specs{}, start.spec, [&]<class Sp>(Sp*) {
    using W = ts::ShardedTensor<double, M2, Sp>;
    auto gradient_on = [&](const M2& m, Replay& r) {
      const W w = ts::distribute<Sp>(m, start.serial);
      auto [loss, g] = ts::ad::value_and_grad(
          [&](const auto& x) { return replay_loss(m, draw, length, start.serial, x, dir_seed, r); }, w);
      return std::make_pair(loss, E2(g.gather()));
    };
    Replay base, alone;
    const auto [loss, g] = gradient_on(mesh, base);
    out.steps = base.steps;
    out.steps.insert(out.steps.begin(), "start [" + std::to_string(start.serial.dimension(0)) + ", " +
                                            std::to_string(start.serial.dimension(1)) + "] " + spec_name(start.spec, mesh));
    if (!base.mismatch.empty()) {
      out.why = "value: " + base.mismatch;
      return;
    }
    const auto [loss1, g1] = gradient_on(single, alone);
    std::ostringstream why;
    if (!(std::abs(loss - loss1) <= 1e-10 * (1 + std::abs(loss1)))) why << "loss " << loss << ", one rank " << loss1;
    for (Eigen::Index i = 0; i < g.size() && why.str().empty(); ++i)
      if (!(std::abs(g.data()[i] - g1.data()[i]) <= 1e-10 * (1 + std::abs(g1.data()[i]))))
        why << "gradient element " << i << " is " << g.data()[i] << ", one rank " << g1.data()[i];
    if (!why.str().empty()) {
      out.why = why.str();
      return;
    }
    // Central differences along v, replayed untracked; skipped where the replay decides otherwise
    // or the one-sided differences disagree (a kink within h).
    Draw vdraw{std::mt19937_64(dir_seed ^ 0x5bd1e995ULL)};
    const E2 v = vdraw.tensor(start.serial.dimension(0), start.serial.dimension(1));
    const double h = 1e-5;
    auto at = [&](double t, bool& same) {
      const E2 shifted = start.serial + t * v;
      Replay r;
      const double l = number(replay_loss(mesh, draw, length, shifted, ts::distribute<Sp>(mesh, shifted), dir_seed, r));
      same = same && r.steps == base.steps;
      return l;
    };
    bool same = true;
    const double up = at(h, same), down = at(-h, same), up2 = at(h / 2, same), down2 = at(-h / 2, same);
    double analytic = 0;
    for (Eigen::Index i = 0; i < g.size(); ++i) analytic += g.data()[i] * v.data()[i];
    // Richardson's extrapolation of the central differences at h and h / 2 (error O(h^4)): a
    // steep third derivative (sqrt near 0, c / x) no longer passes for a wrong gradient.
    const double central = (up - down) / (2 * h), half = (up2 - down2) / h, forward = (up - loss) / h,
                 backward = (loss - down) / h, extrapolated = (4 * half - central) / 3;
    const double scale = std::max({1.0, std::abs(extrapolated), std::abs(analytic)});
    if (!same || std::abs(forward - backward) > 1e-3 * scale || std::abs(central - half) > 1e-3 * scale) {
      out.fd_skipped = true;
      return;
    }
    if (!(std::abs(analytic - extrapolated) <= 1e-6 * scale)) {
      why << "directional derivative " << analytic << " by the gradient, " << extrapolated << " by central differences";
      out.why = why.str();
    }
  });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return i + 1 < argc ? std::atol(argv[++i]) : 0L; };
    if (a == "--chains") o.chains = value();
    else if (a == "--first") o.first = value();
    else if (a == "--seed") o.seed = std::uint64_t(value());
    else if (a == "--length") o.length = value();
    else if (a == "--verbose") o.verbose = true;
    else if (a == "--grad") o.grad = true;
    else {
      if (ts::Environment::world_rank() == 0) std::fprintf(stderr, "tshard_differential: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const int p = ts::Environment::world_size(), rank = ts::Environment::world_rank();
  std::vector<int> divisors;
  for (int a = 1; a <= p; ++a)
    if (p % a == 0) divisors.push_back(a);
  std::vector<std::unique_ptr<M2>> meshes;  // one per shape: mesh creation is collective
  for (int a : divisors) meshes.push_back(std::unique_ptr<M2>(new M2({a, p / a})));
  long failed = 0, steps = 0;
  if (o.grad) {
    const M2 single(MPI_COMM_SELF, {1, 1});
    long skipped = 0;
    for (long c = o.first; c < o.first + o.chains; ++c) {
      const M2& mesh = *meshes[std::size_t(c % long(meshes.size()))];
      GradOutcome r;
      try {
        r = check_gradient(mesh, single, o, c);
      } catch (const std::exception& e) {
        r.why = std::string("threw: ") + e.what();
      }
      skipped += r.fd_skipped ? 1 : 0;
      steps += long(r.steps.size());
      if ((!r.why.empty() || o.verbose) && rank == 0) {
        std::printf("%s gradient chain %ld (seed %llu) on mesh %d x %d: %s%s\n", r.why.empty() ? "ok" : "FAILED", c,
                    (unsigned long long)o.seed, mesh.size<"x">(), mesh.size<"y">(), r.why.c_str(),
                    r.fd_skipped ? " (finite differences skipped)" : "");
        for (const auto& s : r.steps) std::printf("    %s\n", s.c_str());
        if (!r.why.empty())
          std::printf("  replay: mpirun -np %d ./tshard_differential --grad --seed %llu --first %ld --chains 1 --length %ld\n",
                      p, (unsigned long long)o.seed, c, o.length);
      }
      failed += r.why.empty() ? 0 : 1;
    }
    if (rank == 0)
      std::printf("tshard_differential --grad: %ld chains (%ld steps) on %d ranks, seed %llu, first %ld: %ld failed, "
                  "%ld without the finite-difference check (a decision or a kink within h)\n",
                  o.chains, steps, p, (unsigned long long)o.seed, o.first, failed, skipped);
    return int(std::min<long>(failed, 100));
  }
  for (long c = o.first; c < o.first + o.chains; ++c) {
    Draw draw{std::mt19937_64(o.seed * 1000003ULL + std::uint64_t(c))};
    const M2& mesh = *meshes[std::size_t(draw.below(int(meshes.size())))];
    Chain chain{mesh, draw, E2(), std::nullopt, {}};
    const Eigen::Index a = draw.extent(), b = draw.extent();
    const int spec = draw.below(size_of(Specs{}));
    chain.serial = draw.tensor(a, b);
    chain.note("mesh " + std::to_string(mesh.size<"x">()) + " x " + std::to_string(mesh.size<"y">()) + ", start [" +
               std::to_string(a) + ", " + std::to_string(b) + "] " + spec_name(spec, mesh));
    chain.value = distribute_as(spec, mesh, chain.serial);
    std::string why;
    const long length = 1 + draw.below(int(o.length));
    for (long s = 0; s < length && why.empty(); ++s) {
      try {
        chain.step();
        why = chain.mismatch();
        if (why.empty()) chain.tame();
      } catch (const std::exception& e) {
        why = std::string("threw: ") + e.what();
      }
      ++steps;
    }
    if (!why.empty() || o.verbose) {
      if (rank == 0) {
        std::printf("%s chain %ld (seed %llu): %s\n", why.empty() ? "ok" : "FAILED", c, (unsigned long long)o.seed,
                    why.empty() ? "" : why.c_str());
        for (const auto& s : chain.steps) std::printf("    %s\n", s.c_str());
        if (!why.empty())
          std::printf("  replay: mpirun -np %d ./tshard_differential --seed %llu --first %ld --chains 1 --length %ld\n", p,
                      (unsigned long long)o.seed, c, o.length);
      }
    }
    failed += why.empty() ? 0 : 1;
  }
  if (rank == 0)
    std::printf("tshard_differential: %ld chains (%ld steps) on %d ranks, seed %llu, first %ld: %ld failed\n", o.chains, steps,
                p, (unsigned long long)o.seed, o.first, failed);
  return int(std::min<long>(failed, 100));
}
