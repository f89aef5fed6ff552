// Busy nodes are not dead (issues #15 and #20): kernels run on a per-shard
// worker, off CAF's scheduler threads, so a shard computing a long step still
// answers liveness probes and its node's heartbeats keep flowing -- also while
// a spinning thread per core (tests/busy_loops.hpp) competes with them.
#include "actors/cluster.hpp"
#include "kernels/backend.hpp"
#include "model/synth.hpp"
#include "model/transformer.hpp"
#include "supervision/fault_plan.hpp"
#include "tests/busy_loops.hpp"
#include "tests/support.hpp"

#include <catch2/catch.hpp>

using namespace cellshard;

namespace {

struct synth_model {
  std::shared_ptr<const model::model_file> file;
  std::shared_ptr<const model::tokenizer> tok;
};

/// A stories42m-shaped synthetic model (8 layers of width 512): a prefill of
/// a few hundred positions computes for seconds -- many heartbeat intervals.
synth_model busy_model() {
  auto cfg = model::synth_preset("stories42m").value();
  cfg.seq_len = 320;
  auto f = model::model_file::from_bytes(model::synth_bytes(cfg, 42), "busy synth (stories42m shape)");
  REQUIRE(f.ok());
  return {*f, model::tokenizer::byte_level(cfg.vocab_size)};
}

/// The same generation on one engine, no actors: the independent reference.
std::vector<int> reference_ids(const synth_model& m, const model::generation_params& gp,
                               const std::string& backend = "blas") {
  auto w = model::shard_weights::make(m.file, model::slice_spec::whole(m.file->cfg()));
  REQUIRE(w.ok());
  model::engine eng(*w, *kernels::find_backend(backend));
  auto r = model::generate([&](int t, int p) -> result<const float*> { return eng.forward(t, p); }, *m.tok,
                           m.file->cfg().vocab_size, gp, nullptr);
  REQUIRE(r.ok());
  return r->ids;
}

}  // namespace

TEST_CASE("shards computing a long prefill are never restarted, but a silent node still is",
          "[resilience][busy]") {
  const auto m = busy_model();
  model::generation_params gp;
  for (int i = 0; i < 10; ++i) gp.prompt += "once upon a time there was a little girl. ";  // 430 bytes
  gp.prompt.resize(260);
  gp.steps = 290;
  gp.sampling = {0.0f, 0.9f, 1};
  gp = model::normalise(gp, m.file->cfg().seq_len);
  const auto want = reference_ids(m, gp);
  const int n_prompt = static_cast<int>(m.tok->encode(gp.prompt, true, false).size());
  REQUIRE(n_prompt + 5 < gp.steps);

  actors::cluster_options o;
  o.file = m.file;
  o.tok = m.tok;
  o.nodes = 2;
  o.spares = 1;
  o.topology = "pipeline";
  // One scheduler thread for everything that carries messages: with kernels
  // on it, a prefill starved the heartbeats (issue #15: every node flagged
  // silent); with kernels on the shards' workers nothing waits on them.
  o.caf_threads = 1;
  o.step_timeout = std::chrono::seconds(120);
  o.step_timeout_min = std::chrono::seconds(60);
  // Stage 1's node falls silent during decoding: still detected and moved.
  auto f = supervision::parse_fault_spec("silence:node=1:step=" + std::to_string(n_prompt + 5));
  REQUIRE(f.ok());
  o.faults = {*f};
  // Every core busy for the whole run (issue #20): the prefill's kernels, the
  // heartbeats and the probes all compete with a spinning thread per core.
  test::busy_loops load(std::chrono::minutes(10));
  auto c = actors::cluster::start(o);
  REQUIRE(c.ok());
  auto r = (*c)->generate(gp, {}, std::chrono::minutes(5));
  load.stop();
  CHECK(load.ended_on_bound() == 0);  // the load lasted the whole run
  CHECK(load.spins() > 0);
  REQUIRE(r.ok());
  INFO(r->error);
  REQUIRE(r->ok);
  CHECK(r->result.ids == want);
  const auto faults = (*c)->faults();
  // Exactly one restart: the silenced node's. The prefill (ttft below)
  // restarted nothing.
  WARN(load.threads() << " busy loop(s); prefill of " << n_prompt << " positions: ttft " << r->result.ttft_ms << " ms; suspicions cleared: "
                     << (*c)->suspicions().size());
  REQUIRE(faults.size() == 1u);
  CHECK(faults.front().kind == "silence");
  CHECK(faults.front().index == 1);
  CHECK(faults.front().recover_ms >= 0);
  CHECK(faults.front().moved_to_node == 2);
}

