// A Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Llama 3, Qwen, SmolLM), encoding
// and decoding as HF tokenizers does: added and special tokens split out first, the normalizer, the
// pre-tokenizers (ByteLevel with GPT-2's pattern, Split, Digits, Sequence), the BPE model, the
// post-processor (TemplateProcessing's BOS, Roberta, Bert, ByteLevel, Sequence); decoding maps
// byte-level tokens back to bytes. A component of a file this class does not implement is one
// IoError naming it. The patterns need a Unicode regex engine (tshard::tokenizer, PCRE2).
//
//   const auto tok = ts::train::Tokenizer::from_file(dir + "/tokenizer.json");
//   std::vector<std::int32_t> ids = tok.encode("Héllo 2024!");   // = HF's encode(text).ids
//   std::string text = tok.decode(ids);                           // = HF's decode(ids)
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/error.hpp"
#include "tshard/io/json.hpp"
#include "tshard/train/bpe.hpp"
#include "tshard/train/byte_level.hpp"
#include "tshard/train/unicode_regex.hpp"

namespace tshard::train {

class Tokenizer {
 public:
  // The tokenizer of a tokenizer.json file (every rank may read its own copy: no communication).
  static Tokenizer from_file(const std::string& path);

  // The tokenizer of tokenizer.json's text; `what` names it in errors.
  Tokenizer(std::string_view json, const std::string& what);

  // HF's encode(text).ids: with add_special_tokens, the post-processor's tokens (a BOS, say) too.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  // HF's decode(ids): every token through the decoder (byte-level tokens as their bytes; an added
  // token whose characters are not all byte-level ones as written), the whole read as UTF-8 with
  // ill-formed bytes as U+FFFD. An id no vocabulary has is left out, as HF does.
  std::string decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens = false) const;

  // Whether decode removes the space before punctuation and English contractions, as transformers'
  // decode does where tokenizer_config.json says "clean_up_tokenization_spaces": true (HF
  // tokenizers' own decode never does).
  void set_clean_up_tokenization_spaces(bool on) { clean_up_spaces_ = on; }

  // One more than the largest id of the model and the added tokens: the embedding's rows it needs.
  std::size_t vocab_size() const;
  std::optional<std::int32_t> token_to_id(const std::string& token) const;

 private:
  using Json = io::detail::JsonValue;
  using Kind = Json::Kind;
  struct AddedToken {
    std::int32_t id = 0;
    std::string content;
    bool single_word = false, lstrip = false, rstrip = false, special = false;
  };
  enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
  struct PreTokenizerStep {
    enum class Kind { ByteLevel, Split, Digits } kind;
    bool add_prefix_space = false, use_regex = true;  // ByteLevel
    std::optional<UnicodeRegex> regex;                // ByteLevel (use_regex) and Split with a Regex
    std::string literal;                              // Split with a String
    Behavior behavior = Behavior::Isolated;           // Split
    bool invert = false;                              // Split
    bool individual_digits = false;                   // Digits
  };
  struct TemplatePiece {  // TemplateProcessing's "single": special tokens' ids, or the sequence
    bool sequence = false;
    std::vector<std::int32_t> ids;
  };

  // GPT-2's pre-tokenization pattern (HF's ByteLevel with use_regex).
  static constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

  [[noreturn]] void fail(const std::string& why) const { throw IoError(what_ + ": " + why); }
  const Json& member(const Json& object, const std::string& key, const std::string& where) const;
  const std::string& string_member(const Json& object, const std::string& key, const std::string& where) const;
  // f(element, "<where>.<key>[i]") for each element of the array object[key] (a Sequence's parts).
  template <class F>
  void for_each_element(const Json& object, const std::string& key, const std::string& where, F&& f) const {
    const Json& list = member(object, key, where);
    if (list.kind != Kind::Array) fail(where + "." + key + " is not an array");
    for (std::size_t i = 0; i < list.array.size(); ++i) f(list.array[i], where + "." + key + "[" + std::to_string(i) + "]");
  }
  bool flag(const Json& object, const std::string& key, bool otherwise) const;
  std::int32_t id_of(const Json& v, const std::string& where) const;
  std::int32_t id_of_token(const std::string& token, const std::string& where) const;

  void read_model(const Json& model);
  void read_added_tokens(const Json& list);
  void read_normalizer(const Json* n);
  void read_pre_tokenizer(const Json& p, const std::string& where);
  void read_post_processor(const Json& p, const std::string& where);
  void read_decoder(const Json& d, const std::string& where);

  // The added tokens found in text, left to right, longest first where several start at one byte
  // (HF's leftmost-longest match), with single_word, lstrip and rstrip applied: [begin, end, id).
  std::vector<std::tuple<std::size_t, std::size_t, std::int32_t>> added_token_matches(std::string_view text) const;
  // Unicode's White_Space (Rust's char::is_whitespace, which HF's lstrip and rstrip use).
  static bool white_space(std::uint32_t c);
  static bool word_byte(char c);

  // Text between added tokens: normalized, pre-tokenized into words, each word through the BPE.
  void encode_segment(std::string_view text, std::vector<std::int32_t>& ids) const;

  // One pre-tokenizer step on one piece, its pieces appended to out (empty ones dropped).
  void split(const PreTokenizerStep& step, std::string piece, std::vector<std::string>& out) const;

  // HF's SplitDelimiterBehavior over the pieces between and at matches (invert: the matches are
  // what is kept as the content, the rest the delimiters).
  static void split_by(const std::string& piece,
                       const std::vector<std::pair<std::size_t, std::size_t>>& matches, Behavior behavior,
                       bool invert, std::vector<std::string>& out);

  // transformers' clean_up_tokenization: these replacements, each over the whole text, in order.
  static std::string clean_up_tokenization_spaces(std::string text);

  std::vector<std::int32_t> post_process(std::vector<std::int32_t> ids) const;

  std::string what_;
  BpeModel model_;
  std::vector<AddedToken> added_;
  std::unordered_map<std::int32_t, std::size_t> added_by_id_;
  std::vector<PreTokenizerStep> pre_;
  std::vector<TemplatePiece> template_;
  std::string normalizer_;                      // NFC or NFKC, implemented where they are the identity
  std::uint32_t normalizer_identity_below_ = 0;  // (the first code point they may change)
  std::array<std::vector<std::size_t>, 256> added_by_first_byte_;  // added_'s indices, longest first
  bool decoder_byte_level_ = false, clean_up_spaces_ = false;
};

}  // namespace tshard::train

#if TSHARD_HEADER_BODIES
#include "tshard/train/tokenizer-inl.hpp"
#endif
