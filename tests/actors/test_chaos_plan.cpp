// chaos's fault plans (actors/chaos_plan.hpp): every drawn value inside its
// documented range, every kind drawn, the same seed redraws the same plans,
// the texts parse back to the plans, and the coincidence rule. No clock.
#include "actors/chaos_plan.hpp"

#include <catch2/catch.hpp>

#include <map>
#include <set>

using namespace cellshard;

TEST_CASE("chaos kinds: defaults and checks", "[chaos_plan]") {
  CHECK(actors::default_fault_kinds(false) ==
        std::vector<std::string>{"crash", "silence", "slow", "drop", "delay", "corrupt", "partition"});
  const auto with = actors::default_fault_kinds(true);
  REQUIRE(with.size() == 9);
  CHECK(with[7] == "kill");
  CHECK(with[8] == "stop");
  CHECK(actors::check_fault_kinds({"crash", "partition"}, false));
  CHECK(actors::check_fault_kinds({"kill", "stop"}, true));
  auto e = actors::check_fault_kinds({"crash", "kill"}, false);
  REQUIRE_FALSE(e);
  CHECK(e.message() == "--kinds kill: external faults need daemons started by chaos (--processes N)");
  auto u = actors::check_fault_kinds({"melt"}, true);
  REQUIRE_FALSE(u);
  CHECK(u.message().find("melt") != std::string::npos);
}

TEST_CASE("chaos draws: ranges of every kind, texts that parse back", "[chaos_plan]") {
  std::mt19937_64 rng(7);
  const auto kinds = actors::default_fault_kinds(true);
  const int shards = 3, positions = 40;
  std::map<std::string, int> seen;
  for (int i = 0; i < 2000; ++i) {
    const auto d = actors::draw_fault(rng, kinds, shards, positions);
    if (d.external) {
      ++seen[d.ext.kind];
      CHECK(d.ext.index >= 0);
      CHECK(d.ext.index < shards);
      CHECK(d.ext.at >= 1);
      CHECK(d.ext.at <= positions - 2);
      if (d.ext.kind == "kill") CHECK(d.ext.ms == 0);
      else CHECK((d.ext.ms == 0 || (d.ext.ms >= 100 && d.ext.ms <= 2000)));
      CHECK(d.text() == actors::to_string(d.ext));
      continue;
    }
    const auto& f = d.plan;
    const std::string kind = supervision::to_string(f.kind);
    ++seen[kind];
    CHECK(f.node < static_cast<uint32_t>(shards));
    CHECK(f.step <= static_cast<uint64_t>(positions - 2));
    using K = supervision::fault_kind;
    switch (f.kind) {
      case K::silence:  // half of them silent until restarted (no ms=)
        CHECK((!f.duration_ms || (*f.duration_ms >= 100 && *f.duration_ms <= 2000)));
        CHECK_FALSE(f.count);
        break;
      case K::crash:
        CHECK_FALSE(f.duration_ms);
        CHECK_FALSE(f.count);
        break;
      case K::slow:
        REQUIRE(f.duration_ms);
        REQUIRE(f.count);
        CHECK(f.duration_ms >= 1);
        CHECK(f.duration_ms <= 10);
        CHECK(f.count >= 1);
        CHECK(f.count <= 20);
        break;
      case K::drop:
      case K::corrupt:
        CHECK_FALSE(f.duration_ms);
        REQUIRE(f.count);
        CHECK(f.count >= 1);
        CHECK(f.count <= 2);
        break;
      case K::delay:
        REQUIRE(f.duration_ms);
        REQUIRE(f.count);
        CHECK(f.duration_ms >= 1);
        CHECK(f.duration_ms <= 50);
        CHECK(f.count >= 1);
        CHECK(f.count <= 3);
        break;
      case K::partition:
        REQUIRE(f.duration_ms);
        CHECK_FALSE(f.count);
        CHECK(f.duration_ms >= 50);
        CHECK(f.duration_ms <= 1500);
        break;
      default: FAIL("unexpected kind " << kind);
    }
    auto back = supervision::parse_fault_spec(d.text());
    REQUIRE(back);
    CHECK(supervision::to_string(*back) == d.text());
    CHECK(*back == f);
  }
  // 9 kinds drawn uniformly: each about 2000/9 = 222 times.
  REQUIRE(seen.size() == 9);
  for (const auto& kv : seen) {
    INFO(kv.first);
    CHECK(kv.second > 150);
    CHECK(kv.second < 300);
  }
}

TEST_CASE("chaos draws: short runs and a restricted kind list", "[chaos_plan]") {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100; ++i) {
    // A run of 2 positions: the only step a fault can fire at is 0 (injected) or 1 (external).
    const auto d = actors::draw_fault(rng, {"crash", "kill"}, 1, 2);
    if (d.external) {
      CHECK(d.ext.kind == "kill");
      CHECK(d.ext.at == 1);
      CHECK(d.ext.index == 0);
    } else {
      CHECK(d.plan.kind == supervision::fault_kind::crash);
      CHECK(d.plan.step == 0);
      CHECK(d.plan.node == 0);
    }
  }
  CHECK(actors::to_string(actors::external_fault{"stop", 2, 5, 250}) == "stop:node=2:step=5:ms=250");
  CHECK(actors::to_string(actors::external_fault{"kill", 0, 3, 0}) == "kill:node=0:step=3");
}

TEST_CASE("chaos run plans: the same seed redraws them, one in four coincides", "[chaos_plan]") {
  const auto kinds = actors::default_fault_kinds(true);
  std::mt19937_64 a(2026), b(2026);
  int coincide = 0, pairs = 0;
  for (int run = 0; run < 400; ++run) {
    const auto p = actors::draw_run_plan(a, kinds, 4, 100, 3);
    const auto q = actors::draw_run_plan(b, kinds, 4, 100, 3);
    CHECK(p.texts == q.texts);
    REQUIRE(p.texts.size() == 3);
    REQUIRE(p.injected.size() + p.external.size() == 3);
    // Injected plans in drawing order: a later one at the previous one's step
    // is a coincidence (chance alone gives about 1 in 99).
    for (size_t k = 1; k < p.injected.size(); ++k) {
      ++pairs;
      if (p.injected[k].step == p.injected[k - 1].step) ++coincide;
    }
  }
  REQUIRE(pairs > 200);
  const double share = static_cast<double>(coincide) / pairs;
  INFO(coincide << " of " << pairs);
  CHECK(share > 0.15);  // ~ 1/4 of the pairs moved, + 1/99 by chance
  CHECK(share < 0.40);
  std::mt19937_64 c(2027);
  CHECK(actors::draw_run_plan(c, kinds, 4, 100, 3).texts != actors::draw_run_plan(b, kinds, 4, 100, 3).texts);
}
