// Supervision in one process (issue #6): crashed and silent shards are
// detected, restarted (in place, or on a spare), restored from checkpoints and
// replayed, and the output equals llama2.c's fixture exactly. Times here are
// real (the phi detector needs wall-clock heartbeats), but nothing sleeps:
// every wait is on a result with a deadline.
#include <sstream>
#include "supervision/fault_plan.hpp"
#include "tests/actors/fixture_runner.hpp"

using namespace cellshard;

namespace {

struct fault_case {
  std::string name;
  int nodes, spares;
  std::string topology;
  std::string fixture;
  std::vector<std::string> faults;
  int checkpoint_every = 16;
};

const test::fixture_case& fixture(const std::string& name) {
  for (const auto& fc : test::fixture_cases())
    if (fc.name == name) return fc;
  FAIL("no fixture " << name);
  return test::fixture_cases().front();
}

actors::session_outcome run_with_faults(const fault_case& c, actors::cluster_options o,
                                        std::vector<actors::fault_record>* records = nullptr) {
  for (const auto& spec : c.faults) {
    auto f = supervision::parse_fault_spec(spec);
    REQUIRE(f.ok());
    o.faults.push_back(*f);
  }
  o.checkpoint_every = c.checkpoint_every;
  o.spares = c.spares;
  auto cl = actors::cluster::start(o);
  REQUIRE(cl.ok());
  auto r = (*cl)->generate(test::params_of(fixture(c.fixture)), {}, std::chrono::seconds(60));
  REQUIRE(r.ok());
  if (records) *records = (*cl)->faults();
  return *r;
}

}  // namespace

TEST_CASE("crashes and silences at several positions reproduce the fixtures", "[recovery]") {
  if (!test::have_shared()) return;
  const std::vector<fault_case> cases = {
      // pipeline: prefill, first decode step, before and after a checkpoint, mid-run
      {"pipeline crash in prefill", 3, 1, "pipeline", "greedy_prompt_lily_tom_n100", {"crash:node=1:step=5"}},
      {"pipeline crash at the first decode step", 3, 1, "pipeline", "greedy_prompt_lily_tom_n100",
       {"crash:node=2:step=12"}},
      {"pipeline crash before any checkpoint", 3, 1, "pipeline", "greedy_bos_n200", {"crash:node=1:step=9"}},
      {"pipeline crash after a checkpoint", 3, 1, "pipeline", "topp_t1.0_p0.9_s133742_n256",
       {"crash:node=1:step=40"}},
      {"pipeline crash of stage 0", 3, 1, "pipeline", "mult_t0.9_p1.0_s2024_n150", {"crash:node=0:step=77"}},
      {"pipeline silence mid-run moves to the spare", 3, 1, "pipeline", "topp_t0.5_p0.95_s7_n150",
       {"silence:node=1:step=60"}},
      {"pipeline two crashes in two stages", 4, 0, "pipeline", "greedy_bos_n200",
       {"crash:node=1:step=30", "crash:node=3:step=120"}},
      // tensor parallel: the whole group replays
      {"tensor crash mid-run", 3, 1, "tensor", "topp_t1.0_p0.9_s133742_n256", {"crash:node=1:step=50"}},
      {"tensor crash in prefill", 2, 1, "tensor", "greedy_prompt_lily_tom_n100", {"crash:node=0:step=3"}},
      {"tensor silence moves to the spare", 3, 1, "tensor", "greedy_bos_n200", {"silence:node=2:step=33"}},
      {"hybrid crash of a rank in stage 1", 4, 0, "hybrid:2x2", "greedy_bos_n200", {"crash:node=3:step=64"}},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      std::vector<actors::fault_record> records;
      auto out = run_with_faults(c, test::stories_options(c.nodes, c.topology), &records);
      INFO(out.error);
      REQUIRE(out.ok);
      {
        const auto want = test::read_ids(test::shared_file("fixtures/" + c.fixture + ".ids"));
        size_t d = 0;
        while (d < want.size() && d < out.result.ids.size() && want[d] == out.result.ids[d]) ++d;
        INFO("first difference at position " << d);
        for (const auto& rec : out.recoveries)
          INFO("recovery at " << rec.position << " restored " << rec.restored_to << " replayed "
                              << rec.replayed_positions << (rec.from_upstream_log ? " (log)" : " (tokens)"));
        CHECK(d == want.size());
      }
      CHECK(out.result.ids == test::read_ids(test::shared_file("fixtures/" + c.fixture + ".ids")));
      CHECK(out.result.text + "\n" == test::read_file(test::shared_file("fixtures/" + c.fixture + ".txt")));
      // Every fault was detected and recovered from.
      REQUIRE(records.size() == c.faults.size());
      REQUIRE(out.recoveries.size() >= c.faults.size());
      for (const auto& r : records) {
        CHECK(r.detect_ms >= 0);
        CHECK(r.recover_ms >= 0);
        if (r.kind == "silence") CHECK(r.moved_to_node != r.node);  // went to a spare
        if (r.kind == "crash") CHECK(r.moved_to_node == r.node);    // restarted in place
      }
      // Replay covers exactly the positions since the restored checkpoint.
      for (const auto& rec : out.recoveries) {
        CHECK(rec.replayed_positions == rec.position - rec.restored_to);
        CHECK(rec.restored_to <= rec.position);
      }
    }
  }
}

