// A shard answers a liveness probe in the middle of a step (issue #15: "the
// shard actor stays responsive while a step computes (it can answer a
// liveness probe mid-step)"). Real scheduler, real worker threads: a
// pipeline:2 of stories260K whose shards' workers pass every job through a
// compute_gate (actors/compute_gate.hpp, test-only). The gate holds the
// step's compute on the worker; while it is held, the shard answers the
// supervisor's suspicion probe (alive_atom, supervision/suspicion.hpp's
// direct probe; the indirect one relays the same message) and the session's
// step probe says the step is being worked on; released, the step's logits
// are bit-identical to one engine's. Every wait has a deadline; nothing is
// timed or slept.
// The second case holds two sessions' steps in the two stages at once
// (issue #19: pipelines overlap sessions).
#include "actors/compute_gate.hpp"
#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "actors/recovery.hpp"
#include "actors/shard.hpp"
#include "kernels/backend.hpp"
#include "model/checkpoint.hpp"
#include "model/transformer.hpp"
#include "topologies/placement.hpp"
#include "topologies/profile.hpp"

#include "tests/support.hpp"

#include <catch2/catch.hpp>

#include <caf/all.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <vector>

using namespace cellshard;

namespace {

// A pipeline:2 of `file` on the real scheduler of `sys`, each shard's worker
// passing its jobs through a compute_gate of its own (armed for `arm` jobs: 0
// leaves it to the test).
struct gated_pipeline {
  std::optional<topologies::placement> plan;
  std::vector<std::shared_ptr<actors::compute_gate>> gates;
  std::vector<caf::actor> shards;
};

gated_pipeline spawn_gated_pipeline(caf::actor_system& sys, const std::shared_ptr<const model::model_file>& file,
                                    const kernels::backend* be, int arm) {
  gated_pipeline g;
  auto plan = topologies::place(file->cfg(), topologies::make_nodes(2, topologies::host_profile()),
                                topologies::parse_strategy("pipeline:2").value());
  REQUIRE(plan.ok());
  REQUIRE(plan->shards.size() == 2);
  g.plan = plan.value();
  for (int i = 0; i < 2; ++i) {
    const auto& placed = g.plan->shards[static_cast<size_t>(i)];
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
    auto node = std::make_shared<actors::node_state>();
    node->index = placed.node;
    actors::shard_init init;
    init.index = i;
    init.stage = placed.stage;
    init.rank = placed.rank;
    init.group_size = placed.group_size;
    init.checkpoint_every = 0;
    init.weights = w.value();
    init.backend = be;
    init.node = node;
    g.gates.push_back(std::make_shared<actors::compute_gate>());
    if (arm > 0) g.gates.back()->arm(arm);
    init.gate = g.gates.back();
    g.shards.push_back(actors::spawn_shard(sys, std::move(init)));
  }
  return g;
}

}  // namespace

