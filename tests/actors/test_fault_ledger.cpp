// actors/fault_ledger: one record per failure whatever order the report of
// an injected fault, the restart decision and the recovery arrive in.
// Times are plain numbers (ns); no actor system.
#include "actors/fault_ledger.hpp"

#include <catch2/catch.hpp>

using cellshard::actors::fault_ledger;

namespace {
constexpr int64_t ms = 1'000'000;
}

TEST_CASE("fault ledger: a crash reported before its decision gets detect and recover times", "[fault_ledger]") {
  fault_ledger l;
  l.fired("crash", 2, 1, 40, 1000 * ms);
  l.decided(2, 1, "exit", 1003 * ms);
  l.recovered(2, 8, 1010 * ms, 3);
  REQUIRE(l.records().size() == 1);
  const auto& r = l.records()[0];
  CHECK(r.kind == "crash");
  CHECK(r.step == 40);
  CHECK(r.node == 1);
  CHECK(r.detect_ms == Approx(3.0));
  CHECK(r.recover_ms == Approx(7.0));
  CHECK(r.replayed_positions == 8);
  CHECK(r.moved_to_node == 3);
}

TEST_CASE("fault ledger: a decision that overtakes the report is completed by it", "[fault_ledger]") {
  fault_ledger l;
  l.decided(1, 4, "exit", 2005 * ms);  // the down_msg came first
  REQUIRE(l.records().size() == 1);
  CHECK(l.records()[0].kind == "exit");
  CHECK(l.records()[0].detect_ms == -1);
  l.fired("silence", 1, 4, 12, 2000 * ms);
  REQUIRE(l.records().size() == 1);
  CHECK(l.records()[0].kind == "silence");
  CHECK(l.records()[0].step == 12);
  CHECK(l.records()[0].detect_ms == Approx(5.0));
  // A report that fired after the decision is another fault.
  l.fired("crash", 1, 4, 30, 2010 * ms);
  CHECK(l.records().size() == 2);
}

TEST_CASE("fault ledger: observed failures, repeated decisions and slow plans", "[fault_ledger]") {
  fault_ledger l;
  // A killed daemon: the coordinator decides, then the supervisor's factory
  // decides again for the same shard: one failure.
  l.decided(3, 2, "node-silent", 100 * ms);
  l.decided(3, 2, "node-down", 150 * ms);
  REQUIRE(l.records().size() == 1);
  CHECK(l.records()[0].kind == "node-silent");
  CHECK(l.records()[0].step == -1);
  CHECK(l.records()[0].node == 2);
  // Once recovered, a later decision is a new failure; so is one 10 s later.
  l.recovered(3, 0, 200 * ms, 5);
  l.decided(3, 5, "node-down", 300 * ms);
  CHECK(l.records().size() == 2);
  l.decided(3, 5, "node-down", 300 * ms + 10'001 * ms);
  CHECK(l.records().size() == 3);
  // A slow plan fires at every step it covers: one record per plan step.
  l.fired("slow", 0, 0, 5, 400 * ms);
  l.fired("slow", 0, 0, 5, 410 * ms);
  CHECK(l.records().size() == 4);
  // Kinds that do not restart a shard never take a decision.
  l.decided(0, 0, "exit", 420 * ms);
  REQUIRE(l.records().size() == 5);
  CHECK(l.records()[3].decided_ns == 0);
  CHECK(l.records()[4].kind == "exit");
  // A recovery with no decision pending changes nothing.
  fault_ledger empty;
  empty.recovered(1, 3, 5, 1);
  CHECK(empty.records().empty());
  CHECK(fault_ledger::restarts_shard("partition"));
  CHECK_FALSE(fault_ledger::restarts_shard("drop"));
}