TEST_CASE("checkpoints bound the replay", "[recovery]") {
  if (!test::have_shared()) return;
  // A crash at position 100 with checkpoints every 16 positions restores at
  // least position 96's checkpoint and replays only what followed.
  fault_case c{"", 3, 0, "pipeline", "greedy_bos_n200", {"crash:node=1:step=100"}, 16};
  auto out = run_with_faults(c, test::stories_options(3, "pipeline"));
  REQUIRE(out.ok);
  REQUIRE(out.recoveries.size() == 1);
  const auto& rec = out.recoveries[0];
  CHECK(rec.position == 100);
  CHECK(rec.restored_to == 96);
  CHECK(rec.replayed_positions == 4);
  CHECK(rec.from_upstream_log);  // stage 1 replays from stage 0's log
  CHECK(out.result.ids == test::read_ids(test::shared_file("fixtures/greedy_bos_n200.ids")));
}

TEST_CASE("a corrupted checkpoint is detected and the run still reproduces the fixture",
          "[recovery][checkpoint]") {
  if (!test::have_shared()) return;
  fault_case c{"", 3, 0, "pipeline", "topp_t1.0_p0.9_s133742_n256", {"crash:node=1:step=70"}, 16};
  auto o = test::stories_options(3, "pipeline");
  o.corrupt_checkpoints_of = 1;
  auto out = run_with_faults(c, o);
  INFO(out.error);
  REQUIRE(out.ok);
  REQUIRE(out.recoveries.size() == 1);
  // Every delta of shard 1 is corrupt: the chain ends at once, the shard is
  // rebuilt by replaying everything, and the reason is reported.
  CHECK(out.recoveries[0].restored_to == 0);
  CHECK(out.recoveries[0].replayed_positions == 70);
  CHECK_THAT(out.recoveries[0].checkpoint_note, Catch::Contains("shard-1"));
  CHECK(out.result.ids == test::read_ids(test::shared_file("fixtures/topp_t1.0_p0.9_s133742_n256.ids")));
}

TEST_CASE("no spare: a silent node's shard is re-placed on the survivor with the most room", "[recovery][replace]") {
  if (!test::have_shared()) return;
  fault_case c{"", 3, 0, "pipeline", "greedy_bos_n200", {"silence:node=1:step=40"}};
  auto o = test::stories_options(3, "pipeline");
  o.memory = 2 << 20;  // room for two stages per node
  std::vector<actors::fault_record> records;
  auto out = run_with_faults(c, o, &records);
  INFO(out.error);
  REQUIRE(out.ok);
  CHECK(out.result.ids == test::read_ids(test::shared_file("fixtures/greedy_bos_n200.ids")));
  REQUIRE(out.recoveries.size() == 1);
  REQUIRE(records.size() == 1);
  CHECK(records[0].kind == "silence");
  // Stage 1 (0.6 MiB) joins stage 2 (0.4 MiB, more room left) rather than stage 0 (0.7 MiB).
  CHECK(records[0].moved_to_node == 2);
}

