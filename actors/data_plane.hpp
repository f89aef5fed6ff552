// actors/data_plane.hpp: a socket per pair of daemons carrying the tensor
// reductions' partial sums and the pipeline's activations (stage to stage)
// as raw length-prefixed frames, beside CAF (issue #19). CAF stays the control plane: the endpoint of a daemon's data
// plane (host, port, a random 64-bit key) is asked for with a CAF request
// (dp_addr_atom) to one of its shards, the dialler proves it got the key that
// way (its first 12 bytes), and everything else (wiring, steps, liveness,
// recovery) stays on CAF. A frame goes straight from the sending shard's
// thread into the socket (non-blocking; what the socket does not take waits
// in the link's queue for the link's own thread), and the receiving link's
// thread, blocked in read(), decodes it and enqueues it in the destination
// actor's mailbox: one hand-off per hop where CAF's middleman makes two (see
// docs/distributed.md, "Where a hop goes").
//
// Frames, every integer little-endian:
//   [u32 magic 0x50445343 "CSDP"][u8 kind][3 x u8 0][u64 destination actor id]
//   [u64 body length][body]
// kind 1, partial_sum: [u64 session][u32 epoch][i32 pos0][i32 count]
//   [i32 layer][i32 phase][i32 rank] then the blob's wire form exactly as
//   blob::encode writes it ([u8 big_endian][u32 n][u64 xxh64][n floats], in
//   the sender's byte order; a `corrupt` fault's damaged_wire verbatim), so
//   the receiver checks the checksum and converts the byte order as it does
//   for a blob that came through CAF: the epoch, checksum and byte-order
//   semantics are the same on both paths. A `--sync q8_0` partial sum
//   (blob::q8) travels as blob::encode's q8_0 form too (flags bit 1, the
//   blocks; protocol 8): 34 bytes per 32 floats instead of 128.
// kind 2, activation (protocol 9): [u64 session][u32 epoch][i32 pos0]
//   [i32 count][i32 replay_until][i64 compute_ns] then the blob as for kind
//   1. No reply_to (a CAF actor handle cannot travel in a raw frame): it is
//   delivered to the destination as (dp_act_atom, activation) with reply_to
//   empty, and the shard takes reply_to from the CAF activation of the same
//   (session, epoch), which a sender always sends first through CAF
//   (actors/shard.cpp, send_data; the receiver holds a frame that overtakes
//   it).
//
// Failure: a link whose socket fails (peer killed, reset) is closed; the
// message that found it broken, and every later one, goes through CAF (whose
// proxy of a dead node drops it, as before), and the link is asked for again
// (at most 3 times per peer). A frozen peer fills its socket: frames then
// wait in the link's queue (at most 64 MiB, beyond that they are dropped and
// counted, as a lost message; the session's deadlines re-send the step).
// Nothing blocks a CAF thread.
//
// Not with TLS: frames are not encrypted, so daemons with --tls-* keep every
// message on caf-openssl (the data plane is not started); the key only keeps
// strangers from injecting frames into a plain (loopback or --insecure)
// daemon. CELLSHARD_DATA_PLANE=caf switches it off (comparisons).
//
// A sink (attach) lets a shard take partial sums on the reader's thread:
// actors/shard.cpp's fused jobs run a tensor group's layer halves and their
// reductions on the compute worker, which then waits for its peers' partials
// without a hop through the actor (CELLSHARD_DATA_PLANE=unfused: not used),
// and, lending the reading (lend/pump; CELLSHARD_DATA_PLANE=nolend: not),
// read the sockets themselves while they wait.
//
// Thread safety: every member function may be called from any thread.
#pragma once

#include "actors/messages.hpp"

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/expected.hpp>

#include <atomic>
#include <condition_variable>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace cellshard::actors {

/// (dp_addr) -> (std::string host, uint16_t port, uint64_t key): a shard's
/// answer naming its process's data plane; an error when it has none.
using dp_addr_atom = caf::atom_constant<caf::atom("cs_dpaddr")>;
/// (dp_act, activation): an activation that came as a data-plane frame,
/// delivered in process by the plane's reader (or a borrower's pump) to the
/// frame's destination actor; its reply_to is empty (see kind 2 above).
using dp_act_atom = caf::atom_constant<caf::atom("cs_dpact")>;

struct data_endpoint {
  std::string host;
  uint16_t port = 0;
  uint64_t key = 0;
};

/// Counters of one data plane (monotonic).
struct data_plane_stats {
  uint64_t frames_sent = 0, frames_received = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;  // frame bytes, headers included
  uint64_t frames_dropped = 0;     // queue of a stuck link full
  uint64_t links_failed = 0;       // sockets that broke (or never came up)
  uint64_t frames_refused = 0;     // malformed frames or wrong keys (connection closed)
  uint64_t lends = 0;              // readings lent to a borrower (lend() true)
  uint64_t activations_sent = 0, activations_received = 0;  // kind 2 frames (within frames_*)
};

class data_plane {
public:
  /// Listens on `host` (a port of its own). Error when the socket cannot be
  /// made. `host` must be the address peers reach this process at.
  /// `log` (may be empty; called from the plane's threads) hears links
  /// coming up and ending and refused connections.
  static caf::expected<std::shared_ptr<data_plane>> start(const std::string& host,
                                                          std::function<void(const std::string&)> log = {});
  /// True unless CELLSHARD_DATA_PLANE=caf.
  static bool enabled_by_env();
  /// False when CELLSHARD_DATA_PLANE=unfused: partial sums still take the
  /// sockets, but every one goes through the shard actor's mailbox and each
  /// layer half is a job of its own (the path before actors/shard.cpp's fused
  /// jobs; for comparisons: bench peers --cluster --data-plane socket,unfused).
  static bool fused_by_env();
  /// True unless CELLSHARD_DATA_PLANE=nolend: fused jobs borrow the reading
  /// (lend/pump below) instead of waiting on a condition variable while the
  /// reader threads read. The default since 2026-12-03: 3.5x fewer context
  /// switches and 10-20 % less CPU per token than nolend, measured in the
  /// same runs on 4 daemons (docs/distributed.md, "Fused tensor jobs").
  static bool lend_by_env();
  ~data_plane();
  data_plane(const data_plane&) = delete;
  data_plane& operator=(const data_plane&) = delete;

