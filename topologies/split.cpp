// topologies/split.cpp: even and weighted contiguous splits.
#include "topologies/split.hpp"

#include <cmath>

namespace cellshard::topologies {

std::string to_string(const range& r) {
  return "[" + std::to_string(r.begin) + "," + std::to_string(r.end) + ")";
}

std::vector<range> split_even(int n, int k) {
  std::vector<range> parts;
  if (k < 1 || n < 0) return parts;
  parts.reserve(static_cast<size_t>(k));
  const int base = n / k, extra = n % k;
  int at = 0;
  for (int i = 0; i < k; ++i) {
    const int size = base + (i < extra ? 1 : 0);
    parts.push_back(range{at, at + size});
    at += size;
  }
  return parts;
}

result<std::vector<range>> split_weighted(int n, const std::vector<double>& weights,
                                          const std::vector<int>& capacity,
                                          const std::vector<double>& tie_cost) {
  const size_t k = weights.size();
  if (k == 0) return make_error("split of " + std::to_string(n) + " items into no parts");
  if (!capacity.empty() && capacity.size() != k) {
    return make_error("split: " + std::to_string(capacity.size()) + " capacities for " + std::to_string(k) + " parts");
  }
  if (!tie_cost.empty() && tie_cost.size() != k) {
    return make_error("split: " + std::to_string(tie_cost.size()) + " tie costs for " + std::to_string(k) + " parts");
  }
  for (size_t i = 0; i < k; ++i) {
    if (!(weights[i] > 0) || !std::isfinite(weights[i])) {
      return make_error("split: part " + std::to_string(i) + " has weight " + std::to_string(weights[i]) +
                        " (must be positive)");
    }
  }
  if (n < static_cast<int>(k)) {
    return make_error("split of " + std::to_string(n) + " items into " + std::to_string(k) +
                      " parts: every part needs at least one item");
  }
  long long total_capacity = 0;
  for (size_t i = 0; i < k; ++i) {
    const int cap = capacity.empty() ? n : capacity[i];
    if (cap < 1) {
      return make_error("split: part " + std::to_string(i) + " has room for no item");
    }
    total_capacity += cap;
  }
  if (total_capacity < n) {
    return make_error("split of " + std::to_string(n) + " items: the parts have room for only " +
                      std::to_string(total_capacity));
  }

  std::vector<int> count(k, 1);
  for (int placed = static_cast<int>(k); placed < n; ++placed) {
    int best = -1;
    double best_load = 0, best_tie = 0;
    for (size_t i = 0; i < k; ++i) {
      if (!capacity.empty() && count[i] >= capacity[i]) continue;
      const double load = (count[i] + 1) / weights[i];
      const double tie = tie_cost.empty() ? 0.0 : tie_cost[i];
      // Loads compared with a relative tolerance so equal weights tie exactly
      // even after division.
      const bool better =
          best < 0 || load < best_load * (1 - 1e-12) ||
          (load <= best_load * (1 + 1e-12) && tie < best_tie);
      if (better) {
        best = static_cast<int>(i);
        best_load = load;
        best_tie = tie;
      }
    }
    ++count[static_cast<size_t>(best)];  // total capacity >= n: some part has room
  }

  std::vector<range> parts;
  parts.reserve(k);
  int at = 0;
  for (size_t i = 0; i < k; ++i) {
    parts.push_back(range{at, at + count[i]});
    at += count[i];
  }
  return parts;
}

}  // namespace cellshard::topologies
