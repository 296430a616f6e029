// The definitions of safetensors_shards.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tshard/io/safetensors_shards.hpp"

namespace tshard::io {

TSHARD_FUNC std::vector<std::string> save_safetensors_shards(MPI_Comm comm, const std::string& dir,
                                                             const std::vector<NamedTensor>& tensors,
                                                             std::int64_t max_shard_bytes,
                                                             const std::map<std::string, std::string>& metadata) {
  namespace fs = std::filesystem;
  detail::on_first_rank(comm, "making '" + dir + "'", [&] {  // (and removing an earlier save's weights, as HF does)
    fs::create_directories(dir);
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name == "model.safetensors" || name == "model.safetensors.index.json" ||
          (name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos && name.size() > 12 &&
           name.compare(name.size() - 12, 12, ".safetensors") == 0))
        fs::remove(entry.path());
    }
  });
  // The union of every rank's (name, bytes), first listing first, as save_safetensors orders it.
  std::string mine;
  for (const auto& t : tensors) {
    std::int64_t n = 1;
    for (auto d : t.shape()) n *= d;
    mine += t.name() + '\t' + std::to_string(n * detail::safetensors_itemsize(t.dtype())) + '\n';
  }
  const std::string all = tshard::detail::gather_text(comm, mine);
  std::vector<std::pair<std::string, std::int64_t>> order;
  std::map<std::string, std::size_t> shard_of;
  for (std::size_t at = 0; at < all.size();) {
    const std::size_t tab = all.find('\t', at), end = all.find('\n', tab);
    const std::string name = all.substr(at, tab - at);
    if (!shard_of.count(name)) shard_of[name] = 0, order.emplace_back(name, std::stoll(all.substr(tab + 1, end - tab - 1)));
    at = end + 1;
  }
  // Greedy, in order, as huggingface_hub's split_state_dict_into_shards: a tensor past the size
  // has a shard of its own (numbered when it comes), the others fill the current one until the
  // next would tip it over.
  std::vector<std::vector<std::string>> shard_list;
  std::vector<std::string> current;
  std::int64_t current_bytes = 0, total = 0;
  for (const auto& [name, bytes] : order) {
    total += bytes;
    if (bytes > max_shard_bytes) {
      shard_list.push_back({name});
      continue;
    }
    if (current_bytes + bytes > max_shard_bytes) shard_list.push_back(std::move(current)), current.clear(), current_bytes = 0;
    current.push_back(name), current_bytes += bytes;
  }
  if (!current.empty() || shard_list.empty()) shard_list.push_back(std::move(current));
  for (std::size_t s = 0; s < shard_list.size(); ++s)
    for (const auto& name : shard_list[s]) shard_of[name] = s;
  const std::size_t shards = shard_list.size();
  auto file_of = [&](std::size_t s) {
    if (shards == 1) return std::string("model.safetensors");
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards);
    return std::string(name);
  };
  std::vector<std::string> written;
  for (std::size_t s = 0; s < shards; ++s) {
    std::vector<NamedTensor> part;
    for (const auto& t : tensors)
      if (shard_of[t.name()] == s) part.push_back(t);
    save_safetensors(comm, (fs::path(dir) / file_of(s)).string(), part, metadata);
    written.push_back(file_of(s));
  }
  if (shards > 1) {
    detail::on_first_rank(comm, "writing the index of '" + dir + "'", [&] {
      std::string json = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total) + "\n  },\n  \"weight_map\": {";
      bool first = true;
      for (const auto& [name, s] : shard_of)  // (sorted by name, as transformers writes it)
        json += std::string(first ? "" : ",") + "\n    " + detail::json_quote(name) + ": \"" + file_of(s) + "\"", first = false;
      json += "\n  }\n}\n";
      std::ofstream out(fs::path(dir) / "model.safetensors.index.json", std::ios::binary);
      out << json;
      if (!out.flush()) throw std::runtime_error("cannot write model.safetensors.index.json");
    });
    written.push_back("model.safetensors.index.json");
  }
  return written;
}

}  // namespace tshard::io
