// `cellshard bench net`: the cluster over node daemon processes on loopback
// (issue #5), each row beside a baseline measured in the same run:
//   net.tcp_rtt      a raw TCP loopback round trip (64 B each way, TCP_NODELAY)
//   net.hop          one hop through CAF's middleman (half a request/response
//                    round trip to a daemon actor), with and without TLS, vs
//                    half the raw TCP round trip
//   net.hop_payload  a partial_sum hop (1 KiB, 64 KiB, 1 MiB) through CAF vs
//                    half a raw TCP round trip of the same bytes between the
//                    same two processes
//   net.hop_data_plane the same hop over the data plane (actors/data_plane.hpp)
//                    vs the same raw TCP baseline (issue #19 goal: <= 2x)
//   net.hop_activation, net.hop_activation_data_plane  the same bytes as an
//                    activation (stage to stage) through CAF (with its
//                    reply_to handle) and as a data-plane frame (kind 2)
//   net.hop_local    the same request to an actor of this process (CAF's
//                    scheduler and mailboxes alone), vs the same baseline
//   net.tpot         time per output token over 1, 2, 4, 8 daemon processes
//                    (pipeline), with and without TLS, vs the same placement
//                    with in-process nodes
//   net.comm_share   the communication share of those runs vs in process
//   net.start        cluster start (connect, join, links, spawns) vs in process
// Daemons are children of this process (`cellshard node`, port 0), stopped
// with SIGKILL + waitpid whatever happens; the TLS PKI is made with the
// openssl command line in a temporary folder.
#include "actors/cluster.hpp"
#include "actors/data_plane.hpp"
#include "actors/messages.hpp"
#include "actors/remote.hpp"
#include "actors/local_daemons.hpp"
#include "base/percentile.hpp"
#include "actors/run_report.hpp"
#include "base/spawn.hpp"
#include "tools/bench.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"
#include "actors/tls.hpp"

#include <caf/all.hpp>
#include <caf/defaults.hpp>
#include <caf/io/all.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/binary_deserializer.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <atomic>
#include <future>
#include <functional>
#include <memory>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <type_traits>
#include <unistd.h>

