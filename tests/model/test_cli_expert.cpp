// Expert parallelism through the binary (issue #23): `--topology expert:E` and
// `pipeline:P,expert:E` run moe-small-f32.gguf to llama.cpp's greedy ids
// (../shared/models/gguf/gguf-small-reference-ids.json) with the reference
// kernels and the default backend; a synthetic MoE (with and without a
// shared expert) gives the one-node ids on pipeline:2,expert:4 with and
// without replicas; an expert node that crashes or falls silent, with and
// without a replica, changes no id and replays no position; bad input gets
// exit 2 and a message naming the flag.
#include "tests/support.hpp"

#include <nlohmann/json.hpp>

#include <set>

using namespace cellshard;

namespace {

std::vector<int> want_ids(const std::string& prompt) {
  return test::gguf_reference_ids("moe-small-f32.gguf", prompt);
}

std::vector<int> ids_of(const test::command_result& r, const std::string& path) {
  return test::ids_written(r, path);
}

std::vector<std::string> base_run(const std::string& model, int n, const std::string& out) {
  return {test::cellshard_bin(), "run", "-m", model, "-i", "Once upon a time", "-n", std::to_string(n),
          "-t", "0", "--ignore-eos", "--ids-out", out, "-q"};
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

}  // namespace

TEST_CASE("run --topology expert: moe-small-f32.gguf gives llama.cpp's ids on expert placements",
          "[cli][moe][expert]") {
  const auto model = test::shared_file("models/gguf/moe-small-f32.gguf");
  if (model.empty()) return;
  const std::string dir = test::temp_dir("cli-expert");
  const auto want = want_ids("Once upon a time");
  const std::vector<std::vector<std::string>> placements = {
      {"--nodes", "3", "--topology", "expert:2"},
      {"--nodes", "5", "--topology", "expert:4"},
      {"--nodes", "6", "--topology", "pipeline:2,expert:2"},
      {"--nodes", "3", "--topology", "expert:2", "--kernels", "reference"},
      {"--nodes", "5", "--topology", "expert:4", "--kernels", "reference"},
      {"--nodes", "6", "--topology", "pipeline:2,expert:2", "--kernels", "reference"},
      {"--nodes", "5", "--topology", "expert:4", "--expert-replicas", "2", "--batch-size", "3"},
      {"--nodes", "3", "--topology", "expert:2", "--kernels", "blas"},  // native where the build has no OpenBLAS
      {"--nodes", "3", "--topology", "expert:2", "--kernels", "spe"},
  };
  int i = 0;
  for (const auto& extra : placements) {
    const std::string out = dir + "/once" + std::to_string(i++) + ".ids";
    auto a = base_run(model, static_cast<int>(want.size()) - 1, out);
    a.insert(a.end(), extra.begin(), extra.end());
    INFO(join(extra));
    CHECK(ids_of(test::run_command(a), out) == want);
  }
}

TEST_CASE("run --topology expert: weights quantized at load give the one-node ids", "[cli][moe][expert]") {
  const auto model = test::shared_file("models/gguf/moe-small-f32.gguf");
  if (model.empty()) return;
  const std::string dir = test::temp_dir("cli-expert");
  for (const char* w : {"q8_0", "q4_0"}) {
    INFO(w);
    auto one = base_run(model, 40, dir + "/w1.ids");
    auto split = base_run(model, 40, dir + "/w2.ids");
    for (auto* a : {&one, &split}) {
      a->push_back("--weights");
      a->push_back(w);
    }
    for (const char* x : {"--nodes", "7", "--topology", "pipeline:2,expert:2", "--expert-replicas", "2"})
      split.push_back(x);
    const auto want = ids_of(test::run_command(one), dir + "/w1.ids");
    CHECK(want.size() == 41);
    CHECK(ids_of(test::run_command(split), dir + "/w2.ids") == want);
  }
}

TEST_CASE("run --topology expert: --print-placement shows expert nodes and their experts", "[cli][moe][expert]") {
  const auto model = test::shared_file("models/gguf/moe-small-f32.gguf");
  if (model.empty()) return;
  const std::string dir = test::temp_dir("cli-expert");
  auto a = base_run(model, 3, dir + "/pp.ids");
  for (const char* x : {"--nodes", "7", "--topology", "pipeline:2,expert:2", "--expert-replicas", "2",
                        "--print-placement"})
    a.push_back(x);
  const auto r = test::run_command(a);
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("placement pipeline:2,expert:2: 2 stages x (1 + 2 expert nodes, 2 replicas"));
  CHECK_THAT(r.err, Catch::Contains("stage 1 / expert node 1"));
  CHECK_THAT(r.err, Catch::Contains("experts {0,1,2,3,4,5,6,7}"));
  CHECK_THAT(r.err, Catch::Contains("dispatch to [4,5]"));
  CHECK_THAT(r.err, Catch::Contains("spare"));
}

