// The run report (actors/run_report.hpp) on hand-made values: per-node sums
// and roles, links matched with their measurements, the communication share,
// the percentiles, the JSON keys of CLI.md "run --json" and the stderr summary.
// No actor system, no clock.
#include "actors/run_report.hpp"

#include <catch2/catch.hpp>

using namespace cellshard;
using actors::cluster;

namespace {

topologies::shard make_shard(int index, int node, int stage, int rank, int group) {
  topologies::shard s;
  s.index = index;
  s.node = node;
  s.stage = stage;
  s.rank = rank;
  s.group_size = group;
  return s;
}

actors::shard_stats make_stats(int index, int node, int64_t compute_ns, uint64_t sent, uint64_t received) {
  actors::shard_stats s;
  s.index = index;
  s.node = node;
  s.compute_ns = compute_ns;
  s.bytes_sent = sent;
  s.bytes_received = received;
  return s;
}

// Hybrid 1 stage x 2 ranks, then a stage on node 0 again (re-placed there),
// spares on nodes 3 and 4; node 4's spare took over nothing.
topologies::placement plan_of_three() {
  topologies::placement p;
  p.shards = {make_shard(0, 0, 0, 0, 2), make_shard(1, 1, 0, 1, 2), make_shard(2, 0, 1, 0, 1)};
  topologies::spare_node a, b;
  a.index = 3;
  a.node = 3;
  b.index = 4;
  b.node = 4;
  p.spares = {a, b};
  return p;
}

}  // namespace

TEST_CASE("comm share: 1 - compute / duration, clamped, 0 without a duration", "[run_report]") {
  CHECK(actors::comm_share(30.0, 120.0) == Approx(0.75));
  CHECK(actors::comm_share(120.0, 120.0) == 0);
  CHECK(actors::comm_share(150.0, 120.0) == 0);  // kernel time summed over a group can exceed the wall time
  CHECK(actors::comm_share(-5.0, 10.0) == 1);
  CHECK(actors::comm_share(5.0, 0.0) == 0);
  actors::session_outcome out;
  out.compute_ms = 10;
  out.result.duration_ms = 40;
  CHECK(actors::comm_share(out) == Approx(0.75));
}

TEST_CASE("decode tokens/s: tokens after the first over the common decode window", "[run_report]") {
  // One session: run.c's achieved tok/s, (tokens - 1) / (last - first).
  CHECK(actors::decode_tokens_per_s({{1.0, 1.1, 1.2, 1.3}}) == Approx(10.0));
  // Two interleaved sessions at 5 tokens/s each: the window [0.1, 0.8]
  // holds 3.5 tokens of each (interpolated), 10 tokens/s together, where
  // the span from the first token to the last would give 8 / 0.9.
  CHECK(actors::decode_tokens_per_s({{0.0, 0.2, 0.4, 0.6, 0.8}, {0.1, 0.3, 0.5, 0.7, 0.9}}) == Approx(10.0));
  // A stall before a session's first token is outside the window.
  CHECK(actors::decode_tokens_per_s({{0.0, 0.1, 0.2, 0.3, 0.4}, {0.35, 0.45, 0.55}}) == Approx(20.0));
  // Sessions that never overlap: all their tokens after the firsts over
  // [earliest first, latest last].
  CHECK(actors::decode_tokens_per_s({{0.0, 0.5, 1.0}, {2.0, 2.5, 3.0}}) == Approx(4.0 / 3.0));
  // A session with one token has no decode: left out; none left: 0.
  CHECK(actors::decode_tokens_per_s({{5.0}, {0.0, 0.5, 1.0}}) == Approx(2.0));
  CHECK(actors::decode_tokens_per_s({{5.0}, {}}) == 0);
  CHECK(actors::decode_tokens_per_s({}) == 0);
}

TEST_CASE("decode comm share: 1 - decode kernel time / decode window, the mean over sessions", "[run_report]") {
  // 4 ms of kernels in 20 ms (0.8), 10 ms in 40 ms (0.75); the third session has no decode.
  CHECK(actors::decode_comm_share({4.0, 10.0, 1.0}, {{0.0, 0.01, 0.02}, {0.0, 0.02, 0.04}, {0.5}}) == Approx(0.775));
  CHECK(actors::decode_comm_share({50.0}, {{0.0, 0.02}}) == 0);  // clamped as comm_share
  CHECK(actors::decode_comm_share({}, {}) == 0);
}

