// actors/chaos_plan.hpp: the random fault plans of `cellshard chaos`, drawn
// from a seed so that a run can be redrawn exactly (same seed, same
// std::mt19937_64 stream, same libstdc++ distributions).
//
// A drawn fault is either a supervision::fault_plan injected inside a shard
// (crash, silence, slow, drop, delay, corrupt, partition) or an external
// fault sent from outside to the node daemon hosting a placement index
// (chaos --processes only):
//   kill:node=I:step=K        SIGKILL when the K-th token is delivered
//   stop:node=I:step=K[:ms=D] SIGSTOP then, SIGCONT D ms later (no D: after the run)
//
// The ranges drawn (uniform, inclusive), for `shards` shards and a reference
// run of `positions` positions:
//   node/index  0 .. shards-1 (a working shard, never a spare)
//   step        injected 0 .. max(0, positions-2); external 1 .. max(1, positions-2)
//               (a position the fault-free run reached, so the fault can fire)
//   silence     ms 100..2000 half of the time (else silent until restarted)
//   slow        ms 1..10 per step, for 1..20 steps
//   drop        1..2 messages;  corrupt 1..2 messages
//   delay       ms 1..50, for 1..3 messages
//   partition   ms 50..1500
//   stop        ms 100..2000 half of the time (else 0: until the run ends)
// draw_run_plan draws `faults` of them for one run; from the second on, one
// time in four a fault is moved to the step of the previous fault of its sort
// (injected or external), so that overlapping failures (two shards of one
// group at once, a fault during another's recovery) are drawn too.
//
// Pure (the generator is the caller's). Errors: check_kinds names the kind
// and what was expected.
#pragma once

#include "model/result.hpp"
#include "supervision/fault_plan.hpp"

#include <random>
#include <string>
#include <vector>

namespace cellshard::actors {

/// A fault sent from outside a daemon process.
struct external_fault {
  std::string kind;  // "kill" (SIGKILL) | "stop" (SIGSTOP, then SIGCONT)
  int index = 0;     // placement index whose daemon (at the time) is signalled
  int at = 1;        // when the at-th token is delivered
  int ms = 0;        // stop: SIGCONT after ms (0: after the run)
};
/// "kill:node=1:step=5", "stop:node=0:step=3:ms=250".
std::string to_string(const external_fault& f);

/// One drawn fault: an injected plan or an external signal.
struct drawn_fault {
  bool external = false;
  supervision::fault_plan plan;  // when !external
  external_fault ext;            // when external
  std::string text() const;      // the plan's spec (supervision::to_string) or to_string(ext)
};

/// The faults of one run: plans to inject, signals to send, and each fault's
/// text in drawing order.
struct run_plan {
  std::vector<supervision::fault_plan> injected;
  std::vector<external_fault> external;
  std::vector<std::string> texts;
};

/// Every kind chaos draws from by default: the injected kinds in
/// supervision::fault_kind order, then kill and stop when `processes`.
std::vector<std::string> default_fault_kinds(bool processes);
/// Every kind is an injected kind, or kill/stop with `processes`; else an
/// error naming the kind ("--kinds X: ...").
result<void> check_fault_kinds(const std::vector<std::string>& kinds, bool processes);

/// One fault of a kind in `kinds` (non-empty, checked), ranges above.
drawn_fault draw_fault(std::mt19937_64& rng, const std::vector<std::string>& kinds, int shards, int positions);
/// `faults` faults for one run, with the coincidence rule above.
run_plan draw_run_plan(std::mt19937_64& rng, const std::vector<std::string>& kinds, int shards, int positions,
                       int faults);

}  // namespace cellshard::actors