TEST_CASE("a shard answers liveness and step probes while its worker is held mid-step", "[resilience][liveness]") {
  const std::string path = test::shared_file("models/stories260K.bin");
  if (path.empty()) return;
  auto f = model::model_file::open(path);
  REQUIRE(f.ok());
  const auto file = f.value();
  const kernels::backend* be = kernels::choose_backend("native").be;
  REQUIRE(be);

  // The step: a 7-token prompt from position 0 as one batch.
  const std::vector<int32_t> tokens = {1, 50, 60, 70, 80, 90, 100};
  const int n = static_cast<int>(tokens.size());
  std::vector<float> want;
  {
    auto w = model::shard_weights::make(file, model::slice_spec::whole(file->cfg()));
    REQUIRE(w.ok());
    model::engine eng(*w, *be);
    std::vector<int> t(tokens.begin(), tokens.end());
    const float* l = eng.prefill(t.data(), n, 0);
    want.assign(l, l + file->cfg().vocab_size);
  }

  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto gp = spawn_gated_pipeline(sys, file, be, 1);  // the first job of the step: its layers
  auto& plan = gp.plan;
  auto& gates = gp.gates;
  auto& shards = gp.shards;
  const std::vector<int> node_of = {plan->shards[0].node, plan->shards[1].node};
  REQUIRE(node_of == std::vector<int>{0, 1});
  for (int i = 0; i < 2; ++i)
    caf::anon_send(shards[static_cast<size_t>(i)], actors::wire_atom::value,
                   actors::wiring_of(*plan, node_of, shards, i));

  caf::scoped_actor session{sys};
  const auto deadline = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(30); };
  constexpr uint64_t sid = 11;
  actors::forward_req r;
  r.id = actors::step_id{sid, 0, 0, n};
  r.tokens = tokens;
  r.reply_to = session;
  caf::anon_send(shards[0], std::move(r));

  // Probes the shard at placement index i as the coordinator's suspicion
  // probe does (alive) and as the session's step probe does (step_query).
  auto probe = [&](int i, int32_t want_working) {
    bool answered = false;
    session->request(shards[static_cast<size_t>(i)], std::chrono::seconds(5), actors::alive_atom::value)
        .receive([&](actors::alive_atom, int32_t node) {
                   answered = true;
                   CHECK(node == i);
                 },
                 [&](caf::error& e) { FAIL("alive probe of shard " << i << ": " << sys.render(e)); });
    CHECK(answered);
    int32_t working = -1;
    session
        ->request(shards[static_cast<size_t>(i)], std::chrono::seconds(5), actors::step_query_atom::value, sid,
                  uint32_t{0}, int32_t{0})
        .receive([&](int32_t w, int64_t) { working = w; },
                 [&](caf::error& e) { FAIL("step probe of shard " << i << ": " << sys.render(e)); });
    CHECK(working == want_working);
  };

  // Stage 0's layers are held on its worker: both shards answer; stage 0
  // says it works on the step, stage 1 has not seen it yet.
  REQUIRE(gates[0]->wait_held(deadline()));
  probe(0, 1);
  probe(1, 0);
  CHECK(gates[0]->holding());  // still mid-step after the probes
  CHECK_FALSE(gates[1]->holding());
  gates[0]->release();

  // Stage 1's layers are held: it answers and says it works on the step.
  REQUIRE(gates[1]->wait_held(deadline()));
  probe(1, 1);
  probe(0, 0);
  CHECK(gates[1]->holding());
  gates[1]->release();

  // The step ends: the logits of one engine, bit for bit.
  std::vector<float> got;
  bool done = false;
  while (!done) {
    session->receive(
        [&](actors::logits_msg& m) {
          CHECK(m.id.pos0 == 0);
          CHECK(m.id.count == n);
          CHECK(m.vocab_begin == 0);
          got = m.logits.data;
          done = true;
        },
        [&](actors::shard_error& e) { FAIL("shard error: " << e.message); },
        caf::after(std::chrono::seconds(30)) >> [&] { FAIL("no logits within 30 s"); });
  }
  REQUIRE(got.size() == want.size());
  CHECK(got == want);
  CHECK(gates[0]->held() == 1);
  CHECK(gates[1]->held() == 1);

  for (auto& a : shards) caf::anon_send_exit(a, caf::exit_reason::kill);
}

