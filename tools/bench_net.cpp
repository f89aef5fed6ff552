// `cellshard bench net`: the cluster over node daemon processes on loopback
// (issue #5), each row beside a baseline measured in the same run:
//   net.tcp_rtt      a raw TCP loopback round trip (64 B each way, TCP_NODELAY)
//   net.hop          one hop through CAF's middleman (half a request/response
//                    round trip to a daemon actor), with and without TLS, vs
//                    half the raw TCP round trip
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
#include "actors/messages.hpp"
#include "actors/remote.hpp"
#include "actors/local_daemons.hpp"
#include "base/percentile.hpp"
#include "actors/run_report.hpp"
#include "base/spawn.hpp"
#include "tools/bench.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <future>
#include <memory>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
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
};

int run_net_bench(const net_bench_options& o, std::vector<bench_row>& rows) {
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
  cmd->add_option("--json", *json, "rows as JSON to FILE (- = stdout)");
  cmd->callback([o, json, &status] {
    std::vector<bench_row> rows;
    status = run_net_bench(*o, rows);
    const std::string j = print_rows(rows);
    if (!json->empty()) write_text(*json, j);
  });
}

}  // namespace cellshard::tools
