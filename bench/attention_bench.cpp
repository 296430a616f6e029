// Attention, forward and backward, in float: ts::nn::scaled_dot_product_attention (fused,
// blockwise) against the same attention written out as the Llama wrote it before (einsum,
// additive causal mask, softmax, einsum: T x T scores kept for the backward), for each sequence
// length. GFLOP/s are counted as PyTorch's figures in the long-context issue were: the causal
// half of 4 B H T^2 Dh, times 3.5 for forward and backward; beside them, the rate of an Eigen
// sgemm (the products the fused kernel runs on) of 512^3 in the same run. The buffer pool's peak
// is each variant's tensors (the written-out scores among them).
//   mpirun -np 1 tshard_bench_attention [--batch 2] [--heads 4] [--kv-heads 4] [--dh 16]
//                                        [--seq 1024,2048,4096] [--written-max 4096] [--reps 3]
//                                        [--documents N] [--dropout P] [--alibi] [--softcap C]
// --documents N packs each row with N documents of equal length (the fused kernel skips the
// blocks between them; the written-out attention masks them). --dropout P, --alibi (the paper's
// slopes, ts::nn::alibi_slopes) and --softcap C each also time the fused attention with that option, beside it in the
// same run.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <tshard/tshard.hpp>

#include "bench_support.hpp"

namespace ts = tshard;
using M = ts::Mesh<"data", "model">;
using QS = ts::Spec<ts::S<"data">, ts::R, ts::R, ts::R, ts::S<"model">>;  // [B, T, Dh, G, KV]
using KS = ts::Spec<ts::S<"data">, ts::R, ts::R, ts::S<"model">>;         // [B, S, Dh, KV]
using Mask = ts::ShardedTensor<float, M, ts::Replicated<5>>;             // [1, T, T, 1, 1]