namespace cellshard::tools {

namespace {

using clk = std::chrono::steady_clock;

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw cli_error("bench net: cannot find the cellshard executable (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

/// Runs argv to completion (stdout/stderr to /dev/null) within `timeout_s`.
int run_quiet(const std::vector<std::string>& args, double timeout_s) {
  const pid_t pid = spawn_child(args);  // stdin, stdout, stderr on /dev/null (base/spawn.hpp)
  if (pid < 0) return -1;
  const auto until = clk::now() + std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (clk::now() > until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a child, not synchronising actors
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}


/// Median round trip of `n` 64-byte ping-pongs over a loopback TCP connection
/// to an echo thread, in microseconds.
double tcp_rtt_us(int n) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0 ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw cli_error("bench net: cannot open a loopback socket");
  const int one = 1;
  std::thread echo([ls, n, one] {
    const int c = ::accept(ls, nullptr, nullptr);
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char buf[64];
    for (int i = 0; i < n; ++i) {
      size_t got = 0;
      while (got < sizeof buf) {
        const ssize_t k = ::read(c, buf + got, sizeof buf - got);
        if (k <= 0) {
          ::close(c);
          return;
        }
        got += static_cast<size_t>(k);
      }
      if (::write(c, buf, sizeof buf) != static_cast<ssize_t>(sizeof buf)) break;
    }
    ::close(c);
  });
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<double> rtt;
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    char buf[64] = {1};
    for (int i = 0; i < n; ++i) {
      const auto t0 = clk::now();
      if (::write(s, buf, sizeof buf) != static_cast<ssize_t>(sizeof buf)) break;
      size_t got = 0;
      while (got < sizeof buf) {
        const ssize_t k = ::read(s, buf + got, sizeof buf - got);
        if (k <= 0) break;
        got += static_cast<size_t>(k);
      }
      rtt.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count());
    }
  }
  ::close(s);
  echo.join();
  ::close(ls);
  return median(rtt);
}

// -- payload hops: CAF against raw TCP between the same two processes ----------
// `bench net-echo` (hidden) runs in a child process: a raw TCP echo server
// (frames: u64 length, then the bytes; echoed whole) on one thread, and a CAF
// actor published on the middleman that answers a partial_sum (the message
// of the tensor reductions: a blob of floats) with the same message. The
// bench process times both with the same payload sizes, in alternating rounds.

bool read_full(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::read(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool write_full(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

/// Serves framed echoes on `ls` (one connection at a time) until `stop`.
void framed_echo_server(int ls, const std::atomic<bool>& stop) {
  const int one = 1;
  std::vector<char> buf;
  while (!stop.load()) {
    pollfd pf{ls, POLLIN, 0};
    if (::poll(&pf, 1, 200) <= 0) continue;  // re-checks stop every 200 ms
    const int c = ::accept(ls, nullptr, nullptr);
    if (c < 0) continue;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint64_t len = 0;
    while (read_full(c, reinterpret_cast<char*>(&len), sizeof len) && len <= (64u << 20)) {
      buf.resize(len);
      if (!read_full(c, buf.data(), len) || !write_full(c, reinterpret_cast<char*>(&len), sizeof len) ||
          !write_full(c, buf.data(), len))
        break;
    }
    ::close(c);
  }
}

/// Round trips (us) of `n` framed echoes of `bytes` on the connected socket `s`.
std::vector<double> framed_rtts(int s, size_t bytes, int n) {
  std::vector<char> buf(bytes, 'x'), back(bytes);
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    const uint64_t len = bytes;
    uint64_t got = 0;
    const auto t0 = clk::now();
    if (!write_full(s, reinterpret_cast<const char*>(&len), sizeof len) || !write_full(s, buf.data(), bytes) ||
        !read_full(s, reinterpret_cast<char*>(&got), sizeof got) || got != len || !read_full(s, back.data(), bytes))
      break;
    out.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count());
  }
  return out;
}

/// The two payload messages of the hop rows: a partial sum (the tensor
/// reductions') and an activation (stage to stage; through CAF it carries the
/// session's handle, as in a run).
actors::blob& payload_blob(actors::partial_sum& m) { return m.data; }
actors::blob& payload_blob(actors::activation& m) { return m.x; }
template <class Msg>
Msg payload_msg(size_t floats, const caf::actor& reply_to) {
  Msg m;
  payload_blob(m).data.assign(floats, 0.5f);
  if constexpr (std::is_same<Msg, actors::activation>::value) {
    m.id.count = 1;
    m.reply_to = reply_to;
  }
  (void)reply_to;
  return m;
}

/// Round trips (us) of `n` sequential `Msg` requests of `floats` floats
/// from an event-based actor to `echo` (which returns the message).
template <class Msg>
std::vector<double> caf_payload_rtts(caf::actor_system& sys, const caf::actor& echo, size_t floats, int n) {
  auto done = std::make_shared<std::promise<std::vector<double>>>();
  auto fut = done->get_future();
  sys.spawn([echo, n, floats, done](caf::event_based_actor* self) {
    auto samples = std::make_shared<std::vector<double>>();
    auto step = std::make_shared<std::function<void()>>();
    auto msg = std::make_shared<Msg>(payload_msg<Msg>(floats, caf::actor_cast<caf::actor>(self)));
    *step = [=] {
      if (static_cast<int>(samples->size()) >= n) {
        done->set_value(*samples);
        self->quit();
        return;
      }
      const auto t0 = clk::now();
      self->request(echo, std::chrono::seconds(10), *msg)
          .then(
              [=](Msg& back) {
                if (payload_blob(back).data.size() != floats || !payload_blob(back).ok()) {
                  done->set_value({});
                  self->quit();
                  return;
                }
                samples->push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count());
                (*step)();
              },
              [=](caf::error&) {
                done->set_value(*samples);
                self->quit();
              });
    };
    (*step)();
  });
  if (fut.wait_for(std::chrono::seconds(120)) != std::future_status::ready)
    throw cli_error("bench net: the payload ping actor did not finish within 120 s");
  return fut.get();
}

/// Round trips (us) of `n` sequential `Msg`s of `floats` floats from an
/// actor of this process over the data plane `dp` (link "echo" up) to the
/// echo actor `echo_id`, which sends each back over its own data plane (an
/// activation arrives as (dp_act_atom, activation), as at a shard).
template <class Msg>
std::vector<double> data_payload_rtts(caf::actor_system& sys, const std::shared_ptr<actors::data_plane>& dp,
                                      const caf::actor& echo, size_t floats, int n) {
  const caf::actor_id echo_id = echo.id();
  auto done = std::make_shared<std::promise<std::vector<double>>>();
  auto fut = done->get_future();
  auto ping = sys.spawn([dp, echo_id, n, floats, done](caf::event_based_actor* self) -> caf::behavior {
    auto samples = std::make_shared<std::vector<double>>();
    auto msg = std::make_shared<Msg>(payload_msg<Msg>(floats, caf::actor{}));
    auto t0 = std::make_shared<clk::time_point>();
    auto fire = [=] {
      *t0 = clk::now();
      if (!dp->send("echo", echo_id, *msg)) {
        done->set_value({});
        self->quit();
      }
    };
    auto back = [=](Msg& m) {
      if (payload_blob(m).data.size() != floats || !payload_blob(m).ok()) {
        done->set_value({});
        self->quit();
        return;
      }
      samples->push_back(std::chrono::duration<double, std::micro>(clk::now() - *t0).count());
      if (static_cast<int>(samples->size()) >= n) {
        done->set_value(*samples);
        self->quit();
        return;
      }
      fire();
    };
    return {
        [=](caf::ok_atom) { fire(); },
        [=](actors::partial_sum& m) {
          if constexpr (std::is_same<Msg, actors::partial_sum>::value) back(m);
        },
        [=](actors::dp_act_atom, actors::activation& m) {
          if constexpr (std::is_same<Msg, actors::activation>::value) back(m);
        },
        caf::after(std::chrono::seconds(10)) >> [=] {
          done->set_value(*samples);
          self->quit();
        }};
  });
  dp->attach(ping);
  {  // the echo sends its answers to this ping actor, over its link to us
    caf::scoped_actor self{sys};
    const auto ep = dp->endpoint();
    bool up = false;
    self->request(echo, std::chrono::seconds(10), actors::dp_addr_atom::value, ep.host, ep.port, ep.key,
                  static_cast<uint64_t>(ping.id()))
        .receive([&](bool ok) { up = ok; }, [&](caf::error&) {});
    if (!up) {
      caf::anon_send_exit(ping, caf::exit_reason::user_shutdown);
      throw cli_error("bench net: the echo process could not reach this data plane");
    }
  }
  caf::anon_send(ping, caf::ok_atom::value);
  if (fut.wait_for(std::chrono::seconds(120)) != std::future_status::ready)
    throw cli_error("bench net: the data-plane ping actor did not finish within 120 s");
  dp->detach(ping.id());
  return fut.get();
}

/// Median microseconds to serialise one partial_sum of `floats` floats (the
/// blob's encode with its XXH64, then CAF's binary serializer) and to
/// deserialise it (CAF's binary deserializer, then decode with the checksum
/// check), on this thread: the part of a hop that is copying and hashing.
std::pair<double, double> ser_deser_us(caf::actor_system& sys, size_t floats, int n) {
  actors::partial_sum m;
  m.data.data.assign(floats, 0.5f);
  std::vector<double> ser, de;
  std::vector<char> buf;  // reused, as the middleman reuses its buffers (a fresh 1 MiB one page-faults)
  for (int i = 0; i < n; ++i) {
    buf.clear();
    const auto t0 = clk::now();
    caf::binary_serializer sink{sys, buf};
    if (sink(m)) throw cli_error("bench net: serialising a partial_sum failed");
    const auto t1 = clk::now();
    actors::partial_sum back;
    caf::binary_deserializer source{sys, buf};
    if (source(back) || back.data.data.size() != floats || !back.data.ok())
      throw cli_error("bench net: deserialising a partial_sum failed");
    const auto t2 = clk::now();
    ser.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    de.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  return {median(ser), median(de)};
}

/// The CAF settings of one idle-worker policy (`bench net --idle`), applied
/// to both processes of the payload rows after configure_network: default
/// (what configure_network chose: wake unless CELLSHARD_CAF_IDLE=poll), poll
/// (CAF 0.17.6's sleep polling) or wake (actors::set_idle_wake).
void apply_idle(caf::actor_system_config& cfg, const std::string& idle) {
  if (idle.empty() || idle == "default") return;
  if (idle == "wake") {
    actors::set_idle_wake(cfg);
    return;
  }
  if (idle == "poll") {
    cfg.set("work-stealing.moderate-poll-attempts", caf::defaults::work_stealing::moderate_poll_attempts);
    return;
  }
  throw cli_error("--idle: expected default, poll or wake, got '" + idle + "'", 2);
}

int run_net_echo(const std::string& idle, int caf_threads, int deadline_s) {
  caf::actor_system_config cfg;
  actors::register_messages(cfg);
  actors::net_options no;
  no.caf_threads = caf_threads;
  if (auto c = actors::configure_network(cfg, no); !c) {
    std::fprintf(stderr, "bench net-echo: %s\n", c.message().c_str());
    return 1;
  }
  apply_idle(cfg, idle);
  caf::actor_system sys{cfg};
  // The data plane's echo: partial sums that came over it (no sender) go
  // back over it to the actor the bench named; CAF requests are answered.
  std::shared_ptr<actors::data_plane> dp;
  if (auto d = actors::data_plane::start("127.0.0.1")) dp = *d;
  auto reply_id = std::make_shared<std::atomic<uint64_t>>(0);
  auto echo = sys.spawn([dp, reply_id](caf::event_based_actor* self) -> caf::behavior {
    return {[=](actors::partial_sum& x) -> caf::result<actors::partial_sum> {
              if (self->current_sender() || !dp) return std::move(x);
              dp->send("bench", reply_id->load(), x);
              return caf::make_error(caf::sec::request_timeout);  // no one asked: nothing is sent
            },
            [=](actors::activation& x) { return std::move(x); },
            [=](actors::dp_act_atom, actors::activation& x) {
              if (dp) dp->send("bench", reply_id->load(), x);
            },
            [=](actors::dp_addr_atom) -> caf::result<std::string, uint16_t, uint64_t> {
              if (!dp) return caf::make_error(caf::sec::invalid_argument, "no data plane");
              auto ep = dp->endpoint();
              return {ep.host, ep.port, ep.key};
            },
            [=](actors::dp_addr_atom, std::string& host, uint16_t port, uint64_t key, uint64_t reply) -> bool {
              if (!dp) return false;
              reply_id->store(reply);
              if (!dp->link_up("bench") && dp->should_ask("bench")) dp->dial("bench", {host, port, key});
              return dp->wait_up("bench", std::chrono::milliseconds(5000));  // a bench helper: may block
            }};
  });
  if (dp) dp->attach(echo);
  auto port = sys.middleman().publish(echo, 0, "127.0.0.1", true);
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (!port || ls < 0 || ::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0 ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::fprintf(stderr, "bench net-echo: cannot listen on loopback\n");
    caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
    return 1;
  }
  std::atomic<bool> stop{false};
  std::thread tcp([ls, &stop] { framed_echo_server(ls, stop); });
  // Two lines: the CAF port, then the raw TCP port.
  std::printf("listening 127.0.0.1:%u\nlistening 127.0.0.1:%u\n", static_cast<unsigned>(*port),
              static_cast<unsigned>(ntohs(a.sin_port)));
  std::fflush(stdout);
  // Until stdin closes (the bench ends or dies) or the deadline.
  pollfd pf{0, POLLIN, 0};
  ::poll(&pf, 1, deadline_s * 1000);
  stop = true;
  ::shutdown(ls, SHUT_RDWR);
  tcp.join();
  ::close(ls);
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
  return 0;
}

/// The payload rows: `sizes` bytes, `rounds` alternating rounds of raw TCP
/// and CAF round trips to a `bench net-echo` child; per size the median of
/// the per-round ratios of median round trips (CAF / raw TCP).
void payload_rows(const std::vector<size_t>& sizes, int pings, int rounds, const std::string& idle, int caf_threads,
                  std::vector<bench_row>& rows) {
  int in_pipe[2], out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0)
    throw cli_error("bench net: cannot make pipes");
  std::vector<std::string> args = {self_exe(), "bench", "net-echo", "--caf-threads", std::to_string(caf_threads)};
  if (!idle.empty()) args.insert(args.end(), {"--idle", idle});
  const pid_t pid = spawn_child(args, in_pipe[0], out_pipe[1], -1);
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  struct guard {
    pid_t pid;
    int in, out;
    ~guard() {
      ::close(in);
      ::close(out);
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        int st = 0;
        ::waitpid(pid, &st, 0);
      }
    }
  } g{pid, in_pipe[1], out_pipe[0]};
  if (pid < 0) throw cli_error("bench net: cannot start the echo process");
  auto l1 = read_listening_line(out_pipe[0], std::chrono::seconds(20));
  if (!l1) throw cli_error("bench net: the echo process did not start: " + l1.message());
  auto l2 = read_listening_line(out_pipe[0], std::chrono::seconds(20));
  if (!l2) throw cli_error("bench net: the echo process did not start: " + l2.message());
  const unsigned caf_port = l1->port, tcp_port = l2->port;
  caf::actor_system_config cfg;
  actors::register_messages(cfg);
  actors::net_options no;
  no.caf_threads = caf_threads;
  if (auto c = actors::configure_network(cfg, no); !c) throw cli_error("bench net: " + c.message());
  apply_idle(cfg, idle);
  caf::actor_system sys{cfg};
  auto echo = sys.middleman().remote_actor("127.0.0.1", static_cast<uint16_t>(caf_port));
  if (!echo) throw cli_error("bench net: cannot reach the echo actor: " + sys.render(echo.error()));
  // This process's data plane and its link to the echo's (asked through CAF).
  std::shared_ptr<actors::data_plane> dp;
  if (auto d = actors::data_plane::start("127.0.0.1")) dp = *d;
  if (dp) {
    caf::scoped_actor self{sys};
    self->request(*echo, std::chrono::seconds(10), actors::dp_addr_atom::value)
        .receive(
            [&](std::string& host, uint16_t port, uint64_t key) {
              if (dp->should_ask("echo")) dp->dial("echo", {host, port, key});
            },
            [&](caf::error&) {});
    if (!dp->wait_up("echo", std::chrono::milliseconds(5000)))
      throw cli_error("bench net: cannot reach the echo process's data plane");
  }
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(tcp_port));
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(s);
    throw cli_error("bench net: cannot connect to the echo process's TCP port");
  }
  for (size_t bytes : sizes) {
    const int n = std::max(20, static_cast<int>(pings * std::min<double>(1.0, 4096.0 / bytes)));
    std::vector<double> ratios, raw_all, caf_all, dp_ratios, dp_all;
    std::vector<double> act_caf_ratios, act_caf_all, act_dp_ratios, act_dp_all;
    for (int r = 0; r < rounds; ++r) {
      auto raw = framed_rtts(s, bytes, n);
      auto viacaf = caf_payload_rtts<actors::partial_sum>(sys, *echo, bytes / sizeof(float), n);
      if (raw.empty() || viacaf.empty()) throw cli_error("bench net: a payload round trip failed");
      const double mr = median(raw), mc = median(viacaf);
      ratios.push_back(mc / mr);
      raw_all.push_back(mr / 2);
      caf_all.push_back(mc / 2);
      std::fprintf(stderr, "payload %zu B, round %d: CAF hop %.1f us, raw TCP %.1f us (half round trips), x%.2f\n",
                   bytes, r + 1, mc / 2, mr / 2, mc / mr);
      if (dp) {
        auto viadp = data_payload_rtts<actors::partial_sum>(sys, dp, *echo, bytes / sizeof(float), n);
        if (viadp.size() != static_cast<size_t>(n)) throw cli_error("bench net: a data-plane round trip failed");
        const double md = median(viadp);
        dp_ratios.push_back(md / mr);
        dp_all.push_back(md / 2);
        std::fprintf(stderr, "payload %zu B, round %d: data-plane hop %.1f us, x%.2f raw TCP\n", bytes, r + 1,
                     md / 2, md / mr);
      }
      // The same bytes as an activation (stage to stage): through CAF with
      // the session's handle, and as a data-plane frame (kind 2).
      auto act_caf = caf_payload_rtts<actors::activation>(sys, *echo, bytes / sizeof(float), n);
      if (act_caf.size() != static_cast<size_t>(n)) throw cli_error("bench net: an activation round trip failed");
      const double ma = median(act_caf);
      act_caf_ratios.push_back(ma / mr);
      act_caf_all.push_back(ma / 2);
      std::fprintf(stderr, "payload %zu B, round %d: activation CAF hop %.1f us, x%.2f raw TCP\n", bytes, r + 1,
                   ma / 2, ma / mr);
      if (dp) {
        auto act_dp = data_payload_rtts<actors::activation>(sys, dp, *echo, bytes / sizeof(float), n);
        if (act_dp.size() != static_cast<size_t>(n))
          throw cli_error("bench net: an activation data-plane round trip failed");
        const double md = median(act_dp);
        act_dp_ratios.push_back(md / mr);
        act_dp_all.push_back(md / 2);
        std::fprintf(stderr, "payload %zu B, round %d: activation data-plane hop %.1f us, x%.2f raw TCP\n", bytes,
                     r + 1, md / 2, md / mr);
      }
    }
    const std::string sz = bytes >= (1u << 20) ? std::to_string(bytes >> 20) + " MiB"
                                               : std::to_string(bytes >> 10) + " KiB";
    const auto sd = ser_deser_us(sys, bytes / sizeof(float), std::max(5, std::min(n, 200)));
    const double hop = median(caf_all), raw = median(raw_all);
    std::fprintf(stderr, "payload %s: CAF hop %.1f us = raw TCP %.1f us + serialise %.1f us + deserialise %.1f us "
                 "(blob encode/decode with XXH64 and CAF's binary (de)serializer, measured alone) + the rest "
                 "%.1f us (thread hand-offs: sending actor -> middleman thread -> socket -> middleman thread -> "
                 "receiving actor's worker, BASP framing)\n",
                 sz.c_str(), hop, raw, sd.first, sd.second, hop - raw - sd.first - sd.second);
    char b1[32], b2[32];
    std::snprintf(b1, sizeof b1, "%.1f", sd.first);
    std::snprintf(b2, sizeof b2, "%.1f", sd.second);
    rows.push_back({"net.hop_payload",
                    {{"payload", sz}, {"pings", std::to_string(n)}, {"rounds", std::to_string(rounds)},
                     {"idle", idle.empty() ? "default" : idle}, {"goal", "<= 2x"},
                     {"ser_us", b1}, {"deser_us", b2}},
                    median(caf_all), "us", median(raw_all),
                    "half a raw TCP round trip of the same bytes between the same two processes, same run",
                    median(ratios)});
    if (dp)
      rows.push_back({"net.hop_data_plane",
                      {{"payload", sz}, {"pings", std::to_string(n)}, {"rounds", std::to_string(rounds)},
                       {"idle", idle.empty() ? "default" : idle}, {"goal", "<= 2x"}},
                      median(dp_all), "us", median(raw_all),
                      "half a raw TCP round trip of the same bytes between the same two processes, same run",
                      median(dp_ratios)});
    rows.push_back({"net.hop_activation",
                    {{"payload", sz}, {"pings", std::to_string(n)}, {"rounds", std::to_string(rounds)},
                     {"idle", idle.empty() ? "default" : idle}, {"path", "caf"}},
                    median(act_caf_all), "us", median(raw_all),
                    "half a raw TCP round trip of the same bytes between the same two processes, same run",
                    median(act_caf_ratios)});
    if (dp)
      rows.push_back({"net.hop_activation_data_plane",
                      {{"payload", sz}, {"pings", std::to_string(n)}, {"rounds", std::to_string(rounds)},
                       {"idle", idle.empty() ? "default" : idle}, {"goal", "<= 2x"}},
                      median(act_dp_all), "us", median(raw_all),
                      "half a raw TCP round trip of the same bytes between the same two processes, same run",
                      median(act_dp_ratios)});
  }
  ::close(s);
  caf::anon_send_exit(*echo, caf::exit_reason::user_shutdown);
}

