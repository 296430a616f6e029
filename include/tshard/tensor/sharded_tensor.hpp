// ShardedTensor<T, Mesh, Spec, Partial>: a global tensor split over a mesh as its type says.
// Each rank holds one padded, column-major block in pooled storage; copies are deep, moves cheap.
// `s * x` is kept unevaluated (x's buffer, shared, and the factor) so that `w -= lr * g` and
// `a + s * b` run in one pass; any other read evaluates it, and a write to a buffer that an
// unevaluated tensor shares copies it first, so values behave as if every copy were deep.
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>

#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/datatype.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/core/shard.hpp"
#include "tshard/core/spec.hpp"
#include "tshard/core/spec_descriptor.hpp"
#include "tshard/tensor/gather.hpp"

namespace tshard {

namespace detail {
struct AdoptStorage {};  // tag: construct around existing storage
// Fills a released tensor's padded block with its values (see ShardedTensor::restore_).
template <class T>
using RestoreValues = std::function<void(T* block)>;
struct TensorAccess;     // the ops' access to storage and to an unevaluated factor
class GradNode;          // a tensor's place on the tape of a gradient (tensor/tape.hpp)

template <int Rank>
std::array<Eigen::Index, Rank> to_array(const Extents& e) {
  std::array<Eigen::Index, Rank> a{};
  for (int d = 0; d < Rank; ++d) a[d] = e[d];
  return a;
}
template <std::size_t N>
Extents to_extents(const std::array<Eigen::Index, N>& a) {
  Extents e{};
  for (std::size_t d = 0; d < N; ++d) e[d] = a[d];
  return e;
}
}  // namespace detail

namespace detail {
// "[7, 5] {x, R}": a tensor's shape and spec, for error messages.
[[gnu::noinline]] inline std::string describe_tensor(const Extents& shape, const SpecDesc& spec, const MeshShape& mesh) {
  return shape_to_string(shape, spec.rank) + " " + spec.to_string(mesh);
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_released(const char* op, const std::string& what) {
  throw SpecError(std::string("tshard::ShardedTensor::") + op + ": " + what +
                  " holds no values: ZeRO-3 released this parameter after its layer's use "
                  "(opt.gather_parameters() brings every parameter back)");
}

// What a ShardedTensor holds apart from its mesh, and the member functions that need no more
// than its element type: compiled once per T, not once per (mesh, spec, partial) type, which is
// what a model instantiates dozens of.
template <class T>
class TensorBlock {
  friend struct TensorAccess;

 protected:
  TensorBlock() = default;
  // A block of the given global shape in pooled storage (contents unspecified).
  [[gnu::noinline]] TensorBlock(const Extents& shape, const SpecDesc& spec, const MeshState& mesh) : shape_(shape) {
    layout_ = shard_layout(spec, shape_, mesh.shape(), mesh.coords());
    data_ = pooled_array<T>(static_cast<std::size_t>(layout_.padded_size()));
  }
  // Around existing storage (null: a tensor with no values yet, as the tape's shapes are).
  [[gnu::noinline]] TensorBlock(const Extents& shape, const SpecDesc& spec, const MeshState& mesh,
                                std::shared_ptr<T> storage)
      : shape_(shape), data_(std::move(storage)) {
    layout_ = shard_layout(spec, shape_, mesh.shape(), mesh.coords());
  }
  // Deep: the same value in a buffer of its own, on the same place of the tape.
  [[gnu::noinline]] TensorBlock(const TensorBlock& o)
      : shape_(o.shape_), layout_(o.layout_), node_(o.node_) {
    data_ = pooled_array<T>(static_cast<std::size_t>(layout_.padded_size()));
    if (layout_.padded_size() && o.data_)
      std::memcpy(data_.get(), o.data(), sizeof(T) * static_cast<std::size_t>(layout_.padded_size()));
  }
  TensorBlock(TensorBlock&&) noexcept = default;
  TensorBlock& operator=(TensorBlock&&) noexcept = default;
  TensorBlock& operator=(const TensorBlock&) = delete;
  ~TensorBlock() = default;

  const T* data() const {
    evaluate();
    return data_.get();
  }
  T* data() {
    own();
    return data_.get();
  }
  // A parameter ZeRO-3 released between its layer's uses holds no buffer (on every rank alike).
  bool released() const { return !data_ && layout_.padded_size() > 0; }

  // An unevaluated `scale_ * x` becomes a buffer of its own (once, on first read).
  void evaluate() const {
    if (scaled_) evaluate_now();
  }
  // Before a write: a buffer shared with an unevaluated tensor is copied, so that one keeps
  // the value it was made from.
  void own() {
    if (scaled_ || data_.use_count() > 1) own_now();
  }

  Extents shape_{};
  ShardLayout layout_{};
  mutable std::shared_ptr<T> data_;
  mutable T scale_{1};          // the value is scale_ * data_ while scaled_
  mutable bool scaled_ = false;
  std::shared_ptr<GradNode> node_;  // set only while a gradient is taken of this value (ts::ad)
  // While the buffer is released (ZeRO-3): how its values are gathered back from the chunks their
  // owners hold (writes padded_size() elements; collective over the owners' group).
  std::shared_ptr<const RestoreValues<T>> restore_;

 private:
  [[gnu::noinline]] void evaluate_now() const {
    const std::size_t n = static_cast<std::size_t>(layout_.padded_size());
    auto fresh = pooled_array<T>(n);
    const T* src = data_.get();
    T* dst = fresh.get();
    for (std::size_t i = 0; i < n; ++i) dst[i] = scale_ * src[i];
    data_ = std::move(fresh);
    scaled_ = false;
  }
  [[gnu::noinline]] void own_now() {
    evaluate();
    if (data_.use_count() > 1) {
      auto fresh = pooled_array<T>(static_cast<std::size_t>(layout_.padded_size()));
      if (layout_.padded_size())
        std::memcpy(fresh.get(), data_.get(), sizeof(T) * static_cast<std::size_t>(layout_.padded_size()));
      data_ = std::move(fresh);
    }
  }
};

// Always false: its arguments name the two types in a refused conversion's error.
template <class Held, class Wanted>
struct spec_mismatch : std::false_type {};
// What a public entry point returns once one of its static_asserts has failed: never runs; it
// lets the compiler stop at the sentence instead of reporting the body's follow-on errors.
template <class Out>
Out refused() {
  return *static_cast<Out*>(nullptr);
}
}  // namespace detail

template <class T, class M, class SpecT, class P = NoPartial>
class ShardedTensor : private detail::TensorBlock<T> {
  using Block = detail::TensorBlock<T>;
  using Block::data_, Block::layout_, Block::shape_, Block::node_, Block::scale_, Block::scaled_, Block::restore_;
  using Block::evaluate, Block::own;

