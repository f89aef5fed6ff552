// The shard's recovery protocol (DESIGN.md "Fault tolerance", actors/shard.hpp)
// on CAF's test_coordinator: a 2-stage pipeline of stories260K whose shards
// compute inline (shard_init::compute_inline), driven by a stand-in for the
// session. Every message order is the test coordinator's; nothing is timed.
// Checked: checkpoint deltas every K positions; a restarted shard drops steps
// of a session it has not been restored for; restore_req rebuilds its KV
// cache from the deltas and answers where the chain ends; the upstream
// replay log re-sends a range (and refuses one it cannot serve) to the
// restarted stage only, which recomputes it without emitting logits; a
// message of an older epoch is dropped; the step re-sent in the new epoch
// and the steps after it give logits bit-identical to a run without the
// fault, and the restored shard checkpoints on from where its chain ended.
// Activations that came as data-plane frames (no reply_to) wait for their
// epoch's CAF activation, run in order after it, and are dropped when stale,
// beyond the bound, or superseded by a newer epoch (issue #19).
#include "actors/data_plane.hpp"
#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "actors/recovery.hpp"
#include "actors/shard.hpp"
#include "kernels/backend.hpp"
#include "model/checkpoint.hpp"
#include "topologies/placement.hpp"
#include "topologies/profile.hpp"

#include "tests/support.hpp"

#include <catch2/catch.hpp>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <map>
#include <memory>
#include <utility>
#include <vector>

using namespace cellshard;
using actors::step_id;

namespace {

using ask_restore_atom = caf::atom_constant<caf::atom("t_restore")>;
using ask_replay_atom = caf::atom_constant<caf::atom("t_replay")>;

constexpr uint64_t session_id = 7;
const std::vector<int32_t> tokens = {1, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150};

/// What reaches the stand-in session.
struct observed {
  std::map<int32_t, std::vector<float>> logits;   // by the step's first position
  std::vector<int32_t> logits_order;              // first positions, arrival order
  std::vector<actors::kv_delta> deltas;
  std::vector<std::string> errors;
  std::vector<int32_t> restored;                  // restore answers (-1: an error)
  std::vector<int> replayed;                      // replay answers (1, 0; -1: an error)
  std::vector<actors::activation> taps;           // stage 0's outputs (pipeline_fixture's tap)
};

/// Stands in for stage 1 as stage 0's next stage: keeps what it is sent.
caf::behavior tap_stub(caf::event_based_actor*, std::shared_ptr<observed> out) {
  return {[out](actors::activation& a) { out->taps.push_back(std::move(a)); }};
}

caf::behavior session_stub(caf::event_based_actor* self, std::shared_ptr<observed> out) {
  return {
      [out](actors::logits_msg& m) {
        out->logits[m.id.pos0] = m.logits.data;
        out->logits_order.push_back(m.id.pos0);
      },
      [out](actors::kv_delta& d) { out->deltas.push_back(std::move(d)); },
      [out](actors::shard_error& e) { out->errors.push_back(e.message); },
      [self, out](ask_restore_atom, caf::actor shard, actors::restore_req& r) {
        self->request(shard, std::chrono::seconds(10), std::move(r))
            .then([out](actors::restore_atom, int32_t end) { out->restored.push_back(end); },
                  [out](caf::error&) { out->restored.push_back(-1); });
      },
      [self, out](ask_replay_atom, caf::actor head, uint32_t epoch, int32_t from, int32_t to, int32_t until) {
        self->request(head, std::chrono::seconds(10), actors::replay_atom::value, session_id, epoch, from, to, until)
            .then([out](bool ok) { out->replayed.push_back(ok ? 1 : 0); },
                  [out](caf::error&) { out->replayed.push_back(-1); });
      },
  };
}

/// Two shards (a pipeline:2 placement of stories260K, checkpoint every 2
/// positions) on one test_coordinator, and the session stand-in.
struct pipeline_fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  std::shared_ptr<const model::model_file> file;
  topologies::placement plan;
  std::vector<std::shared_ptr<actors::node_state>> nodes;
  std::vector<caf::actor> shards;
  std::shared_ptr<observed> out = std::make_shared<observed>();
  caf::actor session;
  caf::actor tap;  // when given: stage 0 sends its outputs here, not to stage 1

