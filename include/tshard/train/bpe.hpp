// The BPE model of a tokenizer.json (Sennrich et al. 2016, as HF tokenizers' models::bpe): a word
// starts as its characters and the pair with the lowest merge rank is merged, leftmost first,
// until no pair merges. Encoded words are cached, as HF does (so a model encodes on one thread
// at a time).
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/error.hpp"
#include "tshard/train/byte_level.hpp"

namespace tshard::train {

struct BpeOptions {
  std::optional<std::string> unk_token;  // a character the vocabulary lacks: this token (else dropped)
  bool fuse_unk = false;                 // consecutive unknowns as one
  bool byte_fallback = false;            // a character the vocabulary lacks: its bytes' <0xXX> tokens
  bool ignore_merges = false;            // a word in the vocabulary is its token, merges or not
};

class BpeModel {
 public:
  BpeModel() = default;
  // merges: pairs of tokens in rank order; each pair's concatenation must be in the vocabulary.
  BpeModel(std::unordered_map<std::string, std::int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::string& what);

  std::optional<std::int32_t> token_to_id(const std::string& token) const;
  // The token of an id, or nothing where the vocabulary has no such id.
  const std::string* id_to_token(std::int32_t id) const;
  std::size_t id_bound() const { return tokens_.size(); }

  // The ids of one pre-tokenized word, appended to out.
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;

 private:
  struct Merge {
    std::int32_t rank, id;
  };
  static constexpr std::size_t kCacheCapacity = 10000;  // HF's default
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) { return (std::uint64_t(std::uint32_t(a)) << 32) | std::uint32_t(b); }

  std::vector<std::int32_t> merge(std::string_view word) const;

  static std::string byte_token(unsigned char b);
  bool all_bytes_known(std::string_view c) const;

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::vector<std::string> tokens_;  // by id
  std::unordered_map<std::uint64_t, Merge> merges_;
  BpeOptions options_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache_;  // (so: one thread at a time)
};

}  // namespace tshard::train

#if TSHARD_HEADER_BODIES
#include "tshard/train/bpe-inl.hpp"
#endif