TEST_CASE("nodes: the shards of a node summed, roles joined, idle spares listed", "[run_report]") {
  const auto plan = plan_of_three();
  // Node 3's spare hosts shard 1 now (moved there after a fault).
  std::vector<actors::shard_stats> st = {make_stats(2, 0, 2'500'000, 100, 10), make_stats(0, 0, 1'000'000, 7, 3),
                                         make_stats(1, 3, 4'000'000, 50, 60),
                                         make_stats(9, 2, 1, 1, 1)};  // no such index: ignored
  const std::vector<uint64_t> mem = {4096, 0, 0, 2048};                 // node 4 beyond: 0
  const auto nodes = actors::aggregate_nodes(plan, st, mem);
  REQUIRE(nodes.size() == 3);
  CHECK(nodes[0].index == 0);
  CHECK(nodes[0].role == "stage 1, stage 0 rank 0");  // in stats order
  CHECK(nodes[0].compute_ms == Approx(3.5));
  CHECK(nodes[0].bytes_sent == 107);
  CHECK(nodes[0].bytes_received == 13);
  CHECK(nodes[0].memory_bytes == 4096);
  CHECK(nodes[1].index == 3);
  CHECK(nodes[1].role == "stage 0 rank 1");
  CHECK(nodes[1].compute_ms == Approx(4.0));
  CHECK(nodes[1].memory_bytes == 2048);
  CHECK(nodes[2].index == 4);
  CHECK(nodes[2].role == "spare");
  CHECK(nodes[2].compute_ms == 0);
  CHECK(nodes[2].memory_bytes == 0);
}

TEST_CASE("links: bytes per token, measurements matched by (from, to)", "[run_report]") {
  auto a = make_stats(0, 0, 0, 0, 0);
  a.link_to = {1, -1};
  a.link_bytes = {9000, 30};
  auto b = make_stats(1, 1, 0, 0, 0);
  b.link_to = {0};
  b.link_bytes = {4500};
  cluster::link_measurement m;
  m.from = 0;
  m.to = 1;
  m.target_bps = 1e9;
  m.measured_bps = 0.95e9;
  m.target_latency_us = 100;
  m.measured_latency_us = 104;
  const auto links = actors::link_reports({a, b}, {m}, 9);
  REQUIRE(links.size() == 3);
  CHECK(links[0].from == 0);
  CHECK(links[0].to == 1);
  CHECK(links[0].bytes == 9000);
  CHECK(links[0].bytes_per_token == Approx(1000));
  REQUIRE(links[0].measured);
  CHECK(links[0].measured->measured_bps == 0.95e9);
  CHECK(links[1].to == -1);
  CHECK_FALSE(links[1].measured);
  CHECK(links[2].from == 1);
  CHECK(links[2].to == 0);
  CHECK_FALSE(links[2].measured);  // 1 -> 0 was not measured
  CHECK(actors::link_reports({a}, {}, 0)[0].bytes_per_token == Approx(9000));  // no token: per 1
}

TEST_CASE("link warning past 10% of the target only", "[run_report]") {
  cluster::link_measurement m;
  m.from = 2;
  m.to = 3;
  m.target_bps = 100e6;
  m.measured_bps = 95e6;
  m.target_latency_us = 2000;
  m.measured_latency_us = 2150;
  CHECK(actors::link_warning(m).empty());  // 5% and 7.5%
  m.measured_latency_us = 2340;            // 17%
  CHECK(actors::link_warning(m) ==
        "link 2 -> 3 measured 95.0 Mbit/s and 2340 us, target 100.0 Mbit/s and 2000 us (off by more than 10%)");
  m.measured_latency_us = 2000;
  m.measured_bps = 80e6;
  CHECK_FALSE(actors::link_warning(m).empty());
}