  static_assert(Element<T>, "tshard: element types are float, double, std::complex<float/double>, int32_t, int64_t and bool (masks)");
  static_assert(MeshType<M>, "tshard: the second argument of ShardedTensor is a tshard::Mesh<...>");
  static_assert(detail::is_spec<SpecT>::value, "tshard: the third argument of ShardedTensor is a tshard::Spec<...>");
  static_assert(detail::is_partial_marker<P>::value,
                "tshard: the fourth argument of ShardedTensor is NoPartial or a Partial<...> marker");
  static_assert(detail::spec_traits<SpecT>::axes_known(M::axis_names),
                "tshard: a spec names an axis that is not an axis of this mesh");
  static_assert(detail::names_unique(detail::spec_traits<SpecT>::all_names()),
                "tshard: a spec uses the same mesh axis twice");
  static_assert(detail::names_known(M::axis_names, P::names),
                "tshard: a partial marker names an axis that is not an axis of this mesh");
  static_assert(detail::names_unique(P::names), "tshard: a partial marker names the same axis twice");
  static_assert(detail::names_disjoint(detail::spec_traits<SpecT>::all_names(), P::names),
                "tshard: a mesh axis is never both split and partial in one tensor");
  static_assert(SpecT::rank <= detail::kMaxRank, "tshard: tensors have at most 8 dims");
  static_assert(!(std::is_same_v<T, bool> && P::is_partial), "tshard: masks (bool tensors) are never partial");
  static_assert(!(is_complex_v<T> && P::is_partial && detail::partial_kind<P>() != detail::PartialKind::Sum),
                "tshard: complex values have no max or min: only partial sums exist for them");

