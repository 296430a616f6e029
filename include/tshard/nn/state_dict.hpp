// A model's state by name, as PyTorch's state_dict: every registered parameter and buffer as a
// StateTensor, a tensor whose type is known where it was registered and erased here, so that one
// list holds a model's float matrices, int64 counters and bfloat16 embeddings alike. What files
// and other models need of it goes through the entry: write it to a checkpoint or a safetensors
// file, read it back (any spec, any mesh, any rank count: the files hold the global tensor), copy
// it from another model's, read its values; as<X>() gives the typed tensor back.
//
//   auto sd = ts::nn::state_dict(model);              // {"up.weight", ...}, the model's own tensors
//   sd.at("up.weight").as<W>()                        // its exact type, or a SpecError naming both
//   ts::nn::load_state_dict(other, sd);               // by name: same shapes, any specs
#pragma once
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/error.hpp"
#include "tshard/io/checkpoint.hpp"
#include "tshard/io/safetensors.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/factories.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::nn {

class StateTensor {
 public:
  virtual ~StateTensor() = default;
  virtual std::string describe() const = 0;     // "[7, 5] {R, model}"
  virtual const char* dtype() const = 0;        // "float32", "float64", "bfloat16", "int32", "int64"
  virtual int rank() const = 0;
  virtual std::vector<Eigen::Index> shape() const = 0;

  // Collective over the tensor's mesh. A parameter ZeRO-3 released is written with its values.
  virtual void save(io::CheckpointWriter& out, const std::string& name) const = 0;
  virtual void load(const io::CheckpointReader& in, const std::string& name) = 0;
  virtual void load(io::SafetensorsReader& in, const std::string& name) = 0;
  // An entry of a safetensors file (it refers to this tensor: keep the state until written).
  virtual io::NamedTensor named(const std::string& name) const = 0;
  // The global values in column-major order, as doubles, on every rank (collective), and back:
  // set_values takes the global values (every rank the same) and keeps its block, converted to
  // the element type (bfloat16 rounds).
  virtual std::vector<double> values() const = 0;
  virtual void set_values(const std::vector<double>& global) = 0;
  // This tensor's value := from's (same element type and shape, same mesh, any spec); `name`,
  // where given, is named in the errors.
  virtual void assign(const StateTensor& from, const std::string& name = "") = 0;

  // The tensor as its exact type (SpecError where X is another).
  template <class X>
  X& as() {
    if (auto* t = static_cast<X*>(typed(typeid(X)))) return *t;
    throw SpecError(std::string("tshard::nn::StateTensor::as: the tensor is ") + describe() + " " + dtype() +
                    ", not the type asked for (" + typeid(X).name() + ")");
  }
  template <class X>
  const X& as() const {
    return const_cast<StateTensor*>(this)->as<X>();
  }

  // Its element type, and its buffer as descriptor code sees it (assign() of another entry reads
  // them): the block's layout, its global extents and its mesh's state.
  virtual const std::type_info& element() const = 0;
  virtual const void* block(tshard::detail::SpecDesc& desc, tshard::detail::Extents& extents,
                            const void*& mesh) const = 0;

 protected:
  virtual void* typed(const std::type_info& type) = 0;
};

namespace detail {

template <class T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else if constexpr (std::is_same_v<T, bfloat16>) return "bfloat16";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  else return "complex";
}

