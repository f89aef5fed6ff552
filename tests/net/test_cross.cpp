// A big-endian node in the cluster (issue #24, docs/cell.md): the cellshard
// daemon cross-built for s390x (64-bit big-endian) by
// `scripts/cross-build.sh s390x OUTDIR`, run under qemu-s390x-static beside
// x86 daemons on loopback, with an x86 front end. Every run must reproduce
// the llama2.c fixture ids and text:
//   - a pipeline of 3 and a tensor group of 3, one node big-endian (the
//     activation and partial-sum blobs cross byte orders both ways);
//   - the big-endian daemon SIGKILLed mid-generation: its shard restored on an
//     x86 spare from the KV checkpoints it wrote; and the other way round;
//   - a journal written by a big-endian front end resumed on x86, and the
//     other way round;
//   - the same group with mutual TLS on every link (certificates made on x86).
//
// The tests run when the environment variable CELLSHARD_CROSS_S390X names the
// cross build's OUTDIR (CI's cross phase sets it) and qemu-s390x-static is
// installed; otherwise they are skipped with a message, and FAIL when CI is
// set and CELLSHARD_CROSS_S390X was given (the cross build was requested).
//
// Every process is owned by an RAII guard that SIGKILLs and reaps it; every
// wait has a deadline; "mid-generation" is a byte count of the front end's
// stdout (from the fixture's ids), never a sleep.
#include "tests/net/net_support.hpp"
#include "tests/support.hpp"

#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <sys/stat.h>

using namespace cellshard;

