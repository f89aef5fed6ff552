// CLI.md: "--json FILE (- for stdout) on every command: the machine-readable
// result". Each command that lacked it (tokenize, synth, certs, sweep, and the
// daemons node and serve, which write their address once they listen) writes
// its result as JSON, checked here against what the command printed or did.
#include "tests/serve/serve_support.hpp"

#include <fstream>
#include <sstream>

using namespace cellshard;
using json = nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

}  // namespace

TEST_CASE("every command takes --json FILE: tokenize, synth, certs, sweep, node and serve", "[cli][processes]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("cli-json");
  const std::string models = test::private_models(dir);
  const std::string model = models + "/stories260K.bin", tok = models + "/tok512.bin";
  const std::string bin = test::cellshard_bin();

  // tokenize: the ids it printed, and back.
  auto t = test::run_command({bin, "tokenize", "-m", model, "-z", tok, "-i", "Once upon", "--json", dir + "/tok.json"});
  REQUIRE(t.status == 0);
  const auto tj = read_json(dir + "/tok.json");
  std::string ids;
  for (const auto& id : tj["ids"]) ids += (ids.empty() ? "" : " ") + std::to_string(id.get<int>());
  CHECK(ids + "\n" == t.out);
  CHECK(tj["text"] == "Once upon");
  auto d = test::run_command({bin, "tokenize", "-m", model, "-z", tok, "--decode", ids, "--json", "-"});
  REQUIRE(d.status == 0);
  CHECK(json::parse(d.out.substr(d.out.find('{')))["text"] == "Once upon");

  // synth: the file it wrote, its size and shape.
  auto s = test::run_command({bin, "synth", "--config", "custom", "--layers", "2", "-s", "5", "-o", dir + "/s.bin",
                              "--json", dir + "/synth.json"});
  REQUIRE(s.status == 0);
  const auto sj = read_json(dir + "/synth.json");
  CHECK(sj["format"] == "llama2.c");
  CHECK(sj["config"]["layers"] == 2);
  CHECK(sj["seed"] == 5);
  std::ifstream sf(dir + "/s.bin", std::ios::binary | std::ios::ate);
  CHECK(static_cast<long long>(sf.tellg()) == sj["bytes"].get<long long>());

  // certs: the files it made.
  auto c = test::run_command({bin, "certs", dir + "/pki", "--json", dir + "/certs.json"}, 60);
  REQUIRE(c.status == 0);
  const auto cj = read_json(dir + "/certs.json");
  for (const char* f : {"ca", "node", "client"}) {
    CHECK(std::ifstream(cj["files"][f]["certificate"].get<std::string>()).good());
    CHECK(std::ifstream(cj["files"][f]["key"].get<std::string>()).good());
  }

  // sweep: one row per point, as in the CSV.
  auto w = test::run_command({bin, "sweep", "-m", model, "-z", tok, "--nodes", "1,2", "--topology", "pipeline", "-n",
                              "8", "--no-plots", "--out", dir + "/sweep", "--json", dir + "/sweep.json"},
                             120);
  INFO(w.err);
  REQUIRE(w.status == 0);
  const auto wj = read_json(dir + "/sweep.json");
  REQUIRE(wj["rows"].size() == 2);
  CHECK(wj["rows"][0]["nodes"] == 1);
  CHECK(wj["rows"][1]["nodes"] == 2);
  CHECK(wj["rows"][1]["bytes_per_token"].get<double>() > 0);
  CHECK(wj["failed"].empty());

  // node and serve: the address they print first, once they listen.
  {
    test::child node({bin, "node", "--listen", "127.0.0.1:0", "--models", models, "--json", dir + "/node.json"},
                     dir + "/node.err");
    const auto nj = read_json(dir + "/node.json");
    CHECK(nj["listening"] == "127.0.0.1:" + std::to_string(node.port()));
    CHECK(nj["pid"] == node.pid());
  }
  {
    test::child srv({bin, "serve", "-m", model, "-z", tok, "--listen", "127.0.0.1:0", "--json", dir + "/serve.json"},
                    dir + "/serve.err");
    const auto vj = read_json(dir + "/serve.json");
    CHECK(vj["listening"] == "127.0.0.1:" + std::to_string(srv.port()));
    CHECK(vj["pid"] == srv.pid());
    CHECK(vj["model"] == "stories260K");
    CHECK(vj["scheme"] == "http");
  }
}
