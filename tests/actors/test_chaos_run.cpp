// chaos's bookkeeping of a run over daemons (actors/chaos_run.hpp): which
// signals are due at a delivered token and to which daemon, which runtime
// record answers each signal, the JSON entries, the first difference and the
// daemons to replace. Values only: a recording sender, no process, no clock.
#include "actors/chaos_run.hpp"

#include <catch2/catch.hpp>

#include <map>

using namespace cellshard;
using actors::fault_record;
using actors::fired_external;

namespace {

fired_external ext(const std::string& kind, int index, int at, int ms = 0) {
  fired_external e;
  e.f.kind = kind;
  e.f.index = index;
  e.f.at = at;
  e.f.ms = ms;
  return e;
}

fault_record record(const std::string& kind, int node, int64_t decided_ns, int64_t fired_ns = 0) {
  fault_record f;
  f.kind = kind;
  f.node = node;
  f.decided_ns = decided_ns;
  f.fired_ns = fired_ns;
  return f;
}

}  // namespace

TEST_CASE("chaos runs: signals fire at their token, to the daemon hosting the index now", "[chaos_run]") {
  std::vector<fired_external> e{ext("kill", 1, 3), ext("stop", 0, 3, 250), ext("stop", 2, 5), ext("kill", 7, 5)};
  std::vector<std::pair<int, bool>> sent;  // (daemon, kill)
  int64_t clock = 1000;
  const actors::external_sender send = [&](int daemon, bool kill) -> result<int64_t> {
    sent.push_back({daemon, kill});
    if (daemon == 9) return make_error("daemon 9 is gone");
    return clock += 10;
  };
  const std::vector<int> nodes{4, 5, 9};  // placement index -> daemon after a move
  CHECK(actors::fire_due(e, 1, nodes, send).empty());
  CHECK(actors::fire_due(e, 2, nodes, send).empty());
  CHECK(sent.empty());
  const auto thaws = actors::fire_due(e, 3, nodes, send);
  REQUIRE(sent.size() == 2u);
  CHECK(sent[0] == std::make_pair(5, true));   // kill of index 1: daemon 5
  CHECK(sent[1] == std::make_pair(4, false));  // stop of index 0: daemon 4
  CHECK(e[0].daemon == 5);
  CHECK(e[0].fired_ns == 1010);
  CHECK(e[1].daemon == 4);
  CHECK(e[1].fired_ns == 1020);
  REQUIRE(thaws.size() == 1u);  // the stop with ms=250
  CHECK(thaws[0].daemon == 4);
  CHECK(thaws[0].at_ns == 1020 + 250 * 1000000LL);
  // Token 3 again (a second session's token 3 cannot re-fire a sent signal).
  CHECK(actors::fire_due(e, 3, nodes, send).empty());
  CHECK(sent.size() == 2u);
  // Token 5: index 2's daemon refuses (its note is the sender's error), index 7 does not exist.
  CHECK(actors::fire_due(e, 5, nodes, send).empty());  // a stop without ms is thawed after the run
  REQUIRE(sent.size() == 3u);
  CHECK(sent[2] == std::make_pair(9, false));
  CHECK(e[2].fired_ns == 0);
  CHECK(e[2].note == "daemon 9 is gone");
  CHECK(e[3].fired_ns == 0);
  CHECK(e[3].daemon == -1);
  CHECK(e[3].note == "no placement index 7");
}

TEST_CASE("chaos runs: a signal's record is the first later decision about its daemon", "[chaos_run]") {
  std::vector<fired_external> e{ext("kill", 0, 2), ext("stop", 1, 4), ext("kill", 2, 6)};
  e[0].daemon = 3, e[0].fired_ns = 100;
  e[1].daemon = 3, e[1].fired_ns = 500;  // the same daemon slot, restarted, signalled again
  // e[2] not sent
  const std::vector<fault_record> records{
      record("crash", 3, 200, 150),        // an injected fault's record (fired_ns != 0): never a signal's
      record("node-silent", 3, 90),        // decided before the kill: not its record
      record("node-down", 3, 130),         // the kill's
      record("node-stopped", 1, 600),      // another daemon
      record("node-silent", 3, 700),       // the stop's
  };
  const auto m = actors::match_external_records(e, records);
  CHECK(m == std::vector<int>{2, 4, -1});

  fault_record down = records[2];
  down.recovered_ns = 4130;
  down.replayed_positions = 3;
  down.moved_to_node = 5;
  CHECK(actors::external_detect_ms(e[0], down) == Approx(30e-6));
  CHECK(actors::external_recover_ms(down) == Approx(4000e-6));
  fault_record unrecovered = records[4];
  unrecovered.recover_ms = 12.5;  // no recovered_ns: the record's own figure
  CHECK(actors::external_recover_ms(unrecovered) == 12.5);

  const auto j = actors::external_json(e[0], &down);
  CHECK(j.at("kind") == "kill");
  CHECK(j.at("node") == 0);
  CHECK(j.at("step") == 2);
  CHECK(j.at("daemon") == 3);
  CHECK(j.at("record") == "node-down");
  CHECK(j.at("detect_ms").get<double>() == Approx(30e-6));
  CHECK(j.at("recover_ms").get<double>() == Approx(4000e-6));
  CHECK(j.at("replayed_positions") == 3);
  CHECK(j.at("moved_to_node") == 5);
  const auto none = actors::external_json(e[2], nullptr);
  CHECK(none.at("detect_ms") == -1);
  CHECK(none.at("note") == "not sent: the run ended first");
  CHECK_FALSE(none.contains("record"));
  const auto unmatched = actors::external_json(e[1], nullptr);  // sent, nothing recorded
  CHECK(unmatched.at("detect_ms") == -1);
  CHECK_FALSE(unmatched.contains("note"));
}

TEST_CASE("chaos runs: first difference and the daemons to replace", "[chaos_run]") {
  CHECK(actors::first_difference({1, 2, 3}, {1, 2, 3}) == 3u);
  CHECK(actors::first_difference({1, 2, 3}, {1, 9, 3}) == 1u);
  CHECK(actors::first_difference({1, 2, 3}, {1, 2}) == 2u);
  CHECK(actors::first_difference({}, {4}) == 0u);

  std::vector<fired_external> e{ext("kill", 0, 2), ext("stop", 1, 4), ext("kill", 1, 9)};
  e[0].daemon = 1, e[0].fired_ns = 10;
  e[1].daemon = 4, e[1].fired_ns = 20;
  e[2].daemon = 2;  // chosen but not sent: kept
  const std::map<int, bool> alive{{0, true}, {1, false}, {2, true}, {3, false}, {4, true}, {5, true}};
  const auto is_alive = [&](int i) { return alive.at(i); };
  CHECK(actors::daemons_to_replace(6, is_alive, e, false) == std::vector<int>{1, 3, 4});
  CHECK(actors::daemons_to_replace(6, is_alive, e, true) == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(actors::daemons_to_replace(6, [](int) { return true; }, {}, false).empty());
}