// The bodies of TypedStateTensor's members that need only the element type, compiled once per
// element type instead of once per tensor type.
template <class T>
std::vector<double> global_values(const tshard::detail::BlockView<T>& x) {
  std::vector<T> g(static_cast<std::size_t>(tshard::detail::volume(x.shape, x.spec.rank)));
  {
    tshard::detail::OperatorScope scope("gather");
    tshard::detail::gather_to_all(x.mesh, x.spec, x.shape, x.data, g.data());
  }
  std::vector<double> out(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) out[i] = double(g[i]);
  return out;
}
template <class T>
void set_block_values(const tshard::detail::ShardLayout& layout, const tshard::detail::Extents& shape, T* block,
                      const std::vector<double>& global) {
  tshard::detail::for_each_local<tshard::detail::kMaxRank>(layout, [&](const auto& g, tshard::detail::Index at) {
    tshard::detail::Index linear = 0, stride = 1;
    for (int d = 0; d < layout.rank; ++d) {
      linear += g[d] * stride;
      stride *= shape[d];
    }
    block[at] = T(global[std::size_t(linear)]);
  });
}
// from's value laid out as `to` (same element type, shape and mesh; SpecError, ShapeError or
// MeshError naming both otherwise).
template <class T>
tshard::detail::AlignedOperand<T> aligned_source(const StateTensor& from, const StateTensor& to, const std::string& name,
                                                 tshard::detail::MeshState& state, const tshard::detail::SpecDesc& spec,
                                                 const tshard::detail::Extents& shape) {
  const std::string what = "tshard::nn::load_state_dict: " + (name.empty() ? std::string() : "\"" + name + "\": ");
  if (from.element() != typeid(T))
    throw SpecError(what + from.describe() + " " + from.dtype() + " into " + to.describe() + " " + to.dtype() +
                    ": the element types differ");
  tshard::detail::SpecDesc desc{};
  tshard::detail::Extents extents{};
  const void* mesh = nullptr;
  const void* data = from.block(desc, extents, mesh);
  if (extents != shape || desc.rank != spec.rank)
    throw ShapeError(what + "the shapes differ: " + from.describe() + " into " + to.describe());
  if (mesh != &state)  // a state dict moves to another mesh through a file: nn::save, then nn::load
    throw MeshError(what + from.describe() + " lives on another mesh than " + to.describe() +
                    tshard::detail::kSeparateMeshes);
  return tshard::detail::implicit_reshard(state, desc, spec, extents, static_cast<const T*>(data), "load_state_dict");
}

// A StateTensor over a ShardedTensor held elsewhere (a module's slot: the pointer keeps it alive)
// or owned by the entry (an optimizer's state, a copy).
template <class T, class M, class S>
class TypedStateTensor final : public StateTensor {
 public:
  using Tensor = ShardedTensor<T, M, S>;
  explicit TypedStateTensor(std::shared_ptr<Tensor> t) : t_(std::move(t)) {}

  Tensor& tensor() { return *t_; }
  const Tensor& tensor() const { return *t_; }

