// The definitions of checkpoint.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "tshard/io/checkpoint.hpp"

namespace tshard::io {

namespace detail {

TSHARD_FUNC std::string file_name(const std::string& tensor) {
  std::string f = tensor;
  for (char& c : f)
    if (c == '/' || c == '\\' || c == ' ') c = '_';
  return f + ".npy";
}

TSHARD_FUNC bool sync_path(const std::filesystem::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

TSHARD_FUNC void probe_folder(const std::filesystem::path& folder, const std::string& stem) {
  std::filesystem::create_directories(folder);
  const std::filesystem::path probe = folder / ("." + stem + ".probe");
  std::ofstream file(probe);
  file << "probe\n";
  file.close();
  const bool written = !file.fail();
  std::error_code ignored;
  std::filesystem::remove(probe, ignored);
  if (!written) throw std::runtime_error("no file can be created in '" + folder.string() + "'");
}

TSHARD_FUNC std::filesystem::path parent_or_here(const std::filesystem::path& p) {
  return p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
}

}  // namespace detail

TSHARD_FUNC void require_writable(MPI_Comm comm, const std::string& path) {
  detail::on_first_rank(comm, "'" + path + "' cannot be written", [&] {
    std::filesystem::path p = std::filesystem::path(path).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();  // "ckpt/"
    detail::probe_folder(detail::parent_or_here(p), p.filename().string());
  });
}

TSHARD_FUNC void require_writable(MPI_Comm comm, std::initializer_list<std::string> paths) {
  for (const auto& path : paths)
    if (!path.empty()) require_writable(comm, path);
}

TSHARD_FUNC void require_writable_directory(MPI_Comm comm, const std::string& dir) {
  if (dir.empty()) return;
  detail::on_first_rank(comm, "'" + dir + "' cannot be written", [&] {
    std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();
    if (std::filesystem::exists(p) && !std::filesystem::is_directory(p))
      throw std::runtime_error("it exists and is not a folder");
    if (std::filesystem::is_directory(p))
      detail::probe_folder(p, "tshard");
    else
      detail::probe_folder(detail::parent_or_here(p), p.filename().string());
  });
}

TSHARD_FUNC CheckpointWriter::CheckpointWriter(MPI_Comm comm, std::string dir)
    : comm_(comm), dir_(std::move(dir)), tmp_(dir_ + ".tmp") {
  detail::on_first_rank(comm_, "preparing the checkpoint '" + dir_ + "'", [&] {
    std::filesystem::remove_all(tmp_);
    std::filesystem::create_directories(tmp_);
  });
}

TSHARD_FUNC void CheckpointWriter::commit() {
  std::string mine;
  for (auto& [k, v] : tensors_) mine += k + " " + std::to_string(v) + "\n";
  std::istringstream all(tshard::detail::gather_text(comm_, mine));
  for (std::string name, sum; all >> name >> sum;) tensors_[name] = std::stoull(sum);
  detail::on_first_rank(comm_, "committing the checkpoint '" + dir_ + "'", [&] {
    {
      std::ofstream m(tmp_ / "manifest.txt");
      m << "tshard-checkpoint 1\n";
      for (auto& [k, v] : meta_) m << "meta " << k << " " << v << "\n";
      for (auto& [k, v] : tensors_) m << "tensor " << k << " " << v << "\n";
      m << "end\n";
      if (!m) throw std::runtime_error("cannot write the manifest");
    }
    for (auto& entry : std::filesystem::directory_iterator(tmp_))
      if (!detail::sync_path(entry.path(), false)) throw std::runtime_error("cannot fsync " + entry.path().string());
    detail::sync_path(tmp_, true);
    const std::filesystem::path dir(dir_), old(dir_ + ".old");
    std::filesystem::remove_all(old);
    if (std::filesystem::exists(dir)) std::filesystem::rename(dir, old);
    std::filesystem::rename(tmp_, dir);
    detail::sync_path(std::filesystem::absolute(dir).parent_path(), true);
    std::filesystem::remove_all(old);
  });
}

TSHARD_FUNC CheckpointReader::CheckpointReader(MPI_Comm comm, std::string dir)
    : comm_(comm), dir_(std::move(dir)) {
  std::string text;
  detail::on_first_rank(comm_, "opening the checkpoint '" + dir_ + "'", [&] {
    // Killed between the two renames of a commit, the previous checkpoint is DIR.old.
    std::filesystem::path at(dir_);
    if (!std::filesystem::exists(at / "manifest.txt") && std::filesystem::exists(dir_ + ".old/manifest.txt"))
      at = dir_ + ".old";
    std::ifstream m(at / "manifest.txt");
    if (!m) throw std::runtime_error("it has no manifest (missing or incomplete)");
    std::stringstream ss;
    ss << m.rdbuf();
    text = at.string() + "\n" + ss.str();
  });
  text = tshard::detail::broadcast_text(comm_, text);
  parse(text);
}

TSHARD_FUNC std::string CheckpointReader::get(const std::string& key) const {
  auto it = meta_.find(key);
  if (it == meta_.end()) throw IoError("tshard::io: the checkpoint '" + dir_ + "' has no '" + key + "'");
  return it->second;
}

TSHARD_FUNC void CheckpointReader::parse(const std::string& text) {
  std::istringstream in(text);
  std::getline(in, at_);
  std::string line;
  bool header = false, end = false;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string kind, key;
    l >> kind >> key;
    if (kind == "tshard-checkpoint") header = true;
    else if (kind == "end") end = true;
    else if (kind == "tensor") l >> tensors_[key];
    else if (kind == "meta") {
      std::string value;
      std::getline(l, value);
      meta_[key] = value.empty() ? value : value.substr(1);
    }
  }
  if (!header || !end) throw IoError("tshard::io: the checkpoint '" + dir_ + "' has a malformed or incomplete manifest");
}

}  // namespace tshard::io
