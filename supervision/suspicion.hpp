// supervision/suspicion.hpp: suspicion is not death (issue #20). A failure
// detector's verdict (phi accrual: heartbeats late) starts a probe round
// instead of a restart; the peer is declared dead only when every probe of a
// round went unanswered.
//
// Protocol, after SWIM (A. Das, I. Gupta, A. Motivala, "SWIM: Scalable
// Weakly-consistent Infection-style Process Group Membership Protocol",
// DSN 2002, section 3.1): on suspicion the watcher sends a direct liveness
// request to the peer and asks k other members to send one too (indirect
// probes, which route around a congested link between watcher and peer).
// Any answer within the probe timeout clears the suspicion; none declares the
// peer dead. Differences from SWIM: the probe round starts on a phi-accrual
// verdict rather than on a periodic random ping, and a cleared peer whose
// heartbeats are still missing is probed again every `reprobe_every` until
// its heartbeats return (a peer that answers probes but then freezes is
// still found, one probe timeout later).
//
// This class is the bookkeeping only, free of actors and of any clock: the
// caller passes `now` (the actor clock in the runtime, any time point in
// tests) and sends the probes itself. One owner, no locking.
//
// Costs: a healthy peer that was only slow costs a probe round (a few small
// messages) and no restart; a frozen peer costs detection + one probe timeout
// (with the defaults ~0.36 s + 25 ms tick + 0.4 s, under the 1 s goal).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cellshard::supervision {

struct suspicion_config {
  /// How long a probe round waits for any answer. Our choice: 400 ms is 4
  /// heartbeat intervals, long enough for a loaded host to schedule a reply
  /// (measured under busy loops on every core: docs/reliability.md), short
  /// enough to keep SIGSTOP detection under 1 s.
  std::chrono::nanoseconds probe_timeout = std::chrono::milliseconds(400);
  /// A cleared peer whose heartbeats have not returned is probed again this often.
  std::chrono::nanoseconds reprobe_every = std::chrono::milliseconds(250);
};

/// A suspicion that ended with the peer answering (or heartbeating again).
struct suspicion_record {
  std::uint64_t peer = 0;
  std::chrono::steady_clock::time_point at;       ///< when the detector suspected it
  double cleared_after_ms = 0;                    ///< at -> first answer / heartbeat
  std::string cleared_by;                         ///< "direct", "indirect" or "heartbeat"
  int rounds = 0;                                 ///< probe rounds while suspected
};

class suspicion_table {
public:
  using time_point = std::chrono::steady_clock::time_point;

  enum class verdict {
    pending,   ///< more answers of this round are outstanding
    cleared,   ///< the peer answered: no restart (first answer of a round only)
    dead,      ///< every probe of the round failed: restart the peer's work
    stale      ///< not the peer's current round, or no suspicion: ignore
  };

  explicit suspicion_table(suspicion_config cfg = {}) : cfg_(cfg) {}

  /// The detector suspects `peer`. Returns true when a probe round should
  /// start now (false: already suspected, or already declared dead).
  bool suspect(std::uint64_t peer, time_point now);

  /// Starts a probe round of `probes` probes (>= 1) for a suspected peer;
  /// returns its id (0 when the peer is not suspected).
  std::uint64_t start_round(std::uint64_t peer, int probes);

  /// One probe of round `round` answered (ok) or failed (timeout, error).
  /// `how` names the probe ("direct", "indirect") for the record.
  verdict answer(std::uint64_t peer, std::uint64_t round, bool ok, time_point now,
                 const std::string& how);

  /// The peer's heartbeats are back: the suspicion ends (recorded as cleared
  /// if no probe cleared it before). No effect on a peer declared dead.
  void alive(std::uint64_t peer, time_point now);

  /// Forget a peer declared dead (e.g. its work moved and it may rejoin).
  void forget(std::uint64_t peer) { peers_.erase(peer); }

  bool suspected(std::uint64_t peer) const;
  bool dead(std::uint64_t peer) const;
  /// Suspected and cleared by a probe, heartbeats still missing: re-probe.
  bool needs_reprobe(std::uint64_t peer) const;

  /// Every suspicion that was cleared, in the order they were cleared.
  const std::vector<suspicion_record>& cleared() const { return cleared_; }
  const suspicion_config& config() const { return cfg_; }

private:
  enum class phase { probing, cleared, dead };
  struct entry {
    phase ph = phase::probing;
    time_point at;
    std::uint64_t round = 0;
    int outstanding = 0;
    bool round_done = false;
    bool recorded = false;  // pushed to cleared_
    int rounds = 0;
  };
  suspicion_config cfg_;
  std::map<std::uint64_t, entry> peers_;
  std::vector<suspicion_record> cleared_;
  std::uint64_t next_round_ = 1;
};

}  // namespace cellshard::supervision
