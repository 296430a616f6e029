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
inline void save_safetensors(MPI_Comm comm, const std::string& path, const std::vector<NamedTensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
  tshard::detail::OperatorScope scope("io::save_safetensors");
  // What every rank has: name, dtype and shape, one line each, gathered in rank order.
  std::string mine;
  for (const auto& t : tensors) {
    mine += t.name() + '\t' + t.dtype();
    for (auto d : t.shape()) mine += '\t' + std::to_string(d);
    mine += '\n';
  }
  const std::string all = tshard::detail::gather_text(comm, mine);
  std::vector<detail::SafetensorsEntry> entries;
  std::map<std::string, std::size_t> index;
  std::string problem;
  for (std::size_t at = 0; at < all.size();) {
    const std::size_t end = all.find('\n', at);
    std::vector<std::string> fields;
    for (std::size_t f = at; f <= end;) {
      const std::size_t tab = std::min(all.find('\t', f), end);
      fields.push_back(all.substr(f, tab - f));
      f = tab + 1;
    }
    at = end + 1;
    detail::SafetensorsEntry e;
    e.name = fields[0];
    e.dtype = fields[1];
    for (std::size_t f = 2; f < fields.size(); ++f) e.shape.push_back(std::stoll(fields[f]));
    if (auto it = index.find(e.name); it != index.end()) {
      const auto& seen = entries[it->second];
      if (seen.dtype != e.dtype || seen.shape != e.shape)
        problem = "the tensor \"" + e.name + "\" is listed with two shapes or dtypes";
      continue;
    }
    index[e.name] = entries.size();
    entries.push_back(std::move(e));
  }
  for (std::size_t i = 0; i < tensors.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (tensors[i].name() == tensors[j].name()) problem = "the tensor \"" + tensors[i].name() + "\" is listed twice";
  if (!problem.empty() || !tshard::agree(problem.empty(), comm)) {
    if (problem.empty()) problem = "another rank lists a tensor twice";
    throw IoError("tshard::io::save_safetensors: '" + path + "': " + problem);
  }
  // Laid out as the safetensors library lays a file out (and so byte for byte as transformers'
  // save_pretrained writes the same tensors): by dtype, widest first, then by name.
  std::stable_sort(entries.begin(), entries.end(), [](const detail::SafetensorsEntry& a, const detail::SafetensorsEntry& b) {
    const int ra = detail::safetensors_dtype_order(a.dtype), rb = detail::safetensors_dtype_order(b.dtype);
    return ra != rb ? ra > rb : a.name < b.name;
  });
  std::int64_t offset = 0;
  for (auto& e : entries) {
    e.begin = offset;
    e.end = offset = offset + e.elements() * detail::safetensors_itemsize(e.dtype);
  }
  const std::string header = detail::safetensors_header(entries, metadata);
  const std::string tmp = path + ".tmp";
  {
    tshard::detail::ParallelFile file(comm, tmp, tshard::detail::ParallelFile::Mode::Write, "tshard::io::save_safetensors");
    file.set_size(MPI_Offset(header.size()) + offset);
    if (tshard::detail::comm_rank(comm) == 0) file.write_at(0, header.data(), tshard::detail::Index(header.size()));
    for (const auto& e : entries) {
      const NamedTensor* t = nullptr;
      for (const auto& candidate : tensors)
        if (candidate.name() == e.name) t = &candidate;
      const MPI_Offset at = MPI_Offset(header.size()) + e.begin;
      if (t) {
        t->write(file, at);
      } else {  // another stage's tensor: this rank takes part in the collective write, with nothing
        const tshard::detail::FileBox nothing{1, {1}, {0}, {0}, {1}, false};
        file.write_box<float>(at, nothing, nullptr, false);
      }
    }
    file.agree_or_throw("writing");
  }
  detail::on_first_rank(comm, "finishing '" + path + "'", [&] {
    if (!detail::sync_path(tmp, false)) throw std::runtime_error("cannot fsync " + tmp);
    std::filesystem::rename(tmp, path);
  });
}

// All tensors on one mesh (or meshes of one communicator): the first tensor's.
inline void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
  if (tensors.empty()) throw IoError("tshard::io::save_safetensors: '" + path + "': no tensors (and so no communicator) given");
  save_safetensors(tensors.front().comm(), path, tensors, metadata);
}

