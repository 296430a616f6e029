// A mixture-of-experts MLP as GShard has it (Lepikhin et al., arXiv 2006.16668, algorithm 1 and
// figure 7): top-2 gating with an expert capacity, the auxiliary load-balancing loss, random
// routing of the second expert, and dispatch and combine (GShard's one-hot einsums, computed as
// the gathers they are: nn/layers/moe_dispatch.hpp). Experts are split over a mesh axis (the data
// axis by default); the all-to-all between the group-split and the expert-split layout is a
// reshard of the expert dim, so explain() and the stats show it.
//
// Groups are data, not ranks: x is [G, S, D], G groups of S tokens (a group is a sequence), and
// capacity, positions and the auxiliary loss are per group. So which tokens are dropped, and
// the loss, do not depend on the mesh or on micro-batching. A token over capacity is dropped by
// that expert: its output there is zero and the block's residual carries it. The random routing
// of the second expert depends only on (seed, step, global token index).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tshard/ad/custom_vjp.hpp"
#include "tshard/nn/functional/activations.hpp"
#include "tshard/nn/init.hpp"
#include "tshard/nn/module.hpp"
#include "tshard/nn/layers/moe_dispatch.hpp"
#include "tshard/nn/layers/moe_gating.hpp"
#include "tshard/ops/einsum.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {

struct MoEOptions {
  Eigen::Index dmodel = 64;
  Eigen::Index hidden = 0;        // each expert's MLP width; 0: 4 * dmodel
  int experts = 4;
  double capacity_factor = 1.25;  // capacity per expert and group: ceil(factor * 2 S / E), at most S
  double aux_weight = 0.01;       // the load-balancing loss's weight in the objective
  bool random_routing = true;     // GShard: the second expert only with probability 2 * its gate
  std::uint64_t seed = 1;
};



// y = sum over the token's (at most two) experts of gate * expert(x), for x [G, S, D]: groups
// split over ExpertAxis, as are the experts' weights wi [D, H, E] and wo [H, D, E], whose hidden
// dim is split over Model. The router [D, E] is replicated. The expert dim is the last (the
// slowest in column-major order), so each expert's tokens and weights are one contiguous GEMM
// operand: GShard's row-major [E, G, C, M] is [G, C, M, E] here.
template <class T, class M, FixedString ExpertAxis = "data", FixedString Model = "model">
class MoE : public Module {
  static_assert(is_real_floating_v<T>, "tshard: MoE's element type is float, double or bfloat16");

 public:
  using XSpec = Spec<S<ExpertAxis>, R, R>;                 // [G, S, D]
  using RouterSpec = Spec<R, R>;                           // [D, E]
  using InSpec = Spec<R, S<Model>, S<ExpertAxis>>;         // wi [D, H, E]
  using OutSpec = Spec<S<Model>, R, S<ExpertAxis>>;        // wo [H, D, E]
  using GroupSplit = Spec<S<ExpertAxis>, R, R, R>;         // [G, C, D, E] as dispatched: groups split
  using ExpertSplit = Spec<R, R, R, S<ExpertAxis>>;        // [G, C, D, E] after the all-to-all
  using X = ShardedTensor<T, M, XSpec>;
  using Router = ShardedTensor<T, M, RouterSpec>;
  using In = ShardedTensor<T, M, InSpec>;
  using Out = ShardedTensor<T, M, OutSpec>;
  using Slots = ShardedTensor<T, M, GroupSplit>;           // dispatched tokens, the experts' outputs
  using Mask = ShardedTensor<T, M, Spec<S<ExpertAxis>, R, R, R>>;  // gate weights [G, S, E, C]
  static_assert(tshard::detail::specs_on_mesh<M, InSpec>(),
                "tshard: MoE's experts split over a mesh axis this mesh lacks (ExpertAxis, \"data\" by default, and "
                "Model, \"model\"): give the mesh those axes (of size 1 where nothing splits over them)");

  MoE(const M& mesh, const MoEOptions& o)
      : mesh_(mesh), o_(o), hidden_(o.hidden > 0 ? o.hidden : 4 * o.dmodel),
        router_(own_parameter("router", detail::uniform_init<T, RouterSpec>(mesh, {o.dmodel, Eigen::Index(o.experts)},
                                                                            o.seed * 4 + 1, 1.0 / std::sqrt(double(o.dmodel))))),
        wi_(own_parameter("expert_in", detail::uniform_init<T, InSpec>(mesh, {o.dmodel, hidden_, Eigen::Index(o.experts)},
                                                                       o.seed * 4 + 2, 1.0 / std::sqrt(double(o.dmodel))))),
        wo_(own_parameter("expert_out", detail::uniform_init<T, OutSpec>(mesh, {hidden_, o.dmodel, Eigen::Index(o.experts)},
                                                                         o.seed * 4 + 3, 1.0 / std::sqrt(double(hidden_))))) {
    streams_parameters_ = true;  // every use is bracketed by use()
    if (o.experts < 1) throw ShapeError("tshard::nn::MoE: " + std::to_string(o.experts) + " experts; at least 1 is needed");
    if (!(o.capacity_factor > 0))
      throw ShapeError("tshard::nn::MoE: the capacity factor " + std::to_string(o.capacity_factor) + " is not positive");
  }