 public:
  static constexpr int rank = SpecT::rank;
  using Scalar = T;
  using MeshT = M;
  using SpecType = SpecT;
  using PartialType = P;
  using Shape = std::array<Eigen::Index, rank>;
  using LocalMap = Eigen::TensorMap<Eigen::Tensor<T, rank>>;
  using ConstLocalMap = Eigen::TensorMap<const Eigen::Tensor<T, rank>>;
  static constexpr bool is_partial = P::is_partial;
  // The run-time descriptor every planner and kernel works on.
  static constexpr detail::SpecDesc spec_desc = detail::make_desc<SpecT, P>(M::axis_names);

  // A tensor of the given global shape; its contents are unspecified (see zeros()).
  ShardedTensor(const M& mesh, const Shape& global_shape)
      : Block(detail::to_extents(global_shape), spec_desc, *detail::state_of(mesh)), mesh_(mesh) {}
  // Around existing storage of at least the padded local size (from_local, factories).
  ShardedTensor(detail::AdoptStorage, const M& mesh, const Shape& global_shape, std::shared_ptr<T> storage)
      : Block(detail::to_extents(global_shape), spec_desc, *detail::state_of(mesh), std::move(storage)), mesh_(mesh) {}

  // A copy is the same value: it keeps its place on the tape of a gradient being taken. A
  // parameter ZeRO-3 released has no value here to copy: that is the SpecError gather() gives.
  ShardedTensor(const ShardedTensor& o) : Block((o.require_values("copy"), static_cast<const Block&>(o))), mesh_(o.mesh_) {}
  ShardedTensor& operator=(const ShardedTensor& o) {
    if (this != &o) *this = ShardedTensor(o);
    return *this;
  }
  ShardedTensor(ShardedTensor&&) noexcept = default;
  ShardedTensor& operator=(ShardedTensor&&) noexcept = default;

  // A tensor of another spec, element type or mesh is another type: converting or assigning one
  // is a compile-time error that says so (and names ts::reshard), not a list of candidates.
  template <class T2, class M2, class S2, class P2>
  ShardedTensor(const ShardedTensor<T2, M2, S2, P2>&) : ShardedTensor(refuse_conversion<ShardedTensor<T2, M2, S2, P2>>()) {}
  template <class T2, class M2, class S2, class P2>
  ShardedTensor& operator=(const ShardedTensor<T2, M2, S2, P2>&) {
    refuse_conversion<ShardedTensor<T2, M2, S2, P2>>();
    return *this;
  }

  const M& mesh() const { return mesh_; }
  Shape global_shape() const { return detail::to_array<rank>(shape_); }
  // Valid extent of this rank's block (0 where the shard is empty).
  Shape local_shape() const { return detail::to_array<rank>(layout_.valid); }
  // Global index of this rank's first element.
  Shape local_offset() const { return detail::to_array<rank>(layout_.offset); }
  // Extent of the local buffer: ceil(N/k) along split dims, identical on every rank.
  Shape padded_shape() const { return detail::to_array<rank>(layout_.padded); }

  // The local (padded) buffer; elements beyond local_shape() are padding, unspecified, so
  // local().sum() counts them: local_valid() is the valid block alone.
  LocalMap local() {
    require_values("local");
    return LocalMap(data(), padded_shape());
  }
  ConstLocalMap local() const {
    require_values("local");
    return ConstLocalMap(data(), padded_shape());
  }
  // The valid block of local() as an Eigen expression (readable, and writable where non-const):
  // x.local_valid().sum() sums this rank's elements, never padding.
  auto local_valid() { return local().slice(Shape{}, local_shape()); }
  auto local_valid() const { return local().slice(Shape{}, local_shape()); }
  using Block::data;
  // Elements of the local (padded) buffer: the product of padded_shape().
  Eigen::Index padded_size() const { return layout_.padded_size(); }
  [[deprecated("tshard: local_size() counted the padded buffer; call padded_size()")]]
  Eigen::Index local_size() const { return padded_size(); }

