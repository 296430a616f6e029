// The pre-layernorm transformer block (GPT-2's): y = h + mlp(ln2(h)), h = x + attention(ln1(x)),
// with dropout on both branches (and attention dropout on its probabilities) and an optional
// mixture of experts for the MLP. Its layouts come from one struct of specs
// (parallel/megatron.hpp's MegatronSpecs by default: heads and the MLP's hidden dim split over
// "model"), so the same block is data-, tensor- or both-parallel by annotation alone.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "tshard/nn/functional/dropout.hpp"
#include "tshard/nn/layers/attention.hpp"
#include "tshard/nn/layers/layer_norm.hpp"
#include "tshard/nn/layers/mlp.hpp"
#include "tshard/nn/layers/moe.hpp"
#include "tshard/parallel/megatron.hpp"

namespace tshard::nn {

// The sizes of a block. hidden 0 means 4 * dmodel; dropout applies to both residual branches,
// attention_dropout to the attention's probabilities (GPT-2's attn_pdrop), with masks from
// (seed, call, global index): the same on every mesh. experts > 0 makes the MLP a GShard mixture
// of experts (each expert hidden wide) with this capacity factor and load-balancing weight.
// kv_heads 0 means heads; fewer is grouped-query attention, for an attention layer that takes
// them (GroupedQuerySpecs' blocks).
struct BlockOptions {
  Eigen::Index dmodel = 64;
  Eigen::Index heads = 4;
  Eigen::Index hidden = 0;
  double dropout = 0.0;
  double attention_dropout = 0.0;
  std::uint64_t seed = 1;
  int experts = 0;
  double capacity_factor = 1.25;
  double aux_weight = 0.01;
  Eigen::Index kv_heads = 0;
};

namespace detail {
// The axes of a specs struct, "model" and "data" where it names none.
template <class Specs>
constexpr auto model_axis_of() {
  if constexpr (requires { Specs::model_axis; }) return Specs::model_axis;
  else return FixedString("model");
}
// The layout a specs struct pins for the block's activations [B, T, D], Deduced where it names none.
template <class Specs>
auto activation_of() {
  if constexpr (requires { typename Specs::activation; }) return std::type_identity<typename Specs::activation>{};
  else return std::type_identity<Deduced>{};
}
template <class Specs>
using activation_of_t = typename decltype(activation_of<Specs>())::type;
template <class Specs>
constexpr auto expert_axis_of() {
  if constexpr (requires { Specs::expert_axis; }) return Specs::expert_axis;
  else return FixedString("data");
}

// The block's submodules, as Megatron's layer specs name them: a specs struct may give its own
// `template <class T, class M> using norm_layer / attention_layer / mlp_layer = ...` (modules
// built as (mesh, dmodel), (mesh, dmodel, heads, seed) and (mesh, dmodel, hidden, seed), callable
// on [B, T, D]; an attention layer that says `static constexpr bool takes_kv_heads = true` is
// built as (mesh, dmodel, heads, kv_heads, seed); one callable as layer(x, const
// AttentionOptions&) gets the block's options and attention dropout, one callable as layer(x)
// only plain causal attention); absent ones are LayerNorm, Attention and MLP on the struct's
// specs. The struct's `activation` spec, where it pins one, goes to those and to an
// attention_layer that takes it as a third argument (template <class T, class M, class Act>).
template <class Specs, class T, class M>
struct block_layers {
  static auto norm() {
    if constexpr (requires { typename Specs::template norm_layer<T, M>; })
      return std::type_identity<typename Specs::template norm_layer<T, M>>{};
    else
      return std::type_identity<LayerNorm<T, M, typename Specs::norm>>{};
  }
  static auto attention() {
    if constexpr (requires { typename Specs::template attention_layer<T, M, activation_of_t<Specs>>; })
      return std::type_identity<typename Specs::template attention_layer<T, M, activation_of_t<Specs>>>{};
    else if constexpr (requires { typename Specs::template attention_layer<T, M>; })
      return std::type_identity<typename Specs::template attention_layer<T, M>>{};
    else
      return std::type_identity<Attention<T, M, typename Specs::qkv, typename Specs::attention_out, activation_of_t<Specs>>>{};
  }
  static auto mlp() {
    if constexpr (requires { typename Specs::template mlp_layer<T, M>; })
      return std::type_identity<typename Specs::template mlp_layer<T, M>>{};
    else
      return std::type_identity<MLP<T, M, typename Specs::mlp_in, typename Specs::mlp_out, activation_of_t<Specs>>>{};
  }
  using Norm = typename decltype(norm())::type;
  using SelfAttention = typename decltype(attention())::type;
  using Mlp = typename decltype(mlp())::type;
};
}  // namespace detail

// y = h + mlp(ln2(h)), h = x + attention(ln1(x)), for x [B, T, D].
template <class T, class M, class Specs = MegatronSpecs<"model">>
class TransformerBlock : public Module {
 public:
  TransformerBlock(const M& mesh, const BlockOptions& o)
      : o_(o),
        ln1_(mesh, o.dmodel),
        attention_(make_attention(mesh, o)),
        ln2_(mesh, o.dmodel) {
    for (const double p : {o.dropout, o.attention_dropout})
      if (!(p >= 0 && p < 1))
        throw ShapeError("tshard::nn::TransformerBlock: dropout " + std::to_string(o.dropout) + " and attention_dropout " +
                         std::to_string(o.attention_dropout) + " must be probabilities in [0, 1)");
    const Eigen::Index hidden = o.hidden > 0 ? o.hidden : 4 * o.dmodel;
    if (o.experts > 0)
      moe_.emplace(mesh, MoEOptions{.dmodel = o.dmodel, .hidden = hidden, .experts = o.experts,
                                    .capacity_factor = o.capacity_factor, .aux_weight = o.aux_weight,
                                    .seed = o.seed * 16 + 12});
    else
      mlp_.emplace(mesh, o.dmodel, hidden, o.seed * 16 + 8);
    register_module("ln1", ln1_);
    register_module("attention", attention_);
    register_module("ln2", ln2_);
    if (mlp_) register_module("mlp", *mlp_);
    else register_module("moe", *moe_);
  }

