// `cellshard sweep` (issue #9): a small grid writes a CSV with every column
// and one PNG per metric; points the model cannot be split into are listed.
#include "tests/support.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <vector>

using namespace cellshard;

TEST_CASE("a small sweep writes the CSV and the plots", "[sweep]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("sweep") + "/out";
  auto r = test::run_command({test::cellshard_bin(), "sweep", "-m", test::shared_file("models/stories260K.bin"),
                              "-z", test::shared_file("models/tok512.bin"), "-n", "24", "--nodes", "1,2,4,8",
                              "--topology", "pipeline,tensor", "--out", dir},
                             180);
  INFO(r.err);
  REQUIRE(r.status == 0);
  std::istringstream csv(test::read_file(dir + "/sweep.csv"));
  std::string header, line;
  std::getline(csv, header);
  CHECK(header == "model,topology,nodes,stages,tp,link,batch,ttft_ms,tpot_ms_p50,tpot_ms_p99,tokens_per_s,"
                  "comm_share,bytes_per_token,reduce,decode_tokens_per_s,decode_comm_share");
  int rows = 0;
  while (std::getline(csv, line)) {
    ++rows;
    CHECK(std::count(line.begin(), line.end(), ',') == 15);
  }
  // 8 points; pipeline:8 (5 layers) and tensor:8 (4 KV heads) cannot be made.
  CHECK(rows == 6);
  CHECK_THAT(r.err, Catch::Contains("skipped 2 point(s)") && Catch::Contains("pipeline 8 nodes") &&
                        Catch::Contains("tensor 8 nodes"));
  for (const char* png : {"latency", "throughput", "comm_share", "bytes_per_token"}) {
    struct stat st;
    INFO(png);
    REQUIRE(::stat((dir + "/" + png + ".png").c_str(), &st) == 0);
    CHECK(st.st_size > 1000);
    CHECK(test::read_file(dir + "/" + png + ".png").substr(1, 3) == "PNG");
  }
}

TEST_CASE("gguf: a sweep over stories260K.gguf", "[sweep][gguf]") {
  // Issue #16: sweep runs a GGUF model (its own tokenizer, --ctx) as a .bin.
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("sweep-gguf") + "/out";
  auto r = test::run_command({test::cellshard_bin(), "sweep", "-m", test::shared_file("models/gguf/stories260K.gguf"),
                              "--ctx", "512", "-n", "40", "--nodes", "2,4", "--topology", "pipeline,tensor",
                              "--out", dir, "--no-plots"},
                             180);
  INFO(r.err);
  REQUIRE(r.status == 0);
  std::istringstream csv(test::read_file(dir + "/sweep.csv"));
  std::string header, line;
  std::getline(csv, header);
  int rows = 0;
  while (std::getline(csv, line)) {
    ++rows;
    INFO(line);
    CHECK_THAT(line, Catch::StartsWith("stories260K.gguf,"));
    CHECK(std::count(line.begin(), line.end(), ',') == 15);
  }
  CHECK(rows == 4);
}

TEST_CASE("sweep --topology expert: the runtime's expert placement on all N nodes", "[sweep]") {
  // Issue #25: the lab sweeps a mixture of experts as expert:N-1 (one stage
  // shard, N - 1 expert nodes) and the planner calibrates on those rows as
  // pipeline:1,expert:N-1.
  if (!test::have_shared()) return;
  const std::string tmp = test::temp_dir("sweep-expert");
  const std::string model = tmp + "/moe4.gguf", dir = tmp + "/out";
  auto s = test::run_command({test::cellshard_bin(), "synth", "--config", "custom", "--dim", "64", "--hidden", "64",
                              "--layers", "2", "--heads", "4", "--kv-heads", "4", "--vocab", "512", "--seq-len", "64",
                              "--experts", "4", "--experts-used", "2", "-o", model},
                             60);
  INFO(s.err);
  REQUIRE(s.status == 0);
  auto r = test::run_command({test::cellshard_bin(), "sweep", "-m", model, "-z", test::shared_file("models/tok512.bin"),
                              "-n", "8", "--nodes", "1,2,3", "--topology", "expert", "--out", dir, "--no-plots"},
                             180);
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("skipped 1 point(s)") && Catch::Contains("expert 1 nodes") &&
                        Catch::Contains("expert needs 2 or more nodes"));
  std::istringstream csv(test::read_file(dir + "/sweep.csv"));
  std::string header, line;
  std::getline(csv, header);
  std::vector<std::string> lines;
  while (std::getline(csv, line)) lines.push_back(line);
  REQUIRE(lines.size() == 2);
  // model,topology,nodes,stages,tp: one stage whose shards are all N nodes.
  CHECK_THAT(lines[0], Catch::StartsWith("moe4.gguf,expert,2,1,2,none,1,"));
  CHECK_THAT(lines[1], Catch::StartsWith("moe4.gguf,expert,3,1,3,none,1,"));
  // The planner reads the rows as the runtime's placement, with the shape
  // beside the CSV (STEM.config.json; --model is a dense preset here).
  std::ofstream(dir + "/moe4.config.json") << R"({"hidden_size": 64, "moe_intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 64,
    "tie_word_embeddings": true, "num_experts": 4, "num_experts_per_tok": 2, "torch_dtype": "float32"})";
  auto p = test::run_command({test::cellshard_bin(), "plan", "-m", "stories260k", "--nodes", "1", "--baseline", "none",
                              "--calibrate", dir + "/sweep.csv", "--json", tmp + "/plan.json"},
                             120);
  INFO(p.out << p.err);
  REQUIRE(p.status == 0);
  const std::string js = test::read_file(tmp + "/plan.json");
  CHECK_THAT(js, Catch::Contains("pipeline:1,expert:1") && Catch::Contains("pipeline:1,expert:2") &&
                     Catch::Contains("expert_message_overhead_s"));
}