  // The global value on every rank; a partial is resolved first.
  Eigen::Tensor<T, rank> gather() const {
    require_values("gather");
    Eigen::Tensor<T, rank> out(global_shape());
    detail::OperatorScope scope("gather");
    detail::gather_to_all(*detail::state_of(mesh_), spec_desc, shape_, data(), out.data());
    return out;
  }
  // The global value on mesh rank `root`; other ranks get an empty (all-zero extents) tensor.
  Eigen::Tensor<T, rank> gather(int root) const {
    require_values("gather");
    Eigen::Tensor<T, rank> out;
    if (mesh_.rank() == root) out.resize(global_shape());
    detail::OperatorScope scope("gather");
    detail::gather_to_root(*detail::state_of(mesh_), spec_desc, shape_, data(), out.data(), root);
    return out;
  }
  // Into an existing tensor of the global shape, on every rank (no allocation of the result).
  void gather_into(Eigen::Tensor<T, rank>& out) const {
    require_values("gather_into");
    if (detail::to_extents(std::array<Eigen::Index, rank>(out.dimensions())) != shape_)
      out.resize(global_shape());
    detail::OperatorScope scope("gather");
    detail::gather_to_all(*detail::state_of(mesh_), spec_desc, shape_, data(), out.data());
  }

  // The value of a tensor of no dims (a full reduction such as ts::sum<0, 1, 2>(x)) as a number,
  // the same on every rank; a partial is summed first (one all-reduce of one element). Collective.
  T item() const {
    static_assert(rank == 0, "tshard: item() reads a tensor of no dims: reduce every dim first (ts::sum<0, 1, ...>(x)), "
                             "or take ts::dot(a, b) or ts::norm(x)");
    require_values("item");
    detail::OperatorScope scope("item");
    T v = data()[0];
    detail::resolve_partial_in_place(*detail::state_of(mesh_), spec_desc, &v, 1);
    return v;
  }

  // `double s = ts::sum<0, 1, 2>(u)` is refused with a sentence that names item(): a conversion
  // could not be collective on every rank by accident.
  template <class U>
    requires(rank == 0 && (std::is_arithmetic_v<U> || is_complex_v<U>))
  operator U() const {
    static_assert(detail::spec_mismatch<ShardedTensor, U>::value,
                  "tshard: a tensor of no dims is read as a number with .item() (ts::sum<0, 1, 2>(x).item(); "
                  "collective: every rank calls it and gets the same value), not by conversion");
    return U{};
  }

  // "[7, 5] {x, R}": shape and spec, for error messages.
  std::string describe() const { return detail::describe_tensor(shape_, spec_desc, mesh_.shape()); }

 private:
  friend struct detail::TensorAccess;

  // A parameter ZeRO-3 released between its layer's uses holds no buffer (on every rank alike):
  // reading it is an error that says so, not a read of null. (Writers of files read it through
  // detail::readable(), which gathers it back.)
  void require_values(const char* op) const {
    if (this->released()) detail::throw_released(op, describe());
  }

