// Slicing math: even splits (heads, FFN units) and the weighted,
// capacity-limited split (pipeline layers), against hand-worked cases and a
// brute-force optimum.
#include "topologies/split.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <random>

using namespace cellshard::topologies;

namespace {
std::vector<int> sizes(const std::vector<range>& parts) {
  std::vector<int> out;
  for (const auto& p : parts) out.push_back(p.size());
  return out;
}
// True when the parts cover [0, n) contiguously, in order.
bool covers(const std::vector<range>& parts, int n) {
  int at = 0;
  for (const auto& p : parts) {
    if (p.begin != at || p.end < p.begin) return false;
    at = p.end;
  }
  return at == n;
}
}  // namespace

TEST_CASE("split_even: uneven splits give the first parts one more", "[split]") {
  CHECK(sizes(split_even(4, 3)) == std::vector<int>{2, 1, 1});
  CHECK(sizes(split_even(172, 3)) == std::vector<int>{58, 57, 57});
  CHECK(sizes(split_even(2048, 5)) == std::vector<int>{410, 410, 410, 409, 409});
  CHECK(sizes(split_even(12, 4)) == std::vector<int>{3, 3, 3, 3});
  CHECK(sizes(split_even(2, 4)) == std::vector<int>{1, 1, 0, 0});
  const auto p = split_even(4, 3);
  CHECK(p[0] == range{0, 2});
  CHECK(p[1] == range{2, 3});
  CHECK(p[2] == range{3, 4});
  CHECK(split_even(5, 0).empty());
  CHECK(split_even(-1, 2).empty());
  CHECK(to_string(range{3, 5}) == "[3,5)");
}

TEST_CASE("split_even: every split covers, sizes differ by at most one, larger first", "[split]") {
  for (int n = 0; n <= 40; ++n) {
    for (int k = 1; k <= 9; ++k) {
      const auto parts = split_even(n, k);
      REQUIRE(static_cast<int>(parts.size()) == k);
      CHECK(covers(parts, n));
      for (size_t i = 1; i < parts.size(); ++i) {
        CHECK(parts[i].size() <= parts[i - 1].size());
        CHECK(parts[0].size() - parts[i].size() <= 1);
      }
    }
  }
}

TEST_CASE("split_weighted: equal weights give floor/ceil, extras by tie cost", "[split]") {
  auto r = split_weighted(12, {1, 1, 1, 1});
  REQUIRE(r);
  CHECK(sizes(*r) == std::vector<int>{3, 3, 3, 3});
  // 5 layers over 3 equal stages: stage 0 carries a small extra (embedding
  // row), the last a big one (classifier): extras go to the middle, then 0.
  r = split_weighted(5, {1, 1, 1}, {}, {1, 0, 5});
  REQUIRE(r);
  CHECK(sizes(*r) == std::vector<int>{2, 2, 1});
  r = split_weighted(7, {1, 1, 1}, {}, {1, 0, 5});
  REQUIRE(r);
  CHECK(sizes(*r) == std::vector<int>{2, 3, 2});
  // No tie costs: lower index first.
  r = split_weighted(5, {2, 2, 2});
  REQUIRE(r);
  CHECK(sizes(*r) == std::vector<int>{2, 2, 1});
  CHECK(covers(*r, 5));
}

TEST_CASE("split_weighted: weights apportion, capacities bind", "[split]") {
  auto r = split_weighted(8, {1, 2, 1});
  REQUIRE(r);
  CHECK(sizes(*r) == std::vector<int>{2, 4, 2});
  r = split_weighted(10, {1, 1, 1}, {2, 10, 10});
  REQUIRE(r);
  CHECK(sizes(*r) == std::vector<int>{2, 4, 4});
  // A tiny weight still gets its one item.
  r = split_weighted(12, {8192, 256, 8192}, {}, {1, 0, 5});
  REQUIRE(r);
  CHECK(sizes(*r) == std::vector<int>{6, 1, 5});
}

TEST_CASE("split_weighted: errors", "[split]") {
  CHECK_FALSE(split_weighted(3, {}));
  const auto few = split_weighted(2, {1, 1, 1});
  REQUIRE_FALSE(few);
  CHECK(few.message() == "split of 2 items into 3 parts: every part needs at least one item");
  const auto room = split_weighted(10, {1, 1}, {4, 5});
  REQUIRE_FALSE(room);
  CHECK(room.message() == "split of 10 items: the parts have room for only 9");
  CHECK_FALSE(split_weighted(4, {1, 1}, {0, 9}));
  CHECK_FALSE(split_weighted(4, {1, 0}));
  CHECK_FALSE(split_weighted(4, {1, -2}));
  CHECK_FALSE(split_weighted(4, {1, 1}, {4}));
  CHECK_FALSE(split_weighted(4, {1, 1}, {}, {0}));
}

TEST_CASE("split_weighted reaches the brute-force minimum of the largest load", "[split]") {
  std::mt19937 rng(20240607u);
  std::uniform_int_distribution<int> wdist(1, 9), cdist(1, 6);
  for (int trial = 0; trial < 300; ++trial) {
    const int k = 1 + trial % 4;
    const int n = k + static_cast<int>(rng() % 8);
    std::vector<double> w;
    std::vector<int> cap;
    for (int i = 0; i < k; ++i) {
      w.push_back(wdist(rng));
      cap.push_back(cdist(rng) + 1);
    }
    int total_cap = 0;
    for (int c : cap) total_cap += c;
    const auto r = split_weighted(n, w, cap);
    if (total_cap < n) {
      CHECK_FALSE(r);
      continue;
    }
    REQUIRE(r);
    REQUIRE(covers(*r, n));
    double got = 0;
    for (int i = 0; i < k; ++i) {
      REQUIRE((*r)[static_cast<size_t>(i)].size() >= 1);
      REQUIRE((*r)[static_cast<size_t>(i)].size() <= cap[static_cast<size_t>(i)]);
      got = std::max(got, (*r)[static_cast<size_t>(i)].size() / w[static_cast<size_t>(i)]);
    }
    // Every composition of n into k parts within [1, cap].
    double best = 1e300;
    std::vector<int> c(static_cast<size_t>(k), 0);
    std::function<void(int, int)> go = [&](int i, int left) {
      if (i == k - 1) {
        if (left < 1 || left > cap[static_cast<size_t>(i)]) return;
        c[static_cast<size_t>(i)] = left;
        double m = 0;
        for (int j = 0; j < k; ++j) m = std::max(m, c[static_cast<size_t>(j)] / w[static_cast<size_t>(j)]);
        best = std::min(best, m);
        return;
      }
      for (int x = 1; x <= std::min(left - (k - 1 - i), cap[static_cast<size_t>(i)]); ++x) {
        c[static_cast<size_t>(i)] = x;
        go(i + 1, left - x);
      }
    };
    go(0, n);
    CHECK(got == Approx(best));
  }
}
