// The data plane (actors/data_plane.hpp): partial sums as raw frames between
// two planes on loopback, with the blob's checksum and byte-order semantics,
// a dialler without the key refused, and a link whose peer is gone falling
// back to CAF (send() false) and asking again; a lent reading (lend/pump)
// delivering on the borrower's thread.
#include "actors/data_plane.hpp"
#include "kernels/backend.hpp"

#include <catch2/catch.hpp>

#include <caf/all.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

using namespace cellshard;
using namespace cellshard::actors;
using namespace std::chrono_literals;

namespace {

caf::actor_system_config& config() {
  static caf::actor_system_config cfg;
  static bool once = [] {
    register_messages(cfg);
    return true;
  }();
  (void)once;
  return cfg;
}

partial_sum sample(size_t n) {
  partial_sum p;
  p.id = step_id{77, 3, 12, 2};
  p.layer = 5;
  p.phase = 2;
  p.rank = 1;
  for (size_t i = 0; i < n; ++i) p.data.data.push_back(0.25f * static_cast<float>(i) - 3.0f);
  return p;
}

/// The next partial_sum the scoped actor receives (5 s deadline).
partial_sum next(caf::scoped_actor& self) {
  partial_sum got;
  bool arrived = false;
  self->receive([&](partial_sum& p) { got = std::move(p); arrived = true; },
                caf::after(std::chrono::seconds(5)) >> [] {});
  REQUIRE(arrived);
  return got;
}

}  // namespace

TEST_CASE("data plane: partial sums between two planes keep their fields, checksum and byte order",
          "[net][data_plane]") {
  caf::actor_system sys{config()};
  auto a = data_plane::start("127.0.0.1");
  auto b = data_plane::start("127.0.0.1");
  REQUIRE(a);
  REQUIRE(b);
  caf::scoped_actor rx{sys};
  const auto rx_handle = caf::actor_cast<caf::actor>(rx);
  (*b)->attach(rx_handle);
  const std::string peer = "node-b";
  partial_sum p = sample(1000);
  CHECK_FALSE((*a)->send(peer, rx_handle.id(), p));  // no link yet: the caller uses CAF
  REQUIRE((*a)->should_ask(peer));
  CHECK_FALSE((*a)->should_ask(peer));  // one question at a time
  (*a)->dial(peer, (*b)->endpoint());
  REQUIRE((*a)->wait_up(peer, 5000ms));

  REQUIRE((*a)->send(peer, rx_handle.id(), p));
  auto got = next(rx);
  CHECK(got.id.session == 77);
  CHECK(got.id.epoch == 3);
  CHECK(got.id.pos0 == 12);
  CHECK(got.id.count == 2);
  CHECK(got.layer == 5);
  CHECK(got.phase == 2);
  CHECK(got.rank == 1);
  REQUIRE(got.data.ok());
  CHECK(got.data.data == p.data.data);

  // A corrupt fault's damaged wire form arrives as a checksum mismatch.
  partial_sum bad = sample(64);
  auto wire = bad.data.encode();
  wire[13 + 40] ^= 0x04;
  bad.data.damaged_wire = wire;
  REQUIRE((*a)->send(peer, rx_handle.id(), bad));
  auto got_bad = next(rx);
  CHECK_FALSE(got_bad.data.ok());
  CHECK(got_bad.data.status == 1);

  // A sender of the other byte order: converted, with its checksum checked.
  partial_sum other = sample(33);
  other.data.damaged_wire = other.data.encode_swapped();
  REQUIRE((*a)->send(peer, rx_handle.id(), other));
  auto got_other = next(rx);
  REQUIRE(got_other.data.ok());
  CHECK(got_other.data.data == other.data.data);

  // Empty and large payloads (the large one does not fit the socket at once).
  REQUIRE((*a)->send(peer, rx_handle.id(), sample(0)));
  CHECK(next(rx).data.data.empty());
  partial_sum big = sample(1 << 20);
  REQUIRE((*a)->send(peer, rx_handle.id(), big));
  auto got_big = next(rx);
  REQUIRE(got_big.data.ok());
  CHECK(got_big.data.data == big.data.data);
  CHECK((*a)->stats().frames_sent == 5);
  CHECK((*b)->stats().frames_received == 5);

  // --sync q8_0: values on the q8_0 grid travel as blocks (34 bytes per 32
  // floats) and arrive as exactly the sender's values, flagged q8.
  partial_sum q = sample(100);
  kernels::round_to_q8(q.data.data.data(), q.data.data.size());
  q.data.q8 = true;
  const uint64_t before = (*a)->stats().bytes_sent;
  REQUIRE((*a)->send(peer, rx_handle.id(), q));
  auto got_q = next(rx);
  REQUIRE(got_q.data.ok());
  CHECK(got_q.data.q8);
  CHECK(got_q.data.data == q.data.data);
  CHECK((*a)->stats().bytes_sent - before == 24 + 32 + 13 + 4 * 34);  // frame, fields, blob head, 4 blocks
  // The same from a sender of the other byte order, and damaged.
  partial_sum qo = q;
  qo.data.damaged_wire = q.data.encode_swapped();
  REQUIRE((*a)->send(peer, rx_handle.id(), qo));
  auto got_qo = next(rx);
  REQUIRE(got_qo.data.ok());
  CHECK(got_qo.data.data == q.data.data);
  partial_sum qb = q;
  qb.data.damaged_wire = q.data.encode();
  qb.data.damaged_wire[13 + 50] ^= 0x04;
  REQUIRE((*a)->send(peer, rx_handle.id(), qb));
  CHECK(next(rx).data.status == 1);
}

