// The device mesh: named axes (compile time), sizes (run time), and its communicators: one for
// the whole mesh (a duplicate, so tshard's traffic never mixes with the user's) and one for
// every subset of axes, whose rank is the mixed-radix coordinate over those axes in the order
// asked for (first major), so that a group's rank is the shard coordinate of a split.
#pragma once
#include "tshard/comm/mpi.hpp"

#include <array>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "tshard/comm/all_reduce.hpp"
#include "tshard/core/fixed_string.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/mesh_shape.hpp"
#include "tshard/core/spec_descriptor.hpp"

namespace tshard {
namespace detail {

class MeshState {
 public:
  MeshState(MPI_Comm parent, std::vector<std::string> names, std::vector<int> sizes);
  ~MeshState();
  MeshState(const MeshState&) = delete;
  MeshState& operator=(const MeshState&) = delete;

  const MeshShape& shape() const { return shape_; }
  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int ranks() const { return shape_.size(); }
  const std::array<int, kMaxAxes>& coords() const { return coords_; }

  // The communicator of the ranks that share this rank's coordinates on every axis not listed;
  // its rank is the mixed radix of the listed axes' coordinates, first major. Collective over
  // the mesh the first time a given ordered list is asked for (SPMD: all ranks ask alike).
  MPI_Comm group(const std::vector<int>& axes);
  MPI_Comm group(const DimSplit& split, int first = 0);
  MPI_Comm group_of_mask(std::uint32_t mask);
  // The group of `mask` split by node (all_reduce.hpp's two levels), made on first use:
  // collective over that group, whose ranks ask alike (they build the same buckets).
  std::shared_ptr<const NodeGroups> node_groups(std::uint32_t mask);

 private:
  MeshShape shape_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::array<int, kMaxAxes> coords_{};
  std::map<std::vector<int>, MPI_Comm> groups_;
  std::map<std::uint32_t, std::shared_ptr<const NodeGroups>> node_groups_;
};

}  // namespace detail

namespace detail {
struct MeshAccess;
}

// An N-D logical grid of ranks with named axes. Copies share one mesh (same communicators);
// tensors keep their mesh alive.
template <FixedString... Axes>
class Mesh {
 public:
  static constexpr int axes = int(sizeof...(Axes));
  static constexpr std::array<std::string_view, sizeof...(Axes)> axis_names{Axes.view()...};
  static_assert(axes > 0, "tshard: a Mesh needs at least one named axis");
  static_assert(axes <= detail::kMaxAxes, "tshard: a Mesh has at most 8 axes");
  static_assert(detail::names_unique(axis_names), "tshard: a Mesh names the same axis twice");

  // Sizes on MPI_COMM_WORLD. A size of -1 is inferred: the ranks the others leave, shared among
  // the -1 axes as evenly as possible, largest first (the MPI standard's rule for MPI_Dims_create:
  // Mesh<"x", "y", "z">({-1, -1, -1}) on 12 ranks is {3, 2, 2}). MeshError where they do not fit.
  template <std::size_t N>
  explicit Mesh(const int (&sizes)[N]) : Mesh(MPI_COMM_WORLD, sizes) {}
  // Sizes on another communicator (a boost::mpi::communicator converts to MPI_Comm).
  template <std::size_t N>
  Mesh(MPI_Comm comm, const int (&sizes)[N]) : Mesh(comm, std::to_array(sizes)) {}
  // The same from a std::array (sizes parsed from a command line, say).
  template <std::size_t N>
  explicit Mesh(const std::array<int, N>& sizes) : Mesh(MPI_COMM_WORLD, sizes) {}
  template <std::size_t N>
  Mesh(MPI_Comm comm, const std::array<int, N>& sizes) {
    static_assert(N == sizeof...(Axes), "tshard: a Mesh takes one size per axis");
    state_ = std::make_shared<detail::MeshState>(
        comm, std::vector<std::string>{std::string(Axes.view())...}, std::vector<int>(sizes.begin(), sizes.end()));
  }

  template <FixedString A>
  static constexpr int axis_index() {
    constexpr std::array<std::string_view, 1> name{A.view()};
    constexpr int a = detail::axis_index(axis_names, name, 0);
    static_assert(a >= 0, "tshard: this name is not an axis of this mesh");
    return a;
  }
  template <FixedString A>
  int size() const {
    return state_->shape().sizes[axis_index<A>()];
  }
  template <FixedString A>
  int coord() const {
    return state_->coords()[axis_index<A>()];
  }
  int size() const { return state_->ranks(); }  // number of ranks
  int rank() const { return state_->rank(); }
  MPI_Comm comm() const { return state_->comm(); }
  // The communicator over the named axes among the ranks that share this rank's coordinates on
  // the others (Elemental's grid.ColComm()): mesh.comm<"stage">() is this rank's pipeline line.
  // Its rank is the mixed radix of the named coordinates, first name major. Owned by the mesh.
  template <FixedString... A>
    requires(sizeof...(A) > 0)
  MPI_Comm comm() const {
    return state_->group(std::vector<int>{axis_index<A>()...});
  }
  const detail::MeshShape& shape() const { return state_->shape(); }
  bool operator==(const Mesh& o) const { return state_ == o.state_; }

  // The mesh of the named axes over the ranks that share this rank's coordinates on the others:
  // a pipeline stage's {data, model} mesh inside {data, stage, model}. Its coordinates are this
  // mesh's on those axes. Collective over this mesh (every rank asks alike).
  template <FixedString... Keep>
  Mesh<Keep...> submesh() const {
    static_assert(sizeof...(Keep) > 0, "tshard: a submesh keeps at least one axis");
    const std::vector<int> kept{axis_index<Keep>()...};
    const int sizes[] = {size<Keep>()...};
    return Mesh<Keep...>(state_->group(kept), sizes);
  }

 private:
  friend struct detail::MeshAccess;
  std::shared_ptr<detail::MeshState> state_;
};

namespace detail {
// The communicators and coordinates that tshard's descriptor code runs on, kept out of Mesh's
// public interface: users need none of it.
struct MeshAccess {
  template <class M>
  static const std::shared_ptr<MeshState>& state(const M& mesh) {
    return mesh.state_;
  }
};
template <class M>
const std::shared_ptr<MeshState>& state_of(const M& mesh) {
  return MeshAccess::state(mesh);
}
}  // namespace detail

namespace detail {
template <class M>
struct is_mesh : std::false_type {};
template <FixedString... A>
struct is_mesh<Mesh<A...>> : std::true_type {};
}  // namespace detail

template <class M>
concept MeshType = detail::is_mesh<M>::value;

// Free-function forms for generic code (no `.template` needed).
template <FixedString A, MeshType M>
int axis_size(const M& mesh) {
  return mesh.template size<A>();
}
template <FixedString A, MeshType M>
int axis_coord(const M& mesh) {
  return mesh.template coord<A>();
}

}  // namespace tshard

#if TSHARD_HEADER_BODIES
#include "tshard/comm/mesh-inl.hpp"
#endif
