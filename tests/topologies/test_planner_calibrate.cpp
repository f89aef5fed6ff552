// Calibration of the planner (topologies/plan_calibrate.hpp): the sweep CSV
// reader, recovery of known constants from a synthetic sweep, and the fit to
// the sweep measured here (docs/planner-sweep-stories260k.csv), and held-out
// validation (issue #25).
#include "topologies/plan_calibrate.hpp"

#include "tests/support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

using namespace cellshard;
using namespace cellshard::topologies;

namespace {

// An in-process host: 20 GB/s, 2 cores, unshaped links (what the sweep's
// in-process runs see).
plan_request host_base() {
  plan_request r;
  r.hw = *find_hardware_preset("host");
  r.hw.node.mem_bandwidth_gbs = 20.0;
  r.hw.parallel_nodes = 2;
  r.hw.node.memory_bytes = 1ull << 34;
  r.context = 64;
  return r;
}

const char* header =
    "model,topology,nodes,stages,tp,link,batch,ttft_ms,tpot_ms_p50,tpot_ms_p99,tokens_per_s,comm_share,"
    "bytes_per_token\n";

/// Rows: pipeline 1..5 and tensor 1..4 on `model_name` (stories260K by
/// default), in process (link none: no serialisation) and over shaped links
/// (where bytes are serialised), at batch 1, and in process at batch 4 too
/// (9 rows last); their "measured" TPOT, tokens/s and comm share are the
/// planner's own prediction under `truth`, with one sequence per station
/// step as the runtime does. `points`: the rows (36). `lab`: the lab's grid
/// instead (shaped links only, 1, 2, 4 nodes, batch 1 and 8: 24 rows).
std::string synthetic_sweep(const plan_request& base, const plan_assumptions& truth, int& points,
                            const char* model_name = "stories260k", bool lab = false) {
  std::string csv = header;
  auto model = find_model_preset(model_name);
  REQUIRE(model);
  points = 0;
  for (int batch : {1, lab ? 8 : 4}) {
    for (const char* link : {"none", "1gbit:100us", "100mbit:1ms"}) {
      if (lab && std::string(link) == "none") continue;
      if (!lab && batch > 1 && std::string(link) != "none") continue;
      for (const char* topo : {"pipeline", "tensor"}) {
        const int most = std::string(topo) == "pipeline" ? 5 : 4;
        for (int n = 1; n <= most; ++n) {
          if (lab && n != 1 && n != 2 && n != 4) continue;
          plan_request r = base;
          r.model = *model;
          r.nodes = n;
          r.batch = batch;
          r.topology = *parse_plan_topology(topo);
          r.assume = truth;
          r.assume.one_sequence_per_step = true;
          if (std::string(link) != "none") r.hw.node.link = *parse_link(link);
          auto p = plan(r);
          REQUIRE(p);
          char line[256];
          std::snprintf(line, sizeof line, "%s,%s,%d,0,0,%s,%d,0,%.17g,0,%.17g,%.17g,0\n", model_name, topo, n, link,
                        batch, p->per_token_latency_s * 1000, p->tokens_per_s, predicted_comm_share(*p));
          csv += line;
          ++points;
        }
      }
    }
  }
  return csv;
}

plan_assumptions synthetic_truth(const plan_request& base) {
  plan_assumptions truth = base.assume;
  truth.compute_efficiency = 0.55;
  truth.message_overhead_s = 4e-6;
  truth.sync_overhead_s = 2.5e-6;
  truth.sync_message_overhead_s = 1.5e-6;
  truth.byte_overhead_s = 2e-10;
  truth.transfer_excess = 0.3;
  truth.message_cpu_s = 3e-6;
  truth.sync_message_cpu_s = 2e-6;
  truth.batch_compute_efficiency = 0.45;
  truth.sync_cpu_s = 1e-6;
  return truth;
}

}  // namespace

