// Grouped-query attention (Ainslie et al. 2023; Llama 2 and 3, Mistral; Megatron's
// num_query_groups): H query heads in KV groups of G = H / KV, each group reading one key-value
// head, so the key and value projections (and what a KV cache would keep) are KV / H the size.
// The query weights are [D, Dh, G, KV], each query head stored beside the key-value head it
// reads, so splitting the key-value heads over an axis keeps every group whole on one rank: the
// fused attention runs locally on any KV and rank count (3 over 2 ranks, 1 over 4), and a split
// sequence goes round the ring or through the all-to-alls as Attention's does. With KV = H (G = 1)
// it computes what Attention does from the same seed (its weights have a unit group dim, so their
// state dicts differ in shape). It has no written-out fallback for a split model dim: it splits
// heads.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "tshard/nn/functional/scaled_dot_product_attention.hpp"
#include "tshard/nn/init.hpp"
#include "tshard/nn/layers/pinned_activations.hpp"
#include "tshard/nn/module.hpp"
#include "tshard/ops/einsum.hpp"
#include "tshard/parallel/megatron.hpp"

namespace tshard::nn {

namespace detail {
// [D, Dh, KV] -> the query weights' [D, Dh, G, KV]; [Dh, KV, D] -> the output's [Dh, G, KV, D]:
// the group dim whole (a group stays with its key-value head).
template <class S>
struct grouped_query_weights;
template <class A, class B, class C>
struct grouped_query_weights<Spec<A, B, C>> {
  using type = Spec<A, B, R, C>;
};
template <class S>
struct grouped_output_weights;
template <class A, class B, class C>
struct grouped_output_weights<Spec<A, B, C>> {
  using type = Spec<A, R, B, C>;
};
}  // namespace detail

// The layer: x [B, T, D] -> [B, T, D]. KVSpec lays out Wk, Wv [D, Dh, KV] (and Wq [D, Dh, G, KV]
// likewise, the group dim whole); OutSpec lays out Wo as [Dh, KV, D] would be (its G dim whole);
// the bias [D] follows Wo's last dim. Dh = ceil(D / H); H a multiple of KV. ActSpec pins the
// layout of x and of the output, as Attention's does.
template <class T, class M, class KVSpec = Spec<R, R, S<"model">>, class OutSpec = Spec<R, S<"model">, R>,
          class ActSpec = Deduced>
class GroupedQueryAttention : public Module {
  static_assert(tshard::detail::is_spec<KVSpec>::value && KVSpec::rank == 3,
                "tshard: GroupedQueryAttention's key-value spec is a rank-3 tshard::Spec<model dim, head dim, "
                "key-value heads>");
  static_assert(tshard::detail::is_spec<OutSpec>::value && OutSpec::rank == 3,
                "tshard: GroupedQueryAttention's output spec is a rank-3 tshard::Spec<head dim, key-value heads, "
                "model dim>");
  static_assert(is_real_floating_v<T>, "tshard: GroupedQueryAttention's element type is float, double or bfloat16");
  static_assert(tshard::detail::specs_on_mesh<M, KVSpec, OutSpec, ActSpec>(),
                "tshard: GroupedQueryAttention's specs split over a mesh axis this mesh lacks (the defaults split "
                "key-value heads over \"model\"): give the mesh that axis (of size 1 where nothing splits over it) "
                "or pass specs of its own axes");
  static_assert(std::is_same_v<tshard::detail::dim_at_t<KVSpec, 0>, R>,
                "tshard: GroupedQueryAttention splits heads, not the model dim: its key-value spec's first dim is R");
  static_assert(tshard::detail::is_deduced<ActSpec> || tshard::detail::pinned_rank<ActSpec>() == 3,
                "tshard: GroupedQueryAttention's activation spec is tshard::Deduced or a rank-3 tshard::Spec<batch, "
                "time, model dim>");

 public:
  static constexpr bool takes_kv_heads = true;  // TransformerBlock builds it with BlockOptions::kv_heads
  using QuerySpec = typename detail::grouped_query_weights<KVSpec>::type;
  using OutputSpec = typename detail::grouped_output_weights<OutSpec>::type;
  using Query = ShardedTensor<T, M, QuerySpec>;         // [D, Dh, G, KV]
  using KeyValue = ShardedTensor<T, M, KVSpec>;         // [D, Dh, KV]
  using Output = ShardedTensor<T, M, OutputSpec>;       // [Dh, G, KV, D]
  using Bias = ShardedTensor<T, M, Spec<tshard::detail::dim_at_t<OutSpec, 2>>>;

