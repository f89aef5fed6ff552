// Concurrent sessions, cancellation freeing KV caches, memory-fit errors.
#include "tests/actors/fixture_runner.hpp"

#include <condition_variable>
#include <future>
#include <mutex>

using namespace cellshard;

TEST_CASE("4 concurrent sessions each reproduce their own fixture", "[actors][sessions]") {
  if (!test::have_shared()) return;
  auto o = test::stories_options(4, "pipeline");
  o.sessions = 4;
  auto c = actors::cluster::start(o);
  REQUIRE(c.ok());
  const auto& cases = test::fixture_cases();
  // Two waves of concurrent requests cover all six fixtures with 4 in flight.
  for (size_t wave = 0; wave < cases.size(); wave += 4) {
    std::vector<std::pair<size_t, std::future<actors::session_outcome>>> futs;
    for (size_t i = wave; i < std::min(cases.size(), wave + 4); ++i) {
      auto p = std::make_shared<std::promise<actors::session_outcome>>();
      futs.emplace_back(i, p->get_future());
      (*c)->submit(test::params_of(cases[i]), {},
                   [p](uint64_t, const actors::session_outcome& out) { p->set_value(out); });
    }
    for (auto& f : futs) {
      REQUIRE(f.second.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
      auto out = f.second.get();
      INFO(cases[f.first].name << ": " << out.error);
      REQUIRE(out.ok);
      CHECK(out.result.ids == test::read_ids(test::shared_file("fixtures/" + cases[f.first].name + ".ids")));
    }
  }
  // Every session freed its KV caches.
  auto st = (*c)->stats();
  REQUIRE(st.ok());
  for (auto& s : *st) {
    CHECK(s.sessions == 0);
    CHECK(s.kv_bytes == 0);
  }
}

// Issue #19: sessions sharing a pipeline overlap (each stage takes the next
// session's step as soon as it is free: every session is its own actor with
// one step in flight, each shard computes on its own worker). A crash or a
// silence of a stage while four different requests are in flight is one
// fault, recovered for every session that had state there: each still gives
// its own fixture, and the faults are recorded once.
TEST_CASE("concurrent sessions on a 3-stage pipeline with a crash or a silence each reproduce their own fixture",
          "[actors][sessions][recovery]") {
  if (!test::have_shared()) return;
  for (const std::string spec : {"crash:node=1:step=30", "silence:node=2:step=40"}) {
    DYNAMIC_SECTION(spec) {
      auto o = test::stories_options(3, "pipeline");
      o.spares = 1;
      o.sessions = 4;
      auto plan = supervision::parse_fault_spec(spec);
      REQUIRE(plan.ok());
      o.faults = {*plan};
      auto c = actors::cluster::start(o);
      REQUIRE(c.ok());
      REQUIRE((*c)->placement().stages.size() == 3);
      const auto& cases = test::fixture_cases();
      std::vector<std::pair<size_t, std::future<actors::session_outcome>>> futs;
      for (size_t i = 0; i < std::min<size_t>(4, cases.size()); ++i) {
        auto p = std::make_shared<std::promise<actors::session_outcome>>();
        futs.emplace_back(i, p->get_future());
        (*c)->submit(test::params_of(cases[i]), {},
                     [p](uint64_t, const actors::session_outcome& out) { p->set_value(out); });
      }
      size_t recovered = 0;
      for (auto& f : futs) {
        REQUIRE(f.second.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
        auto out = f.second.get();
        INFO(cases[f.first].name << ": " << out.error);
        REQUIRE(out.ok);
        CHECK(out.result.ids == test::read_ids(test::shared_file("fixtures/" + cases[f.first].name + ".ids")));
        if (!out.recoveries.empty()) ++recovered;
      }
      CHECK(recovered >= 1);  // the session whose step met the fault, at least
      const auto recs = (*c)->faults();
      REQUIRE(recs.size() == 1);
      CHECK(recs[0].kind == supervision::to_string(plan->kind));
      auto st = (*c)->stats();
      REQUIRE(st.ok());
      for (auto& s : *st) CHECK(s.sessions == 0);
    }
  }
}

TEST_CASE("cancellation reaches every shard and frees its KV cache", "[actors][cancel]") {
  if (!test::have_shared()) return;
  auto c = actors::cluster::start(test::stories_options(4, "hybrid:2x2"));
  REQUIRE(c.ok());
  const auto base = (*c)->node_memory();
  // Cancel from the token callback once 20 tokens have come: the session is
  // certainly mid-generation and every shard holds its KV cache.
  auto done = std::make_shared<std::promise<actors::session_outcome>>();
  auto fut = done->get_future();
  auto count = std::make_shared<int>(0);
  actors::cluster* cl = c->get();
  std::shared_ptr<uint64_t> id = std::make_shared<uint64_t>(0);
  std::mutex mu;
  std::vector<uint64_t> mid_memory;
  model::generation_params gp;
  gp.steps = 256;
  gp.sampling = {0.0f, 0.9f, 1};
  {
    std::lock_guard<std::mutex> lock(mu);
    *id = cl->submit(gp,
                     [&, count, id, cl](uint64_t req, int, const std::string&) {
                       if (++*count == 20) {
                         {
                           std::lock_guard<std::mutex> lock(mu);
                           mid_memory = cl->node_memory();
                         }
                         cl->cancel(req);
                       }
                     },
                     [done](uint64_t, const actors::session_outcome& o) { done->set_value(o); });
  }
  REQUIRE(fut.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  auto out = fut.get();
  CHECK(out.cancelled);
  CHECK_FALSE(out.ok);
  CHECK(out.result.ids.size() >= 21);
  CHECK(out.result.ids.size() < 257);
  {
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(mid_memory.size() == base.size());
    for (size_t n = 0; n < base.size(); ++n) CHECK(mid_memory[n] > base[n]);  // KV held mid-run
  }
  // stats() is answered after each shard's mailbox drained the close message.
  auto st = (*c)->stats();
  REQUIRE(st.ok());
  for (auto& s : *st) {
    CHECK(s.sessions == 0);
    CHECK(s.kv_bytes == 0);
  }
  CHECK((*c)->node_memory() == base);
}

TEST_CASE("a placement that does not fit fails before loading, with the clear error",
          "[actors][memory]") {
  if (!test::have_shared()) return;
  auto o = test::stories_options(2, "pipeline");
  o.memory = 600 * 1024;  // 600 KiB per node: stories260K's halves need more
  auto c = actors::cluster::start(o);
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.message(), Catch::Contains("node 0") && Catch::Contains("needs") &&
                              Catch::Contains("KV cache"));
}

TEST_CASE("limits of a split are clear errors", "[actors][limits]") {
  if (!test::have_shared()) return;
  auto c = actors::cluster::start(test::stories_options(6, "pipeline:6"));
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.message(), Catch::Contains("5 layers"));
  auto t = actors::cluster::start(test::stories_options(5, "tensor:5"));
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.message(), Catch::Contains("4 KV heads"));
  auto h = actors::cluster::start(test::stories_options(4, "hybrid:3x2"));
  REQUIRE_FALSE(h.ok());
  CHECK_THAT(h.message(), Catch::Contains("6 nodes"));
}

TEST_CASE("with a prompt, TTFT ends at the first sampled token and TPOT counts only sampled tokens",
          "[actors][metrics]") {
  if (!test::have_shared()) return;
  const test::fixture_case* fc = nullptr;
  for (const auto& c : test::fixture_cases())
    if (c.name == "greedy_prompt_once_n120") fc = &c;
  REQUIRE(fc);
  auto c = actors::cluster::start(test::stories_options(2, "pipeline"));
  REQUIRE(c.ok());
  auto r = (*c)->generate(test::params_of(*fc));
  REQUIRE(r.ok());
  REQUIRE(r->ok);
  const auto& g = r->result;
  CHECK(g.ids == test::read_ids(test::shared_file("fixtures/greedy_prompt_once_n120.ids")));
  REQUIRE(g.prompt_tokens > 2);
  const size_t sampled = g.ids.size() - static_cast<size_t>(g.prompt_tokens);
  // One TPOT sample per sampled token after the first; none for the prompt.
  CHECK(g.step_ms.size() == sampled - 1);
  // TTFT is the prefill (one batch for the prompt) up to the first sampled token.
  CHECK(g.ttft_ms > 0);
  CHECK(g.ttft_ms < g.duration_ms);
}