  // The sentence names the one difference where there is one: a partial sum and a resolved tensor
  // of the same spec differ only in their last template argument, which reads like a spec mismatch.
  template <class Held>
  static const ShardedTensor& refuse_conversion() {
    if constexpr (std::is_same_v<typename Held::Scalar, T> && std::is_same_v<typename Held::MeshT, M> &&
                  std::is_same_v<typename Held::SpecType, SpecT> && Held::is_partial != is_partial)
      static_assert(detail::spec_mismatch<Held, ShardedTensor>::value,
                    "tshard: this converts or assigns between a partial sum and a resolved tensor of the same "
                    "spec (a partial sum's value is still to be summed over a mesh axis, its PartialType: an "
                    "Embedding's lookup or a product over a split dim gives one, and a variable declared from one "
                    "stays one; the two types are spec_mismatch's arguments, held first, wanted second). Resolve "
                    "it where it is made: ts::reshard<Spec>(x) sums it");
    else
      static_assert(detail::spec_mismatch<Held, ShardedTensor>::value,
                    "tshard: a tensor's spec is part of its type, and this converts or assigns a tensor of one "
                    "ShardedTensor type to another (the two are spec_mismatch's arguments, held first, wanted "
                    "second). Redistribute it explicitly: ts::reshard<WantedSpec>(x); a loop whose body changes "
                    "the spec reshards at the end of each pass");
    return *static_cast<const ShardedTensor*>(nullptr);  // never compiled to run: the assertion fails first
  }

  M mesh_;
};

namespace detail {

// A tensor's buffer with the factor its value still carries (1 where it is evaluated).
template <class T>
struct ScaledBuffer {
  const T* data;
  T scale;
  bool scaled;
};

struct TensorAccess {
  // What descriptor code runs on, kept out of the public interface (users have global_shape(),
  // local_shape(), local_offset() and padded_shape()): the global shape as kMaxRank Extents, and
  // this rank's block.
  template <class T, class M, class S, class P>
  static const Extents& extents(const ShardedTensor<T, M, S, P>& x) {
    return x.shape_;
  }
  template <class T, class M, class S, class P>
  static const ShardLayout& layout(const ShardedTensor<T, M, S, P>& x) {
    return x.layout_;
  }
  template <class T, class M, class S, class P>
  static ScaledBuffer<T> buffer(const ShardedTensor<T, M, S, P>& x) {
    return {x.data_.get(), x.scaled_ ? x.scale_ : T(1), x.scaled_};
  }
  // Whether x's buffer is pooled (not a user's memory adopted by from_local) and x its only
  // owner: an expiring x may then be overwritten.
  template <class T, class M, class S, class P>
  static bool owns_pooled_buffer(const ShardedTensor<T, M, S, P>& x) {
    return x.data_ && x.data_.use_count() == 1 && std::get_deleter<PoolDeleter>(x.data_) != nullptr;
  }
  // Whether an expiring x's buffer may hold an elementwise result of x's own layout: pooled,
  // owned by x alone, and no unevaluated factor on it.
  template <class T, class M, class S, class P>
  static bool reusable(const ShardedTensor<T, M, S, P>& x) {
    return owns_pooled_buffer(x) && !x.scaled_;
  }
  // x's buffer taken for another value of its layout (x expires; its node stays behind).
  template <class T, class M, class S, class P>
  static ShardedTensor<T, M, S, P> taken(ShardedTensor<T, M, S, P>&& x) {
    ShardedTensor<T, M, S, P> out(std::move(x));
    out.node_.reset();
    return out;
  }
  // `s * x` taking x's buffer: x expires.
  template <class T, class M, class S, class P>
  static ShardedTensor<T, M, S, P> scaled(ShardedTensor<T, M, S, P>&& x, T s) {
    ShardedTensor<T, M, S, P> out(std::move(x));
    out.node_.reset();  // another value: its operator records a node of its own
    out.scale_ = out.scaled_ ? T(s * out.scale_) : s;
    out.scaled_ = true;
    return out;
  }
  // `s * x` unevaluated: x's buffer shared, factors multiplied.
  template <class T, class M, class S, class P>
  static ShardedTensor<T, M, S, P> scaled(const ShardedTensor<T, M, S, P>& x, T s) {
    ShardedTensor<T, M, S, P> out(AdoptStorage{}, x.mesh_, x.global_shape(), x.data_);
    out.scale_ = x.scaled_ ? T(s * x.scale_) : s;
    out.scaled_ = true;
    return out;
  }
  // The storage of x (evaluated first unless `evaluate` is false: then the buffer without the
  // factor), for a tensor of another type over the same bytes.
  template <class T, class M, class S, class P>
  static std::shared_ptr<T> storage(const ShardedTensor<T, M, S, P>& x, bool evaluate = true) {
    if (evaluate) x.evaluate();
    return x.data_;
  }
  // Parameters and gradients whose memory comes and goes (ZeRO-2 and -3): the buffer is
  // returned to the pool and later acquired again (unspecified contents) or zeroed.
  // The node of x on the tape of a gradient being taken (null: x is not tracked).
  template <class T, class M, class S, class P>
  static const std::shared_ptr<GradNode>& node(const ShardedTensor<T, M, S, P>& x) {
    return x.node_;
  }
  template <class T, class M, class S, class P>
  static void set_node(ShardedTensor<T, M, S, P>& x, std::shared_ptr<GradNode> n) {
    x.node_ = std::move(n);
  }
  template <class T, class M, class S, class P>
  static bool has_storage(const ShardedTensor<T, M, S, P>& x) {
    return has_block_storage(static_cast<const TensorBlock<T>&>(x));
  }
  // `restore`, where given, gathers the values back for a reader that must have them (a writer).
  template <class T, class M, class S, class P>
  static void release_storage(ShardedTensor<T, M, S, P>& x, std::shared_ptr<const RestoreValues<T>> restore = nullptr) {
    release_block(block(x), std::move(restore));
  }
  template <class T, class M, class S, class P>
  static const std::shared_ptr<const RestoreValues<T>>& restore(const ShardedTensor<T, M, S, P>& x) {
    return x.restore_;
  }
  template <class T, class M, class S, class P>
  static void acquire_storage(ShardedTensor<T, M, S, P>& x, bool zeroed) {
    acquire_block(block(x), zeroed);
  }

