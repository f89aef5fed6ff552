// topologies/split.hpp: the slicing math of a placement as pure functions
// (STYLE.md item 5): contiguous ranges, the even split used for heads and FFN
// units, and the weighted, capacity-limited split used for pipeline layers.
//
// No state, no allocation the caller keeps other than the returned vectors;
// thread-safe. Errors are values.
#pragma once

#include "model/result.hpp"

#include <string>
#include <vector>

namespace cellshard::topologies {

/// A half-open range [begin, end) of items (layers, heads, hidden units).
struct range {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool contains(int i) const { return i >= begin && i < end; }
  friend bool operator==(const range& a, const range& b) { return a.begin == b.begin && a.end == b.end; }
  friend bool operator!=(const range& a, const range& b) { return !(a == b); }
};
/// "[0,3)"
std::string to_string(const range& r);

/// Splits n items into k contiguous, nearly equal parts, in order: the first
/// n % k parts hold one item more (4 over 3 -> 2,1,1; 172 over 3 ->
/// 58,57,57). Parts are empty when n < k. Requires k >= 1, n >= 0 (otherwise
/// an empty vector).
std::vector<range> split_even(int n, int k);

/// Splits n items into weights.size() contiguous parts, each holding at least
/// one item, so that the largest load count_i / weights[i] is as small as the
/// capacities allow.
///
/// Method: every part starts with one item; each further item goes to the
/// part whose load (count_i + 1) / weights[i] would be smallest among the parts
/// below their capacity (D'Hondt / Jefferson apportionment, which minimises
/// the largest load for a given count). Ties go to the part with the smaller
/// tie_cost[i], then to the lower index. With equal weights and no binding
/// capacities this gives floor/ceil counts, the extra items on the parts of
/// least tie_cost.
///
/// weights: one positive weight per part (e.g. memory budget).
/// capacity: maximum items per part; empty = unlimited.
/// tie_cost: a cost already on each part (e.g. embedding or classifier work);
///           empty = all zero. Only breaks ties.
/// Errors: no parts, a non-positive weight, fewer items than parts, a part of
/// capacity 0, or total capacity below n.
result<std::vector<range>> split_weighted(int n, const std::vector<double>& weights,
                                          const std::vector<int>& capacity = {},
                                          const std::vector<double>& tie_cost = {});

}  // namespace cellshard::topologies
