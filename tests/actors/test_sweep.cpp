// `cellshard sweep` (issue #9): a small grid writes a CSV with every column
// and one PNG per metric; points the model cannot be split into are listed.
#include "tests/support.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

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
                  "comm_share,bytes_per_token");
  int rows = 0;
  while (std::getline(csv, line)) {
    ++rows;
    CHECK(std::count(line.begin(), line.end(), ',') == 12);
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
    CHECK(std::count(line.begin(), line.end(), ',') == 12);
  }
  CHECK(rows == 4);
}