template <class Q, class K>
auto written_out(const Q& q, const K& k, const K& v, const Mask& mask, float scale) {
  auto p = ts::nn::softmax<2>(ts::einsum<"btkgv,bskv->btsgv">(q, k) * scale + mask);
  return ts::einsum<"btsgv,bskv->btkgv">(p, v);
}

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  long batch = 2, heads = 4, kv_heads = 0, dh = 16, written_max = 4096, documents = 1;
  int reps = 3;
  double dropout = 0, softcap = 0;
  bool alibi = false;
  std::vector<long> seqs{1024, 2048, 4096};
  const char* usage =
      "usage: tshard_bench_attention [--batch 2] [--heads 4] [--kv-heads 4] [--dh 16] [--seq 1024,2048,4096]\n"
      "                              [--written-max 4096] [--reps 3] [--documents N] [--dropout P] [--alibi]\n"
      "                              [--softcap C]\n";
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      if (tshard_bench::world_rank() == 0) std::fputs(usage, stdout);
      return 0;
    }
    if (a == "--alibi") {  // (a flag: no value)
      alibi = true;
      --i;
      continue;
    }
    if (i + 1 == argc) {
      if (tshard_bench::world_rank() == 0) std::fprintf(stderr, "tshard_bench_attention: %s takes a value\n%s", a.c_str(), usage);
      return 2;
    }
    const long v = std::atol(argv[i + 1]);
    if (a == "--batch") batch = v;
    else if (a == "--heads") heads = v;
    else if (a == "--kv-heads") kv_heads = v;
    else if (a == "--dh") dh = v;
    else if (a == "--written-max") written_max = v;
    else if (a == "--reps") reps = int(v);
    else if (a == "--documents") documents = v;
    else if (a == "--dropout") dropout = std::atof(argv[i + 1]);
    else if (a == "--softcap") softcap = std::atof(argv[i + 1]);
    else if (a == "--seq") {
      seqs.clear();
      for (std::string s = argv[i + 1]; !s.empty();) {
        const auto comma = s.find(',');
        seqs.push_back(std::atol(s.substr(0, comma).c_str()));
        s = comma == std::string::npos ? "" : s.substr(comma + 1);
      }
    } else {
      if (tshard_bench::world_rank() == 0) std::fprintf(stderr, "tshard_bench_attention: unknown option %s\n%s", a.c_str(), usage);
      return 2;
    }
  }
  if (kv_heads == 0) kv_heads = heads;
  if (documents < 1) {
    if (tshard_bench::world_rank() == 0) std::fprintf(stderr, "tshard_bench_attention: --documents takes N >= 1\n");
    return 2;
  }
  if (!(softcap >= 0 && std::isfinite(softcap))) {
    if (tshard_bench::world_rank() == 0) std::fprintf(stderr, "tshard_bench_attention: --softcap takes C >= 0\n");
    return 2;
  }
  if (!(dropout >= 0 && dropout < 1)) {
    if (tshard_bench::world_rank() == 0) std::fprintf(stderr, "tshard_bench_attention: --dropout takes P in [0, 1)\n");
    return 2;
  }
  if (heads % kv_heads != 0) {
    if (tshard_bench::world_rank() == 0) std::fprintf(stderr, "tshard_bench_attention: --kv-heads must divide --heads\n");
    return 2;
  }
  ts::flush_denormals();
  const M mesh({tshard_bench::world_size(), 1});
  const bool root = mesh.rank() == 0;

  Eigen::MatrixXf a = Eigen::MatrixXf::Random(512, 512), b = Eigen::MatrixXf::Random(512, 512), c(512, 512);
  const double sgemm_seconds = tshard_bench::interleaved({[&] { c.noalias() = a * b; }}, 5)[0];
  const double sgemm = 2.0 * 512 * 512 * 512 / sgemm_seconds / 1e9;
  if (root)
    std::printf("attention forward + backward, float, B %ld, %ld query heads over %ld key-value heads, Dh %ld, %d ranks; "
                "Eigen sgemm 512^3: %.1f GFLOP/s%s\n",
                batch, heads, kv_heads, dh, tshard_bench::world_size(), sgemm,
                documents > 1 ? ("; " + std::to_string(documents) + " documents a row").c_str() : "");
  for (const long T : seqs) {
    const Eigen::Index G = heads / kv_heads;
    const auto q = ts::random<float, QS>(mesh, {batch, T, dh, G, kv_heads}, 1);
    const auto k = ts::random<float, KS>(mesh, {batch, T, dh, kv_heads}, 2);
    const auto v = ts::random<float, KS>(mesh, {batch, T, dh, kv_heads}, 3);
    const float scale = 1 / std::sqrt(float(dh));
    ts::nn::AttentionOptions options;
    const auto document = [&](Eigen::Index t) { return t * documents / T; };  // (equal lengths, within one)
    if (documents > 1) {
      std::vector<Eigen::Index> starts;
      for (Eigen::Index t = 0; t < T; ++t)
        if (t == 0 || document(t) != document(t - 1)) starts.push_back(t);
      options.document_starts.assign(std::size_t(batch), starts);
    }
    auto fused_with = [&](const ts::nn::AttentionOptions& o) {
      return [&q, &k, &v, o] {
        auto grads = ts::ad::value_and_grad(
            [&](const auto& q, const auto& k, const auto& v) {
              return ts::sum<0, 1, 2, 3, 4>(ts::nn::scaled_dot_product_attention(q, k, v, o));
            },
            q, k, v);
        (void)grads;
      };
    };
    std::vector<std::function<void()>> variants{fused_with(options)};
    const bool written = T <= written_max;
    std::optional<Mask> mask;
    if (written) {
      mask.emplace(ts::from_function<float, ts::Replicated<5>>(mesh, {1, T, T, 1, 1}, [&](const auto& i) {
        return i[2] > i[1] || document(i[2]) != document(i[1]) ? -std::numeric_limits<float>::infinity() : 0.0f;
      }));
      variants.push_back([&] {
        auto grads = ts::ad::value_and_grad(
            [&](const auto& q, const auto& k, const auto& v) {
              return ts::sum<0, 1, 2, 3, 4>(written_out(q, k, v, *mask, scale));
            },
            q, k, v);
        (void)grads;
      });
    }
    // The options timed beside the plain fused attention: what each costs.
    std::vector<std::string> extras;
    auto time_also = [&](const std::string& label, auto&& change) {
      ts::nn::AttentionOptions o = options;
      change(o);
      variants.push_back(fused_with(o));
      extras.push_back(label);
    };
    auto label = [](const char* format, double x) {
      char text[64];
      std::snprintf(text, sizeof text, format, x);
      return std::string(text);
    };
    if (dropout > 0) time_also(label("dropout %.2f", dropout), [&](auto& o) { o.dropout = {.p = dropout, .seed = 1}; });
    if (alibi) time_also("ALiBi", [&](auto& o) { o.alibi_slopes = ts::nn::alibi_slopes(heads); });
    if (softcap > 0) time_also(label("softcap %g", softcap), [&](auto& o) { o.softcap = softcap; });
    std::vector<double> peaks;
    for (auto& f : variants) {
      ts::reset_pool_peak();
      const auto before = ts::pool_stats().bytes_in_use;
      f();
      peaks.push_back(double(ts::pool_stats().peak_bytes_in_use - before) / (1 << 20));
    }
    const auto times = tshard_bench::interleaved(variants, reps, 1);
    // The causal half of each document's square (one document: T^2 / 2).
    double visible = double(T) * double(T) / 2;
    if (documents > 1) {
      visible = 0;
      for (Eigen::Index t = 0, start = 0; t < T; ++t) {
        if (document(t) != document(start)) start = t;
        visible += double(t - start + 1);
      }
    }
    const double flops = 4.0 * double(batch) * double(heads) * visible * double(dh) * 3.5;
    const double rate = flops / times[0] / 1e9;
    if (!root) continue;
    std::printf("T %6ld: fused %9.2f ms, %6.1f GFLOP/s (%3.0f %% of sgemm), pool peak %8.2f MiB", T, times[0] * 1e3, rate,
                100 * rate / sgemm, peaks[0]);
    for (std::size_t e = 0; e < extras.size(); ++e) {
      const double t = times[times.size() - extras.size() + e];
      std::printf(" | %s %9.2f ms (%.2fx)", extras[e].c_str(), t * 1e3, t / times[0]);
    }
    if (written)
      std::printf(" | written out %9.2f ms, pool peak %8.2f MiB: fused %.1fx faster, %.1fx less memory\n", times[1] * 1e3,
                  peaks[1], times[1] / times[0], peaks[1] / peaks[0]);
    else
      std::printf(" | written out not run (T > --written-max %ld)\n", written_max);
  }
  return 0;
}