  data_endpoint endpoint() const { return ep_; }

  /// Takes a partial sum on the reader's thread instead of `a`'s mailbox:
  /// true when it took it (then `a` never sees it), false to deliver it to
  /// `a` as usual. Called without the plane's locks held; must not block for
  /// long (the link's next frames wait behind it).
  using sink = std::function<bool(partial_sum&)>;
  /// Frames addressed to a.id() are delivered to `a` (held weakly), offered
  /// first to `s` when given (actors/shard.cpp: a compute job in the middle
  /// of a step's reductions takes them there, without a hand-off).
  void attach(const caf::actor& a, sink s = {});
  void detach(caf::actor_id id);

  /// Sends `m` to actor `dest` of peer `peer` (any string naming the peer
  /// process, e.g. to_string of its node_id) when its link is up. False when
  /// it is not (not asked yet, dialling, failed): send through CAF instead.
  bool send(const std::string& peer, caf::actor_id dest, const partial_sum& m);
  /// The same for an activation (frame kind 2; m.reply_to is not sent).
  bool send(const std::string& peer, caf::actor_id dest, const activation& m);

  /// True once per peer without a link (and again after a failure, up to 3
  /// times): the caller should ask the peer's endpoint (dp_addr_atom) and
  /// pass it to dial(), or to ask_failed() on an error.
  bool should_ask(const std::string& peer);
  void ask_failed(const std::string& peer);
  /// Connects to `ep` in the background (bounded: 2 s); send() uses the
  /// link once its key is written.
  void dial(const std::string& peer, const data_endpoint& ep);
  /// Lending the reading (a fused job of actors/shard.cpp with
  /// the default; not with CELLSHARD_DATA_PLANE=nolend, issue #19): while
  /// lent, the plane's reader threads are parked and the borrower reads every
  /// inbound link itself in pump(), so a partial sum wakes the thread that
  /// waits for it and nothing else (a reader thread's wake-up was the largest
  /// cost left per reduction: docs/distributed.md). At most one borrower at a
  /// time: lend() is false when another thread holds it (that one then waits
  /// on the sink's side as before). Frames for other actors read meanwhile
  /// are delivered as the readers would; they wait in the socket while the
  /// borrower computes. give_back() must follow every successful lend().
  /// The first lend of a plane is logged ("data plane: reading lent").
  bool lend();
  void give_back();
  /// The borrower: reads and delivers the frames that arrive within
  /// `timeout` (returns at the first batch, or at a kick()).
  void pump(std::chrono::milliseconds timeout);
  /// Wakes a pump() in progress (something for the borrower came another way).
  void kick();
  /// Whether the link to `peer` is up (for tests).
  bool link_up(const std::string& peer);
  /// Waits until the link to `peer` is up (true) or failed, or `timeout`.
  bool wait_up(const std::string& peer, std::chrono::milliseconds timeout);

  data_plane_stats stats() const;

private:
  struct link;
  struct reader;
  data_plane() = default;
  void accept_loop();
  void read_loop(int fd);
  struct inbound;
  bool read_frame(int fd);  // one frame, delivered; false: the connection cannot go on
  void flush_loop(std::shared_ptr<link> l, data_endpoint ep);
  void fail(link& l);  // with l.mu held
  void deliver_local(uint64_t dest, partial_sum&& m);  // to the attached actor `dest`, if still there
  void deliver_local(uint64_t dest, activation&& m);   // as (dp_act_atom, m), never to the sink
  // One frame of `kind` whose 32 bytes of fields are `fields`, then blob `x`'s wire form.
  bool send_blob(const std::string& peer, uint8_t kind, caf::actor_id dest, const char* fields, const blob& x);
  bool send_frame(const std::string& peer, const char* head, size_t head_len, const char* body2, size_t len2,
                  const char* body3, size_t len3);

  data_endpoint ep_;
  std::function<void(const std::string&)> log_;
  int listen_fd_ = -1;
  std::atomic<bool> closing_{false};
  std::thread acceptor_;
  mutable std::mutex mu_;  // links_, readers_, local_
  std::map<std::string, std::shared_ptr<link>> links_;
  std::vector<std::pair<int, std::thread>> readers_;
  std::vector<std::shared_ptr<inbound>> inbound_;  // connections past their key
  std::mutex lend_mu_;
  std::condition_variable lend_cv_;  // parked readers wait here while lent
  std::atomic<bool> lent_{false};
  std::atomic<uint64_t> lends_{0};  // lend() granted; the first one is logged
  int kick_fd_ = -1;                 // eventfd: wakes the borrower's pump
  struct local_actor {
    caf::actor_addr addr;
    std::shared_ptr<sink> take;  // may be null
  };
  std::unordered_map<caf::actor_id, local_actor> local_;
  std::atomic<uint64_t> sent_{0}, received_{0}, bytes_sent_{0}, bytes_received_{0}, dropped_{0}, failed_{0},
      refused_{0}, act_sent_{0}, act_received_{0};
};

}  // namespace cellshard::actors
