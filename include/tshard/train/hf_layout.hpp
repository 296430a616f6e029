// Parameters in Hugging Face's layout: a model ported from transformers names its parameters as HF
// does and holds each as the column-major reshape of HF's row-major [rows, cols] matrix (a vector
// as it is), in any spec; HF files (safetensors, written by save_pretrained) are read and written
// through that correspondence, and the initial values are drawn in HF's C order, so a model
// starts from the same numbers whatever its layout and mesh.
//
//   struct Mlp : ts::nn::Module {
//     ts::train::HfWeight<T, M, ts::Spec<S<"model">, R>> up_proj;   // [F, D], as HF's [F, D]
//     Mlp(const M& mesh, Index f, Index d, std::uint64_t seed)
//         : up_proj(mesh, "model.layers.0.mlp.up_proj.weight", {f, d}, {f, d}, seed) { register_module("up_proj", up_proj); }
//   };
//   ts::train::load_hf_weights(mesh.comm(), "model.safetensors", model);
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/io/safetensors.hpp"
#include "tshard/nn/module.hpp"
#include "tshard/ops/shape.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/factories.hpp"
#include "tshard/train/sampling.hpp"

namespace tshard::train {

// A parameter with its HF name's file layout; its module holds it.
struct HfParameter {
  virtual ~HfParameter() = default;
  // Reads the tensor `name` of a file in HF's layout into the parameter (collective over its mesh).
  virtual void load(io::SafetensorsReader& in, const std::string& name) = 0;
  // Adds the parameter, in HF's layout, to a list for save_safetensors (stored as its own dtype or
  // as `stored`, io::NamedTensor's); the returned handle keeps a reshaped copy alive until the file
  // is written.
  virtual std::shared_ptr<void> add_to(std::vector<io::NamedTensor>& out, const std::string& name, const std::string& stored = "") = 0;
  // A tied copy of the parameter so named (a head that is the embedding, on the last pipeline
  // stage while the embedding is on the first; ts::optim::Optimizer::tie keeps the two equal):
  // read from that tensor, and left out of the files written, which hold the original.
  std::string tied_to;
};

namespace detail {
// FNV-1a of a name: the seed of a parameter's draws.
inline std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
}  // namespace detail

// A standard normal draw from (seed, i) (Box-Muller of two uniform draws).
inline double normal_draw(std::uint64_t seed, std::uint64_t i) {
  return std::sqrt(-2 * std::log(uniform_draw(seed, 2 * i))) * std::cos(2 * M_PI * uniform_draw(seed, 2 * i + 1));
}

// The file side of a parameter P whose shape is `ours` and whose HF shape is `hf` ([R, C] or [R]).
template <class P>
class HfLayout : public HfParameter {
 public:
  using T = typename P::Scalar;
  static constexpr int N = P::rank;
  explicit HfLayout(std::vector<Eigen::Index> hf) : hf_(std::move(hf)) {}
  void bind(P& p) { p_ = &p; }