  // The same on what a tensor holds apart from its mesh, its spec erased (an optimizer's view).
  template <class T, class M, class S, class P>
  static TensorBlock<T>& block(ShardedTensor<T, M, S, P>& x) {
    return x;
  }
  template <class T, class M, class S, class P>
  static const TensorBlock<T>& block(const ShardedTensor<T, M, S, P>& x) {
    return x;
  }
  template <class T>
  static bool has_block_storage(const TensorBlock<T>& x) {
    return bool(x.data_);
  }
  template <class T>
  static T* block_data(TensorBlock<T>& x) {
    return x.data();
  }
  template <class T>
  static void set_block_node(TensorBlock<T>& x, std::shared_ptr<GradNode> n) {
    x.node_ = std::move(n);
  }
  template <class T>
  static const std::shared_ptr<GradNode>& block_node(const TensorBlock<T>& x) {
    return x.node_;
  }
  template <class T>
  static ScaledBuffer<T> block_buffer(const TensorBlock<T>& x) {
    return {x.data_.get(), x.scaled_ ? x.scale_ : T(1), x.scaled_};
  }
  template <class T>
  static bool reusable_block(const TensorBlock<T>& x) {
    return x.data_ && x.data_.use_count() == 1 && std::get_deleter<PoolDeleter>(x.data_) != nullptr && !x.scaled_;
  }
  // x's buffer, evaluated first (as storage()).
  template <class T>
  static std::shared_ptr<T> block_storage(const TensorBlock<T>& x) {
    x.evaluate();
    return x.data_;
  }
  // out (a block of x's layout, no buffer yet) takes x's buffer: x expires, its node with it.
  template <class T>
  static void take_block(TensorBlock<T>& x, TensorBlock<T>& out) {
    out.data_ = std::move(x.data_);
    x.node_.reset();
  }
  // out (a block with no buffer yet) gets a pooled buffer of its layout (contents unspecified).
  template <class T>
  static void allocate_block(TensorBlock<T>& out) {
    out.data_ = pooled_array<T>(static_cast<std::size_t>(out.layout_.padded_size()));
  }
  // out (a block with no buffer yet) holds x's value in another layout whose blocks are x's:
  // `moved` (x's buffer moved into out's layout) or, where null, x's own buffer, shared; an
  // unevaluated factor stays unevaluated (a reshard is linear).
  template <class T>
  static void share_block(const TensorBlock<T>& x, TensorBlock<T>& out, std::shared_ptr<T> moved) {
    out.data_ = moved ? std::move(moved) : x.data_;
    if (x.scaled_) {
      out.scale_ = x.scale_;
      out.scaled_ = true;
    }
  }
  template <class T>
  static const Extents& block_shape(const TensorBlock<T>& x) {
    return x.shape_;
  }
  template <class T>
  static const ShardLayout& block_layout(const TensorBlock<T>& x) {
    return x.layout_;
  }
  template <class T>
  static const T* block_values(const TensorBlock<T>& x) {
    return x.data();
  }
  template <class T>
  static const std::shared_ptr<const RestoreValues<T>>& block_restore(const TensorBlock<T>& x) {
    return x.restore_;
  }
  // x becomes the value descriptor code read (a file's): its global shape and this rank's block
  // of it, as assigning a new tensor of x's type would (untracked, nothing released).
  template <class T>
  static void adopt_block_storage(TensorBlock<T>& x, const Extents& shape, std::shared_ptr<T> storage,
                                  const SpecDesc& spec, const MeshState& mesh) {
    x.shape_ = shape;
    x.layout_ = shard_layout(spec, x.shape_, mesh.shape(), mesh.coords());
    x.data_ = std::move(storage);
    x.scaled_ = false;
    x.node_.reset();
    x.restore_.reset();
  }
  template <class T>
  static void release_block(TensorBlock<T>& x, std::shared_ptr<const RestoreValues<T>> restore = nullptr) {
    x.data_.reset();
    x.scaled_ = false;
    x.restore_ = std::move(restore);
  }
  template <class T>
  static void acquire_block(TensorBlock<T>& x, bool zeroed) {
    x.restore_.reset();
    if (!x.data_) {
      const auto n = static_cast<std::size_t>(x.layout_.padded_size());
      x.data_ = pooled_array<T>(n);
      if (zeroed && n) std::memset(static_cast<void*>(x.data_.get()), 0, n * sizeof(T));
    }
  }
};

template <class X>
const Extents& extents_of(const X& x) {
  return TensorAccess::extents(x);
}
template <class X>
const ShardLayout& layout_of(const X& x) {
  return TensorAccess::layout(x);
}

// What descriptor code reads of a tensor (a file writer, a checksum): its mesh, spec, global
// shape, block and values. Such code is compiled once per element type, not per tensor type.
template <class T>
struct BlockView {
  MeshState& mesh;
  const SpecDesc& spec;
  const Extents& shape;
  const ShardLayout& layout;
  const T* data;
};
template <class X>
BlockView<typename X::Scalar> block_view(const X& x) {
  return {*state_of(x.mesh()), X::spec_desc, TensorAccess::extents(x), TensorAccess::layout(x), x.data()};
}
// A block that descriptor code allocated and filled (a file reader), and its global shape; the
// typed caller adopts it.
template <class T>
struct LoadedBlock {
  Extents shape{};
  std::shared_ptr<T> data;
};
template <class Out>
Out adopt_block(const typename Out::MeshT& mesh, LoadedBlock<typename Out::Scalar>&& b) {
  return Out(AdoptStorage{}, mesh, to_array<Out::rank>(b.shape), std::move(b.data));
}

// A tensor with its type erased down to the element type: what it holds, its mesh's state and its
// spec. Code that needs no more (a state dict's entry, a file writer) takes this and is compiled
// once per element type, not once per tensor type. It refers to the tensor, which outlives it.
template <class T>
struct ErasedTensor {
  TensorBlock<T>* block = nullptr;
  std::shared_ptr<MeshState> mesh;
  SpecDesc spec{};