TEST_CASE("recovery impossible: the error and the partial output come back", "[recovery][errors]") {
  if (!test::have_shared()) return;
  const auto want = test::read_ids(test::shared_file("fixtures/greedy_bos_n200.ids"));
  SECTION("a silent node, no spare, and no survivor with room for its shard") {
    // 1 MiB per node holds one stage of stories260K (0.4-0.7 MiB) but not two.
    fault_case c{"", 3, 0, "pipeline", "greedy_bos_n200", {"silence:node=1:step=40"}};
    auto o = test::stories_options(3, "pipeline");
    o.memory = 1 << 20;
    auto out = run_with_faults(c, o);
    CHECK_FALSE(out.ok);
    CHECK_THAT(out.error, Catch::Contains("no spare node") && Catch::Contains("placement index 1") &&
                              Catch::Contains("node 1"));
    // The tokens before the fault are there, and they are the right ones.
    REQUIRE(out.result.ids.size() >= 40);
    REQUIRE(out.result.ids.size() < want.size());
    CHECK(std::equal(out.result.ids.begin(), out.result.ids.end(), want.begin()));
  }
  SECTION("restart intensity exceeded") {
    fault_case c{"", 3, 0, "pipeline", "greedy_bos_n200",
                 {"crash:node=1:step=10", "crash:node=1:step=20", "crash:node=1:step=30",
                  "crash:node=1:step=40"}};
    auto out = run_with_faults(c, test::stories_options(3, "pipeline"));
    CHECK_FALSE(out.ok);
    CHECK_THAT(out.error, Catch::Contains("stage 1 supervisor exceeded its restart intensity") &&
                              Catch::Contains("shard-1") && Catch::Contains("injected crash at step 40"));
    REQUIRE(out.result.ids.size() >= 40);
    CHECK(std::equal(out.result.ids.begin(), out.result.ids.end(), want.begin()));
  }
}

TEST_CASE("on_done may submit again once the cluster has failed or is shut down", "[recovery][errors]") {
  if (!test::have_shared()) return;
  // The refusal of a request comes back inside submit(); it used to run
  // with the runtime's mutex (or the request table's) held, so a client
  // resubmitting from on_done waited on itself for ever (found by
  // bench failures, whose second round hung after a failed recovery).
  auto o = test::stories_options(3, "pipeline");
  for (const char* spec : {"crash:node=1:step=10", "crash:node=1:step=20", "crash:node=1:step=30",
                           "crash:node=1:step=40"}) {
    auto f = supervision::parse_fault_spec(spec);
    REQUIRE(f.ok());
    o.faults.push_back(*f);
  }
  auto cl = actors::cluster::start(o);
  REQUIRE(cl.ok());
  auto& c = **cl;
  const auto params = test::params_of(fixture("greedy_bos_n200"));
  auto first = c.generate(params, {}, std::chrono::seconds(60));
  REQUIRE(first.ok());
  REQUIRE_FALSE(first->ok);
  REQUIRE_FALSE(c.failure().empty());
  auto resubmit = [&c, &params](std::vector<std::string>& errors) {
    c.submit(params, {}, [&c, &params, &errors](uint64_t, const actors::session_outcome& so) {
      errors.push_back(so.error);
      c.submit(params, {}, [&errors](uint64_t, const actors::session_outcome& again) { errors.push_back(again.error); });
    });
  };
  std::vector<std::string> errors;
  resubmit(errors);  // the refusal runs on this thread, before submit returns
  REQUIRE(errors.size() == 2);
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("restart intensity"));
  c.shutdown();
  errors.clear();
  resubmit(errors);
  REQUIRE(errors.size() == 2);
  for (const auto& e : errors) CHECK(e == "cluster is shut down");
}

