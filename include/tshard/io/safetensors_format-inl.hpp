// The definitions of safetensors_format.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "tshard/io/json.hpp"
#include "tshard/io/safetensors_format.hpp"

namespace tshard::io::detail {

TSHARD_FUNC std::int64_t SafetensorsEntry::elements() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

TSHARD_FUNC const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

TSHARD_FUNC std::int64_t safetensors_itemsize(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

TSHARD_FUNC int safetensors_dtype_order(const std::string& dtype) {
  static const char* order[] = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64"};
  for (int i = 0; i < int(sizeof order / sizeof *order); ++i)
    if (dtype == order[i]) return i;
  return -1;
}

class SafetensorsParser {
 public:
  // bytes: the file's first bytes (at least the 8-byte length and the header where it fits).
  SafetensorsParser(const char* bytes, std::size_t size, const std::string& path) : p_(bytes), n_(size), path_(path) {}

  SafetensorsHeader parse() {
    if (n_ < 8) fail("it is too short to be a safetensors file (" + std::to_string(n_) + " bytes)");
    std::uint64_t len = 0;
    for (int b = 0; b < 8; ++b) len |= std::uint64_t(static_cast<unsigned char>(p_[b])) << (8 * b);
    if (len > std::uint64_t(kMaxSafetensorsHeader))
      fail("its header length " + std::to_string(len) + " is larger than " + std::to_string(kMaxSafetensorsHeader) + " bytes");
    if (8 + len > n_) fail("its header of " + std::to_string(len) + " bytes is truncated (" + std::to_string(n_) + " bytes)");
    if (len == 0 || p_[8] != '{') fail("its header does not start with '{'");
    SafetensorsHeader h;
    h.data_offset = std::int64_t(8 + len);
    const JsonValue root = parse_json(p_ + 8, std::size_t(len), "the header of '" + path_ + "'");
    if (!root.is_object()) fail("its header is not a JSON object");
    for (std::size_t i = 0; i < root.keys.size(); ++i) {
      const std::string& name = root.keys[i];
      const JsonValue& v = root.members[i];
      if (name == "__metadata__") {
        if (!v.is_object()) fail("__metadata__ is not an object");
        for (std::size_t m = 0; m < v.keys.size(); ++m) {
          if (v.members[m].kind != JsonValue::Kind::String) fail("__metadata__[\"" + v.keys[m] + "\"] is not a string");
          h.metadata[v.keys[m]] = v.members[m].string;
        }
        continue;
      }
      if (h.find(name)) fail("it names tensor \"" + name + "\" twice");
      h.tensors.push_back(entry(name, v));
      h.data_bytes = std::max(h.data_bytes, h.tensors.back().end);
    }
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw IoError("tshard::io: '" + path_ + "' is not a valid safetensors file: " + why);
  }

  SafetensorsEntry entry(const std::string& name, const JsonValue& v) const {
    const std::string of = "tensor \"" + name + "\"";
    if (!v.is_object()) fail(of + " is not an object");
    const JsonValue* dtype = v.find("dtype");
    const JsonValue* shape = v.find("shape");
    const JsonValue* offsets = v.find("data_offsets");
    if (!dtype || dtype->kind != JsonValue::Kind::String) fail(of + " has no dtype string");
    if (!shape || shape->kind != JsonValue::Kind::Array) fail(of + " has no shape array");
    if (!offsets || offsets->kind != JsonValue::Kind::Array || offsets->array.size() != 2)
      fail(of + " has no data_offsets [begin, end]");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = dtype->string;
    const std::int64_t itemsize = safetensors_itemsize(e.dtype);
    if (itemsize == 0) fail(of + " has dtype \"" + e.dtype + "\", which tshard does not know");
    std::int64_t bytes = itemsize;
    for (const auto& d : shape->array) {
      if (d.kind != JsonValue::Kind::Number || !d.integral || d.integer < 0) fail(of + " has a dim that is not a count");
      if (d.integer > 0 && bytes > std::numeric_limits<std::int64_t>::max() / d.integer) fail(of + " is too large");
      bytes *= d.integer;
      e.shape.push_back(d.integer);
    }
    for (const auto& o : offsets->array)
      if (o.kind != JsonValue::Kind::Number || !o.integral || o.integer < 0) fail(of + " has data_offsets that are not offsets");
    e.begin = offsets->array[0].integer;
    e.end = offsets->array[1].integer;
    if (e.end < e.begin || e.end - e.begin != bytes)
      fail(of + " has data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "], not the " +
           std::to_string(bytes) + " bytes its " + e.dtype + " shape needs");
    return e;
  }

  const char* p_;
  std::size_t n_;
  std::string path_;
};

TSHARD_FUNC SafetensorsHeader parse_safetensors_header(const char* bytes, std::size_t size,
                                                       const std::string& path) {
  return SafetensorsParser(bytes, size, path).parse();
}

TSHARD_FUNC std::string safetensors_header(const std::vector<SafetensorsEntry>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      json += (first ? "" : ",") + json_quote(k) + ":" + json_quote(v);
      first = false;
    }
    json += "}";
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    json += (i == 0 && metadata.empty() ? "" : ",") + json_quote(t.name) + ":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) json += (d ? "," : "") + std::to_string(t.shape[d]);
    json += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int b = 0; b < 8; ++b) out[std::size_t(b)] = char((std::uint64_t(json.size()) >> (8 * b)) & 0xff);
  return out + json;
}

TSHARD_FUNC std::map<std::string, std::string> parse_safetensors_index(const char* text, std::size_t size,
                                                                       const std::string& path) {
  const JsonValue root = parse_json(text, size, "'" + path + "'");
  const JsonValue* map = root.is_object() ? root.find("weight_map") : nullptr;
  if (!map || !map->is_object())
    throw IoError("tshard::io: '" + path + "' is not a safetensors index: it has no \"weight_map\" object");
  std::map<std::string, std::string> out;
  for (std::size_t i = 0; i < map->keys.size(); ++i) {
    const JsonValue& file = map->members[i];
    if (file.kind != JsonValue::Kind::String || file.string.empty())
      throw IoError("tshard::io: '" + path + "' maps \"" + map->keys[i] + "\" to something that is not a file name");
    out[map->keys[i]] = file.string;
  }
  return out;
}

}  // namespace tshard::io::detail
