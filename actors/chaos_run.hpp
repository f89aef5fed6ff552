// actors/chaos_run.hpp: the bookkeeping of one `cellshard chaos` run over
// node daemons, apart from the command line: which external faults
// (actors/chaos_plan.hpp: kill and stop of the daemon hosting a placement
// index) are due when a token is delivered, which of the runtime's fault
// records answers each signal sent, how a run's ids compare with the
// reference, and which daemons a next run needs replaced.
//
// The matching rule (match_external_records): the record of a signal is the
// first record, in the runtime's order, about the signalled daemon (record
// node == daemon) that was decided at or after the signal (decided_ns >=
// fired_ns, both steady-clock ns, CLOCK_MONOTONIC, comparable across
// processes) and is not an injected fault's (fired_ns == 0: the runtime did
// not fire it itself); each record answers at most one signal, signals
// are matched in their order.
//
// Pure functions on values (fire_due calls the caller's `send`). Thread
// safety: none needed; fire_due is called under the caller's lock.
#pragma once

#include "actors/chaos_plan.hpp"
#include "actors/recovery.hpp"
#include "model/result.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace cellshard::actors {

/// What happened to one external fault in a run.
struct fired_external {
  external_fault f;
  int daemon = -1;       // the daemon signalled (-1: none)
  int64_t fired_ns = 0;  // steady-clock ns of the signal (0: not sent)
  std::string note;      // why not sent, when not
};

/// Sends the signal of an external fault to a daemon: `kill` true for
/// SIGKILL, false for SIGSTOP; returns the steady-clock ns it was sent at.
using external_sender = std::function<result<int64_t>(int daemon, bool kill)>;

/// A stopped daemon to SIGCONT at `at_ns` (steady-clock ns).
struct thaw_at {
  int daemon = -1;
  int64_t at_ns = 0;
};

/// When the `delivered`-th token is delivered: sends every fault of `ext`
/// due then (f.at == delivered, not sent yet) to the daemon hosting its
/// placement index now (`nodes[f.index]`, the cluster's current nodes);
/// records daemon and fired_ns, or the note of why not (no such index; the
/// sender's error message). Returns the thaws that stops with ms > 0 need.
std::vector<thaw_at> fire_due(std::vector<fired_external>& ext, int delivered, const std::vector<int>& nodes,
                              const external_sender& send);

/// Per signal of `ext`, the index in `records` of its record (the rule
/// above), or -1 (not sent, or nothing recorded).
std::vector<int> match_external_records(const std::vector<fired_external>& ext,
                                        const std::vector<fault_record>& records);

/// chaos --json's entry for a signal: kind, node (placement index), step,
/// daemon, detect_ms (signal -> decision), recover_ms (decision -> next
/// token, or the record's recover_ms), replayed_positions, and record /
/// moved_to_node when matched; -1 and a note when not sent.
nlohmann::json external_json(const fired_external& e, const fault_record* record);
/// detect_ms of a matched signal: (decided_ns - fired_ns) / 1e6.
double external_detect_ms(const fired_external& e, const fault_record& record);
/// recover_ms of a matched signal: (recovered_ns - decided_ns) / 1e6, or the
/// record's recover_ms when it has no recovered_ns.
double external_recover_ms(const fault_record& record);

/// The first position where `got` differs from `want` (the shorter's length
/// when one is a prefix of the other; want.size() when equal).
size_t first_difference(const std::vector<int>& want, const std::vector<int>& got);

/// The daemons (0 .. n_daemons-1) to replace before the next run: every one
/// when `teardown_all` (a hung run), else the dead ones (`alive(i)` false)
/// and every one a signal of `ext` was sent to. Ascending.
std::vector<int> daemons_to_replace(int n_daemons, const std::function<bool(int)>& alive,
                                    const std::vector<fired_external>& ext, bool teardown_all);

}  // namespace cellshard::actors
