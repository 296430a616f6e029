// Hugging Face safetensors files, in parallel: each rank writes and reads only its own block of
// each tensor through MPI-IO at the right offsets, as with .npy; no rank gathers a tensor.
//
//   ts::io::save_safetensors("model.safetensors", {{"wte", wte}, {"lm_head", head}});
//   auto w = ts::io::load_safetensors<float, ts::Spec<ts::S<"model">, ts::R>>(mesh, "model.safetensors", "wte");
//   ts::io::SafetensorsReader in(mesh.comm(), "llama/");   // a file, an index .json or a directory
//   auto q = in.load<float, ts::Spec<ts::R, ts::S<"model">>>(mesh, "q_proj.weight", {2048, 2048});
//
// The file holds the global tensor in C order, as numpy and PyTorch give it: a[i, j] == x(i, j).
// Reading converts F32, F64, BF16 and F16 to float or double (I32 and I64 to int32 or int64);
// writing keeps the tensor's type. A model split over files (model.safetensors.index.json and
// its weight_map) reads as one. A missing file or tensor, another shape, a dtype that does not
// convert or a malformed or truncated file is an IoError on every rank naming the file and
// tensor. A save is atomic: written to PATH.tmp and renamed once every rank has written.
#pragma once
#include <algorithm>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tshard/comm/file.hpp"
#include "tshard/comm/text.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/io/blocks.hpp"
#include "tshard/io/checkpoint.hpp"
#include "tshard/io/safetensors_format.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::io::detail {
template <>
inline constexpr const char* other_safetensors_dtype<bfloat16> = "BF16";
}  // namespace tshard::io::detail

namespace tshard::io {
namespace detail {

// A rank's valid box in C order, described for MPI-IO.
inline tshard::detail::FileBox c_order_box(int rank, const tshard::detail::Extents& global,
                                           const tshard::detail::ShardLayout& layout) {
  return tshard::detail::FileBox{rank, global, layout.offset, layout.valid, layout.padded, false};
}

// Reads this rank's box of `e` (dtype S on file) and converts it to T, in C order.
template <class T, class S, class Convert>
void read_converted(tshard::detail::ParallelFile& file, MPI_Offset at, const tshard::detail::FileBox& box, bool mine,
                    T* c_order, Convert convert) {
  const auto n = static_cast<std::size_t>(std::max<tshard::detail::Index>(box.elements(), 1));
  tshard::detail::Scratch<S> raw(n);
  file.read_box(at, box, raw.data(), mine);
  if (mine)
    for (std::size_t i = 0; i < std::size_t(box.elements()); ++i) c_order[i] = convert(raw.data()[i]);
}

}  // namespace detail

// A tensor to save under a name: any ShardedTensor (a partial is resolved), referenced until the
// save returns; stored as its own dtype, or a real one as `stored` ("F64", "F32", "BF16" or "F16",
// rounded to nearest even as PyTorch converts).
class NamedTensor {
 public:
  template <ShardedTensorType X>
  NamedTensor(std::string name, const X& x_in, std::string stored = "") : name_(std::move(name)) {
    static_assert(X::rank >= 1, "tshard: safetensors holds tensors of rank 1 or more here");
    dtype_ = checked_dtype<typename X::Scalar>(name_, std::move(stored));
    const X* x = &x_in;
    if constexpr (X::is_partial) {
      auto resolved = std::make_shared<decltype(tshard::detail::resolved(x_in, "io::save_safetensors"))>(
          tshard::detail::resolved(x_in, "io::save_safetensors"));
      keep_ = resolved;
      x = nullptr;
      write_ = [resolved, d = dtype_](tshard::detail::ParallelFile& file, MPI_Offset at) { write_block(*resolved, file, at, d); };
    }
    comm_ = x_in.mesh().comm();
    for (int d = 0; d < X::rank; ++d) shape_.push_back(tshard::detail::extents_of(x_in)[d]);
    if (x) write_ = [x, d = dtype_](tshard::detail::ParallelFile& file, MPI_Offset at) { write_block(*x, file, at, d); };
  }

  // The same for an erased tensor (a state dict's entry); `keep` keeps it alive until written.
  template <class T>
  NamedTensor(std::string name, const tshard::detail::ErasedTensor<T>& x, std::string stored = "",
              std::shared_ptr<void> keep = nullptr)
      : name_(std::move(name)), keep_(std::move(keep)) {
    if (x.spec.rank < 1) throw SpecError("tshard::io::NamedTensor: \"" + name_ + "\" has rank 0: safetensors holds tensors of rank 1 or more here");
    dtype_ = checked_dtype<T>(name_, std::move(stored));
    comm_ = x.mesh->comm();
    for (int d = 0; d < x.spec.rank; ++d) shape_.push_back(x.shape()[d]);
    write_ = [x, d = dtype_](tshard::detail::ParallelFile& file, MPI_Offset at) {
      const tshard::detail::ReadableBlock<T> values(x, "io::save_safetensors");  // a released ZeRO-3 parameter: gathered back
      write_view(values.view(), file, at, d);
    };
  }

