// The input window each rank's output block of a windowed layer reads (conv2d, pooling,
// upsampling), gathered through the halo path, and the transpose that sends a gradient with
// respect to that window back to the blocks it was read from. Kept from forward to backward.
#pragma once
#include <algorithm>
#include <memory>

#include "tshard/comm/halo_transfer.hpp"
#include "tshard/core/halo_geometry.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::nn::detail {

template <class T>
struct WindowGather {
  tshard::detail::HaloTransfer<T> transfer;
  std::shared_ptr<T> window;                 // extents `dims`, starting at global index `lo`
  tshard::detail::Extents dims{}, lo{};
  int rank = 0;

  // Fills `window` with x's elements in this rank's request (request(r): rank r's window, the
  // same on every rank); zeros outside x. Collective over x's mesh.
  template <class X, class Request>
  void gather(const X& x, Request&& request) {
    auto mesh = tshard::detail::state_of(x.mesh());
    lo = request(mesh->rank()).lo;
    rank = X::rank;
    transfer = tshard::detail::HaloTransfer<T>(mesh, tshard::detail::plan_window(X::spec_desc, tshard::detail::extents_of(x),
                                                                                 mesh->shape(), mesh->rank(), request,
                                                                                 Boundary::Zero));
    dims = transfer.layout().window;
    window = tshard::detail::pooled_array<T>(std::size_t(std::max<tshard::detail::Index>(elements(), 1)));
    transfer.start(x.data(), tshard::detail::layout_of(x).padded, tshard::detail::Extents{}, window.get());
    transfer.finish();
  }
  tshard::detail::Index elements() const { return tshard::detail::volume(dims, rank); }
  // A zeroed buffer of the window's extents, for its gradient.
  std::shared_ptr<T> zeroed_window() const {
    auto d = tshard::detail::pooled_array<T>(std::size_t(std::max<tshard::detail::Index>(elements(), 1)));
    std::fill(d.get(), d.get() + elements(), T(0));
    return d;
  }
  // dx (type X, like's shape and mesh) from the window's gradient; releases the window.
  // Collective.
  template <class X, class Like>
  X add_back(const T* dwindow, const Like& like) {
    X dx(like.mesh(), like.global_shape());
    std::fill(dx.data(), dx.data() + dx.padded_size(), T(0));
    transfer.add_back(dwindow, dx.data(), tshard::detail::layout_of(dx).padded, tshard::detail::Extents{});
    window.reset();
    return dx;
  }
};

}  // namespace tshard::nn::detail