TEST_CASE("sweep CSV: header-named columns, errors by line and column", "[planner][calibrate]") {
  const std::string text = std::string(header) +
                           "# comment\n"
                           "stories260K.bin,pipeline,4,4,1,unlimited,1,0.6,0.08,0.2,12000,0.2,2800\n"
                           "stories260k,tensor,2,1,2,1gbit:100us,2,0.7,0.09,0.3,11000,0.6,3100\n";
  auto rows = parse_sweep_csv(text, "s.csv");
  REQUIRE(rows);
  REQUIRE(rows->size() == 2);
  CHECK((*rows)[0].model == "stories260K.bin");
  CHECK((*rows)[0].nodes == 4);
  CHECK((*rows)[0].tpot_ms_p50 == 0.08);
  CHECK((*rows)[1].link == "1gbit:100us");
  CHECK((*rows)[1].batch == 2);
  CHECK((*rows)[1].line == 4);

  auto bad = parse_sweep_csv(std::string(header) + "m,pipeline,x,1,1,,1,0,0.1,0,0,0,0\n", "s.csv");
  REQUIRE_FALSE(bad);
  CHECK(bad.message() == "s.csv line 2: column 'nodes': 'x' is not a number");
  auto no_col = parse_sweep_csv("model,topology,nodes\n", "s.csv");
  REQUIRE_FALSE(no_col);
  CHECK(no_col.message().find("tpot_ms_p50") != std::string::npos);

  // Without the decode columns they are -1 (not measured).
  CHECK((*rows)[0].decode_tokens_per_s == -1);
  CHECK((*rows)[0].decode_comm_share == -1);
  // With them (sweep since issue #25), the validation compares with them.
  auto dec = parse_sweep_csv(std::string("model,topology,nodes,batch,tpot_ms_p50,tokens_per_s,comm_share,"
                                         "decode_tokens_per_s,decode_comm_share\n"
                                         "stories260k,pipeline,1,1,0.08,3.5,0.9,12500,0.25\n"
                                         "stories260k,pipeline,2,1,0.07,3.6,0.9,,\n"
                                         "stories260k,pipeline,3,1,0.06,3.7,0.9,16000,0.4\n"),
                             "d.csv");
  REQUIRE(dec);
  CHECK((*dec)[0].tokens_per_s == 3.5);
  CHECK((*dec)[0].decode_tokens_per_s == 12500);
  CHECK((*dec)[0].decode_comm_share == 0.25);
  CHECK((*dec)[1].decode_tokens_per_s == -1);  // empty cells: not measured
  auto v = validate(*dec, host_base(), preset_resolver(nullptr), *parse_holdout("last:1"));
  REQUIRE(v);
  REQUIRE(v->held_out.size() == 1u);
  CHECK(v->held_out[0].measured_tokens_per_s == 16000);
  CHECK(v->held_out[0].measured_comm_share == 0.4);
  CHECK(v->held_out[0].tokens_per_s_error ==
        Approx((v->held_out[0].predicted_tokens_per_s - 16000) / 16000));
  // A row without them falls back to tokens_per_s and comm_share.
  auto fit = calibrate(*dec, host_base(), preset_resolver(nullptr));
  REQUIRE(fit);
  CHECK(fit->points[1].measured_tokens_per_s == 3.6);
  CHECK(fit->points[1].measured_comm_share == 0.9);

  // TPOT: the decode's mean time between a sequence's tokens when the row
  // lets it be known (batch x 1000 / decode tokens/s), else the p50.
  CHECK(measured_tpot_ms((*dec)[0]) == Approx(1000.0 / 12500));
  CHECK(measured_tpot_ms((*dec)[1]) == 0.07);
  CHECK(fit->points[0].measured_tpot_ms == Approx(0.08));  // 1000 / 12500
  CHECK(fit->points[0].measured_tpot_p50_ms == 0.08);
  CHECK(fit->points[2].measured_tpot_ms == Approx(0.0625));  // 1000 / 16000, not the p50 0.06
  CHECK(fit->points[2].measured_tpot_p50_ms == 0.06);
  CHECK(fit->points[2].p50_error == Approx((fit->points[2].predicted_tpot_ms - 0.06) / 0.06));
  auto b8 = parse_sweep_csv(std::string("model,topology,nodes,batch,tpot_ms_p50,decode_tokens_per_s,decode_tpot_ms\n"
                                        "m,pipeline,1,8,30,200,\n"
                                        "m,pipeline,1,8,30,200,41.5\n"),
                            "b.csv");
  REQUIRE(b8);
  CHECK(measured_tpot_ms((*b8)[0]) == Approx(40.0));  // 8 sessions share 200 tokens/s: 25 each
  CHECK(measured_tpot_ms((*b8)[1]) == 41.5);          // the column, when given

  // The resolver maps file names to presets.
  auto res = preset_resolver(nullptr);
  CHECK(res("../models/stories260K.bin")->name == "stories260k");
  CHECK(res("synth stories110m")->name == "stories110m");
  CHECK_FALSE(res("mystery"));
}