/// Median round trip of `n` sequential (stats_atom) requests from an
/// event-based actor to a daemon actor, in microseconds.
double caf_rtt_us(caf::actor_system& sys, const caf::actor& daemon, int n) {
  auto done = std::make_shared<std::promise<std::vector<double>>>();
  auto fut = done->get_future();
  sys.spawn([daemon, n, done](caf::event_based_actor* self) {
    auto samples = std::make_shared<std::vector<double>>();
    auto step = std::make_shared<std::function<void()>>();
    *step = [=] {
      if (static_cast<int>(samples->size()) >= n) {
        done->set_value(*samples);
        self->quit();
        return;
      }
      const auto t0 = clk::now();
      self->request(daemon, std::chrono::seconds(5), actors::stats_atom::value)
          .then(
              [=](actors::node_report&) {
                samples->push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count());
                (*step)();
              },
              [=](caf::error&) {
                done->set_value(*samples);
                self->quit();
              });
    };
    (*step)();
  });
  if (fut.wait_for(std::chrono::seconds(60)) != std::future_status::ready)
    throw cli_error("bench net: the ping actor did not finish within 60 s");
  return median(fut.get());
}

struct run_result {
  double tpot_ms = 0, comm_share = 0, start_ms = 0;
  int stages = 0;
};