  explicit pipeline_fixture(const std::string& path, bool with_tap = false) {
    cfg.set("scheduler.policy", caf::atom("testing"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
    auto f = model::model_file::open(path);
    REQUIRE(f.ok());
    file = f.value();
    auto strat = topologies::parse_strategy("pipeline:2");
    REQUIRE(strat.ok());
    auto p = topologies::place(file->cfg(), topologies::make_nodes(2, topologies::host_profile()), strat.value());
    REQUIRE(p.ok());
    plan = std::move(p.value());
    REQUIRE(plan.shards.size() == 2);
    for (int n = 0; n < 2; ++n) {
      auto ns = std::make_shared<actors::node_state>();
      ns->index = n;
      nodes.push_back(ns);
    }
    session = sys->spawn(session_stub, out);
    if (with_tap) tap = sys->spawn(tap_stub, out);
    shards = {spawn(0, false), spawn(1, false)};
    wire();
  }
  ~pipeline_fixture() {
    for (auto& a : shards) caf::anon_send_exit(a, caf::exit_reason::kill);
    caf::anon_send_exit(session, caf::exit_reason::kill);
    if (tap) caf::anon_send_exit(tap, caf::exit_reason::kill);
    sched->run();
  }

  caf::actor spawn(int index, bool restarted) {
    const auto& placed = plan.shards[static_cast<size_t>(index)];
    model::slice_spec spec;
    spec.layer_begin = placed.layers.begin;
    spec.layer_end = placed.layers.end;
    spec.kv_head_begin = placed.kv_heads.begin;
    spec.kv_head_end = placed.kv_heads.end;
    spec.ffn_begin = placed.ffn.begin;
    spec.ffn_end = placed.ffn.end;
    spec.embedding = placed.has_embedding;
    spec.classifier = placed.has_classifier;
    spec.vocab_begin = placed.vocab.begin;
    spec.vocab_end = placed.vocab.end;
    auto w = model::shard_weights::make(file, spec);
    REQUIRE(w.ok());
    actors::shard_init init;
    init.index = index;
    init.stage = placed.stage;
    init.rank = placed.rank;
    init.group_size = placed.group_size;
    init.checkpoint_every = 2;
    init.restarted = restarted;
    init.weights = w.value();
    init.backend = kernels::choose_backend("native").be;
    REQUIRE(init.backend);
    init.node = nodes[static_cast<size_t>(placed.node)];
    init.compute_inline = true;
    auto a = actors::spawn_shard(*sys, std::move(init));
    sched->run();
    return a;
  }
  /// Sends every shard its wiring (the runtime's wiring_of).
  void wire() {
    const std::vector<int> node_of = {plan.shards[0].node, plan.shards[1].node};
    for (int i = 0; i < 2; ++i)
      caf::anon_send(shards[static_cast<size_t>(i)], actors::wire_atom::value,
                     actors::wiring_of(plan, node_of, i == 0 && tap ? std::vector<caf::actor>{shards[0], tap} : shards,
                                       i));
    sched->run();
  }
  /// The session's step: tokens of positions [pos0, pos0 + count) to stage 0.
  void step(uint32_t epoch, int32_t pos0, int32_t count) {
    actors::forward_req r;
    r.id = step_id{session_id, epoch, pos0, count};
    r.tokens.assign(tokens.begin() + pos0, tokens.begin() + pos0 + count);
    r.reply_to = session;
    caf::anon_send(shards[0], std::move(r));
    sched->run();
  }
  /// The shard at placement index 1 is lost; a new incarnation takes over.
  void restart_last_stage() {
    caf::anon_send_exit(shards[1], caf::exit_reason::kill);
    sched->run();
    shards[1] = spawn(1, true);
    wire();
  }
};

/// The steps of run.c's loop for 12 positions: position 0, the rest of a
/// 7-token prompt as one batch, then one position per step.
const std::vector<std::pair<int32_t, int32_t>> steps = {{0, 1}, {1, 6}, {7, 1}, {8, 1}, {9, 1}, {10, 1}, {11, 1}};

}  // namespace

TEST_CASE("shard protocol: restore, replay from the upstream log, epochs and the re-sent step, on test_coordinator",
          "[shard_protocol]") {
  const std::string path = test::shared_file("models/stories260K.bin");
  if (path.empty()) return;

  // The run without a fault: the logits of every step.
  std::map<int32_t, std::vector<float>> reference;
  {
    pipeline_fixture ref(path);
    for (auto [pos0, count] : steps) ref.step(0, pos0, count);
    REQUIRE(ref.out->errors.empty());
    REQUIRE(ref.out->logits.size() == steps.size());
    for (auto& [pos0, v] : ref.out->logits) CHECK(v.size() == 512u);  // the whole vocabulary, stage 1
    reference = ref.out->logits;
  }

  pipeline_fixture f(path);
  for (size_t i = 0; i < 5; ++i) f.step(0, steps[i].first, steps[i].second);  // positions [0, 10)
  REQUIRE(f.out->errors.empty());
  for (int32_t pos0 : {0, 1, 7, 8, 9}) CHECK(f.out->logits.at(pos0) == reference.at(pos0));

  // Checkpoints: every shard's KV rows once K = 2 positions have gathered
  // past its last delta -- [0, 7) after the prompt, [7, 9) after position 8.
  std::vector<actors::kv_delta> of_last;
  std::vector<std::pair<int32_t, int32_t>> ranges0, ranges1;
  for (auto& d : f.out->deltas) {
    (d.index == 0 ? ranges0 : ranges1).emplace_back(d.begin, d.end);
    if (d.index == 1) of_last.push_back(d);
  }
  const std::vector<std::pair<int32_t, int32_t>> want = {{0, 7}, {7, 9}};
  CHECK(ranges0 == want);
  CHECK(ranges1 == want);

  // Stage 1 is lost while position 10 is the next step.
  f.restart_last_stage();
  f.out->logits.clear();
  f.out->logits_order.clear();
  f.out->deltas.clear();

  // A restarted incarnation drops a step of a session it was not restored
  // for (its KV cache would be empty): no logits, no error.
  // (Stage 0 computed it: its own delta [9, 11) goes out.)
  f.step(0, 10, 1);
  CHECK(f.out->logits.empty());
  CHECK(f.out->errors.empty());
  REQUIRE(f.out->deltas.size() == 1);
  CHECK(f.out->deltas[0].index == 0);
  CHECK(f.out->deltas[0].begin == 9);
  CHECK(f.out->deltas[0].end == 11);
  f.out->deltas.clear();

  // Recovery in epoch 1. Restore from the deltas: the chain ends at 9.
  actors::restore_req r;
  r.session = session_id;
  r.epoch = 1;
  for (auto& d : of_last) {
    r.begins.push_back(d.begin);
    r.ends.push_back(d.end);
    r.parts.push_back(d.rows);
  }
  caf::anon_send(f.session, ask_restore_atom::value, f.shards[1], std::move(r));
  f.sched->run();
  CHECK(f.out->restored == std::vector<int32_t>{9});

  // The upstream log cannot serve a range it never sent (past position 11)...
  caf::anon_send(f.session, ask_replay_atom::value, f.shards[0], uint32_t{1}, int32_t{3}, int32_t{12}, int32_t{1});
  f.sched->run();
  // ... and re-sends [9, 10) to stage 1 only, which recomputes it and emits nothing.
  caf::anon_send(f.session, ask_replay_atom::value, f.shards[0], uint32_t{1}, int32_t{9}, int32_t{10}, int32_t{1});
  f.sched->run();
  CHECK(f.out->replayed == std::vector<int>{0, 1});
  CHECK(f.out->logits.empty());
  CHECK(f.out->deltas.empty());  // a replay writes no checkpoint

  // A message of the abandoned epoch 0 reaching the restored shard is dropped.
  actors::activation stale;
  stale.id = step_id{session_id, 0, 10, 1};
  stale.x.data.assign(static_cast<size_t>(f.file->cfg().dim), 0.5f);
  stale.reply_to = f.session;
  caf::anon_send(f.shards[1], std::move(stale));
  f.sched->run();
  CHECK(f.out->logits.empty());
  CHECK(f.out->errors.empty());

  // The step in flight re-sent in epoch 1, then the next one: the logits of
  // the run without the fault, bit for bit.
  f.step(1, 10, 1);
  f.step(1, 11, 1);
  REQUIRE(f.out->errors.empty());
  CHECK(f.out->logits_order == std::vector<int32_t>{10, 11});
  CHECK(f.out->logits.at(10) == reference.at(10));
  CHECK(f.out->logits.at(11) == reference.at(11));
  // The restored shard checkpoints on from where its chain ended.
  std::vector<std::pair<int32_t, int32_t>> after;
  for (auto& d : f.out->deltas)
    if (d.index == 1) after.emplace_back(d.begin, d.end);
  CHECK(after == std::vector<std::pair<int32_t, int32_t>>{{9, 11}});
}

TEST_CASE("shard protocol: activation frames wait for their epoch's CAF activation, then run in order",
          "[shard_protocol][data_plane]") {
  const std::string path = test::shared_file("models/stories260K.bin");
  if (path.empty()) return;
  std::map<int32_t, std::vector<float>> reference;
  {
    pipeline_fixture ref(path);
    for (auto [pos0, count] : steps) ref.step(0, pos0, count);
    REQUIRE(ref.out->errors.empty());
    reference = ref.out->logits;
  }
  // Stage 0's output of every step, as it would go to stage 1; stage 1 is
  // then driven by hand as the two channels could deliver them.
  pipeline_fixture f(path, true);
  for (auto [pos0, count] : steps) f.step(0, pos0, count);
  REQUIRE(f.out->errors.empty());
  REQUIRE(f.out->taps.size() == steps.size());
  const auto taps = f.out->taps;
  CHECK(f.out->logits.empty());
  auto& node1 = *f.nodes[static_cast<size_t>(f.plan.shards[1].node)];
  auto frame = [&](actors::activation a, uint32_t epoch) {  // as the data plane delivers one
    a.id.epoch = epoch;
    a.reply_to = caf::actor{};
    caf::anon_send(f.shards[1], actors::dp_act_atom::value, std::move(a));
    f.sched->run();
  };
  auto through_caf = [&](actors::activation a, uint32_t epoch) {
    a.id.epoch = epoch;
    caf::anon_send(f.shards[1], std::move(a));
    f.sched->run();
  };

  // The prompt's batch as a frame that overtook the epoch's first (CAF)
  // activation: it waits; then both run, the CAF one first.
  frame(taps[1], 0);
  CHECK(f.out->logits.empty());
  CHECK(f.out->errors.empty());
  CHECK(node1.activations_held == 1);
  through_caf(taps[0], 0);
  CHECK(f.out->logits_order == std::vector<int32_t>{0, 1});
  // A later frame of the epoch runs at once, with the epoch's reply_to.
  frame(taps[2], 0);
  CHECK(f.out->logits_order == std::vector<int32_t>{0, 1, 7});

  // A new epoch (a re-sent step): its frame waits for its CAF activation,
  // which runs first; a frame of the older epoch is stale afterwards.
  frame(taps[4], 1);
  CHECK(f.out->logits_order.size() == 3);
  through_caf(taps[3], 1);
  CHECK(f.out->logits_order == std::vector<int32_t>{0, 1, 7, 8, 9});
  frame(taps[5], 0);
  CHECK(f.out->logits_order.size() == 5);

  // Frames of an epoch whose CAF activation never comes: 64 held, the rest
  // dropped and counted; the held ones are dropped when a newer epoch's comes.
  for (int i = 0; i < 70; ++i) frame(taps[5], 2);
  CHECK(node1.activations_held_dropped == 6);
  through_caf(taps[5], 3);
  CHECK(node1.activations_held_dropped == 70);
  CHECK(f.out->logits_order == std::vector<int32_t>{0, 1, 7, 8, 9, 10});
  REQUIRE(f.out->errors.empty());
  for (int32_t pos0 : {0, 1, 7, 8, 9, 10}) CHECK(f.out->logits.at(pos0) == reference.at(pos0));

  // A frame that failed its checksum is reported to the epoch's reply_to, as
  // a corrupt payload that came through CAF (the session re-sends the step).
  actors::activation bad = taps[6];
  bad.x.data.clear();
  bad.x.status = 1;
  frame(bad, 3);
  REQUIRE(f.out->errors.size() == 1);
  CHECK_THAT(f.out->errors[0], Catch::Contains("corrupt activation payload"));
  // The step itself, then a closed session's frames are dropped.
  frame(taps[6], 3);
  CHECK(f.out->logits.at(11) == reference.at(11));
  caf::anon_send(f.shards[1], actors::close_atom::value, session_id);
  f.sched->run();
  frame(taps[6], 4);
  CHECK(f.out->logits_order.size() == 7);
}