TEST_CASE("held-out validation: a deterministic split, predictions of rows the fit never saw", "[planner][calibrate]") {
  const plan_request base = host_base();
  const plan_assumptions truth = synthetic_truth(base);
  int points = 0;
  auto rows = parse_sweep_csv(synthetic_sweep(base, truth, points), "synthetic.csv");
  REQUIRE(rows);

  auto every = parse_holdout("every:4");
  REQUIRE(every);
  CHECK(to_string(*every) == "every:4:3");
  auto v = validate(*rows, base, preset_resolver(nullptr), *every);
  REQUIRE(v);
  // 36 rows: positions 3, 7, ..., 35 are held out (9), 27 fitted.
  REQUIRE(points == 36);
  CHECK(v->held_out.size() == 9u);
  CHECK(v->fit.points.size() == 27u);
  CHECK(v->skipped == 0);
  CHECK(v->held_out[0].line == 2 + 3);  // header is line 1
  CHECK(v->held_out[1].line == 2 + 7);
  // Data made by the planner itself: the held-out rows are predicted exactly,
  // in time per token, tokens/s and comm share.
  CHECK(v->fit.fitted.compute_efficiency == Approx(truth.compute_efficiency).epsilon(1e-6));
  CHECK(v->max_abs_error < 1e-6);
  CHECK(v->max_abs_tokens_per_s_error < 1e-6);
  CHECK(v->max_abs_comm_share_error < 1e-9);
  // The same split on a second run.
  auto again = validate(*rows, base, preset_resolver(nullptr), *every);
  REQUIRE(again);
  for (size_t i = 0; i < v->held_out.size(); ++i) CHECK(again->held_out[i].line == v->held_out[i].line);

  // Extrapolation in scale: fit on 1-3 nodes, predict 4 and 5.
  auto big = validate(*rows, base, preset_resolver(nullptr), *parse_holdout("nodes:4"));
  REQUIRE(big);
  CHECK(big->held_out.size() == 12u);  // pipeline 4, 5 and tensor 4, on three links and at batch 4
  for (const auto& pt : big->held_out) CHECK(pt.nodes >= 4);
  CHECK(big->max_abs_error < 1e-6);

  // A measurement the planner does not reproduce shows up as that row's error.
  std::vector<sweep_row> off = *rows;
  off[3].tpot_ms_p50 *= 2;  // held out by every:4
  auto w = validate(off, base, preset_resolver(nullptr), *every);
  REQUIRE(w);
  CHECK(w->held_out[0].error == Approx(-0.5).margin(1e-6));
  CHECK(w->max_abs_error == Approx(0.5).margin(1e-6));

  // Fresh points appended to the file: the last 2 rows, whatever they are
  // (tensor:3 and tensor:4 at batch 4; tensor:2's batch-4 row stays in the
  // fit, the one other row whose busy station handles all-reduce messages).
  auto fresh = validate(*rows, base, preset_resolver(nullptr), *parse_holdout("last:2"));
  REQUIRE(fresh);
  REQUIRE(fresh->held_out.size() == 2u);
  CHECK(fresh->held_out.front().line == (*rows)[rows->size() - 2].line);
  CHECK(fresh->held_out.back().line == rows->back().line);
  CHECK(fresh->max_abs_error < 1e-6);
  CHECK(to_string(*parse_holdout("last:5")) == "last:5");
  CHECK_FALSE(validate(*rows, base, preset_resolver(nullptr), *parse_holdout("last:36")));

  // Splits that leave nothing on one side, and bad rules.
  CHECK_FALSE(validate(*rows, base, preset_resolver(nullptr), *parse_holdout("nodes:9")));
  for (const char* bad : {"every:1", "every:4:4", "every", "nodes:1", "nodes:x", "half", "every:-2", "last:0", "last"}) {
    INFO(bad);
    auto r = parse_holdout(bad);
    REQUIRE_FALSE(r);
    CHECK(r.message().find("every:K") != std::string::npos);
  }
  CHECK(parse_holdout("every:3:0")->offset == 0);
}