// Issue #19, "pipelines overlap": while stage 1 computes session A's step,
// stage 0 takes session B's. The gates make the moment certain without any
// timing: stage 1's worker holds A's layers; B's step then reaches stage 0,
// whose worker holds B's layers, so both stages are in the middle of a step
// of a different session at once (each answers the step probe for its
// session). Released, both sessions' logits equal one engine's, bit for bit.
TEST_CASE("pipeline stages compute steps of two sessions at the same time", "[resilience][liveness][sessions]") {
  const std::string path = test::shared_file("models/stories260K.bin");
  if (path.empty()) return;
  auto f = model::model_file::open(path);
  REQUIRE(f.ok());
  const auto file = f.value();
  const kernels::backend* be = kernels::choose_backend("native").be;
  REQUIRE(be);

  const std::vector<int32_t> tokens_a = {1, 50, 60, 70, 80}, tokens_b = {1, 400, 300, 200, 100, 90, 7};
  auto engine_logits = [&](const std::vector<int32_t>& tokens) {
    auto w = model::shard_weights::make(file, model::slice_spec::whole(file->cfg()));
    REQUIRE(w.ok());
    model::engine eng(*w, *be);
    std::vector<int> t(tokens.begin(), tokens.end());
    const float* l = eng.prefill(t.data(), static_cast<int>(t.size()), 0);
    return std::vector<float>(l, l + file->cfg().vocab_size);
  };
  const std::vector<float> want_a = engine_logits(tokens_a), want_b = engine_logits(tokens_b);

  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto gp = spawn_gated_pipeline(sys, file, be, 0);
  auto& plan = gp.plan;
  auto& gates = gp.gates;
  auto& shards = gp.shards;
  const std::vector<int> node_of = {plan->shards[0].node, plan->shards[1].node};
  for (int i = 0; i < 2; ++i)
    caf::anon_send(shards[static_cast<size_t>(i)], actors::wire_atom::value,
                   actors::wiring_of(*plan, node_of, shards, i));

  caf::scoped_actor session{sys};
  const auto deadline = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(30); };
  constexpr uint64_t sid_a = 21, sid_b = 22;
  auto send_step = [&](uint64_t sid, const std::vector<int32_t>& tokens) {
    actors::forward_req r;
    r.id = actors::step_id{sid, 0, 0, static_cast<int32_t>(tokens.size())};
    r.tokens = tokens;
    r.reply_to = session;
    caf::anon_send(shards[0], std::move(r));
  };
  auto working_on = [&](int i, uint64_t sid) {
    int32_t working = -1;
    session
        ->request(shards[static_cast<size_t>(i)], std::chrono::seconds(5), actors::step_query_atom::value, sid,
                  uint32_t{0}, int32_t{0})
        .receive([&](int32_t w, int64_t) { working = w; },
                 [&](caf::error& e) { FAIL("step probe of shard " << i << ": " << sys.render(e)); });
    return working;
  };

  // Session A passes stage 0 and is held in stage 1's layers.
  gates[1]->arm(1);
  send_step(sid_a, tokens_a);
  REQUIRE(gates[1]->wait_held(deadline()));
  // Session B's step reaches stage 0 while A is held at stage 1, and is held in stage 0's layers.
  gates[0]->arm(1);
  send_step(sid_b, tokens_b);
  REQUIRE(gates[0]->wait_held(deadline()));
  CHECK(gates[1]->holding());  // both stages mid-step, on different sessions
  CHECK(working_on(0, sid_b) == 1);
  CHECK(working_on(1, sid_a) == 1);
  CHECK(working_on(1, sid_b) == 0);  // B has not reached stage 1
  gates[1]->release();
  gates[0]->release();

  std::map<uint64_t, std::vector<float>> got;
  while (got.size() < 2) {
    bool timed_out = false;
    session->receive(
        [&](actors::logits_msg& m) {
          CHECK(m.id.pos0 == 0);
          got[m.id.session] = m.logits.data;
        },
        [&](actors::shard_error& e) { FAIL("shard error: " << e.message); },
        caf::after(std::chrono::seconds(30)) >> [&] { timed_out = true; });
    REQUIRE_FALSE(timed_out);
  }
  CHECK(got[sid_a] == want_a);
  CHECK(got[sid_b] == want_b);
  CHECK(gates[0]->held() == 1);
  CHECK(gates[1]->held() == 1);

  for (auto& a : shards) caf::anon_send_exit(a, caf::exit_reason::kill);
}