// -- issue #15's case: a stories110m-shaped model, tokenizer.bin, 301 positions --
//
// With kernels on CAF's scheduler threads this failed 5 of 5 with "recovery
// impossible ... no healthy node left" and no fault injected: the prefill
// occupied both scheduler threads and every node's heartbeats starved. Each
// stage's prefill is one step (one worker job over 6 layers x 301 positions,
// seconds: tens of heartbeat intervals). The next case runs the same model
// and prompt in process with a silence injected while a node computes.
#include <cstdio>
#include <future>
#include <sstream>

#include <nlohmann/json.hpp>

namespace {

/// 25 x the sentence of issue #15: 301 tokens with tokenizer.bin (BOS included).
std::string issue15_prompt() {
  std::string p;
  for (int i = 0; i < 25; ++i) p += (i ? " " : "") + std::string("once upon a time there was a little girl named lily");
  return p;
}

nlohmann::json read_json(const std::string& path) {
  const std::string text = test::read_file(path);
  auto j = nlohmann::json::parse(text, nullptr, false);
  REQUIRE_FALSE(j.is_discarded());
  return j;
}

/// Removes a file when the test ends (the synthetic model is 418 MiB).
struct remove_at_end {
  std::string path;
  ~remove_at_end() { std::remove(path.c_str()); }
};

}  // namespace

TEST_CASE("issue 15: 301 prompt positions on stories110m over a 2-stage pipeline complete with no fault",
          "[resilience][busy][processes]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("busy110m");
  const std::string m = dir + "/s110.bin";
  remove_at_end cleanup{m};
  const std::string z = test::shared_file("models/tokenizer.bin");
  const std::string bin = test::cellshard_bin();
  auto s = test::run_command({bin, "synth", "--config", "stories110m", "--seq-len", "512", "-o", m});
  INFO(s.err);
  REQUIRE(s.status == 0);
  const std::string prompt = issue15_prompt();
  auto t = test::run_command({bin, "tokenize", "-m", m, "-z", z, "-i", prompt});
  REQUIRE(t.status == 0);
  {
    std::istringstream ids(t.out);
    int n = 0;
    for (int id; ids >> id;) ++n;
    REQUIRE(n == 301);  // BOS + 300 tokens: the issue's 301 positions
  }
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args{bin, "run", "-m", m, "-z", z, "-i", prompt, "-t", "0", "-n", "480", "-q",
                                  "--ids-out", dir + "/" + name + ".ids", "--json", dir + "/" + name + ".json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return test::run_command(args, 600);
  };
  // The reference: the same generation on one node (no fixture: any model's
  // ids must equal its single-node run).
  auto one = run("single", {});
  INFO(one.err);
  REQUIRE(one.status == 0);
  const auto want = test::read_ids(dir + "/single.ids");
  REQUIRE(want.size() == 481u);  // BOS + 480 positions

  // The issue's command: exit 0, the single-node ids, no fault of any kind
  // (a busy node may be suspected and cleared by a probe: `suspicions`).
  auto two = run("pipeline", {"--nodes", "2", "--topology", "pipeline"});
  INFO(two.err);
  CHECK(two.status == 0);
  CHECK(test::read_ids(dir + "/pipeline.ids") == want);
  auto j = read_json(dir + "/pipeline.json");
  CHECK(j["ok"] == true);
  CHECK(j["faults"] == nlohmann::json::array());
  WARN("stories110m, 2-stage pipeline, 301 prompt positions: ttft " << j["ttft_ms"].get<double>() << " ms, "
                                                                   << j["suspicions"].size()
                                                                   << " suspicion(s) cleared, no fault");
}

