// topologies/plan_sim.hpp: the at-scale discrete-event simulation of `cellshard
// plan --simulate` (issue #10 "At scale"): requests arriving, their tokens
// flowing through the stations of a plan's layout (pipeline stages, TP
// groups with their expert step, vocabulary pools), every used node failing
// at random, detection and recovery stalling its station.
//
// Model (the closed form of planner.hpp, made dynamic):
// - Stations in chain order; station s serves up to `micro_batch` waiting
//   sequences at once in W_s(n) seconds (planner chain_cost's station work
//   for n sequences); between stations a batch of n travels for H_s(n) (the
//   hop: latency + transfer + overhead); after the last station the return
//   hop brings the token to the session, which sends the next one.
// - Requests: a closed loop of `batch` sessions, each running requests of
//   request_tokens one after another (arrival_rate 0), or Poisson arrivals at
//   arrival_rate per second admitted while fewer than `batch` are active
//   (others wait; their wait counts in the request latency).
// - Failures: every used node fails after an exponential time of rate
//   failures_per_year / 8766 h (x failure_scale); the superposition over U
//   nodes is a Poisson process of rate U x lambda, each event a uniformly
//   chosen node. Its station stops for detect + recover + reload (the
//   node's weights over its link) + replay (uniform 0..checkpoint_every
//   positions x W_s(1)); a batch in service there is served again after the
//   repair. A spare takes the failed node's place (counted; when spares run
//   out, recovery goes on at the same cost and the result says when).
// Per-node state is a role table (station of each node), so 100,000 nodes
// cost O(1) per failure; events are O(tokens / micro_batch x stations).
//
// Deterministic for a seed (std::mt19937_64). No wall clock is read: the
// caller times the run if it wants to. Errors: result values.
#pragma once

#include "model/result.hpp"
#include "topologies/planner.hpp"

#include <cstdint>
#include <vector>

namespace cellshard::topologies {

struct sim_options {
  double duration_s = 3600;     // simulated time
  double arrival_rate = 0;      // requests per second; 0 = closed loop of `batch` sessions
  double failure_scale = 1;     // multiplies every node's failure rate (0 = none)
  uint64_t seed = 1;
  uint64_t max_events = 400000000;  // a safety bound; the result says when it stopped early
  size_t max_samples = 4000000;     // token latencies kept for the percentiles
};

struct sim_result {
  int nodes = 0;              // nodes simulated (used + spare)
  int used_nodes = 0;
  int stations = 0;
  double simulated_s = 0;
  uint64_t events = 0;
  bool stopped_early = false;
  uint64_t tokens = 0;        // tokens delivered
  uint64_t requests_done = 0;
  double tokens_per_s = 0;    // delivered per simulated second (goodput: recovery is exact)
  double token_latency_p50_s = 0;  // time between two tokens of one sequence
  double token_latency_p90_s = 0;
  double token_latency_p99_s = 0;
  double token_latency_max_s = 0;
  double request_latency_p50_s = 0;  // arrival to last token
  double request_latency_p99_s = 0;
  uint64_t failures = 0;
  double downtime_s = 0;             // summed over failures (station-seconds down)
  uint64_t requests_hit = 0;         // requests during which some failure happened
  double request_failure_fraction = 0;  // requests_hit / requests_done
  int spares_left = 0;
  double spares_exhausted_at_s = -1;    // -1: never
};

/// Runs the simulation of `p`'s layout. Errors: a plan with no stations or
/// no throughput (e.g. unknown hardware rates).
result<sim_result> simulate(const plan_result& p, const sim_options& o);

}  // namespace cellshard::topologies