TEST_CASE("a node that was suspected and heartbeats again rejoins as a spare", "[recovery][replace]") {
  if (!test::have_shared()) return;
  // Paced (10 ms per step at stage 0) so that node 1's 1.2 s silence (from
  // ~0.2 s) ends well before step 190 (~1.9 s): its shard moves to the spare (node 3), node 1
  // heartbeats again and holds nothing, so it is offered as a spare; the
  // second silence (node 2, for ever) then moves stage 2 onto node 1.
  fault_case c{"", 3, 1, "pipeline", "greedy_bos_n200",
               {"slow:node=0:step=0:ms=10", "silence:node=1:step=20:ms=1200", "silence:node=2:step=190"}};
  std::vector<actors::fault_record> records;
  auto out = run_with_faults(c, test::stories_options(3, "pipeline"), &records);
  INFO(out.error);
  REQUIRE(out.ok);
  CHECK(out.result.ids == test::read_ids(test::shared_file("fixtures/greedy_bos_n200.ids")));
  std::vector<std::pair<int, int>> moves;  // (placement index, node it moved to)
  for (const auto& r : records)
    if (r.kind == "silence") moves.emplace_back(r.index, r.moved_to_node);
  CHECK(moves == std::vector<std::pair<int, int>>{{1, 3}, {2, 1}});
}

TEST_CASE("two shards of one tensor group failing at the same step: one recovery, fixture ids",
          "[recovery][tensor]") {
  if (!test::have_shared()) return;
  // The restarts overlap: the coordinator announces them as one batch, so no
  // session replays through a new incarnation it has not restored. (Before,
  // about 1 run in 6 diverged at position 38, and some crashed on an unwired
  // shard.) Several pairs and repetitions, as the overlap is a race.
  const auto want = test::read_ids(test::shared_file("fixtures/topp_t0.5_p0.95_s7_n150.ids"));
  const std::vector<std::pair<int, int>> pairs = {{0, 3}, {1, 2}, {0, 1}, {2, 3}, {0, 3}, {1, 3}, {0, 2}, {0, 3}};
  for (auto [a, b] : pairs) {
    fault_case c{"", 4, 2, "tensor", "topp_t0.5_p0.95_s7_n150",
                 {"crash:node=" + std::to_string(a) + ":step=35", "crash:node=" + std::to_string(b) + ":step=35"}};
    auto o = test::stories_options(4, "tensor");
    o.caf_threads = 4;
    std::vector<actors::fault_record> records;
    auto out = run_with_faults(c, o, &records);
    INFO("crashes of " << a << " and " << b << ": " << out.error);
    std::ostringstream what;
    for (const auto& r : out.recoveries)
      what << "recovery at " << r.position << " of " << r.indices.size() << " shard(s), restored to "
           << r.restored_to << ", replayed " << r.replayed_positions << (r.from_upstream_log ? " (log)" : " (tokens)")
           << "; ";
    for (const auto& r : records)
      what << "record " << r.kind << " index " << r.index << " recover_ms " << r.recover_ms << "; ";
    what << out.retries << " re-sends";
    INFO(what.str());
    REQUIRE(out.ok);
    CHECK(out.result.ids == want);
    CHECK(records.size() == 2);
    for (const auto& r : records) CHECK(r.recover_ms >= 0);
  }
}

// Also the regression of the busy-node step probes: the surviving rank had
// queued the re-sent step behind the replay, which waited forever for the
// partitioned rank's partial sums; the probe took the queued copy for work in
// progress and extended the deadline until generate() gave up.
TEST_CASE("a short partition of one rank while another rank's crash is recovered: fixture ids",
          "[recovery][tensor]") {
  if (!test::have_shared()) return;
  // Found by chaos (seed 11): the partitioned rank drops the recovery's
  // replay; the re-send after the deadline must redo the replay, not only the
  // step (which diverged at position 73).
  for (int partitioned : {0, 1}) {
    fault_case c{"", 4, 3, "tensor", "topp_t0.5_p0.95_s7_n150",
                 {"partition:node=" + std::to_string(partitioned) + ":step=70:ms=96", "crash:node=2:step=70"}};
    auto out = run_with_faults(c, test::stories_options(4, "tensor"));
    INFO("partitioned rank " << partitioned << ": " << out.error);
    REQUIRE(out.ok);
    CHECK(out.result.ids == test::read_ids(test::shared_file("fixtures/topp_t0.5_p0.95_s7_n150.ids")));
  }
}

