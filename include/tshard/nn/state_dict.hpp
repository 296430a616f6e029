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

// What ErasedStateTensor's members share with other descriptor code, per element type.
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

// A StateTensor over a ShardedTensor held elsewhere (a module's slot: `keep` keeps it alive) or
// owned by the entry (an optimizer's state, a copy). Its type is erased down to the element type,
// so the members are compiled once per element type (tshard::kernels), not once per tensor type;
// `type` and `typed` are what as<X>() gives back.
template <class T>
class ErasedStateTensor final : public StateTensor {
 public:
  ErasedStateTensor(std::shared_ptr<void> keep, tshard::detail::ErasedTensor<T> t, const std::type_info& type, void* typed)
      : keep_(std::move(keep)), t_(std::move(t)), type_(&type), typed_(typed) {}

  std::string describe() const override { return t_.describe(); }
  const char* dtype() const override { return dtype_name<T>(); }
  int rank() const override { return t_.spec.rank; }
  std::vector<Eigen::Index> shape() const override {
    return std::vector<Eigen::Index>(t_.shape().begin(), t_.shape().begin() + t_.spec.rank);
  }
  // (.npy has no bfloat16: a bfloat16 tensor is written as the float32 it widens to, exactly,
  // and read back rounded, which gives its values again.)
  void save(io::CheckpointWriter& out, const std::string& name) const override {
    const tshard::detail::ReadableBlock<T> values(t_, "io::CheckpointWriter::add");
    const auto view = values.view();
    if constexpr (std::is_same_v<T, bfloat16>) {
      const auto n = static_cast<std::size_t>(view.layout.padded_size());
      std::vector<float> wide(n);
      for (std::size_t i = 0; i < n; ++i) wide[i] = float(view.data[i]);
      out.add_block(name, tshard::detail::BlockView<float>{view.mesh, view.spec, view.shape, view.layout, wide.data()});
    } else {
      out.add_block(name, view);
    }
  }
  void load(const io::CheckpointReader& in, const std::string& name) override {
    tshard::detail::OperatorScope scope("io::load_npy");
    if constexpr (std::is_same_v<T, bfloat16>) {
      auto wide = in.load_block<float>(*t_.mesh, t_.spec, name);
      require_shape(wide.shape, name, "the checkpoint's");
      const auto layout = tshard::detail::shard_layout(t_.spec, wide.shape, t_.mesh->shape(), t_.mesh->coords());
      auto narrow = tshard::detail::pooled_array<T>(static_cast<std::size_t>(layout.padded_size()));
      for (Eigen::Index i = 0; i < layout.padded_size(); ++i) narrow.get()[i] = bfloat16(wide.data.get()[i]);
      adopt(wide.shape, std::move(narrow));
    } else {
      auto block = in.load_block<T>(*t_.mesh, t_.spec, name);
      require_shape(block.shape, name, "the checkpoint's");
      adopt(block.shape, std::move(block.data));
    }
  }
  void load(io::SafetensorsReader& in, const std::string& name) override {
    tshard::detail::OperatorScope scope("io::load_safetensors");
    std::vector<std::int64_t> expect(t_.shape().begin(), t_.shape().begin() + t_.spec.rank);
    auto block = in.load_block<T>(*t_.mesh, t_.spec, name, expect);
    adopt(block.shape, std::move(block.data));
  }
  io::NamedTensor named(const std::string& name) const override { return io::NamedTensor(name, t_, "", keep_); }
  std::vector<double> values() const override {
    const tshard::detail::ReadableBlock<T> readable(t_, "nn::StateTensor::values");
    return global_values(readable.view());
  }
  void set_values(const std::vector<double>& global) override {
    if (Eigen::Index(global.size()) != tshard::detail::volume(t_.shape(), t_.spec.rank))
      throw ShapeError("tshard::nn::StateTensor::set_values: " + std::to_string(global.size()) + " values for " + describe());
    tshard::detail::TensorAccess::acquire_block(*t_.block, false);
    set_block_values(t_.layout(), t_.shape(), tshard::detail::TensorAccess::block_data(*t_.block), global);
  }
  void assign(const StateTensor& from, const std::string& name = "") override {
    auto moved = aligned_source<T>(from, *this, name, *t_.mesh, t_.spec, t_.shape());
    tshard::detail::TensorAccess::acquire_block(*t_.block, false);
    std::copy(moved.data, moved.data + t_.layout().padded_size(), tshard::detail::TensorAccess::block_data(*t_.block));
  }
  const std::type_info& element() const override { return typeid(T); }
  const void* block(tshard::detail::SpecDesc& desc, tshard::detail::Extents& extents, const void*& mesh) const override {
    desc = t_.spec;
    extents = t_.shape();
    mesh = t_.mesh.get();
    if (!tshard::detail::TensorAccess::has_block_storage(*t_.block) && t_.layout().padded_size() > 0)
      tshard::detail::throw_released("local", describe());
    return tshard::detail::TensorAccess::block_values(*t_.block);
  }

 protected:
  void* typed(const std::type_info& type) override { return type == *type_ ? typed_ : nullptr; }

 private:
  // A file's tensor of another shape than this one is an IoError, not a parameter that changed shape.
  void require_shape(const tshard::detail::Extents& got, const std::string& name, const char* whose) const {
    if (got != t_.shape())
      throw IoError("tshard::nn: \"" + name + "\": " + whose + " tensor is " + tshard::detail::shape_to_string(got, t_.spec.rank) +
                    ", the model's " + describe());
  }
  void adopt(const tshard::detail::Extents& shape, std::shared_ptr<T> storage) {
    tshard::detail::TensorAccess::adopt_block_storage(*t_.block, shape, std::move(storage), t_.spec, *t_.mesh);
  }

  std::shared_ptr<void> keep_;
  tshard::detail::ErasedTensor<T> t_;
  const std::type_info* type_;
  void* typed_;
};

template <class T, class M, class S>
std::shared_ptr<StateTensor> state_of_tensor(std::shared_ptr<ShardedTensor<T, M, S>> t) {
  static_assert(S::rank >= 1, "tshard: a module's parameters and buffers have rank 1 or more (files hold no rank-0 tensors): "
                              "register a scalar as a tensor of shape {1}");
  auto erased = tshard::detail::erased(*t);
  void* typed = t.get();
  return std::make_shared<ErasedStateTensor<T>>(std::move(t), std::move(erased), typeid(ShardedTensor<T, M, S>), typed);
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
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(class ErasedStateTensor<T>)
TSHARD_FOR_EACH_NUMBER(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::nn::detail