  GroupedQueryAttention(const M& mesh, Eigen::Index dmodel, Eigen::Index heads, Eigen::Index kv_heads, std::uint64_t seed)
      : head_dim_(checked_head_dim(dmodel, heads, kv_heads)),
        groups_(heads / kv_heads),
        wq_(own_parameter("wq", detail::uniform_init<T, QuerySpec>(mesh, {dmodel, head_dim_, groups_, kv_heads}, seed,
                                                                   init::default_bound(dmodel)))),
        wk_(own_parameter("wk", detail::uniform_init<T, KVSpec>(mesh, {dmodel, head_dim_, kv_heads}, seed + 1,
                                                                init::default_bound(dmodel)))),
        wv_(own_parameter("wv", detail::uniform_init<T, KVSpec>(mesh, {dmodel, head_dim_, kv_heads}, seed + 2,
                                                                init::default_bound(dmodel)))),
        wo_(own_parameter("wo", detail::uniform_init<T, OutputSpec>(mesh, {head_dim_, groups_, kv_heads, dmodel}, seed + 3,
                                                                    init::default_bound(head_dim_ * heads)))),
        bo_(own_parameter("bo", detail::uniform_init<T, typename Bias::SpecType>(mesh, {dmodel}, seed + 4,
                                                                                 init::default_bound(head_dim_ * heads)))) {
    streams_parameters_ = true;  // every use is bracketed by use()
  }

  Query& wq() { return wq_; }
  KeyValue& wk() { return wk_; }
  KeyValue& wv() { return wv_; }
  Output& wo() { return wo_; }
  Bias& bo() { return bo_; }
  Eigen::Index head_dim() const { return head_dim_; }
  Eigen::Index groups() const { return groups_; }

  // x [B, T, D] -> [B, T, D], forward only (the projections' gradients derived, the attention's
  // its fused backward). options as Attention's: causal by default, attention dropout in
  // training only.
  template <tshard::detail::FloatingTensor X>
  auto operator()(const X& x, const AttentionOptions& options = {}) {
    static_assert(X::rank == 3, "tshard: GroupedQueryAttention takes x [B, T, D]");
    tshard::detail::OperatorScope scope("grouped_query_attention");
    auto in_use = use();
    AttentionOptions scratch;
    return attend(detail::input_for_pinned<ActSpec, KVSpec>(x),  // moved once for the three projections
                  detail::in_mode(options, is_training() && !micro_batch().inference, scratch));
  }

 private:
  template <class X>
  auto attend(const X& x, const AttentionOptions& options) {
    auto q = einsum<"btd,dkgh->btkgh">(x, wq_);  // [B, T, Dh, G, KV]
    auto k = einsum<"btd,dkh->btkh">(x, wk_);    // [B, T, Dh, KV]
    auto v = einsum<"btd,dkh->btkh">(x, wv_);
    static_assert(!decltype(q)::is_partial,
                  "tshard: GroupedQueryAttention splits heads, not the model dim: its projections must not be "
                  "partial sums (use Attention, whose written-out attention resolves them)");
    auto a = scaled_dot_product_attention(q, k, v, options);
    return detail::output_projection<"btkgh,kghd->btd", ActSpec>(a, wo_, bo_);
  }

  static Eigen::Index checked_head_dim(Eigen::Index dmodel, Eigen::Index heads, Eigen::Index kv_heads) {
    if (dmodel < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0)
      throw ShapeError("tshard::nn::GroupedQueryAttention: model dim " + std::to_string(dmodel) + ", heads " +
                       std::to_string(heads) + " and key-value heads " + std::to_string(kv_heads) +
                       " must be positive, the heads a multiple of the key-value heads");
    return (dmodel + heads - 1) / heads;
  }

  Eigen::Index head_dim_, groups_;
  // In the module's parameter slots (registered as wq, wk, wv, wo, bo).
  Query& wq_;
  KeyValue &wk_, &wv_;
  Output& wo_;
  Bias& bo_;
};

// Megatron's layout with grouped-query attention in its blocks: key-value heads (and their
// groups of query heads) over Model; TransformerBlock takes the key-value heads from
// BlockOptions::kv_heads, and the activation spec from a struct derived from this one that pins
// it (`using activation = ...`: sequence parallelism).
template <FixedString Model = "model">
struct GroupedQuerySpecs : MegatronSpecs<Model> {
  template <class T, class M, class Act = Deduced>
  using attention_layer =
      GroupedQueryAttention<T, M, typename MegatronSpecs<Model>::qkv, typename MegatronSpecs<Model>::attention_out, Act>;
};

}  // namespace tshard::nn
