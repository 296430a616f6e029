// The definitions of safetensors.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tshard/io/safetensors.hpp"

namespace tshard::io {

TSHARD_FUNC void save_safetensors(MPI_Comm comm, const std::string& path,
                                  const std::vector<NamedTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
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

TSHARD_FUNC void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  if (tensors.empty()) throw IoError("tshard::io::save_safetensors: '" + path + "': no tensors (and so no communicator) given");
  save_safetensors(tensors.front().comm(), path, tensors, metadata);
}

TSHARD_FUNC SafetensorsReader::SafetensorsReader(MPI_Comm comm, const std::string& path)
    : comm_(comm), path_(path) {
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

TSHARD_FUNC std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : owner_) out.push_back(name);
  return out;
}

TSHARD_FUNC std::string SafetensorsReader::shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t d = 0; d < s.size(); ++d) out += (d ? ", " : "") + std::to_string(s[d]);
  return out + "]";
}

TSHARD_FUNC void SafetensorsReader::open(const std::string& path) {
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

TSHARD_FUNC const detail::SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = owner_.find(name);
  if (it == owner_.end())
    throw IoError("tshard::io::SafetensorsReader: '" + path_ + "' has no tensor \"" + name + "\"");
  return *files_[it->second].header.find(name);
}

}  // namespace tshard::io
