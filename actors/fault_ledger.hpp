// actors/fault_ledger.hpp: the runtime's record of what every fault did, end
// to end -- when it fired, when the runtime decided to restart or move the
// shard, when the next token came after the recovery (issue #15: fault
// bookkeeping out of the coordinator, as plain data with its own tests).
//
// Three kinds of event arrive, in any order, from different actors:
//   fired()     a shard reports that an injected fault fired (fault_report);
//   decided()   a shard factory or the coordinator decides a restart or move;
//   recovered() a session delivers the next token after that recovery.
// The ledger pairs them into one fault_record per failure: a decision that
// finds an undecided injected record of a restarting kind completes it; a
// report that finds a decision made before it (a crash's down_msg can
// overtake its report) completes that one; a second decision for the same
// shard within 10 s of an unrecovered one (the coordinator suspected the
// node, then the supervisor restarted the shard) is the same failure. A
// `slow` plan fires at every step it covers and gets one record.
//
// Thread safety: none; the owner serialises calls (the coordinator actor
// of actors/recovery.cpp owns it). No CAF: unit-tested alone
// (tests/actors/test_fault_ledger.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cellshard::actors {

/// What one fault did, end to end (CLI.md `faults` of `run --json`).
///
/// Injected faults (--fault) are reported by the shard when they fire, so
/// detect_ms is known. A failure the runtime only observes -- a node daemon
/// killed or its connection lost ("node-down": the shard's proxy went down),
/// a daemon frozen ("node-silent": its heartbeats stopped, phi accrual), a
/// daemon stopped on purpose ("node-stopped": SIGTERM, its shards ended
/// with user_shutdown), any other exit of a shard ("exit") --
/// gets a record at the decision with fired_ns = 0 and detect_ms = -1: only
/// whoever caused it knows when it happened, and can compute
/// decided_ns - (its own steady_clock time of the kill). The *_ns fields are
/// std::chrono::steady_clock::now().time_since_epoch() in ns, which is
/// CLOCK_MONOTONIC on Linux, so they compare across processes of one host.
struct fault_record {
  std::string kind;          // a fault_kind name, or node-down / node-silent / node-stopped / exit
  int index = -1;            // placement index
  int node = -1;
  int64_t step = 0;          // position at which it fired (external: the session's position when detected, or -1)
  double detect_ms = -1;     // fault fired -> supervisor decision (-1: not detected, or not known)
  double recover_ms = -1;    // decision -> next token delivered (-1: not recovered)
  int replayed_positions = 0;
  int moved_to_node = -1;    // where the shard runs after recovery
  int64_t fired_ns = 0;      // when it fired (0: unknown, external)
  int64_t decided_ns = 0;    // when the runtime decided to restart or move the shard (0: not yet)
  int64_t recovered_ns = 0;  // when the next token was delivered after the recovery (0: not yet)
  /// Of recover_ms, the time the new node took to get and load the slice
  /// (issue #17: shipped, from its cache or its files; remote hosts only,
  /// filled by the run report from cluster::weight_loads(); -1: unknown).
  double reload_ms = -1;
};

class fault_ledger {
public:
  /// Fault kinds whose effect is a restart decision: crash, silence,
  /// partition. The others (slow, drop, corrupt, ...) are recovered
  /// without one.
  static bool restarts_shard(const std::string& kind);

  /// An injected fault fired on placement index `index` (node `node`) at
  /// position `step`, at `at_ns`.
  void fired(const std::string& kind, int index, int node, int64_t step, int64_t at_ns);

  /// The runtime decided to restart or move placement index `index`, which
  /// ran on `node`, at `at_ns`; `observed_kind` names the failure when no
  /// injected fault explains it (node-down, node-silent, node-stopped, exit).
  void decided(int index, int node, const std::string& observed_kind, int64_t at_ns);

  /// The session delivered the next token after recovering `index` at
  /// `at_ns`, having replayed `replayed` positions; the shard runs on `node_now`.
  void recovered(int index, int replayed, int64_t at_ns, int node_now);

  /// Every record so far, in the order the failures were first seen.
  const std::vector<fault_record>& records() const { return records_; }

private:
  std::vector<fault_record> records_;
};

}  // namespace cellshard::actors