  using Layers = detail::block_layers<Specs, T, M>;
  using Norm = typename Layers::Norm;
  using SelfAttention = typename Layers::SelfAttention;
  using FeedForward = typename Layers::Mlp;
  using Experts = MoE<T, M, detail::expert_axis_of<Specs>(), detail::model_axis_of<Specs>()>;

  Norm& ln1() { return ln1_; }
  Norm& ln2() { return ln2_; }
  SelfAttention& attention() { return attention_; }
  FeedForward& mlp() { return *mlp_; }  // without experts
  Experts& moe() { return *moe_; }      // with experts
  bool has_experts() const { return moe_.has_value(); }
  // Steps seen (dropout masks and expert routing depend on it); a resumed run sets it.
  std::uint64_t steps_seen() const { return calls_; }
  void resume(std::uint64_t steps) {
    calls_ = steps;
    if (moe_) moe_->resume(steps);
  }
  // What the last forward's experts added to the objective (0 without experts).
  T auxiliary_loss() { return moe_ ? moe_->auxiliary_loss() : T(0); }

  // The block forward only, its gradient derived from its submodules' (the experts' gate through
  // its custom VJP). Dropout follows train()/eval(); its masks see the rows at their place in the
  // whole batch through micro_batch(). options go to the attention (bidirectional, a window,
  // packed documents; causal by default); their own dropout is refused, as the block draws
  // attention dropout itself (BlockOptions::attention_dropout, in training only).
  template <tshard::detail::FloatingTensor X>
  auto operator()(const X& x, const AttentionOptions& options = {}) {
    static_assert(X::rank == 3, "tshard: TransformerBlock takes x [B, T, D]");
    using Pinned = detail::activation_of_t<Specs>;
    if constexpr (tshard::detail::is_deduced<Pinned>) {
      return residual(x, options);
    } else {
      tshard::detail::OperatorScope scope("transformer_block");
      return residual(tshard::detail::laid_out_as<Pinned>(x), options);  // the residual stream in the specs' layout
    }
  }