// Issue #25: `sweep --cluster` measures node daemons (the lab's, shaped by tc;
// here two plain daemons on loopback): a point of N nodes uses the first N
// daemons of the file, and --cluster-link names their links in the CSV.
#include "actors/local_daemons.hpp"

TEST_CASE("sweep --cluster: the first N daemons for a point of N nodes", "[sweep][processes]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("sweep-cluster");
  actors::local_daemon_options lo;
  lo.binary = test::cellshard_bin();
  lo.models_dir = test::shared_file("models");
  auto d = actors::local_daemons::start(2, 0, lo);
  REQUIRE(d.ok());
  const std::string cluster = dir + "/cluster.json";
  REQUIRE((*d)->write_cluster_file(cluster).ok());
  const std::string out = dir + "/out";
  auto r = test::run_command({test::cellshard_bin(), "sweep", "--cluster", cluster, "--cluster-link", "1gbit:50us",
                              "-m", test::shared_file("models/stories260K.bin"), "-z",
                              test::shared_file("models/tok512.bin"), "-n", "16", "--nodes", "1,2", "--topology",
                              "pipeline,tensor", "--reduce", "direct,scatter", "--out", out, "--no-plots"},
                             180);
  INFO(r.err);
  REQUIRE(r.status == 0);
  std::istringstream csv(test::read_file(out + "/sweep.csv"));
  std::string header, line;
  std::getline(csv, header);
  std::vector<std::vector<std::string>> rows;
  while (std::getline(csv, line)) {
    std::vector<std::string> cols;
    std::istringstream ls(line);
    for (std::string c; std::getline(ls, c, ',');) cols.push_back(c);
    REQUIRE(cols.size() == 16u);
    rows.push_back(cols);
  }
  REQUIRE(rows.size() == 6u);
  // stories260K: dim 64, 5 layers. Bytes between daemons per token: none on
  // one node; one activation of 64 floats over a 2-stage pipeline; a tensor
  // group of 2 sends the embedding once and, per layer, each rank its
  // partial of two reductions: (1 + 2 x 2 x 5) x 64 x 4 bytes; scattered
  // (issue #19), each rank sends half its partial and half of x per
  // reduction: at T = 2 the same bytes.
  const std::vector<std::string> want_bytes = {"0", "256", "0", "5376", "0", "5376"};
  for (size_t i = 0; i < rows.size(); ++i) {
    INFO(i);
    CHECK(rows[i][0] == "stories260K.bin");
    CHECK(rows[i][1] == (i < 2 ? "pipeline" : "tensor"));
    CHECK(rows[i][13] == (i < 4 ? "direct" : "scatter"));
    CHECK(rows[i][2] == (i % 2 ? "2" : "1"));
    CHECK(rows[i][5] == "1gbit:50us");
    CHECK(std::stod(rows[i][8]) > 0);  // tpot_ms_p50
    CHECK(rows[i][12] == want_bytes[i]);
    // The decode columns: tokens after the first over the decode window, a share.
    CHECK(std::stod(rows[i][14]) > 0);
    CHECK(std::stod(rows[i][15]) >= 0);
    CHECK(std::stod(rows[i][15]) <= 1);
  }

  // Errors: more nodes than the file lists; --link, which shapes in-process
  // nodes only.
  auto many = test::run_command({test::cellshard_bin(), "sweep", "--cluster", cluster, "-m",
                                 test::shared_file("models/stories260K.bin"), "-z", test::shared_file("models/tok512.bin"),
                                 "--nodes", "1,3", "--out", out},
                                60);
  CHECK(many.status == 2);
  CHECK_THAT(many.err, Catch::Contains("--nodes 3") && Catch::Contains("lists only 2 node(s)"));
  auto link = test::run_command({test::cellshard_bin(), "sweep", "--cluster", cluster, "--link", "1gbit:1ms", "-m",
                                 test::shared_file("models/stories260K.bin"), "-z",
                                 test::shared_file("models/tok512.bin"), "--out", out},
                                60);
  CHECK(link.status == 2);
  CHECK_THAT(link.err, Catch::Contains("--cluster-link"));
}