// The tensors of a safetensors file, or of a model split over files; collective over comm.
class SafetensorsReader {
 public:
  // path: a .safetensors file, an index (.json with a weight_map), or a directory holding
  // model.safetensors.index.json or model.safetensors.
  SafetensorsReader(MPI_Comm comm, const std::string& path) : comm_(comm), path_(path) {
    namespace fs = std::filesystem;
    std::string target = path;
    const std::string kind = tshard::detail::broadcast_text(comm, [&] {
      if (tshard::detail::comm_rank(comm) != 0) return std::string();
      std::error_code ec;
      if (fs::is_directory(path, ec)) {
        if (fs::exists(fs::path(path) / "model.safetensors.index.json", ec)) return std::string("dir-index");
        return std::string("dir-file");
      }
      return path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0 ? std::string("index") : std::string("file");
    }());
    if (kind == "dir-index") target = (fs::path(path) / "model.safetensors.index.json").string();
    if (kind == "dir-file") target = (fs::path(path) / "model.safetensors").string();
    if (kind == "dir-index" || kind == "index") {
      std::vector<char> text;
      {
        tshard::detail::ParallelFile index(comm, target, tshard::detail::ParallelFile::Mode::Read,
                                           "tshard::io::SafetensorsReader");
        const MPI_Offset size = index.size();
        text = index.read_everywhere(0, tshard::detail::Index(size));
      }
      const auto map = detail::parse_safetensors_index(text.data(), text.size(), target);
      const fs::path base = fs::path(target).parent_path();
      std::map<std::string, std::size_t> opened;
      for (const auto& [name, file] : map) {
        auto [it, fresh] = opened.emplace(file, files_.size());
        if (fresh) open((base / file).string());
        owner_[name] = it->second;
      }
      for (const auto& [name, f] : owner_)
        if (!files_[f].header.find(name))
          throw IoError("tshard::io::SafetensorsReader: '" + target + "' maps \"" + name + "\" to '" + files_[f].path +
                        "', which does not hold it");
    } else {
      open(target);
      for (const auto& e : files_[0].header.tensors) owner_[e.name] = 0;
    }
  }

  bool contains(const std::string& name) const { return owner_.count(name) != 0; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, f] : owner_) out.push_back(name);
    return out;
  }
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

  static std::string shape_text(const std::vector<std::int64_t>& s) {
    std::string out = "[";
    for (std::size_t d = 0; d < s.size(); ++d) out += (d ? ", " : "") + std::to_string(s[d]);
    return out + "]";
  }

  // Opens a file and reads its header on the first rank; every rank parses the same bytes.
  void open(const std::string& path) {
    File f;
    f.path = path;
    f.file = std::make_unique<tshard::detail::ParallelFile>(comm_, path, tshard::detail::ParallelFile::Mode::Read,
                                                            "tshard::io::SafetensorsReader");
    const MPI_Offset size = f.file->size();
    std::vector<char> head = f.file->read_everywhere(0, 8);
    std::int64_t len = 0;
    if (head.size() == 8) {
      std::uint64_t u = 0;
      for (int b = 0; b < 8; ++b) u |= std::uint64_t(static_cast<unsigned char>(head[std::size_t(b)])) << (8 * b);
      len = std::int64_t(std::min<std::uint64_t>(u, std::uint64_t(detail::kMaxSafetensorsHeader) + 1));
    }
    if (len > 0 && 8 + len <= std::int64_t(size)) head = f.file->read_everywhere(0, 8 + len);
    f.header = detail::parse_safetensors_header(head.data(), head.size(), path);
    if (f.header.data_offset + f.header.data_bytes > std::int64_t(size))
      throw IoError("tshard::io: '" + path + "' is truncated: its tensors need " + std::to_string(f.header.data_bytes) +
                    " bytes of data, the file holds " + std::to_string(std::int64_t(size) - f.header.data_offset));
    files_.push_back(std::move(f));
  }

  const detail::SafetensorsEntry& entry(const std::string& name) const {
    auto it = owner_.find(name);
    if (it == owner_.end())
      throw IoError("tshard::io::SafetensorsReader: '" + path_ + "' has no tensor \"" + name + "\"");
    return *files_[it->second].header.find(name);
  }

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
