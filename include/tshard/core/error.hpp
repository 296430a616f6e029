// The exception hierarchy. Errors that depend on global facts are thrown on every rank alike.
#pragma once
#include <stdexcept>
#include <string>
#include <type_traits>

namespace tshard {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct MeshError : Error {  // mesh sizes vs communicator, tensors of different meshes
  using Error::Error;
};
struct ShapeError : Error {  // shapes that do not fit an operation
  using Error::Error;
};
struct SpecError : Error {  // specs that do not fit an operation at run time
  using Error::Error;
};
struct IndexError : Error {  // an index (take's ids) outside the extent it indexes
  using Error::Error;
};
struct IoError : Error {  // files and rank-local failures agreed on by all ranks
  using Error::Error;
};
struct ValueError : Error {  // option values: an environment variable's, a setting's
  using Error::Error;
};

namespace detail {
// Text for an error message, made only when the error is thrown: a plain string, or a callable
// that returns one (a tensor's describe()), so that operators on the hot path format nothing
// they do not throw. Holds a reference: a parameter type, never stored.
class Text {
 public:
  Text(const char* s) : plain_(s) {}
  Text(const std::string& s) : plain_(s.c_str()) {}
  template <class F>
    requires(std::is_invocable_r_v<std::string, const F&> && !std::is_convertible_v<const F&, const char*>)
  Text(const F& f) : object_(&f), call_([](const void* o) { return std::string((*static_cast<const F*>(o))()); }) {}
  std::string str() const { return call_ ? call_(object_) : std::string(plain_); }

 private:
  const char* plain_ = "";
  const void* object_ = nullptr;
  std::string (*call_)(const void*) = nullptr;
};
}  // namespace detail

}  // namespace tshard
