#include "actors/guard.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace cellshard::actors {

namespace {

std::atomic<uint64_t> rejected_total{0};
using clock_type = std::chrono::steady_clock;
constexpr char magic[8] = {'C', 'S', 'H', 'A', 'R', 'D', '-', 'G'};
constexpr size_t relay_buffer = 256 * 1024;  // bytes buffered per direction before reading stops

std::vector<uint8_t> preamble() {
  std::vector<uint8_t> p(magic, magic + 8);
  for (uint32_t v : {guard_version, static_cast<uint32_t>(guard_preamble_size)})
    for (int s = 24; s >= 0; s -= 8) p.push_back(static_cast<uint8_t>(v >> s));
  return p;
}

/// Whether the bytes read so far can still become a valid preamble.
bool preamble_prefix_ok(const std::vector<uint8_t>& got) {
  static const auto want = preamble();
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (got[i] != want[i]) return false;
  return true;
}

void set_nonblocking(int fd) {
  const int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string key_of(const std::string& host, uint16_t port) { return host + ":" + std::to_string(port); }

/// A listening socket on host:port (port 0: ephemeral); -1 with `err` set.
int listen_on(const std::string& host, uint16_t port, std::string& err, int backlog = 512) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string p = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), p.c_str(), &hints, &res); rc != 0) {
    err = key_of(host, port) + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (auto* a = res; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, backlog) == 0) break;
    err = key_of(host, port) + ": " + std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd >= 0) set_nonblocking(fd);
  return fd;
}

uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

/// A non-blocking connect to host:port started; -1 with `err` set.
int connect_to(const std::string& host, uint16_t port, std::string& err) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string p = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), p.c_str(), &hints, &res); rc != 0) {
    err = key_of(host, port) + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (auto* a = res; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    set_nonblocking(fd);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) break;
    err = key_of(host, port) + ": " + std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

struct endpoint {
  int fd = -1;
  std::vector<char> out;  // bytes waiting to be written to fd
  bool eof = false;       // read side ended
};

struct conn {
  enum class state { server_preamble, client_connecting, client_ack, relay } st;
  endpoint outer;  // the network side (accepted publicly, or dialed)
  endpoint inner;  // CAF's side (loopback)
  std::vector<uint8_t> hs;
  clock_type::time_point deadline;
  std::string target;  // dialer: host:port
  bool dead = false;
};

struct listener {
  int fd = -1;
  bool server = false;
  uint16_t inner_port = 0;  // server: CAF's loopback port
  std::string host;         // client: the target
  uint16_t port = 0;
};

}  // namespace

/// The relay engine: one thread polling every listener and connection.
class guard_engine {
public:
  explicit guard_engine(guard_options o) : opts_(o) {
    if (pipe(wake_) == 0) {
      set_nonblocking(wake_[0]);
      set_nonblocking(wake_[1]);
    }
    thread_ = std::thread([this] { loop(); });
  }
  ~guard_engine() {
    stop_ = true;
    wake();
    if (thread_.joinable()) thread_.join();
    for (auto& c : conns_) close_conn(c);
    for (auto& l : listeners_) close(l.fd);
    close(wake_[0]);
    close(wake_[1]);
  }

  void add(listener l) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      listeners_.push_back(std::move(l));
    }
    wake();
  }
  /// The loopback port of the dialer for host:port, created on first use.
  result<uint16_t> dial_port(const std::string& host, uint16_t port) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& l : listeners_)
      if (!l.server && l.host == host && l.port == port) return local_port(l.fd);
    std::string err;
    const int fd = listen_on("127.0.0.1", 0, err);
    if (fd < 0) return make_error("guard dialer for " + key_of(host, port) + ": " + err);
    listener l;
    l.fd = fd;
    l.host = host;
    l.port = port;
    listeners_.push_back(l);
    wake();
    return local_port(fd);
  }
  std::string last_error(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = errors_.find(key);
    return it == errors_.end() ? std::string() : it->second;
  }
  guard_stats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