  Router& router() { return router_; }
  In& expert_in() { return wi_; }
  Out& expert_out() { return wo_; }
  // The gradients (complete: an owning optimizer finishes their data-parallel sum first).
  Router& router_grad() { return gradient_of(router_); }
  In& expert_in_grad() { return gradient_of(wi_); }
  Out& expert_out_grad() { return gradient_of(wo_); }
  const MoEOptions& options() const { return o_; }

  // Slots per expert and group of S tokens.
  Eigen::Index capacity(Eigen::Index s) const {
    const double c = std::ceil(o_.capacity_factor * 2.0 * double(s) / double(o_.experts));
    return std::max<Eigen::Index>(1, std::min<Eigen::Index>(s, Eigen::Index(c)));
  }

  // The plans of the all-to-alls for an input of `groups` groups of `s` tokens: dispatch (the
  // expert dim from replicated to split, the groups from split to whole) and its way back.
  std::string explain(Eigen::Index groups, Eigen::Index s) const {
    const std::array<Eigen::Index, 4> shape{groups, capacity(s), o_.dmodel, Eigen::Index(o_.experts)};
    const ShardedTensor<T, M, GroupSplit> dispatched(mesh_, shape);
    const ShardedTensor<T, M, ExpertSplit> processed(mesh_, shape);
    return "dispatch [G, C, D, E]: " + explain_reshard<ExpertSplit>(dispatched) + "\ncombine [G, C, D, E]: " +
           explain_reshard<GroupSplit>(processed);
  }

  // The term the last forward added to the objective: aux_weight * l_aux * (its groups' share of
  // the whole batch's groups). The same on every rank.
  T auxiliary_loss() const { return last_.aux_term; }
  // Steps seen (the random routing depends on it); a resumed run sets it.
  void resume(std::uint64_t steps) { calls_ = steps; }
  // The last forward's routing, over all its groups.
  const RoutingStats& routing() const { return last_.routing; }

  // The layer forward only, its gradient derived (ts::ad): the top-2 gate a custom VJP (its
  // hand-written backward, the load-balancing term's gradient included), dispatch and combine
  // gathers over its routes with their transposes as VJPs. The routing statistics and the
  // auxiliary loss of the last forward are kept (routing(), auxiliary_loss()).
  template <tshard::detail::FloatingTensor XIn>
  X operator()(const XIn& x_in) {
    static_assert(XIn::rank == 3, "tshard: MoE takes x [G, S, D] (groups of S tokens)");
    static_assert(std::is_same_v<typename XIn::Scalar, T>, "tshard: MoE's input has the layer's element type");
    tshard::detail::OperatorScope scope("moe");
    auto in_use = use();
    X x = reshard<XSpec>(x_in);
    tshard::detail::require_same_mesh(router_, x, "moe");
    if (tshard::detail::extents_of(x)[2] != tshard::detail::extents_of(router_)[0])
      throw ShapeError("tshard::nn::MoE: the input " + x.describe() + " does not end in the router's " +
                       std::to_string(tshard::detail::extents_of(router_)[0]) + " features");
    const MicroBatch& mb = micro_batch();  // the model's own context, set by its pipeline
    const bool inference = mb.inference || !is_training();
    if (mb.index == 0 && !mb.recompute && !inference) ++calls_;
    const Eigen::Index groups = tshard::detail::extents_of(x)[0], s_len = tshard::detail::extents_of(x)[1],
                       e = o_.experts, c = capacity(s_len);
    const Eigen::Index total_groups = mb.rows_total > 0 ? mb.rows_total : groups;
    using Probs = ShardedTensor<T, M, Spec<S<ExpertAxis>, R, R>>;
    // What the gate's backward, dispatch and combine need, shared by their forwards and backwards.
    struct Gate : Routes {
      std::optional<Probs> probs;
    };
    auto gate = std::make_shared<Gate>();
    last_ = LastForward{};
    auto logits = einsum<"gsm,me->gse">(x, router_);  // [G, S, E], groups split like x
    const bool random = o_.random_routing && !inference;
    const std::uint64_t seed = tshard::detail::splitmix64(o_.seed * 1000033 + calls_);
    Mask combine = ad::custom_vjp(
        [&](const auto& l) {
          Mask comb(mesh_, {groups, s_len, e, c});
          Probs probs(mesh_, {groups, s_len, e});
          route(l.data(), tshard::detail::layout_of(l), s_len, c, random, seed, mb, groups, total_groups, comb.data(),
                probs.data(), *gate, last_);
          gate->probs.emplace(std::move(probs));
          return comb;
        },
        [gate, groups, s_len, e](const auto& dcombine, const auto&, const auto& l) {
          Probs dlogits(l.mesh(), {groups, s_len, e});
          const auto& lay = tshard::detail::layout_of(dlogits);
          detail::top2_gating_backward<T>(dcombine.data(), gate->probs->data(), gate->routes.data(), gate->density.data(),
                                          lay.padded[0], lay.valid[0], s_len, e, gate->aux_grad, dlogits.data());
          return dlogits;
        },
        logits);
    // Dispatch: [G, C, D, E] with groups split, then the all-to-all to experts split; the experts'
    // MLP; back to groups split (the partial over Model resolved) and combined. Dispatch and
    // combine are gathers over the routes with their transposes as VJPs (nn/layers/moe_dispatch.hpp).
    auto dispatched = ad::custom_vjp(
        [gate, c](const X& t) {
          Slots out(t.mesh(), {tshard::detail::extents_of(t)[0], c, tshard::detail::extents_of(t)[2], gate->shape.e});
          detail::dispatch_tokens(t.data(), gate->slot_token, gate->shape, out.data());
          return out;
        },
        [gate](const auto& dd, const auto&, const X& t) {
          X dx(t.mesh(), t.global_shape());
          detail::dispatch_tokens_transpose(dd.data(), gate->routes.data(), gate->shape, dx.data());
          return dx;
        },
        x);
    auto xe = reshard<ExpertSplit>(dispatched);
    auto h = einsum<"gcme,mhe->gche">(xe, wi_);        // [G, C, H, E], H split over Model
    auto ye = einsum<"gche,hme->gcme">(gelu(h), wo_);  // partial over Model
    Slots yg = reshard<GroupSplit>(ye);
    return ad::custom_vjp(
        [gate, groups, s_len](const Mask& w, const Slots& out) {
          X y(out.mesh(), {groups, s_len, tshard::detail::extents_of(out)[2]});
          detail::combine_slots(w.data(), out.data(), gate->routes.data(), gate->shape, y.data());
          return y;
        },
        [gate](const auto& dy, const auto&, const Mask& w, const Slots& out) {
          Mask dw(w.mesh(), w.global_shape());
          detail::combine_slots_transpose_weights(dy.data(), out.data(), gate->routes.data(), gate->shape, dw.data());
          Slots dout(out.mesh(), out.global_shape());
          detail::combine_slots_transpose_outputs(w.data(), dy.data(), gate->slot_token, gate->shape, dout.data());
          return std::tuple{std::move(dw), std::move(dout)};
        },
        combine, yg);
  }

