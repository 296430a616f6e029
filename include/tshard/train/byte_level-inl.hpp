// The definitions of byte_level.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

#include "tshard/train/byte_level.hpp"

namespace tshard::train::detail {

TSHARD_FUNC void append_utf8(std::string& out, std::uint32_t cp) {
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

TSHARD_FUNC std::uint32_t code_point_at(std::string_view bytes, std::size_t i) {
  const auto c = static_cast<unsigned char>(bytes[i]);
  const std::size_t n = std::min(utf8_length(c), bytes.size() - i);
  std::uint32_t cp = n == 1 ? c : c & (0x7fu >> n);
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(bytes[i + k]) & 0x3fu);
  return cp;
}
TSHARD_FUNC std::size_t character_before(std::string_view bytes, std::size_t i) {
  do --i;
  while (i > 0 && (static_cast<unsigned char>(bytes[i]) & 0xc0) == 0x80);
  return i;
}

TSHARD_FUNC ByteAlphabet::ByteAlphabet() {
  std::uint32_t next = 256;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const std::uint32_t cp = printable ? b : next++;
    append_utf8(of_byte[b], cp);
    byte_of[cp] = static_cast<unsigned char>(b);
  }
}
TSHARD_FUNC const ByteAlphabet& ByteAlphabet::get() {
  static const ByteAlphabet alphabet;
  return alphabet;
}
TSHARD_FUNC std::string ByteAlphabet::encode(std::string_view s) const {
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char b : s) out += of_byte[b];
  return out;
}
TSHARD_FUNC std::string ByteAlphabet::decode(std::string_view token) const {
  std::string out;
  for (std::size_t i = 0; i < token.size();) {
    const auto it = byte_of.find(code_point_at(token, i));
    if (it == byte_of.end()) return std::string(token);
    out += char(it->second);
    i += utf8_length(static_cast<unsigned char>(token[i]));
  }
  return out;
}

TSHARD_FUNC std::pair<bool, std::size_t> utf8_character(std::string_view bytes, std::size_t i) {
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

TSHARD_FUNC std::size_t first_invalid_utf8(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    const auto [ok, n] = utf8_character(bytes, i);
    if (!ok) return i;
    i += n;
  }
  return std::string_view::npos;
}

TSHARD_FUNC std::string utf8_lossy(std::string_view bytes) {
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