// Frame kind 2 (protocol 9): an activation keeps its step id, replay_until
// and compute_ns, arrives as (dp_act_atom, activation) without reply_to, and
// has the blob's checksum and byte-order semantics; frames of both kinds
// share a link in order.
TEST_CASE("data plane: activations keep their fields, checksum and byte order, without reply_to",
          "[net][data_plane]") {
  caf::actor_system sys{config()};
  auto a = data_plane::start("127.0.0.1");
  auto b = data_plane::start("127.0.0.1");
  REQUIRE(a);
  REQUIRE(b);
  caf::scoped_actor rx{sys};
  const auto rx_handle = caf::actor_cast<caf::actor>(rx);
  (*b)->attach(rx_handle);
  const std::string peer = "node-b";
  REQUIRE((*a)->should_ask(peer));
  (*a)->dial(peer, (*b)->endpoint());
  REQUIRE((*a)->wait_up(peer, 5000ms));
  auto next_act = [&] {
    activation got;
    bool arrived = false;
    rx->receive([&](dp_act_atom, activation& x) { got = std::move(x); arrived = true; },
                caf::after(std::chrono::seconds(5)) >> [] {});
    REQUIRE(arrived);
    return got;
  };
  activation m;
  m.id = step_id{91, 4, 17, 3};
  m.compute_ns = 1234567890123;
  m.replay_until = 2;
  m.reply_to = rx_handle;  // not sent
  for (int i = 0; i < 3 * 64; ++i) m.x.data.push_back(0.5f * static_cast<float>(i) - 7.0f);
  REQUIRE((*a)->send(peer, rx_handle.id(), m));
  auto got = next_act();
  CHECK(got.id.session == 91);
  CHECK(got.id.epoch == 4);
  CHECK(got.id.pos0 == 17);
  CHECK(got.id.count == 3);
  CHECK(got.compute_ns == 1234567890123);
  CHECK(got.replay_until == 2);
  CHECK_FALSE(got.reply_to);
  REQUIRE(got.x.ok());
  CHECK(got.x.data == m.x.data);

  // Not a replay (-1) survives the unsigned field; a damaged wire form
  // arrives marked; a sender of the other byte order is converted.
  activation plain = m;
  plain.replay_until = -1;
  plain.x.damaged_wire = plain.x.encode();
  plain.x.damaged_wire[13 + 100] ^= 0x04;
  REQUIRE((*a)->send(peer, rx_handle.id(), plain));
  auto got_bad = next_act();
  CHECK(got_bad.replay_until == -1);
  CHECK_FALSE(got_bad.x.ok());
  activation other = m;
  other.x.damaged_wire = other.x.encode_swapped();
  REQUIRE((*a)->send(peer, rx_handle.id(), other));
  auto got_other = next_act();
  REQUIRE(got_other.x.ok());
  CHECK(got_other.x.data == m.x.data);

  // A partial sum and an activation on the same link, in order.
  REQUIRE((*a)->send(peer, rx_handle.id(), sample(10)));
  REQUIRE((*a)->send(peer, rx_handle.id(), m));
  CHECK(next(rx).data.data == sample(10).data.data);
  CHECK(next_act().x.data == m.x.data);
  CHECK((*a)->stats().activations_sent == 4);
  CHECK((*b)->stats().activations_received == 4);
  CHECK((*b)->stats().frames_received == 5);
  CHECK((*b)->stats().frames_refused == 0);
}