  const std::string& name() const { return name_; }
  const std::string& dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  MPI_Comm comm() const { return comm_; }
  // Collective over the file's communicator: writes this rank's block at byte `at`.
  void write(tshard::detail::ParallelFile& file, MPI_Offset at) const { write_(file, at); }

 private:
  // `stored`, or T's own dtype where it is empty; IoError where T's elements cannot be stored so.
  template <class T>
  static std::string checked_dtype(const std::string& name, std::string stored) {
    std::string dtype = stored.empty() ? std::string(io::detail::safetensors_dtype<T>()) : std::move(stored);
    if (dtype != io::detail::safetensors_dtype<T>() &&
        !(is_real_floating_v<T> && (dtype == "F64" || dtype == "F32" || dtype == "BF16" || dtype == "F16")))
      throw IoError("tshard::io::NamedTensor: \"" + name + "\" cannot be stored as " + dtype + " (its elements are " +
                    io::detail::safetensors_dtype<T>() + ")");
    return dtype;
  }
  template <class X>
  static void write_block(const X& x_in, tshard::detail::ParallelFile& file, MPI_Offset at, const std::string& stored) {
    const tshard::detail::Readable values(x_in, "io::save_safetensors");  // a released ZeRO-3 parameter: gathered back
    write_view(tshard::detail::block_view(*values), file, at, stored);
  }
  template <class T>
  static void write_view(const tshard::detail::BlockView<T>& x, tshard::detail::ParallelFile& file, MPI_Offset at,
                         const std::string& stored) {
    const auto& layout = x.layout;
    const bool mine = io::detail::first_replica(x.mesh, x.spec, layout);
    tshard::detail::Scratch<T> c_order(static_cast<std::size_t>(std::max<tshard::detail::Index>(layout.valid_size(), 1)));
    if (mine) io::detail::pack_c_order(x.data, layout, c_order.data());
    const auto box = io::detail::c_order_box(x.spec.rank, x.shape, layout);
    if constexpr (is_real_floating_v<T>) {
      if (stored != io::detail::safetensors_dtype<T>())
        return write_converted(file, at, box, c_order.data(), std::size_t(std::max<tshard::detail::Index>(layout.valid_size(), 1)), mine, stored);
    }
    file.write_box(at, box, c_order.data(), mine);
  }
  // Elements converted to `stored` and written (16-bit dtypes move as their bits).
  template <class T>
  static void write_converted(tshard::detail::ParallelFile& file, MPI_Offset at, const tshard::detail::FileBox& box, const T* v,
                              std::size_t n, bool mine, const std::string& stored) {
    auto write_as = [&](auto convert) {
      using E = decltype(convert(T()));
      tshard::detail::Scratch<E> out(n);
      if (mine) std::transform(v, v + n, out.data(), convert);
      file.write_box(at, box, out.data(), mine);
    };
    if (stored == "F64") write_as([](T e) { return double(e); });
    else if (stored == "F32") write_as([](T e) { return float(e); });
    else if (stored == "BF16") write_as([](T e) { return Eigen::numext::bit_cast<bfloat16>(io::detail::float_to_bfloat16(float(e))); });
    else write_as([](T e) { return Eigen::numext::bit_cast<bfloat16>(io::detail::float_to_float16(float(e))); });  // F16's bits
  }