TEST_CASE("calibration recovers the constants a synthetic sweep was made with", "[planner][calibrate]") {
  plan_request base = host_base();
  const plan_assumptions truth = synthetic_truth(base);
  int expected_points = 0;
  const std::string csv = synthetic_sweep(base, truth, expected_points);
  auto rows = parse_sweep_csv(csv, "synthetic.csv");
  REQUIRE(rows);
  auto c = calibrate(*rows, base, preset_resolver(nullptr));
  REQUIRE(c);
  CHECK(c->fitted.compute_efficiency == Approx(truth.compute_efficiency).epsilon(1e-6));
  CHECK(c->fitted.message_overhead_s == Approx(truth.message_overhead_s).epsilon(1e-6));
  CHECK(c->fitted.sync_overhead_s == Approx(truth.sync_overhead_s).epsilon(1e-6));
  CHECK(c->fitted.byte_overhead_s == Approx(truth.byte_overhead_s).epsilon(1e-5));
  CHECK(c->fitted.sync_message_overhead_s == Approx(truth.sync_message_overhead_s).epsilon(1e-6));
  CHECK(c->fitted.transfer_excess == Approx(truth.transfer_excess).epsilon(1e-6));
  CHECK(c->fitted.message_cpu_s == Approx(truth.message_cpu_s).epsilon(1e-6));
  CHECK(c->fitted.sync_message_cpu_s == Approx(truth.sync_message_cpu_s).epsilon(1e-6));
  CHECK(c->fitted.batch_compute_efficiency == Approx(truth.batch_compute_efficiency).epsilon(1e-6));
  CHECK(c->fitted.sync_cpu_s == Approx(truth.sync_cpu_s).epsilon(1e-5));
  CHECK(c->max_abs_error < 1e-6);
  REQUIRE(static_cast<int>(c->points.size()) == expected_points);
  // Every constant names its source rows: the per-hop cost the chain rows,
  // the message CPU the batch rows (in process, lines 29-37), the transfer
  // excess only rows over shaped links.
  REQUIRE(c->constants.size() == 11);
  for (const auto& k : c->constants) {
    INFO(k.name);
    if (k.name == "expert_message_overhead_s") {  // no expert placement in the sweep: a hop message's cost
      CHECK_FALSE(k.fitted);
      CHECK(k.value == c->fitted.message_overhead_s);
      continue;
    }
    CHECK(k.fitted);
    CHECK(k.chain_rows + k.busy_rows == static_cast<int>(k.lines.size()));
    if (k.name == "message_cpu_s") {  // every batch-4 row (and 1-node rows whose station outlasts the chain)
      for (int ln = 29; ln <= 37; ++ln) CHECK(std::count(k.lines.begin(), k.lines.end(), ln) == 1);
    }
    if (k.name == "message_overhead_s") CHECK(k.busy_rows == 0);
    if (k.name == "transfer_excess") {
      for (int ln : k.lines) CHECK((ln >= 11 && ln <= 28));
    }
  }
  CHECK(c->skipped == 0);
  CHECK(c->points[0].topology == "pipeline:1");
  // One node, one station, one sequence per step: 4 sessions take 4 of its
  // steps per token round, so the batch-4 row's time per token is 4 x the
  // station's step, computed at the batch efficiency (0.45, against 0.55 at
  // batch 1): over 4 x batch 1's, under 4 x 0.55 / 0.45 of it (batch 1's
  // chain also holds the session's hops).
  double one = 0, four = 0;
  for (const auto& pt : c->points) {
    if (pt.topology != "tensor:1" || pt.link != "none") continue;
    (pt.batch == 1 ? one : four) = pt.predicted_tpot_ms;
  }
  REQUIRE(one > 0);
  CHECK(four > 4 * one);
  CHECK(four <= 4 * one * truth.compute_efficiency / truth.batch_compute_efficiency);
  CHECK(c->free.size() == 10);
}

TEST_CASE("a CPU quota: a step runs at full speed until the period's quota is spent", "[planner][calibrate]") {
  // 25% of a core in 10 ms periods (scripts/lab.sh), whole quota at the start.
  CHECK(quota_step_seconds(0.001, 0.25, 0.01) == Approx(0.001).epsilon(1e-12));  // fits in 2.5 ms
  // 5 ms of work from phase f: f <= 7.5 ms: 2.5 run + wait to the period's
  // end + 2.5 = 12.5 - f; later: 12.5 ms. Mean over f: 9.6875 ms.
  CHECK(quota_step_seconds(0.005, 0.25, 0.01) == Approx(0.0096875).epsilon(1e-9));
  // Long steps run at the sustained rate, quota x a full core.
  CHECK(quota_step_seconds(1.0, 0.25, 0.01) == Approx(4.0).epsilon(0.01));
  CHECK(quota_step_seconds(0.003, 0, 0.01) == 0.003);  // no quota
  CHECK(quota_step_seconds(0.003, 1, 0.01) == 0.003);
}