namespace {

/// issue #15's prompt, in process, on a synthetic model of `preset`'s shape
/// with tokenizer.bin, while a spinning thread per core competes with
/// everything (tests/busy_loops.hpp): two identical requests at once. Stage
/// 0's worker computes request A's prefill, then B's (FIFO); A's activations
/// reach stage 1, whose node falls silent on them (step 0): it is detected
/// and moved while node 0 is busy with B's prefill -- a busy node and a
/// silent one at the same time, told apart.
void busy_and_silent(const std::string& preset) {
  auto cfg = model::synth_preset(preset).value();
  cfg.seq_len = 512;
  auto f = model::model_file::from_bytes(model::synth_bytes(cfg, 1), "synth " + preset + ", seq_len 512");
  REQUIRE(f.ok());
  auto tok = model::tokenizer::open(test::shared_file("models/tokenizer.bin"));
  REQUIRE(tok.ok());
  const synth_model m{*f, *tok};
  model::generation_params gp;
  gp.prompt = issue15_prompt();
  gp.steps = 311;
  gp.sampling = {0.0f, 0.9f, 1};
  gp = model::normalise(gp, cfg.seq_len);
  REQUIRE(m.tok->encode(gp.prompt, true, false).size() == 301u);
  const auto want = reference_ids(m, gp, "native");

  actors::cluster_options o;
  o.file = m.file;
  o.tok = m.tok;
  o.nodes = 2;
  o.spares = 1;
  o.sessions = 2;
  o.topology = "pipeline";
  auto fp = supervision::parse_fault_spec("silence:node=1:step=0");
  REQUIRE(fp.ok());
  o.faults = {*fp};
  // Every core busy for the whole run (issue #20), as in the first case.
  test::busy_loops load(std::chrono::minutes(20));
  auto c = actors::cluster::start(o);
  REQUIRE(c.ok());
  auto done = std::make_shared<std::promise<actors::session_outcome>>();
  (*c)->submit(gp, {}, [done](uint64_t, const actors::session_outcome& so) { done->set_value(so); });
  auto b = (*c)->generate(gp, {}, std::chrono::minutes(10));
  auto fa = done->get_future();
  REQUIRE(fa.wait_for(std::chrono::minutes(10)) == std::future_status::ready);
  const auto a = fa.get();
  load.stop();
  CHECK(load.ended_on_bound() == 0);  // the load lasted the whole run
  CHECK(load.spins() > 0);
  REQUIRE(b.ok());
  INFO(a.error << " / " << b->error);
  REQUIRE(a.ok);
  REQUIRE(b->ok);
  CHECK(a.result.ids == want);
  CHECK(b->result.ids == want);
  const auto faults = (*c)->faults();
  REQUIRE(faults.size() == 1u);  // node 0 (busy throughout) was never restarted
  CHECK(faults.front().kind == "silence");
  CHECK(faults.front().index == 1);
  CHECK(faults.front().moved_to_node == 2);
  CHECK(faults.front().recover_ms >= 0);
  WARN(preset << ", " << load.threads() << " busy loop(s): two 301-position prefills, silence on stage 1 detected after "
              << faults.front().detect_ms << " ms; " << (*c)->suspicions().size() << " suspicion(s) cleared");
}

}  // namespace

// The issue's shape: ~2 minutes under busy loops on 2 cores, so `slow`.
TEST_CASE("a node silent while another computes a 301-position prefill: only the silent one is moved",
          "[resilience][busy][slow]") {
  if (!test::have_shared()) return;
  busy_and_silent("stories110m");
}

// The same on a stories42m shape (8 layers of width 512), for CI.
TEST_CASE("stories42m shape: a node silent while another computes a 301-position prefill is the one moved",
          "[resilience][busy]") {
  if (!test::have_shared()) return;
  busy_and_silent("stories42m");
}