TEST_CASE("a message lost during the prefill is re-sent at the first deadline, not after the ceiling",
          "[recovery][deadline]") {
  if (!test::have_shared()) return;
  // The prefill deadline starts at step_timeout_min (2 s) and doubles per
  // re-send; it used to be the 30 s ceiling from the start.
  fault_case c{"", 4, 0, "hybrid:2x2", "greedy_prompt_lily_tom_n100", {"drop:node=3:step=5:n=1"}};
  auto out = run_with_faults(c, test::stories_options(4, "hybrid:2x2"));
  INFO(out.error);
  REQUIRE(out.ok);
  CHECK(out.result.ids == test::read_ids(test::shared_file("fixtures/greedy_prompt_lily_tom_n100.ids")));
  CHECK(out.retries == 1);
  // The deadline that passed was the floor, not the 60 s ceiling.
  REQUIRE(out.resend_deadlines_ms.size() == 1);
  CHECK(out.resend_deadlines_ms[0] == 2000);
}

TEST_CASE("a shard failing while another's recovery restores it: the next recovery takes over",
          "[recovery][errors]") {
  if (!test::have_shared()) return;
  // Found by review: the restore request to a shard that died meanwhile
  // ended the run ("did not restore its KV cache: request_receiver_down")
  // instead of waiting for that shard's own restart.
  for (int k = 0; k < 4; ++k) {
    fault_case c{"", 4, 0, "hybrid:2x2", "greedy_prompt_lily_tom_n100",
                 {"partition:node=3:step=5:ms=400", "silence:node=0:step=5:ms=400", "crash:node=2:step=12"}};
    auto out = run_with_faults(c, test::stories_options(4, "hybrid:2x2"));
    INFO("attempt " << k << ": " << out.error);
    REQUIRE(out.ok);
    CHECK(out.result.ids == test::read_ids(test::shared_file("fixtures/greedy_prompt_lily_tom_n100.ids")));
  }
}

// Issue #19: the scatter_gather reduce (--reduce scatter) under a crash (the
// rank restarts in place) and a silence (it moves to the spare) on every
// tensor width and hybrid 2x2; every fixture appears at least once.
TEST_CASE("scatter_gather reduce: crashes and silences in tensor groups reproduce the fixtures",
          "[recovery][reduce]") {
  if (!test::have_shared()) return;
  const std::vector<fault_case> cases = {
      {"tensor:2 crash", 2, 0, "tensor", "topp_t1.0_p0.9_s133742_n256", {"crash:node=1:step=50"}},
      {"tensor:2 silence of the embedding holder", 2, 1, "tensor", "greedy_bos_n200", {"silence:node=0:step=33"}},
      {"tensor:3 crash in prefill", 3, 0, "tensor", "greedy_prompt_lily_tom_n100", {"crash:node=2:step=3"}},
      {"tensor:3 silence", 3, 1, "tensor", "topp_t0.5_p0.95_s7_n150", {"silence:node=1:step=60"}},
      {"tensor:4 crash", 4, 0, "tensor", "mult_t0.9_p1.0_s2024_n150", {"crash:node=3:step=77"}},
      {"tensor:4 silence", 4, 1, "tensor", "greedy_prompt_once_n120", {"silence:node=2:step=40"}},
      {"hybrid:2x2 crash of a stage-0 rank", 4, 0, "hybrid:2x2", "greedy_bos_n200", {"crash:node=1:step=64"}},
      {"hybrid:2x2 silence of a stage-1 rank", 4, 1, "hybrid:2x2", "topp_t1.0_p0.9_s133742_n256",
       {"silence:node=3:step=90"}},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      auto o = test::stories_options(c.nodes, c.topology);
      o.reduce = "scatter";
      std::vector<actors::fault_record> records;
      auto out = run_with_faults(c, o, &records);
      INFO(out.error);
      REQUIRE(out.ok);
      CHECK(out.result.ids == test::read_ids(test::shared_file("fixtures/" + c.fixture + ".ids")));
      CHECK(out.result.text + "\n" == test::read_file(test::shared_file("fixtures/" + c.fixture + ".txt")));
      REQUIRE(records.size() == 1u);
      CHECK(records.front().kind == c.faults.front().substr(0, c.faults.front().find(':')));
      CHECK(records.front().recover_ms >= 0);
      if (records.front().kind == "silence") CHECK(records.front().moved_to_node != records.front().node);
      if (records.front().kind == "crash") CHECK(records.front().moved_to_node == records.front().node);
      REQUIRE(out.recoveries.size() >= 1u);
    }
  }
}