TEST_CASE("calibration under a CPU quota recovers the constants of a synthetic lab grid", "[planner][calibrate]") {
  // The lab's nodes: 25% of a 20 GB/s core; stories110m (440 MB) is long
  // enough a step to be throttled on 1 and 2 nodes, short enough on 4.
  plan_request base = host_base();
  base.hw.cpu_quota = 0.25;
  base.hw.cpu_quota_period_s = 0.01;
  base.hw.parallel_nodes = 0;
  base.context = 16;
  plan_assumptions truth = synthetic_truth(base);
  truth.compute_efficiency = 0.6;
  truth.message_overhead_s = 400e-6;
  truth.sync_overhead_s = 1.5e-3;
  truth.sync_message_overhead_s = 1e-3;
  truth.byte_overhead_s = 1e-9;
  truth.transfer_excess = 0.5;
  truth.message_cpu_s = 300e-6;
  truth.sync_message_cpu_s = 150e-6;
  truth.sync_cpu_s = 100e-6;
  truth.batch_compute_efficiency = 0.45;
  int points = 0;
  auto rows = parse_sweep_csv(synthetic_sweep(base, truth, points, "stories110m", true), "lab.csv");
  REQUIRE(rows);
  CHECK(points == 24);
  auto c = calibrate(*rows, base, preset_resolver(nullptr));
  REQUIRE(c);
  CHECK(c->fitted.compute_efficiency == Approx(truth.compute_efficiency).epsilon(1e-5));
  CHECK(c->fitted.message_overhead_s == Approx(truth.message_overhead_s).epsilon(1e-4));
  CHECK(c->fitted.sync_overhead_s == Approx(truth.sync_overhead_s).epsilon(1e-4));
  CHECK(c->fitted.sync_message_overhead_s == Approx(truth.sync_message_overhead_s).epsilon(1e-4));
  CHECK(c->fitted.transfer_excess == Approx(truth.transfer_excess).epsilon(1e-4));
  CHECK(c->fitted.message_cpu_s == Approx(truth.message_cpu_s).epsilon(1e-4));
  CHECK(c->fitted.sync_message_cpu_s == Approx(truth.sync_message_cpu_s).epsilon(1e-4));
  CHECK(c->fitted.batch_compute_efficiency == Approx(truth.batch_compute_efficiency).epsilon(1e-4));
  CHECK(c->fitted.sync_cpu_s == Approx(truth.sync_cpu_s).epsilon(1e-4));
  CHECK(c->max_abs_error < 1e-5);
  // The busy-station constants have their own source rows: the all-reduce
  // message and round CPU busy TP rows of batch 8 only, the batch efficiency
  // busy rows of batch 8 only (lines 14-25: the batch-8 half of the grid).
  for (const auto& k : c->constants) {
    if (k.name != "sync_message_cpu_s" && k.name != "batch_compute_efficiency" && k.name != "sync_cpu_s") continue;
    INFO(k.name);
    CHECK(k.fitted);
    CHECK(k.chain_rows == 0);
    CHECK(k.busy_rows > 0);
    for (int ln : k.lines) CHECK((ln >= 14 && ln <= 25));
  }
  // The comm share of a busy row: the chain's compute against the time per
  // token (a session's own steps; the wait for the others is not compute).
  {
    plan_request eight = base;
    eight.model = *find_model_preset("stories110m");
    eight.nodes = 4;
    eight.batch = 8;
    eight.topology = *parse_plan_topology("pipeline");
    eight.assume = truth;
    eight.assume.one_sequence_per_step = true;
    auto p8 = plan(eight);
    REQUIRE(p8);
    REQUIRE(p8->per_token_latency_s > p8->chain_s);
    CHECK(predicted_comm_share(*p8) == Approx(1 - p8->chain_compute_s / p8->per_token_latency_s).epsilon(1e-12));
  }
  // The quota shows: one node's step is throttled on the chain (more than
  // its full-speed compute), and at batch 8 the node runs at 25%.
  plan_request one = base;
  one.model = *find_model_preset("stories110m");
  one.assume = c->fitted;
  one.assume.one_sequence_per_step = true;
  auto p = plan(one);
  REQUIRE(p);
  CHECK(p->chain_compute_s > 1.5 * p->chain_busy_compute_s * 0.25);
  CHECK(p->chain_compute_s < p->chain_busy_compute_s);
}

