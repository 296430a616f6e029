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

namespace tshard::train::detail {

inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6)), out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3f)), out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f)), out += char(0x80 | (cp & 0x3f));
  }
}

// The length in bytes of the UTF-8 character starting with lead byte c (1 for a stray byte).
inline std::size_t utf8_length(unsigned char c) { return c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4; }

// The code point of the UTF-8 character at bytes[i] (well formed), and where the one before
// byte i starts.
inline std::uint32_t code_point_at(std::string_view bytes, std::size_t i) {
  const auto c = static_cast<unsigned char>(bytes[i]);
  const std::size_t n = std::min(utf8_length(c), bytes.size() - i);
  std::uint32_t cp = n == 1 ? c : c & (0x7fu >> n);
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(bytes[i + k]) & 0x3fu);
  return cp;
}
inline std::size_t character_before(std::string_view bytes, std::size_t i) {
  do --i;
  while (i > 0 && (static_cast<unsigned char>(bytes[i]) & 0xc0) == 0x80);
  return i;
}

// The byte-level alphabet: byte b as a character (printable bytes as themselves, the others as
// U+0100 onwards in byte order), in UTF-8, and the inverse.
struct ByteAlphabet {
  std::array<std::string, 256> of_byte;
  std::unordered_map<std::uint32_t, unsigned char> byte_of;
  ByteAlphabet() {
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const std::uint32_t cp = printable ? b : next++;
      append_utf8(of_byte[b], cp);
      byte_of[cp] = static_cast<unsigned char>(b);
    }
  }
  static const ByteAlphabet& get() {
    static const ByteAlphabet alphabet;
    return alphabet;
  }
  // The bytes of s as byte-level characters.
  std::string encode(std::string_view s) const {
    std::string out;
    out.reserve(s.size() * 2);
    for (unsigned char b : s) out += of_byte[b];
    return out;
  }
  // The bytes a token of byte-level characters stands for; a token with a character outside the
  // alphabet is its own UTF-8 bytes (HF's ByteLevel decoder does the same).
  std::string decode(std::string_view token) const {
    std::string out;
    for (std::size_t i = 0; i < token.size();) {
      const auto it = byte_of.find(code_point_at(token, i));
      if (it == byte_of.end()) return std::string(token);
      out += char(it->second);
      i += utf8_length(static_cast<unsigned char>(token[i]));
    }
    return out;
  }
};

// The UTF-8 character at bytes[i]: {true, its length} where well formed (RFC 3629: no overlongs,
// surrogates or code points past U+10FFFF), else {false, the length of its maximal ill-formed
// subpart} (Unicode's "substitution of maximal subparts").
inline std::pair<bool, std::size_t> utf8_character(std::string_view bytes, std::size_t i) {
  const auto c = static_cast<unsigned char>(bytes[i]);
  const int n = c < 0x80 ? 0 : c >= 0xc2 && c < 0xe0 ? 1 : c >= 0xe0 && c < 0xf0 ? 2 : c >= 0xf0 && c < 0xf5 ? 3 : -1;
  if (n <= 0) return {n == 0, 1};
  const unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
  int k = 1;
  for (; k <= n && i + std::size_t(k) < bytes.size(); ++k) {
    const auto b = static_cast<unsigned char>(bytes[i + std::size_t(k)]);
    if (b < (k == 1 ? lo : 0x80u) || b > (k == 1 ? hi : 0xbfu)) break;
  }
  return {k == n + 1, std::size_t(k)};
}

// The byte where bytes first stop being well-formed UTF-8, or npos.
inline std::size_t first_invalid_utf8(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    const auto [ok, n] = utf8_character(bytes, i);
    if (!ok) return i;
    i += n;
  }
  return std::string_view::npos;
}

// bytes as UTF-8 text, each maximal ill-formed subpart replaced by U+FFFD (as Rust's
// String::from_utf8_lossy, which HF's decoders use).
inline std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    const auto [ok, n] = utf8_character(bytes, i);
    if (ok) out.append(bytes.substr(i, n));
    else out += "\xef\xbf\xbd";
    i += n;
  }
  return out;
}

}  // namespace tshard::train::detail