run_result run_cluster(const loaded_model& lm, std::shared_ptr<actors::shard_host> host, int nodes,
                       int steps, int reps, int caf_threads) {
  actors::cluster_options co;
  co.file = lm.file;
  co.tok = lm.tok;
  co.nodes = nodes;
  co.topology = "pipeline";
  co.caf_threads = caf_threads;
  co.host = std::move(host);
  const auto t0 = clk::now();
  auto c = actors::cluster::start(co);
  if (!c) throw cli_error("bench net: " + c.message());
  auto wired = (*c)->stats();  // every shard wired (docs/distributed.md)
  if (!wired) throw cli_error("bench net: " + wired.message());
  run_result r;
  r.start_ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
  r.stages = static_cast<int>((*c)->placement().stages.size());
  model::generation_params gp;
  gp.steps = steps;
  gp.sampling = {0.0f, 0.9f, 1};
  std::vector<double> tpot, share;
  for (int i = 0; i < reps; ++i) {
    auto out = (*c)->generate(gp);
    if (!out || !out->ok) throw cli_error("bench net: run failed: " + (out ? out->error : out.message()));
    tpot.push_back(median(out->result.step_ms));
    share.push_back(actors::comm_share(*out));
  }
  r.tpot_ms = median(tpot);
  r.comm_share = median(share);
  return r;
}

