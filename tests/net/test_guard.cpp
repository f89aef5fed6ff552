// The pre-handshake guard of node daemons (issue #20): a crafted BASP header
// that crashed CAF 0.17's multiplexer, and a flood of junk connections, no
// longer reach CAF; a front end pointed at a hostile listener exits with a
// clear error instead of parsing its bytes; a plain daemon listens on
// loopback only unless --insecure; `cellshard certs` makes the PKI of a TLS
// cluster and `cellshard status` reports its daemon.
#include "tests/net/net_support.hpp"
#include "tests/support.hpp"

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <random>
#include <thread>

using namespace cellshard;

namespace {

int connect_loopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// The 76 bytes of the issue: 8 zero bytes, a big-endian 0x40 payload length,
/// 64 zero bytes -- a BASP header CAF 0.17 believed.
std::vector<char> crafted() {
  std::vector<char> b(8, 0);
  for (char c : {'\x00', '\x00', '\x00', '\x40'}) b.push_back(c);
  b.insert(b.end(), 64, 0);
  return b;
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

}  // namespace

TEST_CASE("a crafted header and a 300-connection junk flood leave a plain daemon serving", "[net][guard]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("net-guard");
  test::daemon_process d(dir, {"--models", test::shared_file("models")});
  INFO(d.log());
  REQUIRE(d.ok());
  const auto bytes = crafted();
  REQUIRE(bytes.size() == 76u);
  for (int k = 0; k < 4; ++k) {  // the case crashed the daemon 4 of 4
    const int fd = connect_loopback(d.port());
    REQUIRE(fd >= 0);
    CHECK(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  std::mt19937 rng(20);
  std::vector<int> flood;
  for (int k = 0; k < 300; ++k) {
    const int fd = connect_loopback(d.port());
    if (fd < 0) continue;
    char junk[64];
    for (char& c : junk) c = static_cast<char>(rng());
    (void)::send(fd, junk, sizeof junk, MSG_NOSIGNAL);
    flood.push_back(fd);  // held open while the front end connects
  }
  CHECK(flood.size() >= 250u);
  // A real front end gets through at once and runs a fixture exactly.
  const std::string file = test::write_cluster_file(dir + "/cluster.json", {d.port()});
  const auto& fc = test::fixture_cases()[0];
  std::vector<std::string> args = {test::cellshard_bin(), "run", "-m", test::shared_file("models/stories260K.bin"),
                                   "-z", test::shared_file("models/tok512.bin"), "-n", std::to_string(fc.steps),
                                   "-t", std::to_string(fc.temperature), "-p", std::to_string(fc.topp), "-s",
                                   std::to_string(fc.seed), "--cluster", file, "--expect-ids",
                                   test::shared_file("fixtures/" + fc.name + ".ids")};
  if (!fc.prompt.empty()) {
    args.push_back("-i");
    args.push_back(fc.prompt);
  }
  auto r = test::run_command(args, 60);
  for (int fd : flood) ::close(fd);
  INFO(r.err << "\ndaemon log:\n" << d.log());
  CHECK(r.status == 0);
  CHECK(r.out == test::read_file(test::shared_file("fixtures/" + fc.name + ".txt")));
  CHECK(alive(d.pid()));
  auto q = test::query_daemon(d.port());
  INFO(q.error);
  CHECK(q.ok);
}

TEST_CASE("a front end whose cluster file points at a hostile listener exits with a clear error",
          "[net][guard]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("net-guard-hostile");
  // A listener that answers every connection with the crafted bytes.
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(lfd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(lfd, 16) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const uint16_t port = ntohs(a.sin_port);
  std::atomic<bool> stop{false};
  std::thread hostile([&] {
    const auto bytes = crafted();
    // Bounded: at most 32 connections, and it stops when the test is done.
    for (int k = 0; k < 32 && !stop; ++k) {
      pollfd p{lfd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int fd = ::accept(lfd, nullptr, nullptr);
      if (fd < 0) continue;
      (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      ::close(fd);
    }
  });
  const std::string file = test::write_cluster_file(dir + "/cluster.json", {port});
  auto r = test::run_command({test::cellshard_bin(), "run", "-m", test::shared_file("models/stories260K.bin"), "-z",
                              test::shared_file("models/tok512.bin"), "-n", "8", "-q", "--cluster", file},
                             60);
  stop = true;
  hostile.join();
  ::close(lfd);
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("127.0.0.1:" + std::to_string(port)) &&
                        Catch::Contains("not a cellshard guard ack"));
}

TEST_CASE("a plain daemon binds loopback only, and --insecure allows another address", "[net][guard]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("net-guard-bind");
  auto r = test::run_command({test::cellshard_bin(), "node", "--listen", "0.0.0.0:0", "--models",
                              test::shared_file("models")},
                             20);
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("loopback only") && Catch::Contains("--insecure"));
  test::daemon_process d(dir, {"--models", test::shared_file("models"), "--insecure"}, 20);
  // daemon_process listens on 127.0.0.1 (loopback) whatever; --insecure is accepted.
  INFO(d.log());
  CHECK(d.ok());
}

TEST_CASE("cellshard certs makes the PKI of a TLS cluster, and cellshard status reports its daemon",
          "[net][guard][tls]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("net-certs-status");
  const std::string bin = test::cellshard_bin();
  const std::string pki = dir + "/pki";
  auto made = test::run_command({bin, "certs", pki}, 120);
  INFO(made.err);
  REQUIRE(made.status == 0);
  for (const char* f : {"ca.pem", "ca.key", "node.pem", "node.key", "client.pem", "client.key"}) {
    INFO(f);
    struct stat st {};
    REQUIRE(::stat((pki + "/" + f).c_str(), &st) == 0);
    CHECK(st.st_size > 0);
    if (std::string(f).find(".key") != std::string::npos) CHECK((st.st_mode & 0777) == 0600);
  }
  // A second run does not overwrite them.
  auto again = test::run_command({bin, "certs", pki}, 60);
  CHECK(again.status == 2);
  CHECK_THAT(again.err, Catch::Contains("exists already") && Catch::Contains("--force"));

  // A TLS daemon with the node certificate; a front end with the client's.
  test::daemon_process d(dir, {"--models", test::shared_file("models"), "--memory", "256MiB", "--tls-cert",
                               pki + "/node.pem", "--tls-key", pki + "/node.key", "--tls-ca", pki + "/ca.pem"});
  INFO(d.log());
  REQUIRE(d.ok());
  const std::string file = test::write_cluster_file(dir + "/cluster.json", {d.port()});
  const std::vector<std::string> tls{"--tls-cert", pki + "/client.pem", "--tls-key", pki + "/client.key",
                                     "--tls-ca", pki + "/ca.pem"};
  const auto& fc = test::fixture_cases()[0];
  std::vector<std::string> args = {bin, "run", "-m", test::shared_file("models/stories260K.bin"), "-z",
                                   test::shared_file("models/tok512.bin"), "-n", std::to_string(fc.steps), "-t",
                                   std::to_string(fc.temperature), "-p", std::to_string(fc.topp), "-s",
                                   std::to_string(fc.seed), "--cluster", file, "--expect-ids",
                                   test::shared_file("fixtures/" + fc.name + ".ids")};
  if (!fc.prompt.empty()) args.insert(args.end(), {"-i", fc.prompt});
  args.insert(args.end(), tls.begin(), tls.end());
  auto r = test::run_command(args, 120);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.out == test::read_file(test::shared_file("fixtures/" + fc.name + ".txt")));

  // status over TLS: one line per daemon, and the JSON.
  std::vector<std::string> st{bin, "status", "--cluster", file, "--json", dir + "/status.json"};
  st.insert(st.end(), tls.begin(), tls.end());
  auto s = test::run_command(st, 60);
  INFO(s.err);
  REQUIRE(s.status == 0);
  CHECK_THAT(s.out, Catch::Contains(d.address()) && Catch::Contains("mutual TLS"));
  const auto j = nlohmann::json::parse(test::read_file(dir + "/status.json"), nullptr, false);
  REQUIRE_FALSE(j.is_discarded());
  REQUIRE(j.at("daemons").size() == 1u);
  const auto& e = j.at("daemons")[0];
  CHECK(e.at("address") == d.address());
  CHECK(e.at("tls") == true);
  CHECK(e.at("pid") == d.pid());
  CHECK(e.at("budget_bytes") == 256ull << 20);
  CHECK(e.at("used_bytes").get<uint64_t>() <= 256ull << 20);
  CHECK(e.at("version") == "0.1.0");
  CHECK(e.at("uptime_s").get<double>() > 0);
  CHECK(e.at("profile") == "host");
  // Without the client certificate the daemon is listed unreachable: exit 1.
  auto plain = test::run_command({bin, "status", "--cluster", file, "--timeout-ms", "5000"}, 60);
  CHECK(plain.status == 1);
  CHECK_THAT(plain.out + plain.err, Catch::Contains(d.address()) && Catch::Contains("unreachable"));
}
