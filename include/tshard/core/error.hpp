// The exception hierarchy. Errors that depend on global facts are thrown on every rank alike.
#pragma once
#include <stdexcept>
#include <string>

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

}  // namespace tshard