TEST_CASE("run --topology expert: bad input is a usage error naming the flag", "[cli][moe][expert]") {
  const auto moe = test::shared_file("models/gguf/moe-small-f32.gguf");
  const auto dense = test::shared_file("models/gguf/llama2-small-f32.gguf");
  if (moe.empty() || dense.empty()) return;
  const std::string dir = test::temp_dir("cli-expert");
  struct bad_case {
    std::string model;
    std::vector<std::string> extra;
    std::string text;
  };
  const std::vector<bad_case> cases = {
      {dense, {"--nodes", "3", "--topology", "expert:2"}, "needs a mixture-of-experts model"},
      {moe, {"--nodes", "10", "--topology", "expert:9"}, "at most 8"},
      {moe, {"--nodes", "3", "--topology", "expert:2", "--expert-replicas", "3"}, "--expert-replicas 3: expected 1..2"},
      {moe, {"--nodes", "3", "--topology", "pipeline", "--expert-replicas", "2"}, "needs an expert topology"},
      {moe, {"--nodes", "3", "--topology", "expert"}, "expert:4"},
  };
  for (const auto& c : cases) {
    auto a = base_run(c.model, 3, dir + "/bad.ids");
    a.insert(a.end(), c.extra.begin(), c.extra.end());
    INFO(join(c.extra));
    const auto r = test::run_command(a);
    CHECK(r.status == 2);
    CHECK_THAT(r.err, Catch::Contains(c.text));
  }
  // Not enough nodes, and an expert placement that does not fit in memory:
  // clear errors (the placement's).
  auto a = base_run(moe, 3, dir + "/bad.ids");
  for (const char* x : {"--nodes", "5", "--topology", "pipeline:2,expert:2"}) a.push_back(x);
  auto r = test::run_command(a);
  CHECK(r.status == 2);  // usage: the topology needs more nodes than given
  CHECK_THAT(r.err, Catch::Contains("needs 6 nodes"));
  a = base_run(moe, 3, dir + "/bad.ids");
  for (const char* x : {"--nodes", "3", "--topology", "expert:2", "--memory", "4MiB"}) a.push_back(x);
  r = test::run_command(a);
  CHECK(r.status != 0);
  CHECK_THAT(r.err, Catch::Contains("does not fit"));
  CHECK_THAT(r.err, Catch::Contains("experts of each layer"));
}

TEST_CASE("synth MoE on pipeline:2,expert:4: the one-node ids, with and without replicas",
          "[cli][moe][expert][synth]") {
  const auto tok = test::shared_file("models/tok512.bin");
  if (tok.empty()) return;
  const std::string dir = test::temp_dir("cli-expert-synth");
  for (int shared : {0, 1}) {
    const std::string model = dir + "/moe" + std::to_string(shared) + ".gguf";
    auto s = test::run_command({test::cellshard_bin(), "synth", "--config", "custom", "--dim", "64",
                                "--hidden", "32", "--layers", "4", "--heads", "4", "--kv-heads", "2",
                                "--vocab", "512", "--seq-len", "128", "--experts", "6",
                                "--experts-used", "2", "--shared-experts", std::to_string(shared),
                                "-s", "17", "-o", model});
    INFO(s.err);
    REQUIRE(s.status == 0);
    std::vector<int> first;
    const std::vector<std::vector<std::string>> runs = {
        {},
        {"--nodes", "10", "--topology", "pipeline:2,expert:4"},
        {"--nodes", "10", "--topology", "pipeline:2,expert:4", "--expert-replicas", "3"},
        {"--nodes", "7", "--topology", "expert:6", "--expert-replicas", "6", "--batch-size", "1"},
    };
    int i = 0;
    for (const auto& extra : runs) {
      const std::string out = dir + "/s" + std::to_string(shared) + "_" + std::to_string(i++) + ".ids";
      auto a = base_run(model, 40, out);
      a.insert(a.begin() + 4, {"-z", tok});
      a.insert(a.end(), extra.begin(), extra.end());
      INFO("shared " << shared << ": " << join(extra));
      const auto ids = ids_of(test::run_command(a), out);
      CHECK(ids.size() == 41);
      if (first.empty()) first = ids;
      CHECK(ids == first);
    }
  }
}