 private:
  // The local routing's sizes, from the gate logits' layout [G, S, E] (groups split like x).
  detail::RoutingShape routing_shape(const tshard::detail::ShardLayout& logits, Eigen::Index s_len, Eigen::Index c) const {
    return {.gp = logits.padded[0], .groups = logits.valid[0], .s = s_len, .d = o_.dmodel, .e = Eigen::Index(o_.experts),
            .c = c};
  }

  // What the gate decided in one forward, which dispatch, combine and the gate's backward read.
  struct Routes {
    detail::RoutingShape shape;
    std::vector<detail::Route> routes;
    std::vector<std::int32_t> slot_token;
    std::vector<T> density;
    double aux_grad = 0;  // d(objective)/d(l_aux) of each group
  };
  // What the last forward's routing decided, over all its groups.
  struct LastForward {
    RoutingStats routing;
    T aux_term = T(0);
  };

  // The top-2 gate over this rank's logits (layout lay, [G, S, E]): fills combine and probs
  // ([G, S, E, C] and [G, S, E] blocks), the routes, and the routing's counts and auxiliary term
  // over every group (an all-reduce over the groups' axes) in sv.
  void route(const T* logits, const tshard::detail::ShardLayout& lay, Eigen::Index s_len, Eigen::Index c, bool random,
             std::uint64_t seed, const MicroBatch& mb, Eigen::Index groups, Eigen::Index total_groups, T* combine,
             T* probs, Routes& r, LastForward& sv) {
    const Eigen::Index gp = lay.padded[0], e = o_.experts;
    r.shape = routing_shape(lay, s_len, c);
    r.routes.assign(std::size_t(gp * s_len), detail::Route{});
    r.density.assign(std::size_t(gp * e), T(0));
    RoutingStats local;
    const double aux = detail::top2_gating<T>(logits, gp, lay.valid[0], s_len, e, c, random, seed, lay.offset[0],
                                              mb.row_offset, total_groups, combine, probs, r.routes.data(),
                                              r.density.data(), local);
    r.slot_token = detail::slot_tokens(r.routes.data(), r.shape);
    double sums[3] = {double(local.assignments), double(local.dropped), aux}, all[3] = {0, 0, 0};
    tshard::detail::all_reduce(tshard::detail::state_of(mesh_)->group_of_mask(X::spec_desc.split_axes()), sums, all, 3,
                               ReduceOp::Sum);
    sv.routing = RoutingStats{std::int64_t(all[0]), std::int64_t(all[1]), all[2] / double(groups)};
    sv.aux_term = T(o_.aux_weight * all[2] / double(total_groups));
    r.aux_grad = o_.aux_weight / double(total_groups);
  }

  M mesh_;
  MoEOptions o_;
  Eigen::Index hidden_;
  Router& router_;  // (in the module's parameter slots: they stay put when the layer moves)
  In& wi_;
  Out& wo_;
  LastForward last_;
  std::uint64_t calls_ = 0;
};

}  // namespace tshard::nn
