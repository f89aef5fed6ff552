// `cellshard node`: a node daemon that hosts shards for front ends
// (`cellshard run --cluster FILE`), taking each slice from --cache, else its
// own copy of the model found by file name in --models, else shipped by the
// front end (issue #17, actors/daemon.hpp). Its first line on stdout is
// `listening HOST:PORT` (with the port the OS picked for port 0); it runs
// until SIGINT or SIGTERM. Joins, spawns and departures are logged to stderr.
#include "actors/daemon.hpp"
#include "actors/tls.hpp"
#include "topologies/profile.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"
#include "tools/stop_signals.hpp"

#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cellshard::tools {

namespace {

struct node_opts {
  std::string listen, profile = "host", memory, link, models, tls_cert, tls_key, tls_ca, cache, cache_max;
  int caf_threads = 2, blas_threads = 1, threads = 0;
  int heartbeat_ms = 1000, connection_timeout_ms = 3000, peer_timeout_ms = 5000;
  bool quiet = false, insecure = false;
  std::string json_out;
  int handshake_ms = 2000, max_pending = 64;
};

int do_node(const node_opts& o) {
  actors::daemon_options d;
  d.net.tls = {o.tls_cert, o.tls_key, o.tls_ca};
  // Usage errors first, before anything starts (a CA file alone would make
  // caf-openssl terminate the process).
  auto flags = actors::check_tls_flags(d.net.tls);
  if (!flags) throw cli_error(flags.message(), 2);
  auto hp = actors::parse_host_port(o.listen, "--listen");
  if (!hp) throw cli_error(hp.message(), 2);
  d.host = hp->host;
  d.port = hp->port;
  d.insecure = o.insecure;
  d.guard.handshake_deadline = std::chrono::milliseconds(o.handshake_ms);
  d.guard.max_pending = static_cast<size_t>(o.max_pending);
  d.profile = o.profile;
  d.link = o.link;
  if (!o.memory.empty()) {
    auto m = topologies::parse_memory(o.memory);
    if (!m) throw cli_error("--memory: " + m.message(), 2);
    d.memory = *m;
  }
  if (o.models.empty()) {
    const char* env = std::getenv("CELLSHARD_MODELS");
    d.models_dir = env && *env ? env : "./models";
    struct stat sb;
    if (!(env && *env) && (::stat("./models", &sb) != 0 || !S_ISDIR(sb.st_mode)))
      d.models_dir.clear();  // no folder of models: every slice from --cache or shipped
  } else {
    d.models_dir = o.models;
  }
  d.cache_dir = o.cache;
  if (!o.cache_max.empty()) {
    auto m = topologies::parse_memory(o.cache_max);
    if (!m) throw cli_error("--cache-max: " + m.message(), 2);
    if (o.cache.empty()) throw cli_error("--cache-max needs --cache DIR", 2);
    d.cache_max = *m;
  }
  d.net.caf_threads = o.caf_threads;
  d.net.heartbeat = std::chrono::milliseconds(o.heartbeat_ms);
  d.net.connection_timeout = std::chrono::milliseconds(o.connection_timeout_ms);
  d.peer_timeout = std::chrono::milliseconds(o.peer_timeout_ms);
  d.blas_threads = o.blas_threads;
  if (o.threads < 0 || o.threads > max_kernel_threads)
    throw cli_error("--threads: got " + std::to_string(o.threads) + ", expected 0 (the CPUs this process may use) to " +
                        std::to_string(max_kernel_threads) + " kernel threads per node",
                    2);
  d.threads = o.threads;
  auto prefix = std::make_shared<std::string>("cellshard node");
  if (!o.quiet)
    d.log = [prefix](const std::string& line) { std::fprintf(stderr, "%s: %s\n", prefix->c_str(), line.c_str()); };

  // SIGINT/SIGTERM stop the daemon cleanly, whichever thread takes them
  // (tools/stop_signals.hpp).
  stop_signals stop;

  auto daemon = actors::node_daemon::start(d);
  if (!daemon) throw cli_error(daemon.message());
  const std::string addr = (*daemon)->host() + ":" + std::to_string((*daemon)->port());
  *prefix = "cellshard node " + addr;
  // --json: the address for scripts, written once the daemon listens and
  // before the `listening` line (whoever read that line finds the file).
  if (!o.json_out.empty()) write_text(o.json_out, nlohmann::json{{"listening", addr}, {"pid", ::getpid()}}.dump() + "\n");
  std::printf("listening %s\n", addr.c_str());
  std::fflush(stdout);
  if (!o.quiet)
    std::fprintf(stderr, "cellshard node %s: profile %s, models in %s%s%s\n", addr.c_str(), d.profile.c_str(),
                 d.models_dir.c_str(), d.net.tls.requested() ? ", mutual TLS" : "",
                 d.link.empty() ? "" : (", links shaped to " + d.link).c_str());
  const int sig = stop.wait();
  if (!o.quiet) std::fprintf(stderr, "cellshard node %s: signal %d, stopping\n", addr.c_str(), sig);
  (*daemon)->stop();
  return 0;
}

}  // namespace