TEST_CASE("run --json of a report: CLI.md keys and values", "[run_report]") {
  actors::run_report r;
  r.model = "stories260K";
  r.kernels = "reference";
  r.weights = "f32";
  r.matmul = "exact";
  r.result.ids = {1, 400, 401, 402, 403};
  r.result.ttft_ms = 2.0;
  r.result.step_ms = {1.0, 2.0, 3.0, 4.0};  // p50 2.5, p99 3.97 (interpolated, base/percentile.hpp)
  r.result.tokens_per_s = 300;
  r.result.duration_ms = 12;
  r.comm_share = 0.25;
  r.nodes = actors::aggregate_nodes(plan_of_three(), {make_stats(0, 0, 1'000'000, 1, 2)}, {100});
  actors::fault_record f;
  f.kind = "crash";
  f.index = 2;
  f.node = 0;
  f.step = 3;
  f.detect_ms = 0.5;
  f.recover_ms = 1.5;
  f.replayed_positions = 3;
  f.moved_to_node = 3;
  f.fired_ns = 10;
  f.decided_ns = 20;
  f.recovered_ns = 30;
  r.faults = {f};
  r.suspicions = {{1, 99, 12.5, "direct"}};
  r.diverged = false;
  CHECK(r.tokens() == 4);
  CHECK(r.tpot_p50() == Approx(2.5));
  CHECK(r.tpot_p99() == Approx(3.97));

  const auto j = actors::to_json(r);
  CHECK(j["ok"] == true);
  CHECK(j["model"] == "stories260K");
  CHECK(j["kernels"] == "reference");
  CHECK(j["weights"] == "f32");
  CHECK(j["matmul"] == "exact");
  CHECK(j["ttft_ms"].get<double>() == 2.0);
  CHECK(j["tpot_ms_p50"].get<double>() == Approx(2.5));
  CHECK(j["tpot_ms_p99"].get<double>() == Approx(3.97));
  CHECK(j["tokens_per_s"].get<double>() == 300);
  CHECK(j["comm_share"].get<double>() == 0.25);
  CHECK(j["tokens"] == 4);
  CHECK(j["duration_ms"].get<double>() == 12);
  CHECK(j["ids"] == nlohmann::json({1, 400, 401, 402, 403}));
  CHECK(j["token_times_ms"] == nlohmann::json({2.0, 3.0, 5.0, 8.0, 12.0}));
  CHECK(j["diverged"] == false);
  REQUIRE(j["nodes"].size() == 3);
  CHECK(j["nodes"][0] == nlohmann::json({{"index", 0}, {"role", "stage 0 rank 0"}, {"memory_bytes", 100},
                                         {"compute_ms", 1.0}, {"bytes_sent", 1}, {"bytes_received", 2},
                                         {"shipped_bytes", 0}, {"cache_hits", 0}}));  // issue #17
  CHECK(j["nodes"][1]["role"] == "spare");
  CHECK(j["links"].empty());
  REQUIRE(j["faults"].size() == 1);
  CHECK(j["faults"][0] == nlohmann::json({{"kind", "crash"}, {"node", 2}, {"step", 3}, {"detect_ms", 0.5},
                                          {"recover_ms", 1.5}, {"reload_ms", -1.0}, {"replayed_positions", 3}, {"host_node", 0},
                                          {"moved_to_node", 3}, {"fired_ns", 10}, {"decided_ns", 20},
                                          {"recovered_ns", 30}}));
  CHECK(j["suspicions"][0] ==
        nlohmann::json({{"node", 1}, {"at", 99}, {"cleared_after_ms", 12.5}, {"cleared_by", "direct"}}));

  // A link: "front end" for -1, null for figures not measured.
  actors::link_figures l;
  l.from = 1;
  l.to = -1;
  l.bytes = 40;
  l.bytes_per_token = 10;
  r.links = {l};
  const auto jl = actors::to_json(r)["links"][0];
  CHECK(jl["to"] == "front end");
  CHECK(jl["bandwidth_bps"].is_null());
  CHECK(jl["target_latency_us"].is_null());
  CHECK(jl["bytes"] == 40);

  CHECK(actors::summary_line(r) ==
        "ttft 2.00 ms, tpot p50 2.500 ms p99 3.970 ms, 300.0 tok/s, comm share 0.25; memory per node "
        "{0: 0 KiB, 3: 0 KiB, 4: 0 KiB}; 1 fault(s)");
  r.batch_aggregate = true;
  CHECK(actors::summary_line(r).find("300.0 tok/s (aggregate of the batch)") != std::string::npos);
}

TEST_CASE("run --json of a failed run: the error, the partial ids and the faults only", "[run_report]") {
  actors::run_report r;
  r.ok = false;
  r.error = "no spare left for placement index 1";
  r.result.ids = {1, 5, 6};
  r.result.duration_ms = 7;
  r.model = "ignored on failure";
  const auto j = actors::to_json(r);
  CHECK(j["ok"] == false);
  CHECK(j["error"] == "no spare left for placement index 1");
  CHECK(j["tokens"] == 2);
  CHECK(j["ids"] == nlohmann::json({1, 5, 6}));
  CHECK(j["duration_ms"].get<double>() == 7);
  CHECK(j["faults"].is_array());
  CHECK(j["suspicions"].is_array());
  CHECK_FALSE(j.contains("nodes"));
  CHECK_FALSE(j.contains("model"));
}