  const Extents& shape() const { return TensorAccess::block_shape(*block); }
  const ShardLayout& layout() const { return TensorAccess::block_layout(*block); }
  std::string describe() const { return describe_tensor(shape(), spec, mesh->shape()); }
};
template <class T, class M, class S, class P>
ErasedTensor<T> erased(ShardedTensor<T, M, S, P>& x) {
  return {&TensorAccess::block(x), state_of(x.mesh()), x.spec_desc};
}

// x's values for a reader that must see them whatever state x is in (a file writer, a checksum):
// x itself, or, for a parameter ZeRO-3 released, a copy gathered back from the chunks its
// optimizer holds (collective over them: every rank holds x released alike). A tensor released
// with no way back is the SpecError that gather() gives.
// The values of a block whose buffer ZeRO-3 released, gathered back from the chunks that hold
// them (null where the block holds its own, or none); the SpecError that gather() gives where
// nothing holds them. What Readable and ReadableBlock share.
template <class T>
std::shared_ptr<T> restored_values(const TensorBlock<T>& x, const char* op, Text describe) {
  const Index n = TensorAccess::block_layout(x).padded_size();
  if (TensorAccess::has_block_storage(x) || n == 0) return nullptr;
  const auto& restore = TensorAccess::block_restore(x);
  if (!restore)
    throw SpecError(std::string("tshard::") + op + ": " + describe.str() +
                    " holds no values: its buffer was released, and nothing holds them");
  auto block = pooled_array<T>(static_cast<std::size_t>(n));
  (*restore)(block.get());
  return block;
}
template <class X>
class Readable {
 public:
  Readable(const X& x, const char* op) : x_(&x) {
    if (auto block = restored_values(TensorAccess::block(x), op, [&] { return x.describe(); })) {
      copy_.emplace(AdoptStorage{}, x.mesh(), x.global_shape(), std::move(block));
      x_ = &*copy_;
    }
  }
  Readable(const Readable&) = delete;
  Readable& operator=(const Readable&) = delete;
  const X& operator*() const { return *x_; }
  const X* operator->() const { return x_; }

