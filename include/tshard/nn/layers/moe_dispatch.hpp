// Dispatch and combine of a mixture-of-experts layer as gathers over the gate's routes, not
// GShard's one-hot einsums. A token fills at most two of the E x C slots of its group, so the
// einsums' sums over S (dispatch) and over E x C (combine) have at most one or two nonzero
// terms: these kernels read x and the experts' outputs in place at those terms only. That
// costs O(G S D) per pass instead of the einsums' O(G S E C D) plus their copies into GEMM
// order (the groups are the fastest dim of every operand), which is what kept the experts
// below the dense model's speed for the same expert FLOPs. Dispatch, its transpose and the
// combine's gradient to the experts' outputs have a single term per element, so they equal
// the einsums bitwise; the combine and its gradient to the gates sum in the accumulator type
// (float for bfloat16) in a fixed order.
//
// Local layouts, column-major, groups padded to gp on every rank: x and y [gp, S, D];
// slots [gp, C, D, E] (GShard's row-major [E, G, C, M]); the gate weights [gp, S, E, C].
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "tshard/comm/datatype.hpp"
#include "tshard/core/shard.hpp"

namespace tshard::nn::detail {

using tshard::detail::Index;

// One token's routing, kept for backward.
struct Route {
  std::int32_t e1 = 0, e2 = 0;  // top-1 and top-2 experts
  std::int32_t c1 = -1, c2 = -1;  // their slots; -1: not dispatched (dropped, or not routed)
};

// The sizes of one layer's local routing: gp groups in the buffer (groups of them valid), each
// of s tokens of d features, over e experts of c slots each.
struct RoutingShape {
  Index gp = 0, groups = 0, s = 0, d = 0, e = 0, c = 0;
  Index tokens() const { return gp * s; }   // [gp, S]
  Index slots() const { return gp * c * e; }  // [gp, C, E]
};

// Which token fills each slot: token[g + gp (c + C e)] = s, or -1 for an empty slot.
inline std::vector<std::int32_t> slot_tokens(const Route* routes, const RoutingShape& r) {
  std::vector<std::int32_t> token(static_cast<std::size_t>(r.slots()), -1);
  for (Index s = 0; s < r.s; ++s)
    for (Index g = 0; g < r.groups; ++g) {
      const Route& t = routes[g + r.gp * s];
      if (t.c1 >= 0) token[std::size_t(g + r.gp * (t.c1 + r.c * t.e1))] = std::int32_t(s);
      if (t.c2 >= 0) token[std::size_t(g + r.gp * (t.c2 + r.c * t.e2))] = std::int32_t(s);
    }
  return token;
}

// out(g, c, m, e) = value(g, s, c, m, e) over a slots buffer [gp, C, D, E], s the token that
// fills slot (c, e) of group g; 0 for an empty slot or a padding group.
template <class T, class F>
void fill_slots(const std::vector<std::int32_t>& token, const RoutingShape& r, T* out, F&& value) {
  for (Index e = 0; e < r.e; ++e)
    for (Index m = 0; m < r.d; ++m)
      for (Index c = 0; c < r.c; ++c) {
        const std::int32_t* tok = token.data() + r.gp * (c + r.c * e);
        T* o = out + r.gp * (c + r.c * (m + r.d * e));
        for (Index g = 0; g < r.gp; ++g) o[g] = tok[g] >= 0 ? T(value(g, Index(tok[g]), c, m, e)) : T(0);
      }
}

// out(g, s, m) = value(g, s, route of token s, m) over a tokens buffer [gp, S, D]; 0 for padding.
template <class T, class F>
void fill_tokens(const Route* routes, const RoutingShape& r, T* out, F&& value) {
  for (Index m = 0; m < r.d; ++m)
    for (Index s = 0; s < r.s; ++s) {
      T* o = out + r.gp * (s + r.s * m);
      for (Index g = 0; g < r.gp; ++g) o[g] = g < r.groups ? T(value(g, s, routes[g + r.gp * s], m)) : T(0);
    }
}

// The element of slot (c, e) of group g at feature m in a slots buffer [gp, C, D, E].
inline Index slot_at(const RoutingShape& r, Index g, Index c, Index m, Index e) { return g + r.gp * (c + r.c * (m + r.d * e)); }
// The weight of token s of group g in slot (c, e), in the gate weights [gp, S, E, C].
inline Index weight_at(const RoutingShape& r, Index g, Index s, Index e, Index c) {
  return g + r.gp * (s + r.s * (e + r.e * c));
}

// dispatched(g, c, m, e) = x(g, s, m) for the slot's token s.
template <class T>
void dispatch_tokens(const T* x, const std::vector<std::int32_t>& token, const RoutingShape& r, T* dispatched) {
  fill_slots(token, r, dispatched, [&](Index g, Index s, Index, Index m, Index) { return x[g + r.gp * (s + r.s * m)]; });
}

// The transpose of dispatch: dx(g, s, m) = the sum of dd over the (at most two) slots token s
// fills, in the accumulator type.
template <class T>
void dispatch_tokens_transpose(const T* dd, const Route* routes, const RoutingShape& r, T* dx) {
  using A = tshard::accumulator_t<T>;
  fill_tokens(routes, r, dx, [&](Index g, Index, const Route& t, Index m) {
    A acc = A(0);
    if (t.c1 >= 0) acc += A(dd[slot_at(r, g, t.c1, m, t.e1)]);
    if (t.c2 >= 0) acc += A(dd[slot_at(r, g, t.c2, m, t.e2)]);
    return acc;
  });
}

// y(g, s, m) = w1 ye(g, c1, m, e1) + w2 ye(g, c2, m, e2) over the token's kept slots, w the gate
// weights [gp, S, E, C]; 0 for a token both its experts dropped.
template <class T>
void combine_slots(const T* w, const T* ye, const Route* routes, const RoutingShape& r, T* y) {
  using A = tshard::accumulator_t<T>;
  fill_tokens(routes, r, y, [&](Index g, Index s, const Route& t, Index m) {
    A acc = A(0);
    if (t.c1 >= 0) acc += A(w[weight_at(r, g, s, t.e1, t.c1)]) * A(ye[slot_at(r, g, t.c1, m, t.e1)]);
    if (t.c2 >= 0) acc += A(w[weight_at(r, g, s, t.e2, t.c2)]) * A(ye[slot_at(r, g, t.c2, m, t.e2)]);
    return acc;
  });
}

// The combine's gradient to the experts' outputs: dye(g, c, m, e) = w(g, s, e, c) dy(g, s, m)
// for the slot's token s.
template <class T>
void combine_slots_transpose_outputs(const T* w, const T* dy, const std::vector<std::int32_t>& token,
                                     const RoutingShape& r, T* dye) {
  using A = tshard::accumulator_t<T>;
  fill_slots(token, r, dye, [&](Index g, Index s, Index c, Index m, Index e) {
    return A(w[weight_at(r, g, s, e, c)]) * A(dy[g + r.gp * (s + r.s * m)]);
  });
}

// The combine's gradient to the gate weights: dw(g, s, e, c) = sum over m of dy(g, s, m)
// ye(g, c, m, e) at the token's kept slots (in the accumulator type, m in order), 0 elsewhere:
// the weights are zero there, and the gate's backward reads only its routes' slots.
template <class T>
void combine_slots_transpose_weights(const T* dy, const T* ye, const Route* routes, const RoutingShape& r, T* dw) {
  using A = tshard::accumulator_t<T>;
  std::fill(dw, dw + r.tokens() * r.e * r.c, T(0));
  std::vector<A> first(static_cast<std::size_t>(r.tokens()), A(0)), second(first.size(), A(0));
  for (Index m = 0; m < r.d; ++m)  // m outermost: dy and ye are read down their columns
    for (Index s = 0; s < r.s; ++s)
      for (Index g = 0; g < r.groups; ++g) {
        const Index at = g + r.gp * s;
        const Route& t = routes[at];
        const A v = A(dy[at + r.tokens() * m]);
        if (t.c1 >= 0) first[std::size_t(at)] += v * A(ye[slot_at(r, g, t.c1, m, t.e1)]);
        if (t.c2 >= 0) second[std::size_t(at)] += v * A(ye[slot_at(r, g, t.c2, m, t.e2)]);
      }
  for (Index s = 0; s < r.s; ++s)
    for (Index g = 0; g < r.groups; ++g) {
      const Index at = g + r.gp * s;
      const Route& t = routes[at];
      if (t.c1 >= 0) dw[weight_at(r, g, s, t.e1, t.c1)] = T(first[std::size_t(at)]);
      if (t.c2 >= 0) dw[weight_at(r, g, s, t.e2, t.c2)] = T(second[std::size_t(at)]);
    }
}

}  // namespace tshard::nn::detail