  std::string describe() const override { return t_->describe(); }
  const char* dtype() const override { return dtype_name<T>(); }
  int rank() const override { return Tensor::rank; }
  std::vector<Eigen::Index> shape() const override {
    const auto s = t_->global_shape();
    return std::vector<Eigen::Index>(s.begin(), s.end());
  }
  // (.npy has no bfloat16: a bfloat16 tensor is written as the float32 it widens to, exactly,
  // and read back rounded, which gives its values again.)
  void save(io::CheckpointWriter& out, const std::string& name) const override {
    if constexpr (std::is_same_v<T, bfloat16>) {
      const tshard::detail::Readable values(*t_, "io::CheckpointWriter::add");
      out.add(name, widened(*values));
    } else {
      out.add(name, *t_);
    }
  }
  void load(const io::CheckpointReader& in, const std::string& name) override {
    if constexpr (std::is_same_v<T, bfloat16>) {
      const auto wide = in.load<float, S>(t_->mesh(), name);
      Tensor narrow(t_->mesh(), t_->global_shape());
      const float* w = wide.data();
      bfloat16* n = narrow.data();
      for (Eigen::Index i = 0; i < narrow.padded_size(); ++i) n[i] = bfloat16(w[i]);
      *t_ = std::move(narrow);
    } else {
      *t_ = in.load<T, S>(t_->mesh(), name);
    }
  }
  void load(io::SafetensorsReader& in, const std::string& name) override {
    std::vector<std::int64_t> expect;
    for (auto d : t_->global_shape()) expect.push_back(d);
    *t_ = in.load<T, S>(t_->mesh(), name, expect);
  }
  io::NamedTensor named(const std::string& name) const override { return io::NamedTensor(name, *t_); }
  std::vector<double> values() const override {
    const tshard::detail::Readable readable(*t_, "nn::StateTensor::values");
    return global_values(tshard::detail::block_view(*readable));
  }
  void set_values(const std::vector<double>& global) override {
    if (Eigen::Index(global.size()) != tshard::detail::volume(tshard::detail::extents_of(*t_), Tensor::rank))
      throw ShapeError("tshard::nn::StateTensor::set_values: " + std::to_string(global.size()) + " values for " + describe());
    tshard::detail::TensorAccess::acquire_storage(*t_, false);
    set_block_values(tshard::detail::layout_of(*t_), tshard::detail::extents_of(*t_), t_->data(), global);
  }
  void assign(const StateTensor& from, const std::string& name = "") override {
    auto moved = aligned_source<T>(from, *this, name, *tshard::detail::state_of(t_->mesh()), Tensor::spec_desc,
                                   tshard::detail::extents_of(*t_));
    tshard::detail::TensorAccess::acquire_storage(*t_, false);
    std::copy(moved.data, moved.data + t_->padded_size(), t_->data());
  }
  const std::type_info& element() const override { return typeid(T); }
  const void* block(tshard::detail::SpecDesc& desc, tshard::detail::Extents& extents, const void*& mesh) const override {
    desc = Tensor::spec_desc;
    extents = tshard::detail::extents_of(*t_);
    mesh = tshard::detail::state_of(t_->mesh()).get();
    if (!tshard::detail::TensorAccess::has_storage(*t_) && t_->padded_size() > 0) (void)t_->local();  // (the SpecError)
    return std::as_const(*t_).data();
  }

 protected:
  void* typed(const std::type_info& type) override { return type == typeid(Tensor) ? t_.get() : nullptr; }

 private:
  static ShardedTensor<float, M, S> widened(const Tensor& x) {
    ShardedTensor<float, M, S> out(x.mesh(), x.global_shape());
    const T* in = x.data();
    float* o = out.data();
    for (Eigen::Index i = 0; i < out.padded_size(); ++i) o[i] = float(in[i]);
    return out;
  }

  std::shared_ptr<Tensor> t_;
};

template <class T, class M, class S>
std::shared_ptr<StateTensor> state_of_tensor(std::shared_ptr<ShardedTensor<T, M, S>> t) {
  return std::make_shared<TypedStateTensor<T, M, S>>(std::move(t));
}

}  // namespace detail

// The named tensors of a model (or of an optimizer), in a fixed order.
class StateDict {
 public:
  using Entry = std::pair<std::string, std::shared_ptr<StateTensor>>;

  void add(std::string name, std::shared_ptr<StateTensor> t) {
    if (find(name)) throw SpecError("tshard::nn::StateDict: the name \"" + name + "\" is there twice");
    entries_.emplace_back(std::move(name), std::move(t));
  }
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  StateTensor& at(const std::string& name) const {
    if (auto* t = find(name)) return *t;
    throw SpecError("tshard::nn::StateDict: no tensor named \"" + name + "\"");
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : entries_) out.push_back(e.first);
    return out;
  }
  std::size_t size() const { return entries_.size(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

  // Every entry into a checkpoint, under its name with `prefix` before it (collective).
  void save(io::CheckpointWriter& out, const std::string& prefix = "") const {
    for (const auto& [name, t] : entries_) t->save(out, prefix + name);
  }

 private:
  StateTensor* find(const std::string& name) const {
    for (const auto& e : entries_)
      if (e.first == name) return e.second.get();
    return nullptr;
  }
  std::vector<Entry> entries_;
};

}  // namespace tshard::nn

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::nn::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(tshard::detail::AlignedOperand<T> aligned_source<T>(const StateTensor&, const StateTensor&, const std::string&, tshard::detail::MeshState&, const tshard::detail::SpecDesc&, const tshard::detail::Extents&))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::nn::detail
