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

#include "tshard/core/kernel_instances.hpp"
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
  static HfDirectory open(MPI_Comm comm, const std::string& dir);
};

// Writes `dir` as a model directory transformers loads (collective over comm: every rank, every
// pipeline stage; ZeRO-3 parameters must be present): the weights of `model` in HF's layout as
// `dtype` (F32, BF16 or F16), in one file or shards past max_shard_bytes; config.json and
// generation_config.json copied from `from` where the model came from a directory, else written
// from `config`; the tokenizer files `from` has.
void save_hf_directory(MPI_Comm comm, const std::string& dir, nn::Module& model, const LlamaConfig& config,
                       const HfDirectory* from, const std::string& dtype = "F32",
                       std::int64_t max_shard_bytes = 5'000'000'000);

}  // namespace tshard::train

#if TSHARD_HEADER_BODIES
#include "tshard/train/hf_directory-inl.hpp"
#endif