  // Values std * N(0, 1) drawn from (seed ^ a hash of the HF name, index in HF's C-order
  // tensor), or ones: the same numbers whatever our layout, spec and mesh.
  static P init(const typename P::MeshT& mesh, const std::array<Eigen::Index, N>& ours, const std::vector<Eigen::Index>& hf,
                std::uint64_t seed, const std::string& hf_name, double std, bool ones = false) {
    seed ^= detail::name_hash(hf_name);
    const Eigen::Index rows = hf[0], cols = hf.size() > 1 ? hf[1] : 1;
    Eigen::Index dims[N];
    std::copy(ours.begin(), ours.end(), dims);
    return from_function<T, typename P::SpecType>(mesh, dims, [&](const std::array<Eigen::Index, N>& i) {
      if (ones) return T(1);
      Eigen::Index flat = 0, stride = 1;  // our column-major index = HF's column-major index
      for (int d = 0; d < N; ++d) flat += i[std::size_t(d)] * stride, stride *= ours[std::size_t(d)];
      return T(std * normal_draw(seed, std::uint64_t((flat % rows) * cols + flat / rows)));  // HF's C-order index
    });
  }
  void load(io::SafetensorsReader& in, const std::string& name) override {
    const std::vector<std::int64_t> hf(hf_.begin(), hf_.end());
    if constexpr (N <= 2) {
      if (int(hf_.size()) == N) return void(*p_ = in.template load<T, typename P::SpecType>(p_->mesh(), name, hf));
    }
    if (hf_.size() != 2) throw IoError("tshard::train: " + name + " is not a matrix in HF's layout");
    const auto flat = in.template load<T, Replicated<2>>(p_->mesh(), name, hf);
    *p_ = reshard<typename P::SpecType>(reshaped<Replicated<N>>(flat, ours()));
  }
  std::shared_ptr<void> add_to(std::vector<io::NamedTensor>& out, const std::string& name, const std::string& stored = "") override {
    if (int(hf_.size()) == N) return out.emplace_back(name, *p_, stored), nullptr;
    using Flat = decltype(reshaped<Replicated<2>>(reshard<Replicated<N>>(*p_), std::array<Eigen::Index, 2>{}));
    auto flat = std::make_shared<Flat>(reshaped<Replicated<2>>(reshard<Replicated<N>>(*p_), std::array<Eigen::Index, 2>{hf_[0], hf_[1]}));
    out.emplace_back(name, *flat, stored);
    return flat;
  }

 private:
  template <class SpecT, class X, std::size_t K>
  static auto reshaped(const X& x, const std::array<Eigen::Index, K>& shape) {
    Eigen::Index dims[K];
    std::copy(shape.begin(), shape.end(), dims);
    return reshape<SpecT>(x, dims);
  }
  std::array<Eigen::Index, N> ours() const {
    std::array<Eigen::Index, N> s{};
    const auto g = p_->global_shape();
    std::copy(g.begin(), g.end(), s.begin());
    return s;
  }
  P* p_ = nullptr;  // the module's parameter, bound once it is registered
  std::vector<Eigen::Index> hf_;
};

// A module holding one parameter named "weight", as HF's Linear, RMSNorm and Embedding do, drawn
// N(0, std) from (seed ^ its name's hash) in HF's order, or ones (a norm's).
template <class T, MeshType M, class SpecT>
struct HfWeight : nn::Module, HfLayout<ShardedTensor<T, M, SpecT>> {
  using P = ShardedTensor<T, M, SpecT>;
  P& weight;
  HfWeight(const M& mesh, const std::string& hf_name, std::array<Eigen::Index, P::rank> ours, std::vector<Eigen::Index> hf,
           std::uint64_t seed, double std = 0.02, bool ones = false)
      : HfLayout<P>(hf),
        weight(register_parameter("weight", HfLayout<P>::init(mesh, ours, hf, seed, hf_name, std, ones))) {
    this->bind(weight);
  }
};

// Every HF parameter of a model (its modules that are HfParameters) by its name in HF's files:
// "<module path>weight", or the name a tied copy reads. `written`: only those a file holds (no
// tied copy).
std::vector<std::pair<std::string, HfParameter*>> hf_parameters(nn::Module& model, bool written = false);

// The model's HF parameters from a safetensors file, an index or a model directory (collective
// over comm, whose ranks hold the model's tensors; a pipeline stage reads its own).
void load_hf_weights(MPI_Comm comm, const std::string& path, nn::Module& model);

// The model's HF parameters into one safetensors file in HF's layout (collective over comm: every
// rank, every stage's tensors). ZeRO-3 parameters must be present (opt.gather_parameters()).
void save_hf_weights(MPI_Comm comm, const std::string& path, nn::Module& model);

}  // namespace tshard::train

#if TSHARD_HEADER_BODIES
#include "tshard/train/hf_layout-inl.hpp"
#endif