void add_node(CLI::App& app, int& status) {
  auto o = std::make_shared<node_opts>();
  auto* cmd = app.add_subcommand("node", "a node daemon that hosts shards for a cluster (run --cluster)");
  cmd->add_option("--listen", o->listen, "HOST:PORT to listen on (port 0 picks a free one); "
                  "the first line on stdout is 'listening HOST:PORT'")->required();
  cmd->add_option("--profile", o->profile, "node profile: host|ps3|ps3-slim|rpi5")->capture_default_str();
  cmd->add_option("--memory", o->memory, "memory budget, e.g. 256MiB (overrides the profile's)");
  cmd->add_option("--link", o->link,
                  "shape the shards' outgoing links, BANDWIDTH:LATENCY e.g. 1gbit:100us (overrides the profile's)");
  cmd->add_option("--models", o->models,
                  "folder holding the model and tokenizer files, found by file name "
                  "(default: $CELLSHARD_MODELS, else ./models)");
  cmd->add_option("--cache", o->cache,
                  "folder where slices shipped by front ends are kept by manifest digest (created when missing); "
                  "without it shipped slices are kept in memory only");
  cmd->add_option("--cache-max", o->cache_max,
                  "bound of --cache, e.g. 64MiB (least recently used slices are removed; a slice larger than "
                  "this is refused)");
  cmd->add_option("--tls-cert", o->tls_cert, "this node's certificate (PEM); mutual TLS needs all three");
  cmd->add_option("--tls-key", o->tls_key, "its private key (PEM, unencrypted)");
  cmd->add_option("--tls-ca", o->tls_ca, "the CA certificate every peer must be signed by (PEM)");
  cmd->add_option("--caf-threads", o->caf_threads, "CAF scheduler threads")->capture_default_str();
  cmd->add_option("--blas-threads", o->blas_threads, "OpenBLAS threads")->capture_default_str();
  cmd->add_option("--threads", o->threads,
                  "kernel threads of this node's shards (native backend; 0 = the CPUs this process may use)")
      ->capture_default_str();
  cmd->add_option("--heartbeat-ms", o->heartbeat_ms, "middleman heartbeat interval")->capture_default_str();
  cmd->add_option("--connection-timeout-ms", o->connection_timeout_ms,
                  "a peer silent this long is disconnected")->capture_default_str();
  cmd->add_option("--peer-timeout-ms", o->peer_timeout_ms,
                  "deadline of a connection to another node")->capture_default_str();
  cmd->add_flag("-q,--quiet", o->quiet, "log nothing to stderr but errors");
  cmd->add_option("--json", o->json_out, "write {\"listening\": \"HOST:PORT\", \"pid\": N} to FILE once listening");
  cmd->add_flag("--insecure", o->insecure,
                "without TLS, allow a non-loopback --listen address (plain, unauthenticated connections)");
  cmd->add_option("--handshake-ms", o->handshake_ms,
                  "deadline for a new connection's guard preamble, before anything reaches CAF")
      ->check(CLI::Range(10, 600000))
      ->capture_default_str();
  cmd->add_option("--max-pending", o->max_pending,
                  "connections in the guard handshake at once; one more evicts the oldest")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->callback([o, &status] { status = do_node(*o); });
}

}  // namespace cellshard::tools
