// <cellshard/daemons.hpp>: node daemons (`cellshard node` processes) on
// loopback, started and stopped by this program: for examples, tests and
// tools that want a real multi-process cluster on one machine. (Daemons on
// other machines are started there, and listed in a cluster file for
// hosts::daemons.) Target cellshard::cellshard. No CAF header is reachable.
//
//   cellshard::daemon_set::options o;
//   o.binary = "/usr/local/bin/cellshard";
//   o.models_dir = "/models";                  // holds the model and tokenizer files
//   auto d = cellshard::daemon_set::start(3, 0, o);
//   auto h = (*d)->hosts();                    // -> cluster::start(opts, *h)
//
// Each daemon is started as
//   BINARY node --listen 127.0.0.1:0 --models DIR [--profile P] [--memory BYTES] [TLS flags]
// and its first stdout line `listening HOST:PORT` is read under a deadline.
// Lifetime: the destructor kills (SIGKILL) and reaps every daemon. The
// daemons also die with the thread that started them (PR_SET_PDEATHSIG), so
// start daemon_sets from a thread that outlives them (the main thread). They
// inherit no descriptor but stdin (/dev/null), stdout (a pipe) and stderr (a
// log file). Linux only.
// Thread safety: kill/freeze/thaw from any thread; the rest from the owner.
// Errors: result<> with the daemon (index, pid), the cause, and the tail of
// its stderr when it did not start.
#pragma once

#include <cellshard/cluster.hpp>
#include <cellshard/result.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace cellshard {

class daemon_set {
public:
  struct options {
    std::string binary;            ///< the cellshard executable (required)
    std::string models_dir;        ///< --models: holds the model and tokenizer files (required)
    node_profile profile = node_profile::host;
    std::uint64_t memory_bytes = 0;  ///< per daemon; 0 = the profile's
    tls_settings tls;              ///< the daemons' side: all three files or none
    std::string log_dir;           ///< daemons' stderr; "" = a temporary folder removed at the end
    std::chrono::milliseconds start_deadline{20000};  ///< per daemon, until `listening`
  };
  /// Starts `working + spares` daemons, one after the other. On error the
  /// ones already started are stopped.
  static result<std::unique_ptr<daemon_set>> start(int working, int spares, const options& o);
  ~daemon_set();
  daemon_set(const daemon_set&) = delete;
  daemon_set& operator=(const daemon_set&) = delete;

  int size() const;
  std::uint16_t port(int i) const;
  int pid(int i) const;
  /// Writes the cluster file ({"nodes": [...]}, the last `spares` marked spare).
  result<void> write_cluster_file(const std::string& path) const;
  /// The daemons as hosts for cluster::start (writes a cluster file into the
  /// log folder); `tls` is the front end's side.
  result<cellshard::hosts> hosts(const tls_settings& tls = {}) const;

  /// Signals daemon i (no wait): kill = SIGKILL, freeze = SIGSTOP, thaw = SIGCONT.
  result<void> kill(int i);
  result<void> freeze(int i);
  result<void> thaw(int i);
  /// What daemon i wrote on stderr (its last `max_bytes`).
  std::string log(int i, std::size_t max_bytes = 4000) const;

  struct impl;

private:
  explicit daemon_set(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace cellshard
