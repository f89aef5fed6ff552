// base/percentile.hpp: the one percentile of the project (run reports, chaos,
// the planner's simulator, benches): linear interpolation between the two
// closest ranks, i.e. the q-quantile of the sorted samples x[0..n-1] is
//   x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]),  h = q * (n - 1)
// (Hyndman & Fan's definition 7; numpy's and R's default). q in [0, 1] (clamped).
// Empty input: 0. Pure; takes its samples by value (it sorts them).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

namespace cellshard {

template <class T>
double percentile(std::vector<T> v, double q) {
  if (v.empty()) return 0;
  q = std::min(1.0, std::max(0.0, q));
  std::sort(v.begin(), v.end());
  const double h = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(h));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  const double a = static_cast<double>(v[lo]), b = static_cast<double>(v[hi]);
  return a + (h - static_cast<double>(lo)) * (b - a);
}

/// percentile(v, 0.5): the middle sample, or the mean of the two middle ones
/// when there is an even number of them. Empty input: 0.
template <class T>
double median(std::vector<T> v) {
  return percentile(std::move(v), 0.5);
}

}  // namespace cellshard
