// Mutual TLS between the front end and the node daemons (caf-openssl), with
// a throwaway PKI made by the openssl command line in the build's tmp/: a TLS
// cluster reproduces a fixture; a node whose certificate comes from another
// CA, and a client without TLS, are rejected; misconfigured TLS flags refuse
// to start (with a message, not CAF's terminate).
#include "tests/net/net_support.hpp"
#include "tests/support.hpp"

#include <memory>

using namespace cellshard;

namespace {

struct pki {
  std::string dir;
  explicit pki(const std::string& name) : dir(test::temp_dir(name)) {
    const std::string err = test::make_pki(dir);
    INFO(err);
    REQUIRE(err.empty());
  }
  std::vector<std::string> tls(const std::string& who, const std::string& ca = "ca") const {
    return {"--tls-cert", dir + "/" + who + ".pem", "--tls-key", dir + "/" + who + ".key", "--tls-ca",
            dir + "/" + ca + ".pem"};
  }
  std::vector<std::string> node_args(const std::string& who, const std::string& ca = "ca") const {
    auto a = tls(who, ca);
    a.insert(a.begin(), {"--models", test::shared_file("models")});
    return a;
  }
};

std::vector<std::string> run_args(const std::string& cluster_file, const std::vector<std::string>& extra,
                                  const std::string& fixture = "") {
  std::vector<std::string> a = {test::cellshard_bin(), "run", "-m", test::shared_file("models/stories260K.bin"),
                                "-z", test::shared_file("models/tok512.bin"), "-t", "0", "-q",
                                "--cluster", cluster_file};
  if (fixture.empty()) {
    a.insert(a.end(), {"-n", "20"});
  } else {
    a.insert(a.end(), {"-n", "200", "--expect-ids", test::shared_file("fixtures/" + fixture + ".ids")});
  }
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace

TEST_CASE("a mutual-TLS cluster reproduces a fixture", "[net][tls]") {
  if (!test::have_shared()) return;
  pki p("net-tls-ok");
  std::vector<std::unique_ptr<test::daemon_process>> nodes;
  std::vector<uint16_t> ports;
  for (int i = 0; i < 4; ++i) {
    nodes.push_back(std::make_unique<test::daemon_process>(p.dir, p.node_args("node")));
    INFO(nodes.back()->log());
    REQUIRE(nodes.back()->ok());
    ports.push_back(nodes.back()->port());
  }
  const std::string file = test::write_cluster_file(p.dir + "/cluster.json", ports);
  for (const std::string topo : {"pipeline", "hybrid:2x2"}) {
    auto args = run_args(file, p.tls("front"), "greedy_bos_n200");
    args.insert(args.end(), {"--topology", topo});
    auto r = test::run_command(args, 60);
    INFO(topo << "\n" << r.err);
    CHECK(r.status == 0);
  }
}

TEST_CASE("TLS: a foreign CA's node and a plain client are rejected", "[net][tls]") {
  if (!test::have_shared()) return;
  pki p("net-tls-reject");
  test::daemon_process good(p.dir, p.node_args("node"));
  test::daemon_process foreign(p.dir, p.node_args("foreign", "ca2"));  // consistent, but another CA
  test::daemon_process plain(p.dir, {"--models", test::shared_file("models")});
  for (auto* d : {&good, &foreign, &plain}) {
    INFO(d->log());
    REQUIRE(d->ok());
  }
  SECTION("a node certified by another CA") {
    auto r = test::run_command(
        run_args(test::write_cluster_file(p.dir + "/f.json", {good.port(), foreign.port()}), p.tls("front")), 60);
    INFO(r.err);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("node 1 (" + foreign.address() + ")") && Catch::Contains("TLS"));
    CHECK_THAT(r.err, !Catch::Contains(good.address()));
  }
  SECTION("a client without TLS") {
    auto r = test::run_command(run_args(test::write_cluster_file(p.dir + "/p.json", {good.port()}), {}), 60);
    INFO(r.err);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("node 0 (" + good.address() + ")") && Catch::Contains("cannot connect"));
  }
  SECTION("a TLS client and a node without TLS") {
    auto r = test::run_command(
        run_args(test::write_cluster_file(p.dir + "/q.json", {plain.port()}), p.tls("front")), 60);
    INFO(r.err);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("node 0 (" + plain.address() + ")"));
  }
  SECTION("a client certified by another CA") {
    auto r = test::run_command(
        run_args(test::write_cluster_file(p.dir + "/c.json", {good.port()}), p.tls("foreign", "ca2")), 60);
    INFO(r.err);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("node 0 (" + good.address() + ")"));
  }
}

TEST_CASE("TLS misconfigurations refuse to start with a clear message", "[net][tls]") {
  if (!test::have_shared()) return;
  pki p("net-tls-misconfig");
  const std::string models = test::shared_file("models");
  auto start = [&](const std::vector<std::string>& args) {
    test::daemon_process d(p.dir, args);
    return std::make_pair(d.early_status(), d.log());
  };
  SECTION("a daemon given only a CA file") {
    auto [status, log] = start({"--models", models, "--tls-ca", p.dir + "/ca.pem"});
    INFO(log);
    CHECK(status == 2);
    CHECK_THAT(log, Catch::Contains("--tls-cert") && Catch::Contains("--tls-key") && Catch::Contains("missing"));
  }
  SECTION("a key that does not belong to the certificate") {
    auto [status, log] = start({"--models", models, "--tls-cert", p.dir + "/node.pem", "--tls-key",
                                p.dir + "/front.key", "--tls-ca", p.dir + "/ca.pem"});
    INFO(log);
    CHECK(status == 1);
    CHECK_THAT(log, Catch::Contains("front.key") && Catch::Contains("does not belong"));
  }
  SECTION("a certificate another CA signed") {
    auto [status, log] = start({"--models", models, "--tls-cert", p.dir + "/foreign.pem", "--tls-key",
                                p.dir + "/foreign.key", "--tls-ca", p.dir + "/ca.pem"});
    INFO(log);
    CHECK(status == 1);
    CHECK_THAT(log, Catch::Contains("foreign.pem") && Catch::Contains("does not verify"));
  }
  SECTION("a missing file") {
    auto [status, log] = start({"--models", models, "--tls-cert", p.dir + "/nope.pem", "--tls-key",
                                p.dir + "/node.key", "--tls-ca", p.dir + "/ca.pem"});
    INFO(log);
    CHECK(status == 1);
    CHECK_THAT(log, Catch::Contains("cannot read") && Catch::Contains("nope.pem"));
  }
  SECTION("the front end: TLS flags without --cluster, and a partial set") {
    auto r = test::run_command({test::cellshard_bin(), "run", "-n", "4", "--tls-ca", p.dir + "/ca.pem"});
    CHECK(r.status == 2);
    CHECK_THAT(r.err, Catch::Contains("--cluster"));
    const std::string file = test::write_cluster_file(p.dir + "/x.json", {test::closed_port()});
    auto r2 = test::run_command(run_args(file, {"--tls-cert", p.dir + "/front.pem", "--tls-ca", p.dir + "/ca.pem"}));
    CHECK(r2.status == 2);
    CHECK_THAT(r2.err, Catch::Contains("--tls-key"));
    auto r3 = test::run_command(run_args(file, {"--tls-cert", p.dir + "/front.pem", "--tls-key",
                                                p.dir + "/node.key", "--tls-ca", p.dir + "/ca.pem"}));
    CHECK(r3.status == 1);
    CHECK_THAT(r3.err, Catch::Contains("does not belong"));
  }
}
