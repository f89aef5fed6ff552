// Weights shipped to node daemons (issue #17): daemons started with an empty
// --models folder and a fresh --cache get their slices from the front end
// (model/manifest.hpp, actors/weight_server.hpp) and reproduce llama2.c's
// fixture ids and llama.cpp's ids of llama2-small-f32.gguf; a second run
// ships 0 bytes (every slice from the cache); a corrupted cached slice is
// detected, removed and shipped again; chunks shipped with a wrong digest
// are fetched again; a node whose --cache-max cannot hold its slice says so;
// a node whose own copy of the model differs in a tensor it holds is refused
// naming the tensor. Every wait has a deadline; every process is killed and
// reaped by an RAII guard.
#include "tests/net/net_support.hpp"
#include "tests/support.hpp"

#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <sys/stat.h>

using namespace cellshard;

namespace {

/// n daemons, each with an empty --models folder and its own fresh --cache.
struct shipping_daemons {
  std::string dir;
  std::vector<std::string> caches;
  std::vector<std::unique_ptr<test::daemon_process>> nodes;
  shipping_daemons(const std::string& name, int n, const std::vector<std::string>& extra = {})
      : shipping_daemons(name, std::vector<std::vector<std::string>>(static_cast<size_t>(n), extra)) {}
  /// One daemon per entry of `extra`, with those extra flags.
  shipping_daemons(const std::string& name, const std::vector<std::vector<std::string>>& extra) {
    dir = test::temp_dir(name);
    test::run_command({"/bin/rm", "-rf", dir + "/empty", dir + "/cache-0", dir + "/cache-1", dir + "/cache-2",
                       dir + "/cache-3"});
    test::run_command({"/bin/mkdir", "-p", dir + "/empty"});
    for (size_t i = 0; i < extra.size(); ++i) {
      caches.push_back(dir + "/cache-" + std::to_string(i));
      std::vector<std::string> args = {"--models", dir + "/empty", "--cache", caches.back()};
      args.insert(args.end(), extra[i].begin(), extra[i].end());
      nodes.push_back(std::make_unique<test::daemon_process>(dir, args));
      INFO(nodes.back()->log());
      REQUIRE(nodes.back()->ok());
    }
  }
  std::vector<uint16_t> ports() const {
    std::vector<uint16_t> p;
    for (const auto& n : nodes) p.push_back(n->port());
    return p;
  }
  std::string logs() const {
    std::string s;
    for (size_t i = 0; i < nodes.size(); ++i) s += "--- daemon " + std::to_string(i) + ":\n" + nodes[i]->log() + "\n";
    return s;
  }
};

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(test::read_file(path));
  } catch (const std::exception&) {
    return nlohmann::json();
  }
}

/// nodes[] of a run --json by node index: (shipped_bytes, cache_hits).
std::map<int, std::pair<uint64_t, int>> weights_by_node(const nlohmann::json& j) {
  std::map<int, std::pair<uint64_t, int>> out;
  if (!j.is_object() || !j.contains("nodes")) return out;
  for (const auto& n : j["nodes"])
    out[n.value("index", -1)] = {n.value("shipped_bytes", uint64_t{0}), n.value("cache_hits", 0)};
  return out;
}

/// The slice files in a cache folder.
std::vector<std::string> slice_files(const std::string& dir) {
  auto r = test::run_command({"/usr/bin/find", dir, "-name", "*.slice"}, 10);
  std::vector<std::string> out;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

uint64_t size_of(const std::string& p) {
  struct stat sb;
  return ::stat(p.c_str(), &sb) == 0 ? static_cast<uint64_t>(sb.st_size) : 0;
}

test::fixture_case fixture(const std::string& name) {
  for (const auto& c : test::fixture_cases())
    if (c.name == name) return c;
  FAIL("no fixture " << name);
  return {};
}

std::vector<std::string> fixture_run(const test::fixture_case& f, const std::string& cluster, const std::string& json) {
  std::vector<std::string> a = {test::cellshard_bin(), "run", "-m", test::shared_file("models/stories260K.bin"), "-z",
                                test::shared_file("models/tok512.bin"), "-n", std::to_string(f.steps), "-t",
                                std::to_string(f.temperature), "-p", std::to_string(f.topp), "-s",
                                std::to_string(f.seed), "--cluster", cluster, "--topology", "pipeline",
                                "--expect-ids", test::shared_file("fixtures/" + f.name + ".ids"), "--json", json,
                                "-q"};
  if (!f.prompt.empty()) {
    a.push_back("-i");
    a.push_back(f.prompt);
  }
  return a;
}

}  // namespace

