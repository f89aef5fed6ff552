// The link shaper's arithmetic on an injected clock (actors/transport.hpp): a
// message of b bytes occupies a link for 8b / bandwidth after the previous one
// left, then arrives `latency` later; links to different nodes are separate;
// an idle link banks no credit; the `delay` fault adds to the next messages.
#include "actors/transport.hpp"

#include <catch2/catch.hpp>

#include <chrono>

using namespace cellshard;
using namespace std::chrono;
using actors::link_shaper;

namespace {

struct fake_clock {
  link_shaper::clock_type::time_point t{};
  link_shaper::now_function fn() {
    return [this] { return t; };
  }
};

topologies::link_spec shaped_link(uint64_t bps, double latency_us) {
  topologies::link_spec s;
  s.bandwidth_bps = bps;
  s.latency_us = latency_us;
  return s;
}

}  // namespace

TEST_CASE("a burst leaves at exactly the link's bandwidth", "[shaper]") {
  fake_clock clock;
  link_shaper shaper(shaped_link(100000000, 0), clock.fn());  // 100 Mbit/s
  // 125,000 bytes = 1,000,000 bits = 10 ms at 100 Mbit/s; a burst of ten sent
  // at one instant arrives at 10, 20, ..., 100 ms: 10 Mbit in 100 ms.
  for (int i = 1; i <= 10; ++i) CHECK(shaper.schedule(1, 125000) == milliseconds(10 * i));
  // Another destination is another link: it starts empty.
  CHECK(shaper.schedule(2, 125000) == milliseconds(10));
  // Time passes while link 1 still drains: the next message queues behind.
  clock.t += milliseconds(40);
  CHECK(shaper.schedule(1, 125000) == milliseconds(100 + 10 - 40));  // leaves at 100, done at 110
  // Once idle, a link banks no credit (a bucket one message deep).
  clock.t += seconds(5);
  CHECK(shaper.schedule(1, 125000) == milliseconds(10));
  CHECK(shaper.schedule(1, 0) == milliseconds(10));  // an empty message waits for the link only
}

TEST_CASE("latency adds to the transmission time, once per message", "[shaper]") {
  fake_clock clock;
  link_shaper shaper(shaped_link(1000000000, 100), clock.fn());  // 1 Gbit/s, 100 us
  // 125 bytes = 1000 bits = 1 us on the wire, then 100 us of flight.
  CHECK(shaper.schedule(3, 125) == microseconds(101));
  CHECK(shaper.schedule(3, 125) == microseconds(102));  // queued behind the first
  clock.t += milliseconds(1);
  CHECK(shaper.schedule(3, 125) == microseconds(101));
  // Latency only: messages do not queue.
  link_shaper flight(shaped_link(0, 250), clock.fn());
  CHECK(flight.schedule(0, 1 << 20) == microseconds(250));
  CHECK(flight.schedule(0, 1 << 20) == microseconds(250));
}

TEST_CASE("the delay fault adds to the next messages only, and an unshaped link has none", "[shaper]") {
  fake_clock clock;
  link_shaper plain({}, clock.fn());
  CHECK_FALSE(plain.shaped());
  CHECK(plain.schedule(1, 1 << 20) == nanoseconds(0));
  plain.add_delay(milliseconds(5), 2);
  CHECK(plain.schedule(1, 1) == milliseconds(5));
  CHECK(plain.schedule(2, 1) == milliseconds(5));
  CHECK(plain.schedule(1, 1) == nanoseconds(0));

  link_shaper shaped(shaped_link(100000000, 0), clock.fn());
  shaped.add_delay(milliseconds(5), 1);
  CHECK(shaped.schedule(1, 125000) == milliseconds(15));
  CHECK(shaped.schedule(1, 125000) == milliseconds(20));  // the link, not the delay, carries over
}