struct net_bench_options {
  std::string model, tokenizer;
  std::vector<int> nodes = {1, 2, 4, 8};
  int steps = 128;
  int reps = 3;
  int pings = 2000;
  bool skip_tls = false;
  int caf_threads = 2;
  std::vector<size_t> payloads = {1024, 64 * 1024, 1024 * 1024};
  int payload_rounds = 3;
  std::vector<std::string> idle = {"poll", "wake"};
  bool payload_only = false;
};

int run_net_bench(const net_bench_options& o, std::vector<bench_row>& rows) {
  // The payload hops against raw TCP between the same two processes.
  for (const auto& idle : o.idle) payload_rows(o.payloads, o.pings, o.payload_rounds, idle, o.caf_threads, rows);
  if (o.payload_only) return 0;

  loaded_model lm = load_model(o.model, o.tokenizer);
  struct stat sb;
  if (::stat(lm.file->path().c_str(), &sb) != 0)
    throw cli_error("bench net: the daemons load the model by file name; give -m FILE (got " +
                    lm.file->path() + ")");
  const std::string path = lm.file->path();
  const std::string models_dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  // The tokenizer must sit beside the model under the same name for the daemons.
  const int max_nodes = *std::max_element(o.nodes.begin(), o.nodes.end());

  // Baseline of the hop rows: raw TCP on loopback.
  const double tcp = tcp_rtt_us(o.pings);
  rows.push_back({"net.tcp_rtt", {{"payload", "64 B"}, {"pings", std::to_string(o.pings)}}, tcp, "us", -1, "", 0});
  std::fprintf(stderr, "raw TCP loopback round trip: %.1f us\n", tcp);

  // The hop's share that is not the network: the same request/response to
  // an actor in this process (CAF's scheduler and mailboxes only: no
  // middleman, no serialisation, no socket).
  double local_hop = 0;
  {
    caf::actor_system_config cfg;
    actors::register_messages(cfg);
    cfg.set("scheduler.max-threads", static_cast<size_t>(o.caf_threads));
    caf::actor_system sys{cfg};
    auto echo = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
      return {[](actors::stats_atom) { return actors::node_report{}; }};
    });
    local_hop = caf_rtt_us(sys, echo, o.pings) / 2;
    caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
    rows.push_back({"net.hop_local", {{"pings", std::to_string(o.pings)}}, local_hop, "us", tcp / 2,
                    "half a raw TCP loopback round trip, same run", tcp > 0 ? 2 * local_hop / tcp : 0});
    std::fprintf(stderr, "in-process hop (same request to an actor of this process): %.1f us\n", local_hop);
  }

  // In-process baselines per node count.
  std::map<int, run_result> local;
  for (int n : o.nodes) local[n] = run_cluster(lm, nullptr, n, o.steps, o.reps, o.caf_threads);

  // The PKI for the TLS rows.
  char tmpl[] = "/tmp/cellshard-bench-net-XXXXXX";
  std::string pki;
  bool tls_ok = !o.skip_tls;
  if (tls_ok) {
    if (!::mkdtemp(tmpl)) throw cli_error("bench net: cannot make a temporary folder");
    pki = tmpl;
    const std::string ossl = "/usr/bin/openssl";
    write_text(pki + "/leaf.ext",
               "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1\n");
    auto ec = std::vector<std::string>{"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};
    auto req = [&](std::vector<std::string> a) {
      a.insert(a.begin() + 2, ec.begin(), ec.end());
      return run_quiet(a, 30) == 0;
    };
    tls_ok = req({ossl, "req", "-x509", "-keyout", pki + "/ca.key", "-out", pki + "/ca.pem", "-days", "1", "-subj",
                  "/CN=bench CA"});
    for (const char* who : {"node", "front"}) {
      const std::string w = pki + "/" + who;
      tls_ok = tls_ok && req({ossl, "req", "-keyout", w + ".key", "-out", w + ".csr", "-subj", "/CN=bench"}) &&
               run_quiet({ossl, "x509", "-req", "-in", w + ".csr", "-CA", pki + "/ca.pem", "-CAkey", pki + "/ca.key",
                          "-CAcreateserial", "-out", w + ".pem", "-days", "1", "-extfile", pki + "/leaf.ext"},
                         30) == 0;
    }
    if (!tls_ok) std::fprintf(stderr, "bench net: no PKI (openssl failed): TLS rows skipped\n");
  }

  for (bool tls : {false, true}) {
    if (tls && !tls_ok) continue;
    const std::string tls_name = tls ? "on" : "off";
    // The daemons: the project's one launcher (parent-death kill, no
    // inherited descriptors, SIGKILLed and reaped at the end of this scope).
    actors::local_daemon_options lo;
    lo.binary = self_exe();
    lo.models_dir = models_dir;
    lo.extra_args = {"-q"};
    actors::remote_options ro;
    if (tls) {
      lo.extra_args.insert(lo.extra_args.end(), {"--tls-cert", pki + "/node.pem", "--tls-key", pki + "/node.key",
                                                 "--tls-ca", pki + "/ca.pem"});
      ro.net.tls = {pki + "/front.pem", pki + "/front.key", pki + "/ca.pem"};
    }
    auto started = actors::local_daemons::start(max_nodes, 0, lo);
    if (!started) throw cli_error("bench net: " + started.message());
    auto& daemons = **started;

    // One hop: a request/response round trip to a daemon, halved.
    {
      std::vector<actors::remote_node> one = {{"127.0.0.1", daemons.port(0), "", 0, false}};
      auto host = std::make_shared<actors::remote_host>(one, ro);
      caf::actor_system_config cfg;
      actors::register_messages(cfg);
      auto conf = host->configure(cfg);
      if (!conf) throw cli_error("bench net: " + conf.message());
      cfg.set("scheduler.max-threads", static_cast<size_t>(o.caf_threads));
      caf::actor_system sys{cfg};
      auto conn = host->connect(sys, *lm.file, *lm.tok);
      if (!conn) throw cli_error("bench net: " + conn.message());
      const double rtt = caf_rtt_us(sys, host->daemon(0), o.pings);
      host->shutdown(sys);
      bench_row r{"net.hop", {{"tls", tls_name}, {"pings", std::to_string(o.pings)}}, rtt / 2, "us", tcp / 2,
                  "half a raw TCP loopback round trip, same run", tcp > 0 ? rtt / tcp : 0};
      rows.push_back(r);
      std::fprintf(stderr, "CAF hop (TLS %s): %.1f us (raw TCP %.1f us, x%.2f)\n", tls_name.c_str(), rtt / 2,
                   tcp / 2, r.ratio);
      // A rough split: the scheduler's part (as in process), the kernel's
      // (raw TCP), and the rest (middleman thread, BASP, serialisation, the
      // daemon's own scheduling and wake-ups).
      std::fprintf(stderr, "  split: in-process hop %.1f us + raw TCP %.1f us + the rest %.1f us\n", local_hop,
                   tcp / 2, rtt / 2 - local_hop - tcp / 2);
    }
    // Per-token latency over N processes.
    for (int n : o.nodes) {
      std::vector<actors::remote_node> entries;
      for (int i = 0; i < n; ++i) entries.push_back({"127.0.0.1", daemons.port(i), "", 0, false});
      auto rr = run_cluster(lm, std::make_shared<actors::remote_host>(entries, ro), n, o.steps, o.reps,
                            o.caf_threads);
      const auto& lr = local[n];
      std::map<std::string, std::string> p = {{"processes", std::to_string(n)}, {"stages", std::to_string(rr.stages)},
                                              {"tls", tls_name}, {"steps", std::to_string(o.steps)}};
      rows.push_back({"net.tpot", p, rr.tpot_ms, "ms", lr.tpot_ms, "same placement, in-process nodes",
                      lr.tpot_ms > 0 ? rr.tpot_ms / lr.tpot_ms : 0});
      rows.push_back({"net.comm_share", p, rr.comm_share, "fraction", lr.comm_share,
                      "same placement, in-process nodes", lr.comm_share > 0 ? rr.comm_share / lr.comm_share : 0});
      rows.push_back({"net.start", p, rr.start_ms, "ms", lr.start_ms, "same placement, in-process nodes",
                      lr.start_ms > 0 ? rr.start_ms / lr.start_ms : 0});
      std::fprintf(stderr, "%d process(es), %d stage(s), TLS %s: tpot %.3f ms (in process %.3f), comm share %.2f (%.2f), start %.1f ms (%.1f)\n",
                   n, rr.stages, tls_name.c_str(), rr.tpot_ms, lr.tpot_ms, rr.comm_share, lr.comm_share,
                   rr.start_ms, lr.start_ms);
    }
  }
  if (!pki.empty()) run_quiet({"/bin/rm", "-rf", pki}, 30);
  return 0;
}

}  // namespace