TEST_CASE("data plane: a connection without the key is refused", "[net][data_plane]") {
  auto b = data_plane::start("127.0.0.1");
  REQUIRE(b);
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons((*b)->endpoint().port);
  REQUIRE(::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  // The right magic, a wrong key ("CSDP" then 8 bytes).
  const char hello[12] = {'C', 'S', 'D', 'P', 1, 2, 3, 4, 5, 6, 7, 8};
  REQUIRE(::send(s, hello, sizeof hello, MSG_NOSIGNAL) == 12);
  pollfd pf{s, POLLIN, 0};
  REQUIRE(::poll(&pf, 1, 5000) == 1);
  char c;
  CHECK(::recv(s, &c, 1, 0) == 0);  // closed by the plane
  ::close(s);
  CHECK((*b)->stats().frames_refused == 1);
}

TEST_CASE("data plane: a link whose peer is gone sends through CAF again, and is asked for again",
          "[net][data_plane]") {
  caf::actor_system sys{config()};
  auto a = data_plane::start("127.0.0.1");
  REQUIRE(a);
  const std::string peer = "node-b";
  caf::actor_id dest = 0;
  {
    auto b = data_plane::start("127.0.0.1");
    REQUIRE(b);
    caf::scoped_actor rx{sys};
    dest = rx->id();
    (*b)->attach(caf::actor_cast<caf::actor>(rx));
    REQUIRE((*a)->should_ask(peer));
    (*a)->dial(peer, (*b)->endpoint());
    REQUIRE((*a)->wait_up(peer, 5000ms));
    REQUIRE((*a)->send(peer, dest, sample(16)));
    CHECK(next(rx).data.data == sample(16).data.data);
  }  // b ends: its sockets close
  // The kernel takes a write or two before the reset is known: bounded.
  bool fell_back = false;
  const auto until = std::chrono::steady_clock::now() + 5s;
  for (int i = 0; i < 100000 && !fell_back && std::chrono::steady_clock::now() < until; ++i)
    fell_back = !(*a)->send(peer, dest, sample(16));
  REQUIRE(fell_back);
  CHECK_FALSE((*a)->wait_up(peer, 5000ms));  // the link's thread ended it
  CHECK((*a)->stats().links_failed == 1);
  CHECK((*a)->should_ask(peer));  // asked for again (at most 3 failures per peer)
}

// The lent reading (data_plane::lend/pump, actors/shard.cpp's fused jobs):
// while lent, the plane's reader threads leave every frame to the borrower's
// pump(), which delivers it through the sink on the borrower's own thread; a
// second borrower is refused; given back, the reader threads deliver again.
TEST_CASE("data plane: a lent reading delivers frames on the borrower's thread, then the readers again",
          "[net][data_plane]") {
  caf::actor_system sys{config()};
  auto a = data_plane::start("127.0.0.1");
  auto b = data_plane::start("127.0.0.1");
  REQUIRE(a);
  REQUIRE(b);
  caf::scoped_actor rx{sys};
  const auto rx_handle = caf::actor_cast<caf::actor>(rx);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<int32_t, std::thread::id>> taken;  // (layer, the thread that delivered it)
  (*b)->attach(rx_handle, [&](partial_sum& p) {
    {
      std::lock_guard<std::mutex> g(mu);
      taken.emplace_back(p.layer, std::this_thread::get_id());
    }
    cv.notify_all();
    return true;
  });
  const std::string peer = "node-b";
  REQUIRE((*a)->should_ask(peer));
  (*a)->dial(peer, (*b)->endpoint());
  REQUIRE((*a)->wait_up(peer, 5000ms));
  auto with_layer = [](int32_t layer) {
    partial_sum p = sample(48);
    p.layer = layer;
    return p;
  };
  auto wait_taken = [&](size_t n) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, 5s, [&] { return taken.size() >= n; });
  };
  const auto me = std::this_thread::get_id();

  REQUIRE((*a)->send(peer, rx_handle.id(), with_layer(0)));
  REQUIRE(wait_taken(1));  // a reader thread's
  REQUIRE((*b)->lend());
  CHECK_FALSE((*b)->lend());  // one borrower at a time
  for (int32_t layer = 1; layer <= 3; ++layer) REQUIRE((*a)->send(peer, rx_handle.id(), with_layer(layer)));
  const auto until = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    {
      std::lock_guard<std::mutex> g(mu);
      if (taken.size() >= 4) break;
    }
    if (std::chrono::steady_clock::now() >= until) break;
    (*b)->pump(100ms);
  }
  (*b)->give_back();
  REQUIRE((*a)->send(peer, rx_handle.id(), with_layer(4)));
  REQUIRE(wait_taken(5));
  std::lock_guard<std::mutex> g(mu);
  REQUIRE(taken.size() == 5);
  for (int32_t i = 0; i < 5; ++i) CHECK(taken[static_cast<size_t>(i)].first == i);  // in order, none lost
  CHECK(taken[0].second != me);
  for (size_t i = 1; i <= 3; ++i) CHECK(taken[i].second == me);  // pumped here
  CHECK(taken[4].second != me);  // the readers again
  CHECK((*b)->stats().frames_received == 5);
  CHECK((*b)->stats().lends == 1);
}