TEST_CASE("calibration recovers the expert dispatch and combine cost from a synthetic lab grid with experts",
          "[planner][calibrate]") {
  // The lab's grid (scripts/calibrate-lab.sh): the dense stories110m rows of
  // the quota test, then the runtime's expert placement of an 8-expert top-2
  // model (the lab's labmoe8 shape) on 2, 4 and 8 daemons ("expert" =
  // pipeline:1,expert:N-1), at batch 1 and 8, over both links.
  plan_request base = host_base();
  base.hw.cpu_quota = 0.25;
  base.hw.cpu_quota_period_s = 0.01;
  base.hw.parallel_nodes = 0;
  base.context = 16;
  plan_assumptions truth = synthetic_truth(base);
  truth.compute_efficiency = 0.6;
  truth.message_overhead_s = 400e-6;
  truth.expert_message_overhead_s = 900e-6;
  truth.sync_overhead_s = 1.5e-3;
  truth.sync_message_overhead_s = 1e-3;
  truth.byte_overhead_s = 1e-9;
  truth.transfer_excess = 0.5;
  truth.message_cpu_s = 300e-6;
  truth.sync_message_cpu_s = 150e-6;
  truth.batch_compute_efficiency = 0.45;
  auto moe = spec_from_hf_json(
      R"({"hidden_size": 256, "moe_intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
          "num_key_value_heads": 8, "vocab_size": 512, "max_position_embeddings": 256, "tie_word_embeddings": true,
          "num_experts": 8, "num_experts_per_tok": 2, "torch_dtype": "float32"})",
      "labmoe8.config.json");
  REQUIRE(moe);
  int points = 0;
  std::string csv = synthetic_sweep(base, truth, points, "stories110m", true);
  const int dense_lines = points + 1;  // the header is line 1
  std::vector<int> expert_lines;
  for (int batch : {1, 8})
    for (const char* link : {"1gbit:100us", "100mbit:1ms"})
      for (int n : {2, 4, 8}) {
        plan_request r = base;
        r.model = *moe;
        r.nodes = n;
        r.batch = batch;
        r.topology = *parse_plan_topology("pipeline:1,expert:" + std::to_string(n - 1));
        r.assume = truth;
        r.assume.one_sequence_per_step = true;
        r.hw.node.link = *parse_link(link);
        auto p = plan(r);
        REQUIRE(p);
        // Batch 1 rows sit on the chain, where dispatch and combine are.
        if (batch == 1) CHECK(p->chain_overhead_s > 0);
        char line[256];
        std::snprintf(line, sizeof line, "labmoe8.gguf,expert,%d,0,0,%s,%d,0,%.17g,0,%.17g,%.17g,0\n", n, link, batch,
                      p->per_token_latency_s * 1000, p->tokens_per_s, predicted_comm_share(*p));
        csv += line;
        expert_lines.push_back(dense_lines + static_cast<int>(expert_lines.size()) + 1);
      }
  auto rows = parse_sweep_csv(csv, "lab.csv");
  REQUIRE(rows);
  REQUIRE(rows->size() == 24 + 12);
  auto c = calibrate(*rows, base, preset_resolver(&*moe));
  REQUIRE(c);
  CHECK(c->fitted.expert_message_overhead_s == Approx(truth.expert_message_overhead_s).epsilon(1e-4));
  CHECK(c->fitted.message_overhead_s == Approx(truth.message_overhead_s).epsilon(1e-4));
  CHECK(c->fitted.compute_efficiency == Approx(truth.compute_efficiency).epsilon(1e-5));
  CHECK(c->fitted.sync_overhead_s == Approx(truth.sync_overhead_s).epsilon(1e-4));
  CHECK(c->fitted.message_cpu_s == Approx(truth.message_cpu_s).epsilon(1e-4));
  CHECK(c->max_abs_error < 1e-5);
  // Its source rows are expert rows, and every batch-1 expert row is one.
  bool found = false;
  for (const auto& k : c->constants) {
    if (k.name != "expert_message_overhead_s") continue;
    found = true;
    CHECK(k.fitted);
    for (int ln : k.lines) CHECK(std::count(expert_lines.begin(), expert_lines.end(), ln) == 1);
    for (size_t i = 0; i < 6; ++i) CHECK(std::count(k.lines.begin(), k.lines.end(), expert_lines[i]) == 1);
  }
  CHECK(found);
  // The rows are planned as the runtime placed them.
  CHECK(c->points.back().topology == "pipeline:1,expert:7");
  // A row of one node cannot be an expert placement.
  sweep_row one = rows->back();
  one.nodes = 1;
  auto bad = request_for_row(one, base, preset_resolver(&*moe));
  REQUIRE_FALSE(bad);
  CHECK(bad.message().find("at least 2 nodes") != std::string::npos);
}

