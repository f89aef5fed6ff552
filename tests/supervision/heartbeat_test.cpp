// Heartbeat monitor and sender actors on the test_coordinator with injected
// time: suspicion latency of a silenced sender, recovery, a never-heard peer,
// and jittery live heartbeats that must never be suspected.
#include "supervision/heartbeat.hpp"

#include "tests/supervision/caf_fixture.hpp"

using namespace cellshard::supervision;
using cellshard::test::caf_fixture;
using cellshard::test::event_log;
using namespace std::chrono_literals;

namespace {

double ms(caf::timespan d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct hb_fixture : caf_fixture {
  std::shared_ptr<event_log> log = std::make_shared<event_log>();

  caf::actor monitor(std::vector<std::uint64_t> watch = {}) {
    heartbeat_monitor_config cfg;
    cfg.listeners.push_back(recorder(log));
    cfg.watch = std::move(watch);
    auto m = spawn_heartbeat_monitor(sys, cfg);
    REQUIRE(m);
    return track(*m);
  }
};

}  // namespace

TEST_CASE_METHOD(hb_fixture, "a silenced sender is suspected within 1 s, once, and recovers",
                 "[heartbeat]") {
  auto mon = monitor();
  auto snd = track(spawn_heartbeat_sender(sys, {mon, 7, 100ms}));
  advance(5s, 5ms);
  CHECK(log->suspects.empty());
  auto phi = ask<double>(mon, nullptr, hb_phi_atom::value, std::uint64_t{7});
  REQUIRE(phi);
  CHECK(*phi < 1.0);

  caf::anon_send(snd, hb_silence_atom::value, caf::timespan{0});  // for ever
  auto silenced_at = now();
  advance(1s, 5ms);
  REQUIRE(log->suspects.size() == 1);
  const auto& s = log->suspects[0];
  CHECK(s.peer == 7u);
  CHECK(s.phi >= 8.0);
  // phi crosses 8 at 361.3 ms after the last heartbeat (phi_accrual_test);
  // the monitor notices at its next 25 ms tick.
  CHECK(ms(s.silent_for) >= 361.0);
  CHECK(ms(s.silent_for) <= 361.3 + 25 + 5);
  advance(3s, 5ms);
  CHECK(log->suspects.size() == 1);  // once per suspicion
  CHECK(ms(now() - silenced_at) >= 4000.0);

  caf::anon_send(snd, hb_resume_atom::value);
  advance(200ms, 5ms);
  CHECK(log->alive == std::vector<std::uint64_t>{7});
  advance(2s, 5ms);
  CHECK(log->suspects.size() == 1);
}

TEST_CASE_METHOD(hb_fixture, "a timed silence ends by itself", "[heartbeat]") {
  auto mon = monitor();
  auto snd = track(spawn_heartbeat_sender(sys, {mon, 3, 100ms}));
  advance(2s, 5ms);
  caf::anon_send(snd, hb_silence_atom::value, caf::timespan{600ms});
  advance(2s, 5ms);
  REQUIRE(log->suspects.size() == 1);
  CHECK(log->alive == std::vector<std::uint64_t>{3});
}

TEST_CASE_METHOD(hb_fixture, "a watched peer that never sends is suspected", "[heartbeat]") {
  monitor({11});
  advance(1s, 5ms);
  REQUIRE(log->suspects.size() == 1);
  CHECK(log->suspects[0].peer == 11u);
  CHECK(ms(log->suspects[0].silent_for) <= 361.3 + 25 + 5);
}

TEST_CASE_METHOD(hb_fixture, "jittery live heartbeats (100 +- 40 ms) are never suspected",
                 "[heartbeat]") {
  auto mon = monitor();
  std::uint64_t s = 7;
  // 600 heartbeats, gaps 60..140 ms in 5 ms quanta from a fixed LCG.
  for (int i = 0; i < 600; ++i) {
    caf::anon_send(mon, hb_atom::value, std::uint64_t{5});
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    auto gap = std::chrono::milliseconds(60 + 5 * static_cast<int>((s >> 33) % 17));
    advance(gap, 5ms);
  }
  CHECK(log->suspects.empty());
  caf::error err;
  CHECK_FALSE(ask<double>(mon, &err, hb_phi_atom::value, std::uint64_t{99}));
  CHECK(is(err, sv_errc::unknown_child));
}

TEST_CASE_METHOD(hb_fixture, "monitor config is validated", "[heartbeat]") {
  heartbeat_monitor_config cfg;
  cfg.tick = caf::timespan{0};
  auto m = spawn_heartbeat_monitor(sys, cfg);
  REQUIRE_FALSE(m);
  CHECK(describe(m.error()) == "invalid_config: heartbeat monitor: tick must be > 0");
  cfg = {};
  cfg.detector.threshold = -1;
  CHECK_FALSE(spawn_heartbeat_monitor(sys, cfg));
}
