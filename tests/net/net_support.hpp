// tests/net/net_support.hpp: node daemon processes for tests, each stopped by
// an RAII guard (SIGKILL + waitpid) whatever the test's outcome; cluster
// files; a throwaway PKI made with the openssl command line; and the TCP
// byte counters of this process's sockets (to show what passes through a
// front end running in the test process).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <sys/types.h>
#include <vector>

namespace cellshard::test {

/// One `cellshard node --listen 127.0.0.1:0 ...` process. The constructor
/// waits (at most `deadline_s`) for its `listening HOST:PORT` line; stderr
/// goes to `<dir>/node-<pid>.err`. The destructor SIGKILLs and reaps it.
class daemon_process {
public:
  daemon_process(const std::string& dir, const std::vector<std::string>& extra_args,
                 double deadline_s = 20);
  ~daemon_process();
  daemon_process(const daemon_process&) = delete;
  daemon_process& operator=(const daemon_process&) = delete;

  bool ok() const { return port_ != 0; }
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  /// What the daemon wrote on stderr so far (and, when it failed to start, why).
  std::string log() const;
  /// Exit status when it ended before listening (-1 otherwise).
  int early_status() const { return early_status_; }
  void freeze();  // SIGSTOP
  void thaw();    // SIGCONT

private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  int out_fd_ = -1;
  int early_status_ = -1;
  std::string err_path_;
};

/// Writes {"nodes": [{"host": "127.0.0.1", "port": P}, ...]} and returns the path.
std::string write_cluster_file(const std::string& path, const std::vector<uint16_t>& ports);

/// A TCP port on 127.0.0.1 where nothing listens (bound, then closed).
uint16_t closed_port();

/// Copies `from` to `to`, flipping the byte at `offset` from the end (1 = last).
void copy_with_flip(const std::string& from, const std::string& to, long offset_from_end);
void copy_file(const std::string& from, const std::string& to);

/// A throwaway PKI in `dir`, made with /usr/bin/openssl (EC P-256 keys):
/// ca.pem/ca.key; node.pem/node.key and front.pem/front.key signed by it
/// (SAN IP:127.0.0.1); ca2.pem and foreign.pem/foreign.key, a second CA and a
/// certificate it signed. Returns "" on success, else openssl's complaint.
std::string make_pki(const std::string& dir);

/// Payload bytes of this process's TCP sockets, summed per peer port.
struct tcp_bytes {
  uint64_t sent = 0;      // tcpi_bytes_acked
  uint64_t received = 0;  // tcpi_bytes_received
};
std::map<uint16_t, tcp_bytes> tcp_traffic_by_peer_port();

}  // namespace cellshard::test
