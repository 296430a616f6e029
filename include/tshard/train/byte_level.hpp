// GPT-2's byte-level alphabet (Radford et al. 2019, as HF tokenizers' ByteLevel): every byte is a
// printable character, so a BPE over characters sees any text, and decoding maps them back. Also
// the UTF-8 helpers the tokenizer needs (a character's length, lossy decoding as Rust's
// String::from_utf8_lossy, which HF's decoders use).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "tshard/core/kernel_instances.hpp"

namespace tshard::train::detail {

// cp in UTF-8, appended to out.
void append_utf8(std::string& out, std::uint32_t cp);

// The length in bytes of the UTF-8 character starting with lead byte c (1 for a stray byte).
inline std::size_t utf8_length(unsigned char c) { return c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4; }

// The code point of the UTF-8 character at bytes[i] (well formed), and where the one before
// byte i starts.
std::uint32_t code_point_at(std::string_view bytes, std::size_t i);
std::size_t character_before(std::string_view bytes, std::size_t i);

// The byte-level alphabet: byte b as a character (printable bytes as themselves, the others as
// U+0100 onwards in byte order), in UTF-8, and the inverse.
struct ByteAlphabet {
  std::array<std::string, 256> of_byte;
  std::unordered_map<std::uint32_t, unsigned char> byte_of;
  ByteAlphabet();
  static const ByteAlphabet& get();
  // The bytes of s as byte-level characters.
  std::string encode(std::string_view s) const;
  // The bytes a token of byte-level characters stands for; a token with a character outside the
  // alphabet is its own UTF-8 bytes (HF's ByteLevel decoder does the same).
  std::string decode(std::string_view token) const;
};

// The UTF-8 character at bytes[i]: {true, its length} where well formed (RFC 3629: no overlongs,
// surrogates or code points past U+10FFFF), else {false, the length of its maximal ill-formed
// subpart} (Unicode's "substitution of maximal subparts").
std::pair<bool, std::size_t> utf8_character(std::string_view bytes, std::size_t i);

// The byte where bytes first stop being well-formed UTF-8, or npos.
std::size_t first_invalid_utf8(std::string_view bytes);

// bytes as UTF-8 text, each maximal ill-formed subpart replaced by U+FFFD (as Rust's
// String::from_utf8_lossy, which HF's decoders use).
std::string utf8_lossy(std::string_view bytes);

}  // namespace tshard::train::detail

#if TSHARD_HEADER_BODIES
#include "tshard/train/byte_level-inl.hpp"
#endif
