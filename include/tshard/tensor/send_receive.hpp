// A tensor's block sent to, or received from, the rank at another coordinate of one mesh axis (the
// next pipeline stage), the rest of the coordinates alike: a pipeline's activations moved by hand,
// as in sampling through the stages. The peer holds a tensor of the same type and shape, so its
// block has this one's layout. Counted like every message; blocking.
//
//   ts::send<"stage">(mesh, x, stage + 1);        // x on the stage's {data, model} mesh
//   ts::receive<"stage">(mesh, x, stage - 1);
#pragma once
#include "tshard/comm/point_to_point.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {

template <FixedString Axis, MeshType M, ShardedTensorType X>
void send(const M& mesh, const X& x, int to, int tag = 0) {
  auto m = detail::PendingMessage::send(mesh.template comm<Axis>(), to, x.data(), x.padded_size(), tag);
  m.wait();
}

template <FixedString Axis, MeshType M, ShardedTensorType X>
void receive(const M& mesh, X& x, int from, int tag = 0) {
  static_assert(!X::is_partial, "tshard: a tensor received is a plain one (send its resolved value)");
  auto m = detail::PendingMessage::receive(mesh.template comm<Axis>(), from, x.data(), x.padded_size(), tag);
  m.wait();
}

}  // namespace tshard
