// supervision::suspicion_table on injected time points: suspicion is not
// death (issue #20). No clock is read; every time is given.
#include "supervision/suspicion.hpp"

#include <catch2/catch.hpp>

using namespace cellshard::supervision;
using namespace std::chrono_literals;
using verdict = suspicion_table::verdict;

namespace {
const auto t0 = std::chrono::steady_clock::time_point{} + 1000s;
}

TEST_CASE("a suspected peer that answers a direct probe is cleared, once", "[suspicion]") {
  suspicion_table t;
  REQUIRE(t.suspect(2, t0));
  REQUIRE_FALSE(t.suspect(2, t0 + 10ms));  // one suspicion, one round
  const auto r = t.start_round(2, 2);      // direct + indirect
  REQUIRE(r != 0);
  CHECK(t.answer(2, r, true, t0 + 37ms, "direct") == verdict::cleared);
  CHECK(t.answer(2, r, true, t0 + 40ms, "indirect") == verdict::stale);  // round already decided
  CHECK(t.answer(2, r, false, t0 + 400ms, "indirect") == verdict::stale);
  REQUIRE(t.cleared().size() == 1);
  CHECK(t.cleared()[0].peer == 2);
  CHECK(t.cleared()[0].cleared_after_ms == Approx(37.0));
  CHECK(t.cleared()[0].cleared_by == "direct");
  CHECK(t.suspected(2));  // heartbeats still missing
  CHECK(t.needs_reprobe(2));
  CHECK_FALSE(t.dead(2));
}

TEST_CASE("a peer is dead only when every probe of a round failed", "[suspicion]") {
  suspicion_table t;
  REQUIRE(t.suspect(5, t0));
  const auto r = t.start_round(5, 3);
  CHECK(t.answer(5, r, false, t0 + 400ms, "direct") == verdict::pending);
  CHECK(t.answer(5, r, false, t0 + 400ms, "indirect") == verdict::pending);
  CHECK(t.answer(5, r, false, t0 + 401ms, "indirect") == verdict::dead);
  CHECK(t.dead(5));
  CHECK_FALSE(t.suspected(5));
  CHECK(t.cleared().empty());
  // A late heartbeat does not resurrect it here; forget() lets it rejoin.
  t.alive(5, t0 + 2s);
  CHECK(t.dead(5));
  CHECK_FALSE(t.suspect(5, t0 + 3s));
  t.forget(5);
  CHECK(t.suspect(5, t0 + 4s));
}

TEST_CASE("one answer among failures clears the peer (indirect probe)", "[suspicion]") {
  suspicion_table t;
  REQUIRE(t.suspect(1, t0));
  const auto r = t.start_round(1, 2);
  CHECK(t.answer(1, r, false, t0 + 400ms, "direct") == verdict::pending);
  CHECK(t.answer(1, r, true, t0 + 120ms, "indirect") == verdict::cleared);
  REQUIRE(t.cleared().size() == 1);
  CHECK(t.cleared()[0].cleared_by == "indirect");
}

TEST_CASE("a cleared peer that freezes later is found by a re-probe", "[suspicion]") {
  suspicion_table t;
  REQUIRE(t.suspect(3, t0));
  auto r1 = t.start_round(3, 1);
  CHECK(t.answer(3, r1, true, t0 + 5ms, "direct") == verdict::cleared);
  REQUIRE(t.needs_reprobe(3));
  auto r2 = t.start_round(3, 1);
  CHECK(r2 != r1);
  CHECK(t.answer(3, r1, false, t0 + 300ms, "direct") == verdict::stale);  // an old round
  CHECK(t.answer(3, r2, false, t0 + 655ms, "direct") == verdict::dead);
  CHECK(t.dead(3));
  REQUIRE(t.cleared().size() == 1);  // the clearance stays listed
  CHECK(t.cleared()[0].rounds == 1);
}

TEST_CASE("heartbeats that return end a suspicion, and a new one can start", "[suspicion]") {
  suspicion_table t;
  REQUIRE(t.suspect(4, t0));
  const auto r = t.start_round(4, 1);
  t.alive(4, t0 + 90ms);  // before the probe answered
  CHECK_FALSE(t.suspected(4));
  CHECK(t.answer(4, r, true, t0 + 95ms, "direct") == verdict::stale);
  REQUIRE(t.cleared().size() == 1);
  CHECK(t.cleared()[0].cleared_by == "heartbeat");
  CHECK(t.cleared()[0].cleared_after_ms == Approx(90.0));
  REQUIRE(t.suspect(4, t0 + 5s));
  CHECK(t.start_round(4, 1) != 0);
  CHECK(t.start_round(99, 1) == 0);  // not suspected
}
