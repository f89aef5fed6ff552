// A shard's link environment (actors/links.hpp): the fault wrapper drops,
// corrupts and delays exactly as many payloads as it was armed for, passes
// everything else to the environment it wraps untouched, and does not charge
// the link for a dropped payload; shaped_links is the node's shaper; a
// prober pair measures a burst on CAF's test_coordinator and ends with its owner.
#include "actors/links.hpp"
#include "actors/messages.hpp"

#include <catch2/catch.hpp>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

using namespace cellshard;
using namespace std::chrono;
using actors::faulty_links;
using actors::link_env;
using actors::link_verdict;

namespace {

/// The wrapped environment: records every call, answers a fixed delay.
struct recording_links final : link_env {
  std::vector<std::pair<int32_t, uint64_t>>* calls;
  explicit recording_links(std::vector<std::pair<int32_t, uint64_t>>* c) : calls(c) {}
  link_verdict send(int32_t dest, uint64_t bytes) override {
    calls->emplace_back(dest, bytes);
    link_verdict v;
    v.delay = microseconds(7);
    return v;
  }
};

}  // namespace

TEST_CASE("the fault wrapper drops the armed count and never passes a dropped payload on", "[links]") {
  std::vector<std::pair<int32_t, uint64_t>> calls;
  faulty_links links(std::make_unique<recording_links>(&calls));
  CHECK_FALSE(links.armed());
  links.drop_next(1);
  links.drop_next(1);  // accumulates: two payloads
  CHECK(links.armed());
  auto a = links.send(3, 100);
  auto b = links.send(3, 200);
  CHECK(a.drop);
  CHECK(b.drop);
  CHECK(calls.empty());  // the link never saw them
  auto c = links.send(4, 300);
  CHECK_FALSE(c.drop);
  CHECK_FALSE(c.corrupt);
  CHECK(c.delay == microseconds(7));
  CHECK_FALSE(links.armed());
  REQUIRE(calls.size() == 1);
  CHECK(calls[0] == std::make_pair(int32_t{4}, uint64_t{300}));
}

TEST_CASE("the fault wrapper corrupts and delays the next payloads, then passes the target's verdict", "[links]") {
  std::vector<std::pair<int32_t, uint64_t>> calls;
  faulty_links links(std::make_unique<recording_links>(&calls));
  links.corrupt_next(1);
  links.delay_next(milliseconds(5), 3);
  links.delay_next(milliseconds(2), 2);  // replaces the pending delay
  auto a = links.send(1, 10);
  CHECK(a.corrupt);
  CHECK(a.delay == microseconds(2007));
  auto b = links.send(1, 10);
  CHECK_FALSE(b.corrupt);
  CHECK(b.delay == microseconds(2007));
  auto c = links.send(1, 10);
  CHECK_FALSE(c.corrupt);
  CHECK(c.delay == microseconds(7));
  CHECK(calls.size() == 3);  // corrupted and delayed payloads still take the link
}

TEST_CASE("shaped links answer the node shaper's delay", "[links]") {
  actors::link_shaper::clock_type::time_point t{};
  topologies::link_spec spec;
  spec.bandwidth_bps = 100000000;  // 100 Mbit/s: 125,000 bytes take 10 ms
  auto shaper = std::make_shared<actors::link_shaper>(spec, [&t] { return t; });
  actors::shaped_links links(shaper);
  auto a = links.send(2, 125000);
  auto b = links.send(2, 125000);
  CHECK_FALSE(a.drop);
  CHECK_FALSE(a.corrupt);
  CHECK(a.delay == milliseconds(10));
  CHECK(b.delay == milliseconds(20));  // the same link: queued behind the first
  // The node's shaper is shared: another shard's link to node 2 queues behind these.
  CHECK(shaper->schedule(2, 125000) == milliseconds(30));
}

TEST_CASE("a probe burst between two probers reports its ends and bytes, and probers end with their owner",
          "[links]") {
  // CAF's test_coordinator: messages run only in sched.run(), no wall clock
  // decides anything (the measured latency and bandwidth are not asserted).
  caf::actor_system_config cfg;
  cfg.set("scheduler.policy", caf::atom("testing"));
  caf::actor_system sys{cfg};
  auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  auto results = std::make_shared<std::vector<actors::probe_result>>();
  auto downs = std::make_shared<int>(0);
  caf::actor from, to;
  auto owner = sys.spawn([&, results](caf::event_based_actor* self) -> caf::behavior {
    from = actors::spawn_link_prober(*self, 1, std::make_shared<actors::link_shaper>());
    to = actors::spawn_link_prober(*self, 2, std::make_shared<actors::link_shaper>());
    return {[results](actors::probe_result& r) { results->push_back(r); }};
  });
  sched.run();
  REQUIRE(from);
  REQUIRE(to);
  auto watcher = sys.spawn([downs, from, to](caf::event_based_actor* self) -> caf::behavior {
    self->set_down_handler([downs](caf::down_msg&) { ++*downs; });
    self->monitor(from);
    self->monitor(to);
    return {[](int32_t) {}};
  });
  sched.run();
  caf::anon_send(from, actors::probe_atom::value, to, int32_t{2}, int32_t{8}, int32_t{1024}, owner);
  sched.run();
  REQUIRE(results->size() == 1);
  const auto& r = results->front();
  CHECK(r.from == 1);
  CHECK(r.to == 2);
  CHECK(r.bytes == 8u * 1024u);  // the 8 sized messages; the 5 tiny ones measure latency only
  CHECK(r.latency_us >= 0);
  // The owner ends: both probers are told to stop.
  caf::anon_send_exit(owner, caf::exit_reason::kill);
  sched.run();
  CHECK(*downs == 2);
  from = nullptr;
  to = nullptr;
  caf::anon_send_exit(watcher, caf::exit_reason::kill);
  sched.run();
}