 private:
  const X* x_;
  std::optional<X> copy_;
};
// The same for an erased tensor: view() is its block, or the copy gathered back.
template <class T>
class ReadableBlock {
 public:
  ReadableBlock(const ErasedTensor<T>& x, const char* op)
      : x_(x), copy_(restored_values(*x.block, op, [&] { return x.describe(); })) {}
  ReadableBlock(ErasedTensor<T>&&, const char*) = delete;  // (it refers to x: keep x alive)
  BlockView<T> view() const {
    return {*x_.mesh, x_.spec, x_.shape(), x_.layout(), copy_ ? copy_.get() : TensorAccess::block_values(*x_.block)};
  }

 private:
  const ErasedTensor<T>& x_;
  std::shared_ptr<T> copy_;
};

}  // namespace detail

namespace detail {
template <class X>
struct is_sharded_tensor : std::false_type {};
template <class T, class M, class S, class P>
struct is_sharded_tensor<ShardedTensor<T, M, S, P>> : std::true_type {};

// Why two meshes of the same axes and ranks still differ, for the errors that find them.
inline constexpr const char* kSeparateMeshes =
    " (two Mesh objects constructed separately are two meshes, even of the same axes and ranks: build both"
    " tensors on one Mesh object, whose copies share it, or save and load across meshes)";
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_different_meshes(const char* op, const std::string& a,
                                                                         const MeshShape& ma, const std::string& b,
                                                                         const MeshShape& mb) {
  const std::string hint = ma.describe() == mb.describe() ? std::string(kSeparateMeshes) : std::string();
  throw MeshError(std::string("tshard::") + op + ": the tensors live on different meshes: a is " + a + " on mesh " +
                  ma.describe() + ", b is " + b + " on mesh " + mb.describe() + hint);
}
// MeshError (on every rank alike) when two tensors live on different mesh objects.
template <class A, class B>
void require_same_mesh(const A& a, const B& b, const char* op) {
  if (!(a.mesh() == b.mesh())) [[unlikely]]
    throw_different_meshes(op, a.describe(), a.mesh().shape(), b.describe(), b.mesh().shape());
}
}  // namespace detail

template <class X>
concept ShardedTensorType = detail::is_sharded_tensor<std::remove_cvref_t<X>>::value;

}  // namespace tshard