TEST_CASE("an expert node crashes or falls silent: fixture ids, nothing replayed", "[cli][moe][expert][faults]") {
  const auto model = test::shared_file("models/gguf/moe-small-f32.gguf");
  if (model.empty()) return;
  const std::string dir = test::temp_dir("cli-expert-faults");
  const auto want = want_ids("Once upon a time");
  struct fault_case {
    std::string name;
    std::vector<std::string> extra;
  };
  // Placement indices: 0 the stage shard, 1 and 2 its expert nodes, 3 a spare.
  const std::vector<fault_case> cases = {
      {"crash, no replica", {"--nodes", "3", "--spares", "1", "--topology", "expert:2", "--fault", "crash:node=2:step=12"}},
      {"crash, a replica",
       {"--nodes", "3", "--spares", "1", "--topology", "expert:2", "--expert-replicas", "2", "--fault",
        "crash:node=1:step=12"}},
      {"silence, no replica",
       {"--nodes", "3", "--spares", "1", "--topology", "expert:2", "--fault", "silence:node=1:step=20"}},
      {"silence, a replica",
       {"--nodes", "3", "--spares", "1", "--topology", "expert:2", "--expert-replicas", "2", "--fault",
        "silence:node=2:step=20"}},
  };
  int i = 0;
  for (const auto& c : cases) {
    INFO(c.name);
    const std::string out = dir + "/f" + std::to_string(i) + ".ids";
    const std::string json = dir + "/f" + std::to_string(i++) + ".json";
    auto a = base_run(model, static_cast<int>(want.size()) - 1, out);
    a.insert(a.end(), c.extra.begin(), c.extra.end());
    a.push_back("--json");
    a.push_back(json);
    CHECK(ids_of(test::run_command(a), out) == want);
    const auto j = nlohmann::json::parse(test::read_file(json));
    REQUIRE(j["faults"].size() >= 1);
    for (const auto& f : j["faults"]) {
      INFO(f.dump());
      CHECK(f["replayed_positions"] == 0);
    }
  }
}

TEST_CASE("every fault kind on an expert node (and lost or corrupt dispatches): fixture ids, nothing replayed",
          "[cli][moe][expert][faults]") {
  const auto model = test::shared_file("models/gguf/moe-small-f32.gguf");
  if (model.empty()) return;
  const std::string dir = test::temp_dir("cli-expert-kinds");
  const auto want = want_ids("Once upon a time");
  // Placement indices: 0 the stage shard, 1 and 2 its expert nodes, 3 a spare.
  const std::vector<std::string> faults = {
      "slow:node=1:step=10:ms=5",          // every request of expert node 1 from position 10 held 5 ms
      "drop:node=1:step=10",               // an expert output lost: the request times out, goes again
      "drop:node=0:step=10:n=3",           // expert requests lost on the way out of the stage shard
      "delay:node=2:step=10:ms=300",       // an expert node's link slow for a while
      "corrupt:node=1:step=10",            // an expert output fails its checksum: asked again
      "corrupt:node=0:step=12",            // a request fails its checksum at the expert node
      "partition:node=2:step=10:ms=1500",  // unreachable for 1.5 s
      "silence:node=2:step=0",             // frozen from the prompt on: moved to the spare
      "crash:node=1:step=0",
  };
  int i = 0;
  for (const auto& f : faults)
    for (int replicas : {1, 2}) {
      INFO(f << ", " << replicas << " replica(s)");
      const std::string out = dir + "/k" + std::to_string(i) + ".ids";
      const std::string json = dir + "/k" + std::to_string(i++) + ".json";
      auto a = base_run(model, static_cast<int>(want.size()) - 1, out);
      for (const std::string& x : {std::string("--nodes"), std::string("3"), std::string("--spares"),
                                   std::string("1"), std::string("--topology"), std::string("expert:2"),
                                   std::string("--expert-replicas"), std::to_string(replicas),
                                   std::string("--fault"), f, std::string("--json"), json})
        a.push_back(x);
      CHECK(ids_of(test::run_command(a), out) == want);
      const auto j = nlohmann::json::parse(test::read_file(json));
      CHECK(j["faults"].size() >= 1);
      for (const auto& r : j["faults"]) CHECK(r["replayed_positions"] == 0);
    }
}

