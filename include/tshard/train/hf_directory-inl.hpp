// The definitions of hf_directory.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "tshard/train/hf_directory.hpp"

namespace tshard::train {

TSHARD_FUNC HfDirectory HfDirectory::open(MPI_Comm comm, const std::string& dir) {
  HfDirectory hf;
  hf.path = dir;
  hf.config = LlamaConfig::from_directory(comm, dir);
  const std::string tokenizer = read_text_file(comm, dir + "/tokenizer.json", true);
  if (!tokenizer.empty()) {
    hf.tokenizer.emplace(tokenizer, dir + "/tokenizer.json");
    const std::string config = read_text_file(comm, dir + "/tokenizer_config.json", true);
    if (!config.empty()) {
      const auto c = io::detail::parse_json(config.data(), config.size(), dir + "/tokenizer_config.json");
      const auto* clean = c.find("clean_up_tokenization_spaces");
      hf.tokenizer->set_clean_up_tokenization_spaces(clean && clean->kind == io::detail::JsonValue::Kind::Bool && clean->boolean);
    }
  }
  io::SafetensorsReader weights(comm, dir);
  const std::string probe = "model.embed_tokens.weight";
  if (!weights.contains(probe)) throw IoError("tshard::train::HfDirectory: " + dir + "'s weights hold no \"" + probe + "\"");
  hf.dtype = weights.dtype(probe);
  if (hf.dtype != "F32" && hf.dtype != "BF16" && hf.dtype != "F16")
    throw IoError("tshard::train::HfDirectory: " + dir + "'s weights are " + hf.dtype + ", not F32, BF16 or F16");
  return hf;
}

TSHARD_FUNC void save_hf_directory(MPI_Comm comm, const std::string& dir, nn::Module& model,
                                   const LlamaConfig& config, const HfDirectory* from,
                                   const std::string& dtype, std::int64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  std::vector<io::NamedTensor> tensors;
  std::vector<std::shared_ptr<void>> keep;
  for (const auto& [name, p] : hf_parameters(model, true)) keep.push_back(p->add_to(tensors, name, dtype));
  io::save_safetensors_shards(comm, dir, tensors, max_shard_bytes);
  io::detail::on_first_rank(comm, "writing the configuration and tokenizer into '" + dir + "'", [&] {
    const char* dtype_name = dtype == "BF16" ? "bfloat16" : dtype == "F16" ? "float16" : "float32";
    const std::vector<std::string> copied{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                          "special_tokens_map.json"};
    std::error_code same;
    for (const auto& file : copied)  // (not onto itself: --save-hf into the directory --hf read)
      if (from && fs::exists(fs::path(from->path) / file) && !fs::equivalent(fs::path(from->path) / file, fs::path(dir) / file, same))
        fs::copy_file(fs::path(from->path) / file, fs::path(dir) / file, fs::copy_options::overwrite_existing);
    if (!from) {
      std::ofstream out(fs::path(dir) / "config.json", std::ios::binary);
      out << config.to_json(dtype_name);
      if (!out.flush()) throw std::runtime_error("cannot write config.json");
    }
  });
}

}  // namespace tshard::train