TEST_CASE("3 daemons without the model: slices shipped, then cached, a corrupt cached slice shipped again",
          "[net][ship]") {
  if (!test::have_shared()) return;
  shipping_daemons d("net-ship", 3);
  const std::string cluster = test::write_cluster_file(d.dir + "/cluster.json", d.ports());
  const auto f = fixture("greedy_bos_n200");
  const uint64_t file_bytes = size_of(test::shared_file("models/stories260K.bin"));

  // 1. Cold: every node gets its slice from the front end.
  const std::string j1 = d.dir + "/run1.json";
  auto r1 = test::run_command(fixture_run(f, cluster, j1), 120);
  INFO(r1.err << "\n" << d.logs());
  REQUIRE(r1.status == 0);
  // --expect-ids made the run fail (status 1) on any other id.
  auto w1 = weights_by_node(read_json(j1));
  REQUIRE(w1.size() == 3);
  uint64_t shipped = 0;
  for (int i = 0; i < 3; ++i) {
    CHECK(w1[i].first > 0);
    CHECK(w1[i].first < file_bytes);  // a slice, not the file
    CHECK(w1[i].second == 0);
    const auto files = slice_files(d.caches[static_cast<size_t>(i)]);
    REQUIRE(files.size() == 1);
    CHECK(size_of(files[0]) == w1[i].first);
    shipped += w1[i].first;
  }
  // The three stages' slices cover the file's weights once, plus each
  // slice's header and the classifier (tied: the embedding table, held by
  // stage 0 as embedding and stage 2 as classifier); the unused RoPE tables
  // are never shipped.
  CHECK(shipped < 2 * file_bytes);

  // 2. Warm: nothing shipped, every slice from the cache.
  const std::string j2 = d.dir + "/run2.json";
  auto r2 = test::run_command(fixture_run(f, cluster, j2), 120);
  INFO(r2.err << "\n" << d.logs());
  REQUIRE(r2.status == 0);
  auto w2 = weights_by_node(read_json(j2));
  REQUIRE(w2.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(w2[i].first == 0);
    CHECK(w2[i].second == 1);
  }

  // `cellshard status` shows each daemon's cache: one slice of the size
  // shipped in run 1, unbounded, one hit (run 2), the bytes shipped.
  {
    const std::string sj = d.dir + "/status.json";
    auto st = test::run_command({test::cellshard_bin(), "status", "--cluster", cluster, "--json", sj}, 60);
    INFO(st.out << st.err);
    REQUIRE(st.status == 0);
    CHECK_THAT(st.out, Catch::Contains("1 slices, 1 hits"));
    const auto sd = read_json(sj);
    REQUIRE(sd.contains("daemons"));
    REQUIRE(sd["daemons"].size() == 3u);
    for (size_t i = 0; i < 3; ++i) {
      const auto& e = sd["daemons"][i];
      CHECK(e.value("cache_dir", std::string()) == d.caches[i]);
      CHECK(e.value("cache_entries", uint64_t{9}) == 1u);
      CHECK(e.value("cache_bytes", uint64_t{0}) == w1[static_cast<int>(i)].first);
      CHECK(e.value("cache_max_bytes", uint64_t{9}) == 0u);
      CHECK(e.value("cache_hits", uint64_t{9}) == 1u);
      CHECK(e.value("shipped_bytes", uint64_t{0}) == w1[static_cast<int>(i)].first);
    }
  }

  // 3. A byte of node 1's cached slice flipped: detected, shipped again.
  const auto files = slice_files(d.caches[1]);
  REQUIRE(files.size() == 1);
  {
    std::fstream io(files[0], std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(1000);
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 0x04);
    io.seekp(1000);
    io.write(&c, 1);
  }
  const std::string j3 = d.dir + "/run3.json";
  auto r3 = test::run_command(fixture_run(f, cluster, j3), 120);
  INFO(r3.err << "\n" << d.logs());
  REQUIRE(r3.status == 0);
  auto w3 = weights_by_node(read_json(j3));
  CHECK(w3[0].first == 0);
  CHECK(w3[1].first == w1[1].first);
  CHECK(w3[1].second == 0);
  CHECK(w3[2].first == 0);
  CHECK_THAT(d.nodes[1]->log(), Catch::Contains("cache file " + files[0]) && Catch::Contains("fetching the slice again"));

  // 4. Chunks shipped with a wrong digest (test hook): fetched again, same ids.
  shipping_daemons fresh("net-ship-chunks", 1, {});
  const std::string c1 = test::write_cluster_file(fresh.dir + "/cluster.json", fresh.ports());
  auto args = fixture_run(f, c1, fresh.dir + "/run.json");
  args.push_back("--test-corrupt-chunks");
  args.push_back("2");
  auto r4 = test::run_command(args, 120);
  INFO(r4.err << "\n" << fresh.logs());
  CHECK(r4.status == 0);
  CHECK_THAT(fresh.nodes[0]->log(), Catch::Contains("failed its check") && Catch::Contains("shipping it again"));
}