TEST_CASE("chaos on expert:2: faults drawn on the expert nodes too, 0 diverged, 0 hung", "[cli][moe][expert][chaos]") {
  const auto model = test::shared_file("models/gguf/moe-small-f32.gguf");
  if (model.empty()) return;
  const std::string json = test::temp_dir("cli-expert-chaos") + "/chaos.json";
  // Placement indices: 0 the stage shard, 1 and 2 its expert nodes, 3 a spare.
  auto r = test::run_command({test::cellshard_bin(), "chaos", "-m", model, "-n", "48", "--runs", "8", "--seed",
                              "4", "--topology", "expert:2", "--nodes", "3", "--spares", "1", "--json", json},
                             240);
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  const auto j = nlohmann::json::parse(test::read_file(json));
  CHECK(j["runs"] == 8);
  CHECK(j["diverged_runs"] == 0);
  CHECK(j["hung_runs"] == 0);
  CHECK(j["failed_runs"] == 0);
  REQUIRE(j["details"].size() == 8);
  // The draws cover every placement index, so expert nodes get faults too.
  std::set<int> faulted;
  for (const auto& d : j["details"])
    for (const auto& f : d["faults"]) faulted.insert(f["node"].get<int>());
  CHECK(faulted.count(1) + faulted.count(2) >= 1);
  CHECK(faulted.count(0) == 1);
}

TEST_CASE("run --json on expert:2: per-expert load, pairs per node, dispatch share", "[cli][moe][expert]") {
  const auto model = test::shared_file("models/gguf/moe-small-f32.gguf");
  if (model.empty()) return;
  const std::string dir = test::temp_dir("cli-expert-metrics");
  const std::string out = dir + "/m.ids", json = dir + "/m.json";
  auto a = base_run(model, 20, out);
  for (const char* x : {"--topology", "expert:2", "--nodes", "3", "--json"}) a.push_back(x);
  a.push_back(json);
  auto r = test::run_command(a);
  INFO(r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(test::read_file(json));
  REQUIRE(j.contains("experts"));
  const auto& e = j["experts"];
  // moe-small-f32.gguf: 4 layers, 8 experts, 2 used (../shared/models/README.md); 20 positions, so
  // 20 x 4 x 2 = 160 (position, layer, expert) pairs, each computed on exactly one expert node.
  REQUIRE(e["load"].size() == 1);  // one stage
  REQUIRE(e["load"][0].size() == 8);
  int load = 0;
  for (const auto& v : e["load"][0]) load += v.get<int>();
  CHECK(load == 160);
  int pairs = 0;
  for (const auto& kv : e["pairs_by_node"].items()) {
    CHECK((kv.key() == "1" || kv.key() == "2"));  // the expert nodes, never the stage shard
    pairs += kv.value().get<int>();
  }
  CHECK(pairs == 160);
  CHECK(e["redispatched"] == 0);
  CHECK(e["dispatch_combine_share"].get<double>() > 0);
  CHECK(e["dispatch_combine_share"].get<double>() <= 1);
  REQUIRE(j["nodes"].size() == 3);
  for (int n = 1; n <= 2; ++n) CHECK(j["nodes"][n]["bytes_received"].get<double>() > 0);
}