namespace {

constexpr double run_deadline_s = 240;  // one front end over a QEMU node, start to exit
constexpr int K = 12;                   // act after the K-th generated token

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

/// The command that runs the s390x cellshard under QEMU, or {} after a skip
/// message (a failure when CI is set and the cross build was requested).
std::vector<std::string> s390x_command() {
  const char* dir = std::getenv("CELLSHARD_CROSS_S390X");
  if (!dir || !*dir) {
    WARN("skipped: set CELLSHARD_CROSS_S390X=OUTDIR of `scripts/cross-build.sh s390x OUTDIR` "
         "to run the big-endian node tests");
    return {};
  }
  const std::string out = dir;
  const std::string bin = out + "/build/tools/cellshard";
  const std::string sysroot = out + "/sysroot";
  std::string qemu;
  for (const char* d : {"/usr/bin/", "/usr/local/bin/"})
    if (exists(std::string(d) + "qemu-s390x-static")) qemu = std::string(d) + "qemu-s390x-static";
  std::string missing;
  if (qemu.empty()) missing = "qemu-s390x-static (scripts/install-deps.sh --cross)";
  else if (!exists(bin)) missing = bin + " (scripts/cross-build.sh s390x " + out + ")";
  else if (!exists(sysroot + "/lib/ld64.so.1")) missing = sysroot + "/lib/ld64.so.1";
  if (!missing.empty()) {
    if (std::getenv("CI")) FAIL("CELLSHARD_CROSS_S390X is set but " << missing << " is missing");
    WARN("skipped: " << missing << " is missing");
    return {};
  }
  return {qemu, "-L", sysroot, bin};
}

struct fixture {
  test::fixture_case fc;
  std::string ids_file, text;
  std::vector<size_t> offsets;  // stdout bytes once k tokens were printed
};

fixture load_fixture(const std::string& name) {
  fixture f;
  for (const auto& c : test::fixture_cases())
    if (c.name == name) f.fc = c;
  REQUIRE(f.fc.name == name);
  f.ids_file = test::shared_file("fixtures/" + name + ".ids");
  f.text = test::read_file(test::shared_file("fixtures/" + name + ".txt"));
  f.offsets = test::fixture_text_offsets(f.ids_file, test::shared_file("models/tok512.bin"));
  REQUIRE(f.offsets.back() + 1 == f.text.size());
  return f;
}

/// `run` arguments (after the program) for fixture `f` with `more` appended.
std::vector<std::string> run_args(const fixture& f, const std::vector<std::string>& more) {
  std::vector<std::string> a = {"run", "-m", test::shared_file("models/stories260K.bin"), "-z",
                                test::shared_file("models/tok512.bin"), "-n", std::to_string(f.fc.steps),
                                "-t", std::to_string(f.fc.temperature), "-p", std::to_string(f.fc.topp),
                                "-s", std::to_string(f.fc.seed), "--expect-ids", f.ids_file};
  if (!f.fc.prompt.empty()) a.insert(a.end(), {"-i", f.fc.prompt});
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

/// Daemons on loopback; node i is the s390x one under QEMU when be[i].
struct mixed_cluster {
  std::string dir;
  std::vector<std::unique_ptr<test::daemon_process>> nodes;
  mixed_cluster(const std::string& name, const std::vector<bool>& be, const std::vector<std::string>& qemu,
                const std::vector<std::string>& extra = {}) {
    dir = test::temp_dir(name);
    std::vector<std::string> args = {"--models", test::shared_file("models")};
    args.insert(args.end(), extra.begin(), extra.end());
    for (bool b : be) {
      nodes.push_back(std::make_unique<test::daemon_process>(dir, args, b ? 120 : 20,
                                                             b ? qemu : std::vector<std::string>{}));
      INFO(nodes.back()->log());
      REQUIRE(nodes.back()->ok());
    }
  }
  std::string cluster_file(int spares) const {
    std::vector<test::cluster_entry> e;
    for (size_t i = 0; i < nodes.size(); ++i)
      e.push_back({nodes[i]->port(), i + static_cast<size_t>(spares) >= nodes.size(), ""});
    return test::write_cluster_entries(dir + "/cluster.json", e);
  }
  std::string logs() const {
    std::string s;
    for (size_t i = 0; i < nodes.size(); ++i)
      s += "--- daemon " + std::to_string(i) + " (" + nodes[i]->address() + "):\n" + nodes[i]->log() + "\n";
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

/// Kills node `victim` of `c` after K tokens of a pipeline run of `f` over
/// nodes 0..2 with node 3 the spare; the run must end with the fixture text
/// and record that placement index `victim` moved to node 3.
void kill_and_restore(const mixed_cluster& c, int victim) {
  const fixture f = load_fixture("greedy_prompt_lily_tom_n100");
  const std::string json = c.dir + "/run.json";
  test::front_end_process fe(run_args(
      f, {"--cluster", c.cluster_file(1), "--topology", "pipeline", "--json", json, "--fault",
          "slow:node=0:step=0:ms=20"}));
  REQUIRE(fe.started());
  // K tokens after the prompt's.
  const size_t at = f.offsets[std::min(f.offsets.size() - 1, static_cast<size_t>(K) + 12)];
  const bool reached = fe.wait_for_stdout_bytes(at, 120);
  INFO("front end stderr:\n" << fe.err() << "\n" << c.logs());
  REQUIRE(reached);
  c.nodes[static_cast<size_t>(victim)]->signal(SIGKILL);
  const int status = fe.wait(run_deadline_s);
  INFO("front end stderr:\n" << fe.err() << "\n" << c.logs());
  CHECK(status == 0);
  CHECK(fe.out() == f.text);
  const auto j = read_json(json);
  INFO("json: " << j.dump(1));
  bool moved = false;
  if (j.is_object() && j.contains("faults"))
    for (const auto& r : j["faults"])
      if (r.value("node", -1) == victim && r.value("moved_to_node", -1) == 3) moved = true;
  CHECK(moved);
  CHECK(j.value("diverged", true) == false);
}

}  // namespace

TEST_CASE("an s390x daemon beside two x86 daemons: fixture ids as a pipeline of 3 and a tensor group of 3",
          "[net][cross]") {
  if (!test::have_shared()) return;
  const auto qemu = s390x_command();
  if (qemu.empty()) return;
  mixed_cluster c("cross-fixtures", {false, true, false}, qemu);
  const std::string file = c.cluster_file(0);
  for (const std::string topo : {"pipeline", "tensor"}) {
    for (const std::string name : {"greedy_prompt_lily_tom_n100", "topp_t0.5_p0.95_s7_n150"}) {
      const fixture f = load_fixture(name);
      std::vector<std::string> args = {test::cellshard_bin()};
      // --kernels blas: the cross build has no OpenBLAS, so its daemon runs a substitute.
      const auto more = run_args(f, {"--cluster", file, "--topology", topo, "--kernels", "blas"});
      args.insert(args.end(), more.begin(), more.end());
      auto r = test::run_command(args, run_deadline_s);
      INFO(topo << " " << name << "\n" << r.err << "\n" << c.logs());
      CHECK(r.status == 0);
      CHECK(r.out == f.text);
      // The front end names the big-endian node's substitute for the blas backend.
      CHECK_THAT(r.err, Catch::Contains("(big-endian) has no 'blas' backend") && Catch::Contains("'native'"));
    }
  }
}

TEST_CASE("mutual TLS across byte orders: an s390x daemon in a TLS tensor group and pipeline of 3",
          "[net][cross][tls]") {
  // The certificates come from the x86 binary (`cellshard certs`); the
  // big-endian daemon's OpenSSL (Debian's s390x build) reads the same PEM
  // files, and every link of the group, both directions, is TLS.
  if (!test::have_shared()) return;
  const auto qemu = s390x_command();
  if (qemu.empty()) return;
  const std::string pki = test::temp_dir("cross-tls-pki");
  auto certs = test::run_command({test::cellshard_bin(), "certs", pki, "--force"}, 60);
  INFO(certs.err);
  REQUIRE(certs.status == 0);
  mixed_cluster c("cross-tls", {false, true, false}, qemu,
                  {"--tls-cert", pki + "/node.pem", "--tls-key", pki + "/node.key", "--tls-ca", pki + "/ca.pem"});
  const std::string file = c.cluster_file(0);
  const fixture f = load_fixture("topp_t0.5_p0.95_s7_n150");
  for (const std::string topo : {"tensor", "pipeline"}) {
    std::vector<std::string> args = {test::cellshard_bin()};
    const auto more = run_args(f, {"--cluster", file, "--topology", topo, "--kernels", "blas", "--tls-cert",
                                   pki + "/client.pem", "--tls-key", pki + "/client.key", "--tls-ca", pki + "/ca.pem"});
    args.insert(args.end(), more.begin(), more.end());
    auto r = test::run_command(args, run_deadline_s);
    INFO(topo << "\n" << r.err << "\n" << c.logs());
    CHECK(r.status == 0);
    CHECK(r.out == f.text);
  }
  // Without a client certificate the TLS daemons let nothing through.
  std::vector<std::string> plain = {test::cellshard_bin()};
  const auto more = run_args(f, {"--cluster", file, "--topology", "pipeline"});
  plain.insert(plain.end(), more.begin(), more.end());
  auto r = test::run_command(plain, run_deadline_s);
  INFO(r.err);
  CHECK(r.status != 0);
  CHECK(r.out.empty());
}

TEST_CASE("the s390x daemon SIGKILLed mid-generation: its shard restored on an x86 spare", "[net][cross]") {
  if (!test::have_shared()) return;
  const auto qemu = s390x_command();
  if (qemu.empty()) return;
  mixed_cluster c("cross-kill-be", {false, true, false, false}, qemu);
  kill_and_restore(c, 1);
}

TEST_CASE("an x86 daemon SIGKILLed mid-generation: its shard restored on an s390x spare", "[net][cross]") {
  if (!test::have_shared()) return;
  const auto qemu = s390x_command();
  if (qemu.empty()) return;
  mixed_cluster c("cross-kill-le", {false, false, false, true}, qemu);
  kill_and_restore(c, 1);
}

TEST_CASE("a journal written on the big-endian CPU resumes on x86, and the other way round", "[cross][journal]") {
  if (!test::have_shared()) return;
  const auto qemu = s390x_command();
  if (qemu.empty()) return;
  const fixture f = load_fixture("topp_t1.0_p0.9_s133742_n256");
  const std::string dir = test::temp_dir("cross-journal");
  const std::vector<std::string> x86 = {test::cellshard_bin()};
  // Writer and reader: (s390x, x86) then (x86, s390x); in-process pipelines of
  // 3 nodes on both sides (their KV checkpoints live on the writer's CPU).
  for (int way = 0; way < 2; ++way) {
    const auto& writer = way == 0 ? qemu : x86;
    const auto& reader = way == 0 ? x86 : qemu;
    const std::string journal = dir + "/run" + std::to_string(way) + ".jsonl";
    std::vector<std::string> a = writer;
    const auto w = run_args(f, {"--nodes", "3", "--topology", "pipeline", "--journal", journal, "-q"});
    a.insert(a.end(), w.begin(), w.end());
    auto r = test::run_command(a, run_deadline_s);
    INFO("way " << way << " writer: " << r.err);
    REQUIRE(r.status == 0);
    // Keep the header and the first 40 tokens: a front end killed there.
    std::istringstream in(test::read_file(journal));
    std::ostringstream cut;
    std::string line;
    for (int n = 0; n < 41 && std::getline(in, line); ++n) cut << line << "\n";
    std::ofstream(journal, std::ios::trunc) << cut.str();
    std::vector<std::string> b = reader;
    const auto rd = run_args(f, {"--nodes", "3", "--topology", "pipeline", "--resume", journal});
    b.insert(b.end(), rd.begin(), rd.end());
    auto r2 = test::run_command(b, run_deadline_s);
    INFO("way " << way << " reader: " << r2.err);
    CHECK(r2.status == 0);  // --expect-ids: the whole sequence, the journaled part included
    CHECK_THAT(r2.err, Catch::Contains("resuming"));
    CHECK(f.text.compare(f.offsets[40], std::string::npos, r2.out) == 0);
  }
}