void add_bench_net(CLI::App& app, int& status) {
  auto* bench = app.get_subcommand("bench");
  auto o = std::make_shared<net_bench_options>();
  auto json = std::make_shared<std::string>();
  auto* cmd = bench->add_subcommand(
      "net", "the cluster over node daemon processes: per-token latency at 1-8 processes and the per-hop "
             "latency beside a raw TCP round trip, with and without TLS");
  cmd->add_option("-m,--model", o->model, "model file (the daemons load it by name from its folder)");
  cmd->add_option("-z,--tokenizer", o->tokenizer, "tokenizer (beside the model)");
  cmd->add_option("--nodes", o->nodes, "process counts")->delimiter(',')->capture_default_str();
  cmd->add_option("-n,--steps", o->steps, "positions per run")->capture_default_str();
  cmd->add_option("--reps", o->reps, "runs per point (median)")->capture_default_str();
  cmd->add_option("--pings", o->pings, "round trips per hop measurement")->capture_default_str();
  cmd->add_flag("--skip-tls", o->skip_tls, "leave out the TLS rows");
  cmd->add_option("--caf-threads", o->caf_threads, "CAF scheduler threads of the front end")->capture_default_str();
  cmd->add_option("--payloads", o->payloads, "payload sizes in bytes of the hop-vs-raw-TCP rows")->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--payload-rounds", o->payload_rounds, "alternating rounds per payload size (median of ratios)")
      ->capture_default_str();
  cmd->add_option("--idle", o->idle, "idle-worker policies of both processes of the payload rows: default "
                  "(as daemons run), poll (CAF's sleep polling), wake (actors::set_idle_wake)")->delimiter(',')->capture_default_str();
  cmd->add_flag("--payload-only", o->payload_only, "only the payload rows (no model needed)");
  cmd->add_option("--json", *json, "rows as JSON to FILE (- = stdout)");
  cmd->callback([o, json, &status] {
    std::vector<bench_row> rows;
    status = run_net_bench(*o, rows);
    const std::string j = print_rows(rows);
    if (!json->empty()) write_text(*json, j);
  });
  // The other process of the payload rows (not for users: no help entry).
  auto eidle = std::make_shared<std::string>();
  auto ethreads = std::make_shared<int>(2);
  auto edeadline = std::make_shared<int>(1800);
  auto* echo = bench->add_subcommand("net-echo", "")->group("");
  echo->add_option("--idle", *eidle, "");
  echo->add_option("--caf-threads", *ethreads, "");
  echo->add_option("--deadline", *edeadline, "");
  echo->callback([eidle, ethreads, edeadline, &status] { status = run_net_echo(*eidle, *ethreads, *edeadline); });
}

}  // namespace cellshard::tools
