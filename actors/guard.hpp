// actors/guard.hpp: the pre-handshake guard of node daemons (issue #20).
//
// CAF 0.17's BASP parser trusts the first bytes of a connection: a crafted
// 76-byte header (a payload length CAF believes) crashes libcaf_io in the
// multiplexer (SIGSEGV), and a flood of junk connections stalls its accept
// loop. So nothing reaches CAF before it proved to be one of ours:
//
//   front end / peer                         node daemon
//   CAF --loopback--> dialer relay ==TCP==> guard listener --loopback--> CAF (BASP)
//                     sends preamble        reads preamble (deadline,
//                     checks the ack        size bound), answers the ack,
//                                           then relays bytes both ways
//
// The preamble is 16 bytes: the magic "CSHARD-G" (8 bytes), a protocol
// version (u32, big-endian, guard_version), and the byte count of the
// preamble itself (u32, big-endian, 16) as a size bound: anything else, or
// not 16 bytes within `handshake_deadline`, closes the connection before a
// single byte reaches CAF. The daemon answers with the same 16 bytes; a
// dialer that gets anything else (a hostile or foreign listener) closes its
// side, so the front end's CAF sees a failed connect and never parses the
// stranger's bytes; dial_error() then says what was received.
//
// The daemon's CAF publishes on 127.0.0.1 at an ephemeral port only the guard
// connects to. With TLS the relays carry the TLS bytes unchanged: the guard
// comes first, TLS authenticates on top of it.
//
// Flood bound: at most `max_pending` connections may be in the handshake at
// once; one more evicts the oldest (a real peer sends its preamble at once,
// so it is never the oldest for long). Relayed connections are bounded by
// `max_relays`.
//
// Cost: two extra loopback hops per direction and a copy through user space
// (measured in docs/reliability.md).
//
// Thread safety: one relay thread per guard_engine; the public functions
// lock. Errors: listen/connect failures are returned as result errors naming
// the address.
#pragma once

#include "model/result.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace cellshard::actors {

constexpr uint32_t guard_version = 1;
constexpr size_t guard_preamble_size = 16;

struct guard_options {
  std::chrono::milliseconds handshake_deadline{2000};
  size_t max_pending = 64;
  size_t max_relays = 4096;
};

struct guard_stats {
  uint64_t accepted = 0;         // connections accepted on the public port
  uint64_t relayed = 0;          // of those, passed to CAF after a valid preamble
  uint64_t rejected = 0;         // wrong magic, version or size
  uint64_t timed_out = 0;        // no full preamble within the deadline
  uint64_t evicted = 0;          // pending beyond max_pending
};

/// The daemon side: listens on host:port, relays valid connections to
/// 127.0.0.1:inner_port.
class guard_listener {
public:
  static result<std::unique_ptr<guard_listener>> start(const std::string& host, uint16_t port,
                                                       uint16_t inner_port, guard_options o = {});
  ~guard_listener();
  uint16_t port() const;
  guard_stats stats() const;
  struct impl;

private:
  explicit guard_listener(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// The dialing side (process-wide): a loopback port that, for each
/// connection CAF opens to it, connects to host:port, sends the preamble,
/// checks the ack and then relays. The same (host, port) gets the same local
/// port. Give CAF ("127.0.0.1", that port) instead of (host, port).
result<uint16_t> guarded_port(const std::string& host, uint16_t port);

/// Why the last guarded connection to host:port failed ("" if none did):
/// e.g. "127.0.0.1:4242 answered 16 bytes that are not a cellshard guard ack".
std::string dial_error(const std::string& host, uint16_t port);

/// Connections closed before CAF by every guard_listener of this process
/// (bad preamble, deadline, or evicted): for `cellshard status`.
uint64_t guard_rejected_total();

}  // namespace cellshard::actors
