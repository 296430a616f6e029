// A small JSON reader and string quoting, MPI-free, for the headers of formats tshard reads
// (safetensors' header, Hugging Face's model.safetensors.index.json). It takes any bytes (it is
// fuzzed): malformed text, nesting deeper than 64 and numbers out of range are an IoError
// naming the file and the byte where the text went wrong (RFC 8259's grammar).
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tshard/core/error.hpp"
#include "tshard/core/kernel_instances.hpp"

namespace tshard::io::detail {

struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  bool integral = false;          // written without fraction or exponent, and within int64
  std::int64_t integer = 0;       // its value where integral
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::string> keys;   // an object's member names, in the order written,
  std::vector<JsonValue> members;  // and their values (two vectors: a pair cannot hold an incomplete type)

  bool is_object() const { return kind == Kind::Object; }
  // The member named `key`, or null where there is none.
  const JsonValue* find(const std::string& key) const;
};

// The whole text as one value (surrounding whitespace allowed, nothing after it); `what` names the
// text in errors.
JsonValue parse_json(const char* text, std::size_t size, const std::string& what);

// s as a JSON string literal, quotes included.
std::string json_quote(const std::string& s);

}  // namespace tshard::io::detail

#if TSHARD_HEADER_BODIES
#include "tshard/io/json-inl.hpp"
#endif
