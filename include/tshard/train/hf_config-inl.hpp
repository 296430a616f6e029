// The definitions of hf_config.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

#include "tshard/train/hf_config.hpp"

namespace tshard::train {

TSHARD_FUNC std::string read_text_file(MPI_Comm comm, const std::string& path, bool optional) {
  std::string text;  // 'T' and the bytes, 'N' (absent), or 'E' (cannot open)
  if (tshard::detail::comm_rank(comm) == 0) {
    std::error_code ec;
    std::ifstream in(path, std::ios::binary);
    if (in) text = "T" + std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    else text = optional && !std::filesystem::exists(path, ec) ? "N" : "E";
  }
  text = tshard::detail::broadcast_text(comm, text);
  if (text[0] == 'E') throw IoError("tshard::train: cannot open " + path);
  return text.substr(1);
}

TSHARD_FUNC double LlamaConfig::training_flops_per_token(long seq) const {
  const double d = double(hidden_size), l = double(num_hidden_layers), attention = double(num_attention_heads * head_size());
  const double weights = l * (2 * attention + 2 * double(kv_heads() * head_size())) * d + 3.0 * l * d * double(intermediate_size) +
                         double(vocab_size) * d;
  return 6 * weights + 12.0 * l * double(seq) * attention;
}

TSHARD_FUNC LlamaConfig LlamaConfig::parse(const std::string& text, const std::string& what) {
  using J = io::detail::JsonValue;
  const J root = io::detail::parse_json(text.data(), text.size(), what);
  const std::string at = "tshard::train::LlamaConfig: " + what + ": ";
  if (!root.is_object()) throw IoError(at + "not a JSON object");
  auto string_of = [&](const J& o, const char* key, std::string otherwise) {
    const J* v = o.find(key);
    if (!v || v->kind == J::Kind::Null) return otherwise;
    if (v->kind != J::Kind::String) throw IoError(at + "\"" + key + "\" is not a string");
    return v->string;
  };
  auto number_of = [&](const J& o, const char* key, double otherwise) {
    const J* v = o.find(key);
    if (!v || v->kind == J::Kind::Null) return otherwise;
    if (v->kind != J::Kind::Number) throw IoError(at + "\"" + key + "\" is not a number");
    return v->number;
  };
  auto count_of = [&](const J& o, const char* key, long otherwise) {
    const J* v = o.find(key);
    if (!v || v->kind == J::Kind::Null) return otherwise;
    if (v->kind != J::Kind::Number || !v->integral || v->integer < 1) throw IoError(at + "\"" + key + "\" is not a positive integer");
    return long(v->integer);
  };
  auto flag_of = [&](const J& o, const char* key, bool otherwise) {
    const J* v = o.find(key);
    if (!v || v->kind == J::Kind::Null) return otherwise;
    if (v->kind != J::Kind::Bool) throw IoError(at + "\"" + key + "\" is not true or false");
    return v->boolean;
  };
  if (const std::string type = string_of(root, "model_type", "llama"); type != "llama")
    throw IoError(at + "\"model_type\" is \"" + type + "\": tshard's Llama reads \"llama\" configs only");
  if (const std::string act = string_of(root, "hidden_act", "silu"); act != "silu")
    throw IoError(at + "\"hidden_act\" is \"" + act + "\": tshard's Llama implements \"silu\" only");
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (flag_of(root, key, false)) throw IoError(at + "\"" + std::string(key) + "\" is true: tshard's Llama has no biases");
  if (number_of(root, "pretraining_tp", 1) != 1) throw IoError(at + "\"pretraining_tp\" is not 1: not implemented");

  LlamaConfig c;
  c.hidden_size = count_of(root, "hidden_size", c.hidden_size);
  c.intermediate_size = count_of(root, "intermediate_size", c.intermediate_size);
  c.num_hidden_layers = count_of(root, "num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = count_of(root, "num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = count_of(root, "num_key_value_heads", 0);
  c.head_dim = count_of(root, "head_dim", 0);
  c.vocab_size = count_of(root, "vocab_size", c.vocab_size);
  c.max_position_embeddings = count_of(root, "max_position_embeddings", c.max_position_embeddings);
  c.rms_norm_eps = number_of(root, "rms_norm_eps", c.rms_norm_eps);
  c.tie_word_embeddings = flag_of(root, "tie_word_embeddings", false);
  c.dtype = string_of(root, "dtype", string_of(root, "torch_dtype", c.dtype));
  if (c.dtype != "float32" && c.dtype != "bfloat16" && c.dtype != "float16")
    throw IoError(at + "the dtype \"" + c.dtype + "\" is not float32, bfloat16 or float16");
  if (c.hidden_size % c.num_attention_heads != 0 && c.head_dim == 0)
    throw IoError(at + "\"num_attention_heads\" does not divide \"hidden_size\" and there is no \"head_dim\"");
  if (c.num_attention_heads % c.kv_heads() != 0) throw IoError(at + "\"num_key_value_heads\" does not divide \"num_attention_heads\"");
  if (c.head_size() % 2 != 0) throw IoError(at + "the head dim " + std::to_string(c.head_size()) + " is odd (rotary turns pairs)");

  // Rotary: transformers 5 writes "rope_parameters" (theta inside), 4 "rope_theta" and "rope_scaling".
  const J* params = root.find("rope_parameters");
  if (params && params->kind == J::Kind::Null) params = nullptr;
  const J* scaling = params ? params : root.find("rope_scaling");
  if (scaling && scaling->kind == J::Kind::Null) scaling = nullptr;
  if (scaling && !scaling->is_object()) throw IoError(at + "\"" + std::string(params ? "rope_parameters" : "rope_scaling") + "\" is not an object");
  c.rope.theta = number_of(params ? *params : root, "rope_theta", number_of(root, "rope_theta", 10000.0));
  if (scaling) {
    const std::string field = params ? "rope_parameters" : "rope_scaling";
    const std::string type = string_of(*scaling, "rope_type", string_of(*scaling, "type", "default"));
    if (type == "llama3") {  // (transformers requires all four)
      auto required = [&](const char* key) {
        const double v = number_of(*scaling, key, -1);
        if (!(v > 0)) throw IoError(at + "\"" + field + "\" with rope type \"llama3\" needs a positive \"" + key + "\"");
        return v;
      };
      c.rope.llama3 = true;
      c.rope.factor = required("factor"), c.rope.low_freq_factor = required("low_freq_factor");
      c.rope.high_freq_factor = required("high_freq_factor");
      c.rope.original_max_position_embeddings = required("original_max_position_embeddings");
      if (c.rope.high_freq_factor <= c.rope.low_freq_factor)
        throw IoError(at + "\"" + field + "\": \"high_freq_factor\" must exceed \"low_freq_factor\"");
    } else if (type != "default") {
      throw IoError(at + "\"" + field + "\" has rope type \"" + type + "\": tshard implements \"default\" and \"llama3\"");
    }
  }
  // (absent: LlamaConfig's defaults, 1 and 2; null: none)
  c.bos_token_ids = root.find("bos_token_id") ? ids_of(root.find("bos_token_id"), at + "\"bos_token_id\"") : std::vector<std::int32_t>{1};
  c.eos_token_ids = root.find("eos_token_id") ? ids_of(root.find("eos_token_id"), at + "\"eos_token_id\"") : std::vector<std::int32_t>{2};
  return c;
}

TSHARD_FUNC LlamaConfig LlamaConfig::from_directory(MPI_Comm comm, const std::string& dir) {
  const std::string config = read_text_file(comm, dir + "/config.json");
  LlamaConfig c = parse(config, dir + "/config.json");
  const std::string generation = read_text_file(comm, dir + "/generation_config.json", true);
  if (!generation.empty()) {
    const auto g = io::detail::parse_json(generation.data(), generation.size(), dir + "/generation_config.json");
    const std::string at = "tshard::train::LlamaConfig: " + dir + "/generation_config.json: ";
    if (const auto* e = g.find("eos_token_id"); e && e->kind != io::detail::JsonValue::Kind::Null) c.eos_token_ids = ids_of(e, at + "\"eos_token_id\"");
    if (const auto* b = g.find("bos_token_id"); b && b->kind != io::detail::JsonValue::Kind::Null) c.bos_token_ids = ids_of(b, at + "\"bos_token_id\"");
  }
  return c;
}

TSHARD_FUNC std::string LlamaConfig::to_json(const std::string& dtype_on_file) const {
  auto ids = [](const std::vector<std::int32_t>& v) {
    if (v.empty()) return std::string("null");
    if (v.size() == 1) return std::to_string(v[0]);
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  auto real = [](double x) {  // the shortest text that reads back as x, as Python's json writes it
    char buffer[32];
    const std::string s(buffer, std::to_chars(buffer, buffer + sizeof buffer, x).ptr);
    return s.find_first_of(".e") == std::string::npos ? s + ".0" : s;
  };
  std::string rope = "{\"rope_type\": \"" + std::string(this->rope.llama3 ? "llama3" : "default") + "\"";
  if (this->rope.llama3)
    rope += ", \"factor\": " + real(this->rope.factor) + ", \"low_freq_factor\": " + real(this->rope.low_freq_factor) +
            ", \"high_freq_factor\": " + real(this->rope.high_freq_factor) +
            ", \"original_max_position_embeddings\": " + std::to_string(long(this->rope.original_max_position_embeddings));
  const std::string with_theta = rope + ", \"rope_theta\": " + real(this->rope.theta) + "}";
  rope += "}";
  return "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n"
         "  \"bos_token_id\": " + ids(bos_token_ids) + ",\n  \"dtype\": \"" + dtype_on_file + "\",\n  \"eos_token_id\": " + ids(eos_token_ids) +
         ",\n  \"head_dim\": " + std::to_string(head_size()) + ",\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": " + std::to_string(hidden_size) +
         ",\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": " + std::to_string(intermediate_size) +
         ",\n  \"max_position_embeddings\": " + std::to_string(max_position_embeddings) + ",\n  \"mlp_bias\": false,\n"
         "  \"model_type\": \"llama\",\n  \"num_attention_heads\": " + std::to_string(num_attention_heads) +
         ",\n  \"num_hidden_layers\": " + std::to_string(num_hidden_layers) + ",\n  \"num_key_value_heads\": " + std::to_string(kv_heads()) +
         ",\n  \"pretraining_tp\": 1,\n  \"rms_norm_eps\": " + real(rms_norm_eps) + ",\n  \"rope_parameters\": " + with_theta +
         ",\n  \"rope_scaling\": " + (this->rope.llama3 ? rope : std::string("null")) + ",\n  \"rope_theta\": " + real(this->rope.theta) +
         ",\n  \"tie_word_embeddings\": " + (tie_word_embeddings ? "true" : "false") + ",\n  \"torch_dtype\": \"" + dtype_on_file +
         "\",\n  \"use_cache\": true,\n  \"vocab_size\": " + std::to_string(vocab_size) + "\n}\n";
}

TSHARD_FUNC std::vector<std::int32_t> LlamaConfig::ids_of(const io::detail::JsonValue* v,
                                                          const std::string& what) {
  using J = io::detail::JsonValue;
  std::vector<std::int32_t> out;
  if (!v || v->kind == J::Kind::Null) return out;
  auto one = [&](const J& e) {
    if (e.kind != J::Kind::Number || !e.integral || e.integer < 0 || e.integer > INT32_MAX) throw IoError(what + " is not a token id or a list of them");
    out.push_back(std::int32_t(e.integer));
  };
  if (v->kind == J::Kind::Array) for (const J& e : v->array) one(e);
  else one(*v);
  return out;
}

}  // namespace tshard::train
