// The at-scale simulation (topologies/plan_sim.hpp) against the closed form
// of the planner where both apply. No wall-clock assertions: the simulation
// reads no clock; these check simulated quantities only.
#include "topologies/plan_sim.hpp"

#include <catch2/catch.hpp>

#include <cmath>

using namespace cellshard;
using namespace cellshard::topologies;

namespace {

plan_result make_plan(const char* model, const char* hw, int nodes, const char* topo, int batch, int context) {
  plan_request r;
  r.model = *find_model_preset(model);
  r.hw = *find_hardware_preset(hw);
  r.nodes = nodes;
  r.topology = *parse_plan_topology(topo);
  r.batch = batch;
  r.context = context;
  auto p = plan(r);
  REQUIRE(p);
  return *p;
}

}  // namespace

TEST_CASE("failure-free simulation agrees with the closed form", "[planner][sim]") {
  sim_options o;
  o.failure_scale = 0;
  SECTION("stories110m, pipeline of 3 PS3s, batch 1, 3 and 7") {
    for (int batch : {1, 3, 7}) {
      const plan_result p = make_plan("stories110m", "ps3", 3, "pipeline", batch, 1024);
      o.duration_s = 300;
      auto s = simulate(p, o);
      REQUIRE(s);
      INFO("batch " << batch);
      CHECK(s->tokens_per_s == Approx(p.tokens_per_s).epsilon(0.01));
      CHECK(s->token_latency_p50_s == Approx(p.per_token_latency_s).epsilon(0.01));
      CHECK(s->failures == 0);
    }
  }
  SECTION("llama3-8b, hybrid 32x8 on 2,000 PS3s, batch 64") {
    const plan_result p = make_plan("llama3-8b", "ps3", 2000, "hybrid:32x8", 64, 4096);
    o.duration_s = 200;
    auto s = simulate(p, o);
    REQUIRE(s);
    CHECK(s->tokens_per_s == Approx(p.tokens_per_s).epsilon(0.01));
    CHECK(s->token_latency_p50_s == Approx(p.per_token_latency_s).epsilon(0.01));
  }
  SECTION("Kimi K3, expert parallel on 100,000 PS3s, batch 1: one token per chain") {
    const plan_result p = make_plan("kimi-k3", "ps3", 100000, "expert", 1, 4096);
    o.duration_s = 120;
    auto s = simulate(p, o);
    REQUIRE(s);
    CHECK(s->nodes == 100000);
    CHECK(s->stations == static_cast<int>(p.layout.groups.size()));
    CHECK(s->token_latency_p50_s == Approx(p.chain_s).epsilon(1e-6));
    CHECK(s->tokens_per_s == Approx(p.tokens_per_s).epsilon(0.02));
  }
}

TEST_CASE("simulated failures: the fraction of requests that meet one matches 1 - exp(-lambda t)",
          "[planner][sim]") {
  // stories110m on 3 PS3s whose failure rate is raised to 5 per node-hour:
  // lambda = 15/h; a request of 1,000 tokens at ~37 ms lasts ~37 s, so
  // p = 1 - exp(-15/3600 x 37) ~ 14%.
  plan_request r;
  r.model = *find_model_preset("stories110m");
  r.hw = *find_hardware_preset("ps3");
  r.hw.failures_per_year = 5 * 8766.0;
  r.nodes = 6;  // 3 used, 3 spares (they run out; recovery goes on)
  r.topology = *parse_plan_topology("pipeline:3");
  r.batch = 3;
  r.context = 1024;
  r.assume.request_tokens = 1000;
  r.assume.detect_s = 0.05;
  auto p = plan(r);
  REQUIRE(p);
  sim_options o;
  o.duration_s = 4 * 3600;
  o.seed = 7;
  auto s = simulate(*p, o);
  REQUIRE(s);
  CHECK(s->failures > 40);
  CHECK(s->requests_done > 1000);
  CHECK(s->request_failure_fraction == Approx(p->request_failure_probability).margin(0.03));
  // Goodput: lost time = failures x downtime; tokens/s drops by about that share.
  CHECK(s->tokens_per_s == Approx(p->goodput_tokens_per_s).epsilon(0.02));
  CHECK(s->spares_left == 0);
  CHECK(s->spares_exhausted_at_s > 0);
  // The same seed gives the same run.
  auto again = simulate(*p, o);
  REQUIRE(again);
  CHECK(again->tokens == s->tokens);
  CHECK(again->failures == s->failures);
}