namespace {

/// Repeats a sentence until the tokenizer makes at least `tokens` tokens of it.
std::string prompt_of_tokens(const model::tokenizer& tok, int tokens) {
  std::string p;
  while (static_cast<int>(tok.encode(p, true, false).size()) < tokens)
    p += (p.empty() ? "" : " ") + std::string("once upon a time there was a little girl named lily");
  return p;
}

uint64_t link_bytes(const std::vector<actors::shard_stats>& st) {
  uint64_t b = 0;
  for (const auto& s : st)
    for (size_t i = 0; i < s.link_to.size(); ++i)
      if (s.link_to[i] != s.node) b += s.link_bytes[i];
  return b;
}

struct slow_link_run {
  actors::session_outcome out;
  uint64_t bytes = 0;
};

slow_link_run run_stories(const std::string& topology, int nodes, const std::string& link, int min_tokens,
                          int extra_steps) {
  actors::cluster_options o;
  o.model = test::shared_file("models/stories260K.bin");
  o.tokenizer = test::shared_file("models/tok512.bin");
  o.nodes = nodes;
  o.topology = topology;
  o.link = link;
  auto c = actors::cluster::start(o);
  REQUIRE(c.ok());
  model::generation_params gp;
  gp.prompt = prompt_of_tokens((*c)->tokenizer(), min_tokens);
  gp.steps = static_cast<int>((*c)->tokenizer().encode(gp.prompt, true, false).size()) + extra_steps;
  gp.sampling = {0.0f, 0.9f, 1};
  auto r = (*c)->generate(gp, {}, std::chrono::minutes(10));
  REQUIRE(r.ok());
  slow_link_run out;
  out.out = *r;
  auto st = (*c)->stats();
  REQUIRE(st.ok());
  out.bytes = link_bytes(*st);
  return out;
}

}  // namespace

TEST_CASE("a 100-position prompt over a 50 kbit/s link completes with no re-send", "[resilience][deadline]") {
  if (!test::have_shared()) return;
  // 100 positions x 64 floats = 25.6 kB = 4.1 s on the 0 -> 1 link alone: past
  // the 2 s floor, which used to re-send the prefill (and multiply the bytes).
  const auto fast = run_stories("pipeline", 2, "", 100, 3);
  INFO(fast.out.error);
  REQUIRE(fast.out.ok);
  const auto slow = run_stories("pipeline", 2, "50kbit:10ms", 100, 3);
  INFO(slow.out.error);
  REQUIRE(slow.out.ok);
  CHECK(slow.out.result.ids == fast.out.result.ids);
  CHECK(slow.out.retries == 0);
  WARN("50 kbit/s: prefill " << slow.out.result.ttft_ms << " ms, " << slow.out.extensions
                             << " deadline(s) extended by a probe, link bytes " << slow.bytes << " vs "
                             << fast.bytes << " unshaped");
  CHECK(slow.bytes <= fast.bytes * 3 / 2);
}

TEST_CASE("a 450-position prompt over 200 kbit/s links, tensor 4, completes with no re-send",
          "[resilience][deadline][slow]") {
  if (!test::have_shared()) return;
  const auto fast = run_stories("tensor", 4, "", 450, 3);
  INFO(fast.out.error);
  REQUIRE(fast.out.ok);
  const auto slow = run_stories("tensor", 4, "200kbit:10ms", 450, 3);
  INFO(slow.out.error);
  REQUIRE(slow.out.ok);
  CHECK(slow.out.result.ids == fast.out.result.ids);
  CHECK(slow.out.retries == 0);
  WARN("tensor 4 at 200 kbit/s: prefill " << slow.out.result.ttft_ms << " ms, " << slow.out.extensions
                                          << " extension(s), link bytes " << slow.bytes << " vs " << fast.bytes);
  CHECK(slow.bytes <= fast.bytes * 3 / 2);
}

// -- the pre-handshake guard, without CAF: an echo server behind it ------------
#include "actors/guard.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

namespace {

int tcp_listen_loopback(uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0) return -1;
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

int tcp_connect_loopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  return fd;
}

/// Reads exactly n bytes within 5 s (poll), or fewer when the peer closes.
std::string read_n(int fd, size_t n) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (out.size() < n && std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t k = ::recv(fd, buf, std::min(sizeof buf, n - out.size()), 0);
    if (k <= 0) break;
    out.append(buf, static_cast<size_t>(k));
  }
  return out;
}

