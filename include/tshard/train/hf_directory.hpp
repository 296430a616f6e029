// A Hugging Face model directory, in and out: config.json (and generation_config.json), the
// weights (model.safetensors or its sharded index; F32, BF16 or F16), tokenizer.json (and
// tokenizer_config.json's clean_up_tokenization_spaces). Written back as transformers loads it:
// the config read (or one made from the sizes), the weights in the dtype they were read in, the
// tokenizer files as they were.
//
//   const auto hf = ts::train::HfDirectory::open(MPI_COMM_WORLD, "SmolLM-135M");
//   ... build the model from hf.config; ts::train::load_hf_weights(comm, hf.path, model);
//   std::vector<std::int32_t> ids = hf.tokenizer->encode("Once upon a time");
//   ts::train::save_hf_directory(MPI_COMM_WORLD, "out", model, hf.config, &hf);
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tshard/io/safetensors.hpp"
#include "tshard/io/safetensors_shards.hpp"
#include "tshard/train/hf_config.hpp"
#include "tshard/train/hf_layout.hpp"
#include "tshard/train/tokenizer.hpp"

namespace tshard::train {

struct HfDirectory {
  std::string path;
  LlamaConfig config;
  std::optional<Tokenizer> tokenizer;  // where the directory has tokenizer.json
  std::string dtype = "F32";           // the weights' on file: F32, BF16 or F16

  // Reads the directory's config, tokenizer and weights' dtype; collective over comm (rank 0
  // reads, every rank parses: a bad file is the same IoError on every rank).
  static HfDirectory open(MPI_Comm comm, const std::string& dir) {
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
};

// Writes `dir` as a model directory transformers loads (collective over comm: every rank, every
// pipeline stage; ZeRO-3 parameters must be present): the weights of `model` in HF's layout as
// `dtype` (F32, BF16 or F16), in one file or shards past max_shard_bytes; config.json and
// generation_config.json copied from `from` where the model came from a directory, else written
// from `config`; the tokenizer files `from` has.
inline void save_hf_directory(MPI_Comm comm, const std::string& dir, nn::Module& model, const LlamaConfig& config,
                              const HfDirectory* from, const std::string& dtype = "F32", std::int64_t max_shard_bytes = 5'000'000'000) {
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