 private:
  template <class X>
  auto residual(const X& x, const AttentionOptions& options) {
    tshard::detail::OperatorScope scope("transformer_block");
    auto in_use = use();
    const MicroBatch& mb = micro_batch();  // the model's own context, set by its pipeline
    const bool inference = mb.inference || !is_training();
    if (mb.index == 0 && !mb.recompute && !inference) ++calls_;
    auto branch = [&](const auto& y, int site) {
      using Out = ShardedTensor<T, M, typename std::remove_cvref_t<decltype(y)>::SpecType>;
      if (o_.dropout <= 0 || inference) return tshard::detail::implicit_reshard<typename Out::SpecType>(y, "transformer_block");
      return Out(dropout(y, o_.dropout, tshard::detail::splitmix64(o_.seed * 1000003 + std::uint64_t(calls_) * 2 + site),
                         mb.row_offset, mb.rows_total > 0 ? mb.rows_total : y.global_shape()[0]));
    };
    if (options.dropout.p != 0)
      throw SpecError("tshard::nn::TransformerBlock: the block draws its attention dropout itself (in training, for "
                      "the rows of its micro-batch): set BlockOptions::attention_dropout, not the options' dropout");
    auto attend = [&](const auto& y) {
      if constexpr (!std::is_invocable_v<SelfAttention&, decltype(y), const AttentionOptions&>) {
        // A specs struct's own attention layer, callable on y alone: causal, as it attends.
        if (o_.attention_dropout > 0 || !detail::is_plain_causal(options))
          throw SpecError("tshard::nn::TransformerBlock: its specs' attention_layer takes no AttentionOptions (it is "
                          "called as layer(x)), so the block cannot pass attention options or attention_dropout to "
                          "it: give the layer an operator()(x, const AttentionOptions&)");
        return attention_(y);
      } else {
        if (o_.attention_dropout <= 0 || inference) return attention_(y, options);
        AttentionOptions dropping = options;
        // (a stream of its own: the residual branches' seeds are splitmix64(seed * 1000003 + 2 calls + site))
        dropping.dropout = {.p = o_.attention_dropout,
                            .seed = tshard::detail::random_bits(o_.seed * 1000003 + std::uint64_t(calls_), 2),
                            .row_offset = mb.row_offset};
        return attention_(y, dropping);
      }
    };
    auto h = x + branch(attend(ln1_(x)), 0);
    using Y = decltype(h + branch((*mlp_)(ln2_(h)), 1));
    if (moe_) return reshard<typename Y::SpecType>(h + branch((*moe_)(ln2_(h)), 1));
    return h + branch((*mlp_)(ln2_(h)), 1);
  }

  // The attention layer: with its key-value heads where it says it takes them (mesh, dmodel,
  // heads, kv_heads, seed), else built as (mesh, dmodel, heads, seed), one per head.
  static SelfAttention make_attention(const M& mesh, const BlockOptions& o) {
    if constexpr (requires { requires SelfAttention::takes_kv_heads; }) {
      return SelfAttention(mesh, o.dmodel, o.heads, o.kv_heads != 0 ? o.kv_heads : o.heads, o.seed * 16 + 1);
    } else {
      if (o.kv_heads != 0 && o.kv_heads != o.heads)
        throw SpecError("tshard::nn::TransformerBlock: kv_heads " + std::to_string(o.kv_heads) + " for " +
                        std::to_string(o.heads) + " heads, but its attention layer has a key-value head per query "
                        "head: give the block specs with grouped-query attention (ts::nn::GroupedQuerySpecs)");
      return SelfAttention(mesh, o.dmodel, o.heads, o.seed * 16 + 1);
    }
  }

  BlockOptions o_;
  Norm ln1_;
  SelfAttention attention_;
  Norm ln2_;
  std::optional<FeedForward> mlp_;
  std::optional<Experts> moe_;
  std::uint64_t calls_ = 0;
};

}  // namespace tshard::nn