/// An echo server: accepts up to `max` connections, echoes each until it closes.
struct echo_server {
  int fd = -1;
  uint16_t port = 0;
  std::atomic<int> accepted{0};
  std::atomic<bool> stop{false};
  std::thread t;
  echo_server() {
    fd = tcp_listen_loopback(port);
    t = std::thread([this] {
      std::vector<int> conns;
      while (!stop) {
        std::vector<pollfd> ps{{fd, POLLIN, 0}};
        for (int c : conns) ps.push_back({c, POLLIN, 0});
        if (::poll(ps.data(), ps.size(), 50) <= 0) continue;
        if (ps[0].revents & POLLIN) {
          const int c = ::accept(fd, nullptr, nullptr);
          if (c >= 0) {
            conns.push_back(c);
            ++accepted;
          }
        }
        for (size_t i = 1; i < ps.size(); ++i)
          if (ps[i].revents & (POLLIN | POLLHUP)) {
            char buf[4096];
            const ssize_t k = ::recv(ps[i].fd, buf, sizeof buf, 0);
            if (k > 0) (void)::send(ps[i].fd, buf, static_cast<size_t>(k), MSG_NOSIGNAL);
          }
      }
      for (int c : conns) ::close(c);
    });
  }
  ~echo_server() {
    stop = true;
    t.join();
    ::close(fd);
  }
};

}  // namespace

TEST_CASE("the guard relays a peer that sends the preamble and drops junk before the server sees it",
          "[resilience][guard]") {
  echo_server inner;
  REQUIRE(inner.fd >= 0);
  actors::guard_options go;
  go.handshake_deadline = std::chrono::milliseconds(5000);
  go.max_pending = 8;
  auto g = actors::guard_listener::start("127.0.0.1", 0, inner.port, go);
  REQUIRE(g.ok());
  const uint16_t port = (*g)->port();
  // Junk: the crafted BASP header of issue #20, and silent connections past the pending bound.
  std::vector<char> crafted(8, 0);
  for (char c : {'\x00', '\x00', '\x00', '\x40'}) crafted.push_back(c);
  crafted.insert(crafted.end(), 64, 0);
  const int j = tcp_connect_loopback(port);
  REQUIRE(j >= 0);
  REQUIRE(::send(j, crafted.data(), crafted.size(), MSG_NOSIGNAL) == 76);
  CHECK(read_n(j, 1).empty());  // closed without an answer
  ::close(j);
  std::vector<int> silent;
  for (int k = 0; k < 20; ++k) silent.push_back(tcp_connect_loopback(port));
  // A real peer through the dialer: its bytes come back through the echo.
  auto local = actors::guarded_port("127.0.0.1", port);
  REQUIRE(local.ok());
  const int c = tcp_connect_loopback(*local);
  REQUIRE(c >= 0);
  const std::string msg = "hello through the guard";
  REQUIRE(::send(c, msg.data(), msg.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(msg.size()));
  CHECK(read_n(c, msg.size()) == msg);
  ::close(c);
  for (int s : silent) ::close(s);
  const auto st = (*g)->stats();
  CHECK(st.rejected >= 1);
  CHECK(st.evicted >= 20 - 8 - 1);  // beyond the 8 pending, the oldest went
  CHECK(st.relayed == 1);
  CHECK(inner.accepted == 1);  // only the real peer reached the server
}

TEST_CASE("a dialer pointed at a listener that is not a guard reports what it got", "[resilience][guard]") {
  uint16_t port = 0;
  const int lfd = tcp_listen_loopback(port);
  REQUIRE(lfd >= 0);
  std::thread hostile([lfd] {
    pollfd p{lfd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return;
    const int fd = ::accept(lfd, nullptr, nullptr);
    const char bytes[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40};
    (void)::send(fd, bytes, sizeof bytes, MSG_NOSIGNAL);
    ::close(fd);
  });
  auto local = actors::guarded_port("127.0.0.1", port);
  REQUIRE(local.ok());
  const int c = tcp_connect_loopback(*local);
  REQUIRE(c >= 0);
  CHECK(read_n(c, 1).empty());  // nothing of the stranger's reaches us
  ::close(c);
  hostile.join();
  ::close(lfd);
  CHECK_THAT(actors::dial_error("127.0.0.1", port), Catch::Contains("not a cellshard guard ack"));
}
