// The Attention layer: q, k, v projections [D, Dh, H] with the heads split like the QKV spec, an
// output projection [Dh, H, D] whose product is a partial over the heads' axes (one all-reduce in
// forward and one in backward, as Megatron), attention between them (causal unless options say
// otherwise): the fused blockwise kernel (nn/functional/scaled_dot_product_attention.hpp: no
// T x T scores; a sequence split over an axis goes round a ring or through Ulysses' all-to-alls),
// or, where the projections are partial sums (the model dim split), the written-out causal one
// (nn/functional/attention.hpp), which resolves them. Both are custom VJPs.
#pragma once
#include <cstdint>
#include <string>

#include "tshard/nn/functional/attention.hpp"
#include "tshard/nn/functional/scaled_dot_product_attention.hpp"
#include "tshard/nn/init.hpp"
#include "tshard/nn/layers/pinned_activations.hpp"
#include "tshard/nn/module.hpp"
#include "tshard/ops/einsum.hpp"

namespace tshard::nn {

// The layer: x [B, T, D] -> [B, T, D]. QKVSpec lays out Wq, Wk, Wv [D, Dh, H]; OutSpec lays out
// Wo [Dh, H, D]; the bias [D] follows Wo's last dim. Dh = ceil(D / H), so any (D, H) works.
// ActSpec pins the layout of x and of the output (tokens split over the heads' axis: Megatron's
// sequence parallelism, x all-gathered once before the projections and the output projection's
// partial reduce-scattered into ActSpec).
template <class T, class M, class QKVSpec = Spec<R, R, S<"model">>, class OutSpec = Spec<R, S<"model">, R>,
          class ActSpec = Deduced>
class Attention : public Module {
  static_assert(tshard::detail::is_spec<QKVSpec>::value && QKVSpec::rank == 3,
                "tshard: Attention's QKV spec is a rank-3 tshard::Spec<model dim, head dim, heads>");
  static_assert(tshard::detail::is_spec<OutSpec>::value && OutSpec::rank == 3,
                "tshard: Attention's output spec is a rank-3 tshard::Spec<head dim, heads, model dim>");
  static_assert(is_real_floating_v<T>, "tshard: Attention's element type is float, double or bfloat16");
  static_assert(tshard::detail::specs_on_mesh<M, QKVSpec, OutSpec, ActSpec>(),
                "tshard: Attention's specs split over a mesh axis this mesh lacks (the defaults split heads over \"model\")"
                ": give the mesh that axis (of size 1 where nothing splits over it) or pass specs of its own axes");
  static_assert(tshard::detail::is_deduced<ActSpec> || tshard::detail::pinned_rank<ActSpec>() == 3,
                "tshard: Attention's activation spec is tshard::Deduced or a rank-3 tshard::Spec<batch, time, model dim>");

 public:
  using Proj = ShardedTensor<T, M, QKVSpec>;
  using Out = ShardedTensor<T, M, OutSpec>;
  using Bias = ShardedTensor<T, M, Spec<tshard::detail::dim_at_t<OutSpec, 2>>>;

  Attention(const M& mesh, Eigen::Index dmodel, Eigen::Index heads, std::uint64_t seed)
      : head_dim_((dmodel + std::max<Eigen::Index>(heads, 1) - 1) / std::max<Eigen::Index>(heads, 1)),
        wq_(own_parameter("wq", init_proj(mesh, dmodel, heads, seed))),
        wk_(own_parameter("wk", init_proj(mesh, dmodel, heads, seed + 1))),
        wv_(own_parameter("wv", init_proj(mesh, dmodel, heads, seed + 2))),
        wo_(own_parameter("wo", detail::uniform_init<T, OutSpec>(mesh, {head_dim_, heads, dmodel}, seed + 3,
                                                                 init::default_bound(head_dim_ * heads)))),
        bo_(own_parameter("bo", detail::uniform_init<T, typename Bias::SpecType>(mesh, {dmodel}, seed + 4,
                                                                                 init::default_bound(head_dim_ * heads)))) {
    streams_parameters_ = true;  // every use is bracketed by use()
    if (dmodel < 1 || heads < 1)
      throw ShapeError("tshard::nn::Attention: model dim " + std::to_string(dmodel) + " and heads " +
                       std::to_string(heads) + " must be positive");
  }

  Proj& wq() { return wq_; }
  Proj& wk() { return wk_; }
  Proj& wv() { return wv_; }
  Out& wo() { return wo_; }
  Bias& bo() { return bo_; }
  Eigen::Index head_dim() const { return head_dim_; }

  // x [B, T, D] -> [B, T, D], forward only: the projections' gradients are derived, the
  // attention's is its fused backward (a custom VJP). Nothing is kept in the layer. options
  // (nn/functional/attention_blocks.hpp) make it bidirectional (a ViT's, BERT's), windowed, or
  // keep packed documents apart, or drop probabilities (attention dropout, in training only:
  // eval() turns it off); the default is causal.
  template <tshard::detail::FloatingTensor X>
  auto operator()(const X& x, const AttentionOptions& options = {}) {
    static_assert(X::rank == 3, "tshard: Attention takes x [B, T, D]");
    tshard::detail::OperatorScope scope("attention");
    auto in_use = use();
    AttentionOptions scratch;
    return attend(detail::input_for_pinned<ActSpec, QKVSpec>(x),  // moved once for the three projections
                  detail::in_mode(options, is_training() && !micro_batch().inference, scratch));
  }

 private:
  // The projections, attention and output projection; the output in ActSpec where it is pinned.
  template <class X>
  auto attend(const X& x, const AttentionOptions& options) {
    using Q = decltype(einsum<"btd,dkh->btkh">(x, wq_));
    if constexpr (!Q::is_partial) {
      auto q = einsum<"btd,dkh->btkh">(x, wq_);  // [B, T, Dh, H]
      auto k = einsum<"btd,dkh->btkh">(x, wk_);
      auto v = einsum<"btd,dkh->btkh">(x, wv_);
      auto a = scaled_dot_product_attention(q, k, v, options);
      return detail::output_projection<"btkh,khd->btd", ActSpec>(a, wo_, bo_);
    } else {
      if (!detail::is_plain_causal(options))
        throw SpecError("tshard::nn::Attention: with the model dim split (partial projections) the attention is the "
                        "written-out causal one, which takes no options (bidirectional, window, scale, documents, "
                        "attention dropout, ALiBi, softcap, keys packed apart): split the heads instead");
      auto q = einsum<"btd,dkh->tbkh">(x, wq_);  // time-major: the attention products read in place
      auto k = einsum<"btd,dkh->tbkh">(x, wk_);
      auto v = einsum<"btd,dkh->tbkh">(x, wv_);
      return detail::output_projection<"tbkh,khd->btd", ActSpec>(attention(q, k, v), wo_, bo_);
    }
  }
  Proj init_proj(const M& mesh, Eigen::Index dmodel, Eigen::Index heads, std::uint64_t seed) const {
    return detail::uniform_init<T, QKVSpec>(mesh, {dmodel, head_dim_, heads}, seed, init::default_bound(dmodel));
  }

  Eigen::Index head_dim_;
  // In the module's parameter slots (registered as wq, wk, wv, wo, bo).
  Proj &wq_, &wk_, &wv_;
  Out& wo_;
  Bias& bo_;
};

}  // namespace tshard::nn