  std::string name_, dtype_;
  std::vector<std::int64_t> shape_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::shared_ptr<void> keep_;
  std::function<void(tshard::detail::ParallelFile&, MPI_Offset)> write_;
};

// Writes the tensors into one safetensors file; collective over comm. Ranks may list different
// tensors (a pipeline stage its own layers, on its own mesh): the file holds the union, in the
// order of the ranks that list them first; every rank that lists a tensor lists it alike.
void save_safetensors(MPI_Comm comm, const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// All tensors on one mesh (or meshes of one communicator): the first tensor's.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The tensors of a safetensors file, or of a model split over files; collective over comm.
class SafetensorsReader {
 public:
  // path: a .safetensors file, an index (.json with a weight_map), or a directory holding
  // model.safetensors.index.json or model.safetensors.
  SafetensorsReader(MPI_Comm comm, const std::string& path);

  bool contains(const std::string& name) const { return owner_.count(name) != 0; }
  std::vector<std::string> names() const;
  const std::vector<std::int64_t>& shape(const std::string& name) const { return entry(name).shape; }
  const std::string& dtype(const std::string& name) const { return entry(name).dtype; }
  // The first file's __metadata__.
  const std::map<std::string, std::string>& metadata() const { return files_.front().header.metadata; }

  // The tensor `name` with the given spec on mesh (which spans the reader's ranks), converted to
  // T; where `expected` is given, another shape is an IoError.
  template <class T, class SpecT, MeshType M>
  ShardedTensor<T, M, SpecT> load(const M& mesh, const std::string& name, const std::vector<std::int64_t>& expected = {}) {
    using Out = ShardedTensor<T, M, SpecT>;
    static_assert(Out::rank >= 1, "tshard: load_safetensors reads tensors of rank 1 or more");
    tshard::detail::OperatorScope scope("io::load_safetensors");
    return tshard::detail::adopt_block<Out>(mesh, load_block<T>(*tshard::detail::state_of(mesh), Out::spec_desc, name, expected));
  }

  // load on descriptors, per element type.
  template <class T>
  tshard::detail::LoadedBlock<T> load_block(tshard::detail::MeshState& mesh, const tshard::detail::SpecDesc& spec,
                                            const std::string& name, const std::vector<std::int64_t>& expected) {
    const int rank = spec.rank;
    const auto& e = entry(name);
    File& f = files_[owner_.at(name)];
    const std::string of = "tshard::io::load_safetensors: \"" + name + "\" in '" + f.path + "'";
    if (int(e.shape.size()) != rank)
      throw IoError(of + " has rank " + std::to_string(e.shape.size()) + ", not the rank " + std::to_string(rank) + " asked for");
    if (!expected.empty() && expected != e.shape)
      throw IoError(of + " has shape " + shape_text(e.shape) + ", not " + shape_text(expected));
    tshard::detail::LoadedBlock<T> out;
    for (int d = 0; d < rank; ++d) out.shape[d] = Eigen::Index(e.shape[std::size_t(d)]);
    const auto layout = tshard::detail::shard_layout(spec, out.shape, mesh.shape(), mesh.coords());
    out.data = tshard::detail::pooled_array<T>(static_cast<std::size_t>(layout.padded_size()));
    const auto box = detail::c_order_box(rank, out.shape, layout);
    const bool mine = layout.valid_size() > 0;
    const MPI_Offset at = MPI_Offset(f.header.data_offset + e.begin);
    tshard::detail::Scratch<T> c_order(static_cast<std::size_t>(std::max<tshard::detail::Index>(layout.valid_size(), 1)));
    auto& file = *f.file;
    if (e.dtype == detail::safetensors_dtype<T>()) {
      file.read_box(at, box, c_order.data(), mine);
    } else if constexpr (is_real_floating_v<T>) {  // (bfloat16 from wider dtypes rounds once)
      if (e.dtype == "F32") detail::read_converted<T, float>(file, at, box, mine, c_order.data(), [](float v) { return T(v); });
      else if (e.dtype == "F64") detail::read_converted<T, double>(file, at, box, mine, c_order.data(), [](double v) { return T(v); });
      else if (e.dtype == "BF16")
        detail::read_converted<T, std::uint16_t>(file, at, box, mine, c_order.data(),
                                                 [](std::uint16_t v) { return T(detail::bfloat16_to_float(v)); });
      else if (e.dtype == "F16")
        detail::read_converted<T, std::uint16_t>(file, at, box, mine, c_order.data(),
                                                 [](std::uint16_t v) { return T(detail::float16_to_float(v)); });
      else throw IoError(of + " holds dtype " + e.dtype + ", which does not convert to " + detail::safetensors_dtype<T>());
    } else {
      if (e.dtype == "I32")
        detail::read_converted<T, std::int32_t>(file, at, box, mine, c_order.data(), [](std::int32_t v) { return T(v); });
      else if (e.dtype == "I64")
        detail::read_converted<T, std::int64_t>(file, at, box, mine, c_order.data(), [](std::int64_t v) { return T(v); });
      else throw IoError(of + " holds dtype " + e.dtype + ", which does not convert to " + detail::safetensors_dtype<T>());
    }
    file.agree_or_throw("reading");
    if (mine) detail::place_c_order(c_order.data(), layout, out.data.get());
    return out;
  }

 private:
  struct File {
    std::string path;
    std::unique_ptr<tshard::detail::ParallelFile> file;
    detail::SafetensorsHeader header;
  };

  static std::string shape_text(const std::vector<std::int64_t>& s);

  // Opens a file and reads its header on the first rank; every rank parses the same bytes.
  void open(const std::string& path);

  const detail::SafetensorsEntry& entry(const std::string& name) const;

  MPI_Comm comm_;
  std::string path_;
  std::vector<File> files_;
  std::map<std::string, std::size_t> owner_;  // tensor -> index in files_
};

// One tensor of a safetensors file (or model directory), collective over mesh.
template <class T, class SpecT, MeshType M>
ShardedTensor<T, M, SpecT> load_safetensors(const M& mesh, const std::string& path, const std::string& name) {
  return SafetensorsReader(mesh.comm(), path).load<T, SpecT>(mesh, name);
}

}  // namespace tshard::io

#if TSHARD_HEADER_BODIES
#include "tshard/io/safetensors-inl.hpp"
#endif