TEST_CASE("calibration on the sweep measured here: within 20% at every point", "[planner][calibrate]") {
  // docs/planner-sweep-stories260k.csv: `cellshard run` in process, 128
  // greedy tokens of stories260K, 1..8 nodes, pipeline and tensor (median of
  // 3 runs each; docs/planner.md says how it was made). The host's bandwidth
  // is the figure measured with it (first comment line).
  std::ifstream f(std::string(CELLSHARD_SOURCE_DIR) + "/docs/planner-sweep-stories260k.csv");
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  double gbs = 0;
  int cores = 0;
  REQUIRE(std::sscanf(text.c_str(), "# host: %lf GB/s, %d cores", &gbs, &cores) == 2);
  plan_request base = host_base();
  base.hw.node.mem_bandwidth_gbs = gbs;
  base.hw.parallel_nodes = cores;
  auto rows = parse_sweep_csv(text, "planner-sweep-stories260k.csv");
  REQUIRE(rows);
  CHECK(rows->size() >= 9);
  auto c = calibrate(*rows, base, preset_resolver(nullptr));
  REQUIRE(c);
  for (const auto& p : c->points) {
    INFO(p.topology << " on " << p.nodes << ": measured " << p.measured_tpot_ms << " ms, predicted "
                    << p.predicted_tpot_ms << " ms");
    CHECK(std::fabs(p.error) <= 0.20);
  }
  CHECK(c->fitted.compute_efficiency > 0);
  CHECK(c->fitted.compute_efficiency <= 1.5);
}

TEST_CASE("leave-one-out refits: one set of constants per batch-1 row, the spread a row causes", "[planner][calibrate]") {
  const plan_request base = host_base();
  const plan_assumptions truth = synthetic_truth(base);
  int points = 0;
  auto rows = parse_sweep_csv(synthetic_sweep(base, truth, points), "synthetic.csv");
  REQUIRE(rows);
  auto loo = leave_one_out(*rows, base, preset_resolver(nullptr));
  REQUIRE(loo);
  REQUIRE(static_cast<int>(loo->size()) == points);
  // Consistent data: every refit gives the truth back.
  for (const auto& a : *loo) {
    CHECK(a.compute_efficiency == Approx(truth.compute_efficiency).epsilon(1e-6));
    CHECK(a.message_overhead_s == Approx(truth.message_overhead_s).epsilon(1e-6));
  }
  // One row measured 30% slow: the refit without it is the truth, every other
  // refit is pulled away from it, so the spread comes from that row alone.
  std::vector<sweep_row> off = *rows;
  off[5].tpot_ms_p50 *= 1.3;
  auto pulled = leave_one_out(off, base, preset_resolver(nullptr));
  REQUIRE(pulled);
  CHECK((*pulled)[5].compute_efficiency == Approx(truth.compute_efficiency).epsilon(1e-6));
  int moved = 0;
  for (size_t i = 0; i < pulled->size(); ++i)
    if (i != 5 && std::fabs((*pulled)[i].compute_efficiency - truth.compute_efficiency) > 1e-4) ++moved;
  CHECK(moved > 0);
  // Too few rows to leave one out.
  std::vector<sweep_row> two(rows->begin(), rows->begin() + 2);
  auto few = leave_one_out(two, base, preset_resolver(nullptr));
  REQUIRE_FALSE(few);
  CHECK(few.message().find("at least 3") != std::string::npos);
}