private:
  void wake() {
    const char b = 1;
    if (wake_[1] >= 0) (void)!write(wake_[1], &b, 1);
  }
  void close_conn(conn& c) {
    if (c.outer.fd >= 0) close(c.outer.fd);
    if (c.inner.fd >= 0) close(c.inner.fd);
    c.outer.fd = c.inner.fd = -1;
    c.dead = true;
  }
  void fail(conn& c, const std::string& why) {  // mu_ held
    if (!c.target.empty()) errors_[c.target] = why;
    close_conn(c);
  }
  /// Writes what is pending on `e`; false on a hard error.
  static bool flush(endpoint& e) {
    while (!e.out.empty()) {
      const ssize_t n = send(e.fd, e.out.data(), e.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        e.out.erase(e.out.begin(), e.out.begin() + n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    return true;
  }
  /// Moves bytes from `from` to `to`'s buffer and writes them; false when the
  /// connection is over.
  static bool pump(endpoint& from, endpoint& to) {
    char buf[65536];
    while (to.out.size() < relay_buffer) {
      const ssize_t n = recv(from.fd, buf, sizeof buf, 0);
      if (n > 0) {
        to.out.insert(to.out.end(), buf, buf + n);
        if (!flush(to)) return false;
        continue;
      }
      if (n == 0) {
        from.eof = true;
        flush(to);
        return false;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (errno == EINTR) continue;
      return false;
    }
    return true;
  }
  size_t pending_count() const {
    size_t n = 0;
    for (const auto& c : conns_)
      if (!c.dead && c.st == conn::state::server_preamble) ++n;
    return n;
  }

  void on_accept(listener& l) {  // mu_ held
    for (int k = 0; k < 64; ++k) {
      const int fd = accept(l.fd, nullptr, nullptr);
      if (fd < 0) return;
      set_nonblocking(fd);
      conn c;
      c.deadline = clock_type::now() + opts_.handshake_deadline;
      if (l.server) {
        ++stats_.accepted;
        size_t relays = 0;
        for (const auto& x : conns_)
          if (!x.dead && x.st == conn::state::relay) ++relays;
        if (relays >= opts_.max_relays) {
          close(fd);
          ++stats_.evicted;
              ++rejected_total;
          continue;
        }
        if (pending_count() >= opts_.max_pending) {
          for (auto& x : conns_)
            if (!x.dead && x.st == conn::state::server_preamble) {  // the oldest
              close_conn(x);
              ++stats_.evicted;
              ++rejected_total;
              break;
            }
        }
        c.st = conn::state::server_preamble;
        c.outer.fd = fd;
        c.target = "";
        c.hs.reserve(guard_preamble_size);
        // inner_port carried by the listener
        c.inner.fd = -1;
        inner_port_of_[fd] = l.inner_port;
      } else {
        std::string err;
        const int out = connect_to(l.host, l.port, err);
        c.target = key_of(l.host, l.port);
        if (out < 0) {
          errors_[c.target] = err;
          close(fd);
          continue;
        }
        c.st = conn::state::client_connecting;
        c.outer.fd = out;
        c.inner.fd = fd;
      }
      conns_.push_back(std::move(c));
    }
  }

  void on_server_preamble(conn& c) {  // mu_ held
    uint8_t buf[guard_preamble_size];
    const ssize_t n = recv(c.outer.fd, buf, guard_preamble_size - c.hs.size(), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      close_conn(c);
      return;
    }
    if (n < 0) return;
    c.hs.insert(c.hs.end(), buf, buf + n);
    if (!preamble_prefix_ok(c.hs)) {
      ++stats_.rejected;
      ++rejected_total;
      close_conn(c);
      return;
    }
    if (c.hs.size() < guard_preamble_size) return;
    // Valid: connect to CAF on loopback and answer the ack.
    const uint16_t inner = inner_port_of_[c.outer.fd];
    inner_port_of_.erase(c.outer.fd);
    std::string err;
    const int fd = connect_to("127.0.0.1", inner, err);
    if (fd < 0) {
      close_conn(c);
      return;
    }
    c.inner.fd = fd;
    const auto ack = preamble();
    c.outer.out.assign(ack.begin(), ack.end());
    c.st = conn::state::relay;
    ++stats_.relayed;
    if (!flush(c.outer)) close_conn(c);
  }

  void on_client_ack(conn& c) {  // mu_ held
    uint8_t buf[guard_preamble_size];
    const ssize_t n = recv(c.outer.fd, buf, guard_preamble_size - c.hs.size(), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      fail(c, c.target + " closed the connection before its guard ack: not a cellshard node daemon, or one "
                         "of another version");
      return;
    }
    if (n < 0) return;
    c.hs.insert(c.hs.end(), buf, buf + n);
    if (!preamble_prefix_ok(c.hs)) {
      fail(c, c.target + " answered " + std::to_string(c.hs.size()) +
                  " byte(s) that are not a cellshard guard ack (expected the 16-byte preamble \"CSHARD-G\", "
                  "version " + std::to_string(guard_version) + "): not a cellshard node daemon");
      return;
    }
    if (c.hs.size() == guard_preamble_size) {
      c.st = conn::state::relay;
      errors_.erase(c.target);
    }
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, int>> who;  // (kind, index): 0 wake, 1 listener, 2 outer, 3 inner
    while (!stop_) {
      fds.clear();
      who.clear();
      std::vector<conn*> cs;
      {
        std::lock_guard<std::mutex> lock(mu_);
        conns_.remove_if([](const conn& c) { return c.dead; });
        fds.push_back({wake_[0], POLLIN, 0});
        who.emplace_back(0, 0);
        for (size_t i = 0; i < listeners_.size(); ++i) {
          fds.push_back({listeners_[i].fd, POLLIN, 0});
          who.emplace_back(1, static_cast<int>(i));
        }
        for (auto& c : conns_) {
          const int k = static_cast<int>(cs.size());
          cs.push_back(&c);
          short ev_out = 0, ev_in = 0;
          switch (c.st) {
            case conn::state::server_preamble: ev_out = POLLIN; break;
            case conn::state::client_connecting: ev_out = POLLOUT; break;
            case conn::state::client_ack: ev_out = POLLIN | (c.outer.out.empty() ? 0 : POLLOUT); break;
            case conn::state::relay:
              ev_out = static_cast<short>((c.inner.out.size() < relay_buffer ? POLLIN : 0) |
                                          (c.outer.out.empty() ? 0 : POLLOUT));
              ev_in = static_cast<short>((c.outer.out.size() < relay_buffer ? POLLIN : 0) |
                                         (c.inner.out.empty() ? 0 : POLLOUT));
              break;
          }
          fds.push_back({c.outer.fd, ev_out, 0});
          who.emplace_back(2, k);
          if (c.st == conn::state::relay) {
            fds.push_back({c.inner.fd, ev_in, 0});
            who.emplace_back(3, k);
          }
        }
      }
      const int rc = poll(fds.data(), fds.size(), 100);
      if (rc < 0 && errno != EINTR) break;
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = clock_type::now();
      for (size_t i = 0; i < fds.size(); ++i) {
        const auto [kind, idx] = who[i];
        const short re = fds[i].revents;
        if (kind == 0) {
          if (re & POLLIN) {
            char b[64];
            while (read(wake_[0], b, sizeof b) > 0) {
            }
          }
          continue;
        }
        if (kind == 1) {
          if (re & POLLIN) on_accept(listeners_[idx]);
          continue;
        }
        conn& c = *cs[idx];
        if (c.dead || re == 0) continue;
        if (kind == 2) {
          switch (c.st) {
            case conn::state::server_preamble:
              on_server_preamble(c);
              break;
            case conn::state::client_connecting: {
              int e = 0;
              socklen_t len = sizeof e;
              getsockopt(c.outer.fd, SOL_SOCKET, SO_ERROR, &e, &len);
              if (e != 0 || (re & (POLLERR | POLLHUP))) {
                fail(c, c.target + ": " + std::strerror(e ? e : ECONNREFUSED));
                break;
              }
              const auto p = preamble();
              c.outer.out.assign(p.begin(), p.end());
              c.st = conn::state::client_ack;
              if (!flush(c.outer)) fail(c, c.target + ": connection lost while sending the guard preamble");
              break;
            }
            case conn::state::client_ack:
              if (!c.outer.out.empty() && !flush(c.outer)) {
                fail(c, c.target + ": connection lost while sending the guard preamble");
                break;
              }
              if (re & (POLLIN | POLLHUP | POLLERR)) on_client_ack(c);
              break;
            case conn::state::relay:
              if ((re & POLLOUT) && !flush(c.outer)) {
                close_conn(c);
                break;
              }
              if ((re & (POLLIN | POLLHUP | POLLERR)) && !pump(c.outer, c.inner)) close_conn(c);
              break;
          }
        } else if (c.st == conn::state::relay) {
          if ((re & POLLOUT) && !flush(c.inner)) {
            close_conn(c);
            continue;
          }
          if ((re & (POLLIN | POLLHUP | POLLERR)) && !pump(c.inner, c.outer)) close_conn(c);
        }
      }
      for (auto& c : conns_) {
        if (c.dead || c.st == conn::state::relay || now < c.deadline) continue;
        if (c.st == conn::state::server_preamble) {
          ++stats_.timed_out;
          ++rejected_total;
          inner_port_of_.erase(c.outer.fd);
          close_conn(c);
        } else {
          fail(c, c.target + ": connection timeout: no cellshard guard ack within " +
                      std::to_string(opts_.handshake_deadline.count()) +
                      " ms (a frozen daemon, or not a cellshard node daemon)");
        }
      }
    }
  }

  guard_options opts_;
  std::mutex mu_;
  std::vector<listener> listeners_;
  std::list<conn> conns_;
  std::map<int, uint16_t> inner_port_of_;  // server connections in the preamble: CAF's port
  std::map<std::string, std::string> errors_;
  guard_stats stats_;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

namespace {
guard_engine& dialer() {
  // Never destroyed: CAF connections may outlive every other static.
  static auto* e = new guard_engine(guard_options{});
  return *e;
}
}  // namespace

struct guard_listener::impl {
  std::unique_ptr<guard_engine> engine;
  uint16_t port = 0;
};

guard_listener::guard_listener(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
guard_listener::~guard_listener() = default;

result<std::unique_ptr<guard_listener>> guard_listener::start(const std::string& host, uint16_t port,
                                                              uint16_t inner_port, guard_options o) {
  std::string err;
  const int fd = listen_on(host, port, err);
  if (fd < 0) return make_error("--listen " + err);
  auto im = std::make_unique<impl>();
  im->port = local_port(fd);
  im->engine = std::make_unique<guard_engine>(o);
  listener l;
  l.fd = fd;
  l.server = true;
  l.inner_port = inner_port;
  im->engine->add(l);
  return std::unique_ptr<guard_listener>(new guard_listener(std::move(im)));
}

uint16_t guard_listener::port() const { return impl_->port; }
guard_stats guard_listener::stats() const { return impl_->engine->stats(); }

result<uint16_t> guarded_port(const std::string& host, uint16_t port) { return dialer().dial_port(host, port); }

uint64_t guard_rejected_total() { return rejected_total.load(); }

std::string dial_error(const std::string& host, uint16_t port) {
  return dialer().last_error(key_of(host, port));
}

}  // namespace cellshard::actors
