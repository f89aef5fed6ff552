// Replay log: append/ack/range semantics, batches covering several
// positions, bounded memory with clear errors, per-(receiver, stream) logs.
#include "supervision/replay_log.hpp"

#include <catch2/catch.hpp>

using namespace cellshard::supervision;

namespace {

using floats = std::vector<float>;

std::vector<std::uint64_t> begins(const std::vector<replay_entry<floats>>& xs) {
  std::vector<std::uint64_t> out;
  for (auto& x : xs) out.push_back(x.begin);
  return out;
}

}  // namespace

TEST_CASE("append, ack and range", "[replay]") {
  replay_log<floats> log;
  REQUIRE(log.append(0, 5, floats(8, 0.5f)));  // a prefill batch of positions 0..4
  for (std::uint64_t p = 5; p < 10; ++p) REQUIRE(log.append(p, floats(8, float(p))));
  CHECK(log.size() == 6);
  CHECK(log.bytes() == 6 * 8 * sizeof(float));
  CHECK(log.next() == 10);

  auto r = log.range(3, 7);  // the batch overlaps 3, then 5 and 6
  REQUIRE(r);
  CHECK(begins(*r) == std::vector<std::uint64_t>{0, 5, 6});
  CHECK((*r)[2].payload == floats(8, 6.0f));

  CHECK(log.ack(4) == 0);    // the batch [0,5) still straddles 4
  CHECK(log.ack(5) == 1);
  CHECK(log.acked() == 5);
  CHECK(log.ack(3) == 0);    // an older ack changes nothing
  CHECK(log.acked() == 5);
  CHECK(log.range(4, 6).message() ==
        "replay log: cannot replay from 4: the log starts at 5 (acknowledged up to 5)");
  CHECK(log.range(5, 11).message() == "replay log: cannot replay up to 11: the log ends at 10");
  auto tail = log.range(8, 10);
  REQUIRE(tail);
  CHECK(begins(*tail) == std::vector<std::uint64_t>{8, 9});
  CHECK(log.range(9, 9)->empty());

  CHECK(log.ack(10) == 5);
  CHECK(log.empty());
  CHECK(log.bytes() == 0);
  CHECK(log.next() == 10);
  REQUIRE(log.append(10, floats(1)));
}

TEST_CASE("entries must be contiguous", "[replay]") {
  replay_log<floats> log({}, "log to stage 2");
  REQUIRE(log.append(0, floats(1)));
  CHECK(log.append(2, floats(1)).message() ==
        "log to stage 2: append at 2 but the log ends at 1 (entries must be contiguous)");
  CHECK(log.append(1, 1, floats(1)).message() == "log to stage 2: empty range [1, 1)");
  log.ack(1);
  CHECK(log.append(0, floats(1)).message() ==
        "log to stage 2: append at 0 is below the acknowledged position 1");
  REQUIRE(log.append(1, floats(1)));
}

TEST_CASE("memory is bounded with a clear error", "[replay]") {
  replay_log<floats> by_bytes(replay_limits{100, 64}, "log");
  REQUIRE(by_bytes.append(0, floats(8)));   // 32 bytes
  REQUIRE(by_bytes.append(1, floats(8)));   // 64 bytes
  auto full = by_bytes.append(2, floats(1));
  REQUIRE_FALSE(full);
  CHECK(full.message() ==
        "log: full: 64 bytes held + 4 new > limit 64; the receiver has acknowledged only up "
        "to position 0");
  CHECK(by_bytes.size() == 2);  // nothing was logged
  by_bytes.ack(1);
  REQUIRE(by_bytes.append(2, floats(8)));

  replay_log<floats> by_count(replay_limits{2, 1 << 20}, "log");
  REQUIRE(by_count.append(0, floats(1)));
  REQUIRE(by_count.append(1, floats(1)));
  CHECK(by_count.append(2, floats(1)).message() ==
        "log: full: 2 entries held, limit 2; the receiver has acknowledged only up to position 0");
}

TEST_CASE("one log per receiver and stream: reset and erase", "[replay]") {
  replay_logs<floats> logs(replay_limits{8, 1 << 20});
  REQUIRE(logs.log(1, 0).append(0, floats(4)));
  REQUIRE(logs.log(2, 0).append(7, floats(4)));
  CHECK(logs.log(1, 0).next() == 1);
  CHECK(logs.log(2, 0).next() == 8);
  CHECK(logs.log(2, 1).empty());
  CHECK(logs.bytes() == 32);
  CHECK(logs.log(1, 0).append(5, floats(1)).message().rfind("replay log (receiver 1, stream 0)", 0) == 0);
  logs.log(1, 0).reset(100);
  CHECK(logs.log(1, 0).next() == 100);
  logs.erase(2, 0);
  CHECK(logs.bytes() == 0);

  replay_log<int> ints;
  REQUIRE(ints.append(0, 42));
  CHECK(ints.bytes() == sizeof(int));
}