TEST_CASE("3 daemons without the model: llama2-small-f32.gguf's llama.cpp ids", "[net][ship][gguf]") {
  if (!test::have_shared()) return;
  shipping_daemons d("net-ship-gguf", 3);
  const std::string cluster = test::write_cluster_file(d.dir + "/cluster.json", d.ports());
  const auto runs = test::gguf_reference_runs("llama2-small-f32.gguf", d.dir);
  REQUIRE(!runs.empty());
  const auto& run = runs.front();
  for (const std::string topo : {"pipeline", "tensor"}) {
    const std::string json = d.dir + "/" + topo + ".json";
    auto r = test::run_command({test::cellshard_bin(), "run", "-m", test::shared_file("models/gguf/llama2-small-f32.gguf"),
                                "-i", run.prompt, "-t", "0", "-n", std::to_string(run.ids.size() - 1), "--ignore-eos",
                                "-q", "--cluster", cluster, "--topology", topo, "--expect-ids", run.ids_file, "--json",
                                json},
                               120);
    INFO(topo << "\n" << r.err << "\n" << d.logs());
    CHECK(r.status == 0);
    auto w = weights_by_node(read_json(json));
    // Each topology's slices are new to the nodes (pipeline first: all shipped;
    // tensor: other slices, shipped too).
    for (int i = 0; i < 3; ++i) CHECK(w[i].first > 0);
  }
}

TEST_CASE("a daemon whose --cache-max cannot hold its slice says so and is not used", "[net][ship]") {
  if (!test::have_shared()) return;
  // Nodes 1 (a shard holder at first) and 3 (a spare) cannot hold any slice.
  const std::vector<std::string> tiny = {"--cache-max", "1KiB"};
  shipping_daemons d("net-ship-room", {{}, tiny, {}, tiny});
  const auto p = d.ports();
  const std::string cluster =
      test::write_cluster_entries(d.dir + "/cluster.json", {{p[0], false, {}}, {p[1], false, {}}, {p[2], false, {}}, {p[3], true, {}}});
  const auto f = fixture("greedy_bos_n200");
  const std::string json = d.dir + "/run.json";
  auto r = test::run_command(fixture_run(f, cluster, json), 120);
  INFO(r.err << "\n" << d.logs());
  REQUIRE(r.status == 0);  // the ids are the fixture's (--expect-ids)
  for (int i : {1, 3}) {
    CHECK_THAT(r.err, Catch::Contains("warning: node " + std::to_string(i) + " (" + d.nodes[static_cast<size_t>(i)]->address() +
                                      ") not used") &&
                          Catch::Contains("no room for the slice") && Catch::Contains("--cache-max of " + d.caches[static_cast<size_t>(i)] + " is 1024"));
    CHECK(slice_files(d.caches[static_cast<size_t>(i)]).empty());
  }
  CHECK_THAT(r.err, !Catch::Contains("node 0 (" + d.nodes[0]->address() + ") not used"));
  const auto j = read_json(json);
  REQUIRE(j.contains("skipped_nodes"));
  REQUIRE(j["skipped_nodes"].size() == 2u);
  CHECK(j["skipped_nodes"][0].value("index", -1) == 1);
  CHECK(j["skipped_nodes"][1].value("index", -1) == 3);
  CHECK_THAT(j["skipped_nodes"][0].value("reason", std::string()), Catch::Contains("needs"));
  CHECK_THAT(j["skipped_nodes"][1].value("reason", std::string()), Catch::Contains("as a spare"));
  // The model runs on nodes 0 and 2 only, both shipped their slices.
  auto w = weights_by_node(j);
  CHECK(w.size() == 2);
  CHECK(w.count(0) == 1);
  CHECK(w.count(2) == 1);
  CHECK(w[0].first > 0);
  CHECK(w[2].first > 0);
  CHECK(slice_files(d.caches[0]).size() == 1);
  CHECK(slice_files(d.caches[2]).size() == 1);

  // Alone, the node without room leaves nothing to place on: a clear error naming it.
  const std::string alone = test::write_cluster_file(d.dir + "/alone.json", {p[1]});
  auto r2 = test::run_command({test::cellshard_bin(), "run", "-m", test::shared_file("models/stories260K.bin"), "-z",
                               test::shared_file("models/tok512.bin"), "-n", "8", "-t", "0", "-q", "--cluster", alone},
                              60);
  INFO(r2.err);
  CHECK(r2.status == 1);
  CHECK_THAT(r2.err, Catch::Contains("node 0 (" + d.nodes[1]->address() + ") not used") &&
                         Catch::Contains("no room for the slice"));
}
