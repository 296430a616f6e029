// A Llama's config.json (and generation_config.json) as transformers writes them: the sizes, the
// norm's eps, rotary's theta and scaling (transformers 4's "rope_theta"/"rope_scaling" and 5's
// "rope_parameters"), tied embeddings, the BOS and EOS ids and the dtype. A value tshard's Llama
// does not implement (another model type, a rope type, biases, an activation) is one IoError
// naming the field; read on one rank and broadcast, so every rank throws alike.
//
//   const auto config = ts::train::LlamaConfig::from_directory(comm, "SmolLM-135M");
//   config.hidden_size, config.head_dim, config.rope.theta, config.eos_token_ids ...
#pragma once
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tshard/comm/text.hpp"
#include "tshard/core/error.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/io/json.hpp"
#include "tshard/nn/functional/rotary.hpp"

namespace tshard::train {

// A text file's bytes on every rank of comm, read on rank 0 and broadcast; an optional file that
// is absent is "". A file that cannot be read is an IoError on every rank.
std::string read_text_file(MPI_Comm comm, const std::string& path, bool optional = false);

struct LlamaConfig {
  long hidden_size = 4096, intermediate_size = 11008, num_hidden_layers = 32, num_attention_heads = 32;
  long num_key_value_heads = 0;  // 0: as many as the attention heads
  long head_dim = 0;             // 0: hidden_size / num_attention_heads
  long vocab_size = 32000, max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  nn::Rope rope;
  bool tie_word_embeddings = false;
  std::vector<std::int32_t> bos_token_ids, eos_token_ids;  // (generation_config.json's where it has them)
  std::string dtype = "float32";                           // torch_dtype / dtype: the weights' on file

  long kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  long head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  // A training step's FLOPs per token at sequence length seq: 6 per weight a token multiplies (the
  // head but not the embedding) and 12 L T H Dh for attention's products (PaLM, appendix B).
  double training_flops_per_token(long seq) const;

  // config.json's text (what: its path, for errors), with transformers' defaults for what it omits.
  static LlamaConfig parse(const std::string& text, const std::string& what);

  // A model directory's config.json, with generation_config.json's BOS and EOS ids where it has
  // them (HF's generate stops at those); collective over comm: rank 0 reads, every rank parses.
  static LlamaConfig from_directory(MPI_Comm comm, const std::string& dir);

  // config.json as transformers writes a LlamaConfig (both rope forms, so that transformers 4 and 5
  // read it).
  std::string to_json(const std::string& dtype_on_file) const;

 private:
  static std::vector<std::int32_t> ids_of(const io::detail::JsonValue* v, const std::string& what);
};

}  // namespace tshard::train

#if TSHARD_HEADER_BODIES
#include "tshard/train/hf_config-inl.hpp"
#endif
