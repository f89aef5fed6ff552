// actors/tls.hpp: the network set-up shared by node daemons and the front end:
// CAF's middleman with heartbeats and a connection timeout switched on, and
// optionally mutual TLS through caf-openssl (docs/distributed.md).
//
// Why these checks exist (CAF-0.17.md §4, §6):
// - CAF 0.17 ships with heartbeats off: a frozen (SIGSTOPped) peer is never
//   noticed and a blocking connect to it hangs. Both are on by default here:
//   1 s heartbeat, 3 s connection timeout. Shorter is worse, measured: 0.17.6
//   checks the timeout at each heartbeat tick against a connection's last
//   received message, and a connection whose handshake has not delivered
//   one yet counts as silent since forever, so it is dropped at the next
//   tick; with a 100 ms heartbeat a TLS handshake (or any handshake on a
//   loaded machine) lost that race a few times in a hundred. Connections are
//   retried (actors/remote.cpp, actors/daemon.cpp); docs/distributed.md.
// - caf-openssl silently falls back to anonymous TLS when no key is set, and
//   terminates the process (an exception on a CAF thread) when it cannot load
//   a certificate or key, or when only a CA file is given. So the files are
//   checked with OpenSSL before the actor system starts, and authentication is
//   checked again once it runs.
//
// Thread safety: plain functions; call them from the thread that builds the
// actor system. Errors: cellshard::result with a message naming the flag and
// the file.
#pragma once

#include "model/result.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>
#include <caf/io/middleman_actor.hpp>

#include <chrono>
#include <string>

namespace cellshard::actors {

/// The `--tls-cert F --tls-key F --tls-ca F` files (PEM). All empty: no TLS.
struct tls_files {
  std::string cert;  // this side's certificate (chain)
  std::string key;   // its private key (unencrypted: passphrases are not supported)
  std::string ca;    // the CA that signs every node's and front end's certificate
  bool requested() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

struct net_options {
  tls_files tls;
  std::chrono::milliseconds heartbeat{1000};          // middleman.heartbeat-interval
  std::chrono::milliseconds connection_timeout{3000};  // middleman.connection-timeout
  int caf_threads = 2;                                // scheduler.max-threads (0: leave as set)
};

/// The flag combination: all three TLS flags or none. The error names the
/// missing flags (a usage error: exit status 2 in the CLI).
result<void> check_tls_flags(const tls_files& t);

/// Loads the files with OpenSSL as caf-openssl will: the certificate chain,
/// the key (must be unencrypted and match the certificate), the CA file, and
/// checks that the certificate verifies against that CA. Errors name the
/// flag, the file and OpenSSL's reason.
result<void> validate_tls(const tls_files& t);

/// Idle CAF workers wait on their condition variable at once instead of
/// polling: CAF 0.17.6's work-stealing policy makes an idle worker spin 100
/// times, then poll 500 times with a 50 us sleep between polls (25 ms, in
/// which a job that arrives waits for the end of the current sleep, and the
/// polling costs CPU that a kernel on the same core could use), and only then
/// wait on its condition variable, which an enqueue from another thread (the
/// middleman's) signals. This sets work-stealing.moderate-poll-attempts to 0
/// (no sleep polling; the spin phase and the relaxed steal interval stay as
/// they are). Measured by `bench net --idle wake` (docs/distributed.md).
void set_idle_wake(caf::actor_system_config& cfg);

/// Loads the middleman (and caf-openssl when TLS is requested), sets the
/// heartbeat, the connection timeout, the scheduler threads and the TLS keys.
/// Runs check_tls_flags and validate_tls first.
result<void> configure_network(caf::actor_system_config& cfg, const net_options& o);

/// Once the actor system runs: with TLS requested, caf-openssl must be loaded
/// and authenticating peers (not anonymous TLS); otherwise an error.
result<void> check_network(caf::actor_system& sys, const net_options& o);

/// The actor that opens connections and publishes: caf-openssl's when `tls`,
/// else the plain middleman's. Requests to it: (connect_atom, host, port) ->
/// (node_id, strong_actor_ptr, std::set<std::string>).
caf::io::middleman_actor connector(caf::actor_system& sys, bool tls);

/// A connection error as text with a hint at the likely cause, e.g.
/// "connection timeout (no heartbeat from the peer: frozen or overloaded?)".
std::string describe_connect_error(caf::actor_system& sys, const caf::error& e);

/// "HOST:PORT" split at the last ':'; errors name `flag` and the text.
struct host_port {
  std::string host;
  uint16_t port = 0;
};
result<host_port> parse_host_port(const std::string& text, const std::string& flag);

}  // namespace cellshard::actors
