// alibi_slopes(heads): ALiBi's slopes for AttentionOptions::alibi_slopes, as the paper's
// reference code (Press et al. 2022), BLOOM and MPT compute them: for a power of two n, the
// geometric sequence 2^(-8 / n), 2^(-16 / n), ..., 2^(-8); otherwise those of the power of two
// below n, then every other slope of twice that power for the heads left over.
//
//   auto y = ts::nn::scaled_dot_product_attention(q, k, v, {.alibi_slopes = ts::nn::alibi_slopes(heads)});
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "tshard/core/error.hpp"

namespace tshard::nn {

inline std::vector<double> alibi_slopes(Eigen::Index heads) {
  if (heads < 1) throw ShapeError("tshard::nn::alibi_slopes: " + std::to_string(heads) + " heads (at least 1)");
  Eigen::Index power = 1;  // the largest power of two <= heads
  while (power * 2 <= heads) power *= 2;
  std::vector<double> slopes;
  slopes.reserve(std::size_t(heads));
  for (Eigen::Index i = 1; i <= power; ++i) slopes.push_back(std::exp2(-8.0 * double(i) / double(power)));
  for (Eigen::Index i = 1; Eigen::Index(slopes.size()) < heads; i += 2)  // 2^(-8 i / 2 power), odd i
    slopes.push_back(std::exp2(-4.0 * double(i) / double(power)));
  return slopes;
}

}  // namespace tshard::nn
