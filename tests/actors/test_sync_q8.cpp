// --sync q8_0 (issue #19): tensor groups' partial sums rounded onto the q8_0
// grid before they travel. A tolerance mode: the ids are not llama2.c's
// exactly. What is asserted: f32 sync stays exact (the other fixture tests),
// a q8_0 run repeats bit for bit, the bytes a rank sends are the q8_0 block
// sizes, and the generated ids agree with the fixtures at least at the rate
// docs/distributed.md documents (measured on this model, printed by the test).
#include "tests/actors/fixture_runner.hpp"

#include "topologies/placement.hpp"

#include <cstdio>
#include <string>

using namespace cellshard;

namespace {
/// Sampled ids (after the `prompt` BOS and prompt ids) equal to the
/// fixture's, counted up to the first difference (a generation that diverges
/// once follows its own path from there, so later matches are not counted).
size_t agreeing_prefix(const std::vector<int>& got, const std::vector<int>& want, size_t prompt) {
  size_t i = prompt;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return i - prompt;
}
}  // namespace

TEST_CASE("sync q8_0 on tensor 2, 3, 4 and hybrid 2x2 agrees with the fixtures at the documented rate",
          "[actors][fixtures][sync]") {
  if (!test::have_shared()) return;
  struct topo {
    int nodes;
    const char* topology;
  };
  const topo topos[] = {{2, "tensor"}, {3, "tensor"}, {4, "tensor"}, {4, "hybrid:2x2"}};
  const auto& fixtures = test::fixture_cases();
  size_t greedy_total = 0, greedy_agree = 0, all_total = 0, all_agree = 0;
  int greedy_exact = 0, greedy_runs = 0;
  for (const auto& t : topos) {
    for (const char* reduce : {"direct", "scatter"}) {
      auto o = test::stories_options(t.nodes, t.topology);
      o.reduce = reduce;
      o.sync = "q8_0";
      auto c = actors::cluster::start(o);
      REQUIRE(c.ok());
      const auto& plan = (*c)->placement();
      for (const auto& sh : plan.shards)
        for (const auto& op : sh.program)
          if (op.op == topologies::shard_op::reduce) CHECK(op.sync == topologies::sync_format::q8_0);
      std::string line;
      for (const auto& fc : fixtures) {
        auto r = (*c)->generate(test::params_of(fc));
        REQUIRE(r.ok());
        INFO(t.topology << " " << reduce << " " << fc.name << ": " << r->error);
        REQUIRE(r->ok);
        const auto want = test::read_ids(test::shared_file("fixtures/" + fc.name + ".ids"));
        const size_t prompt = static_cast<size_t>(r->result.prompt_tokens);
        REQUIRE(want.size() > prompt);
        const size_t agree = agreeing_prefix(r->result.ids, want, prompt);
        all_total += want.size() - prompt;
        all_agree += agree;
        line += " " + std::to_string(agree) + "/" + std::to_string(want.size() - prompt);
        if (fc.temperature == 0.0f) {
          greedy_total += want.size() - prompt;
          greedy_agree += agree;
          ++greedy_runs;
          if (r->result.ids == want) ++greedy_exact;
        }
        // The same run again: every rank summed the same rounded values in
        // rank order, so the ids repeat exactly.
        auto again = (*c)->generate(test::params_of(fc));
        REQUIRE(again.ok());
        REQUIRE(again->ok);
        CHECK(again->result.ids == r->result.ids);
      }
      std::printf("--sync q8_0 %s:%d %s, sampled ids agreeing per fixture:%s\n", t.topology, t.nodes, reduce,
                  line.c_str());
    }
  }
  const double greedy_rate = static_cast<double>(greedy_agree) / static_cast<double>(greedy_total);
  const double all_rate = static_cast<double>(all_agree) / static_cast<double>(all_total);
  std::printf("--sync q8_0 on stories260K: greedy fixtures %d of %d runs exact, %.4f of their ids agree "
              "(%zu of %zu); all fixtures %.4f (%zu of %zu)\n",
              greedy_exact, greedy_runs, greedy_rate, greedy_agree, greedy_total, all_rate, all_agree, all_total);
  // The documented rates (docs/distributed.md, "--sync q8_0"), measured on
  // x86-64 with the native kernels (2026-12-02): 16 of 24 greedy runs exact,
  // 2784 of 3200 greedy ids (0.870) and 4121 of 7616 ids of all fixtures
  // (0.541) before the first difference. The runs are deterministic, so
  // these are floors, not averages.
  CHECK(greedy_exact >= 16);
  CHECK(greedy_rate >= 0.87);
  CHECK(all_rate >= 0.54);
}

// The bytes a rank > 0 of a tensor group sends per reduce are the q8_0
// blocks' (34 per 32 floats), against 4 per float with f32 sync.
TEST_CASE("sync q8_0 sends q8_0 blocks", "[actors][sync]") {
  if (!test::have_shared()) return;
  const auto& fc = test::fixture_cases().front();
  uint64_t sent[2] = {0, 0};
  int dim = 0, layers = 0;
  for (int q = 0; q < 2; ++q) {
    auto o = test::stories_options(2, "tensor");
    o.sync = q ? "q8_0" : "f32";
    auto c = actors::cluster::start(o);
    REQUIRE(c.ok());
    const auto& plan = (*c)->placement();
    dim = plan.config.dim;
    const int probe = plan.stages.back().shards.back();
    layers = plan.shards[static_cast<size_t>(probe)].layers.size();
    auto r = (*c)->generate(test::params_of(fc));
    REQUIRE(r.ok());
    REQUIRE(r->ok);
    auto st = (*c)->stats();
    REQUIRE(st.ok());
    for (const auto& s : *st)
      if (s.index == probe)
        for (size_t i = 0; i < s.link_to.size(); ++i)
          if (s.link_to[i] == plan.shards[static_cast<size_t>(plan.stages.back().shards.front())].node)
            sent[q] += s.link_bytes[i];
  }
  INFO("f32 " << sent[0] << " B, q8_0 " << sent[1] << " B, dim " << dim);
  REQUIRE(sent[0] > 0);
  const uint64_t f32_reduce = 2ull * layers * dim * 4, q8_reduce = 2ull * layers * ((dim + 31) / 32 * 34);
  // Rank 1 of 2 sends only its partial sums to rank 0: whole positions' worth
  // in both formats, and the same number of positions.
  CHECK(sent[0] % f32_reduce == 0);
  CHECK(sent[1] % q8_reduce == 0);
  CHECK(sent[0] / f32_reduce == sent[1] / q8_reduce);
}
