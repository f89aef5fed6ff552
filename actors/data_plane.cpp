#include "actors/data_plane.hpp"

#include <caf/send.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <random>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

namespace cellshard::actors {

namespace {

constexpr uint32_t frame_magic = 0x50445343u;  // "CSDP" read as little-endian bytes
constexpr uint8_t kind_partial_sum = 1;
constexpr uint8_t kind_activation = 2;          // protocol 9
constexpr size_t frame_head = 24;               // magic, kind, pad, destination, body length
constexpr size_t frame_fields = 32;             // the step id and the message's own fields (data_plane.hpp)
constexpr size_t blob_head = 13;                // blob::encode's [u8 order][u32 n][u64 xxh64]
constexpr uint64_t max_body = 1ull << 30;       // a frame larger than this is refused
constexpr size_t max_pending = 64u << 20;       // bytes queued on one stuck link before dropping
constexpr int connect_ms = 2000;                // dialling and the key's arrival
constexpr int max_failures = 3;                 // per peer, then CAF only
constexpr int send_wait_us = 20000;             // a sender waits this long for socket room, then queues

void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
/// A frame's first 20 bytes, the step id both kinds carry: session, epoch, pos0, count.
void put_step_id(char* p, const step_id& id) {
  put_u64(p, id.session);
  put_u32(p + 8, id.epoch);
  put_u32(p + 12, static_cast<uint32_t>(id.pos0));
  put_u32(p + 16, static_cast<uint32_t>(id.count));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

bool host_big_endian() {
  const uint16_t one = 1;
  uint8_t b;
  std::memcpy(&b, &one, 1);
  return b == 0;
}

/// Reads exactly n bytes (blocking socket); false on EOF or error.
bool read_full(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

/// Reads exactly n bytes before `until` (poll between reads).
bool read_until(int fd, char* p, size_t n, std::chrono::steady_clock::time_point until) {
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pf{fd, POLLIN, 0};
    const int r = ::poll(&pf, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

/// An accepted connection past its key. Its reader thread owns the fd (closed
/// with the plane); a frame is read by whoever holds `rd` (the reader thread,
/// or a borrower's pump while the reading is lent).
struct data_plane::inbound {
  int fd = -1;
  int wake = -1;  // eventfd: the reader's poll wakes to park when the reading is lent
  std::mutex rd;
  std::atomic<bool> dead{false};
  ~inbound() {
    if (wake >= 0) ::close(wake);
  }
};

namespace {
/// True when fd has bytes to read now.
bool readable_now(int fd) {
  pollfd pf{fd, POLLIN, 0};
  return ::poll(&pf, 1, 0) > 0 && (pf.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}
void drain_eventfd(int fd) {
  uint64_t v;
  while (::read(fd, &v, sizeof v) > 0) {
  }
}
void post_eventfd(int fd) {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t k = ::write(fd, &one, sizeof one);
}
}  // namespace

struct data_plane::link {
  enum class state { none, asking, dialing, up, broken };
  std::mutex mu;
  std::condition_variable cv;
  state st = state::none;
  int failures = 0;
  int fd = -1;                          // owned by the link's thread (it closes it)
  std::deque<std::vector<char>> pending;  // bytes the socket did not take yet, in order
  size_t pending_off = 0;               // into pending.front()
  size_t pending_bytes = 0;
  bool stop = false;
  std::thread th;
};

bool data_plane::enabled_by_env() {
  const char* v = std::getenv("CELLSHARD_DATA_PLANE");
  return !(v && std::string(v) == "caf");
}

bool data_plane::lend_by_env() {
  const char* v = std::getenv("CELLSHARD_DATA_PLANE");
  return !(v && std::string(v) == "nolend");
}

bool data_plane::fused_by_env() {
  const char* v = std::getenv("CELLSHARD_DATA_PLANE");
  return !(v && std::string(v) == "unfused");
}

caf::expected<std::shared_ptr<data_plane>> data_plane::start(const std::string& host,
                                                            std::function<void(const std::string&)> log) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &res) != 0 || !res)
    return caf::make_error(caf::sec::invalid_argument, "data plane: cannot resolve " + host);
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) break;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) return caf::make_error(caf::sec::invalid_argument, "data plane: cannot listen on " + host);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  else if (ss.ss_family == AF_INET6) port = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  std::shared_ptr<data_plane> dp(new data_plane());
  dp->listen_fd_ = fd;
  std::random_device rd;
  dp->ep_ = data_endpoint{host, port, (static_cast<uint64_t>(rd()) << 32) ^ rd()};
  dp->log_ = std::move(log);
  if (dp->log_) dp->log_("data plane: listening " + host + ":" + std::to_string(port));
  dp->kick_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  dp->acceptor_ = std::thread([p = dp.get()] { p->accept_loop(); });
  return dp;
}

data_plane::~data_plane() {
  closing_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  std::vector<std::shared_ptr<link>> links;
  std::vector<std::pair<int, std::thread>> readers;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& kv : links_) links.push_back(kv.second);
    readers.swap(readers_);
  }
  for (auto& l : links) {
    std::lock_guard<std::mutex> g(l->mu);
    l->stop = true;
    if (l->fd >= 0) ::shutdown(l->fd, SHUT_RDWR);
    l->cv.notify_all();
  }
  for (auto& l : links)
    if (l->th.joinable()) l->th.join();
  {
    std::lock_guard<std::mutex> g(lend_mu_);
    lent_ = false;
  }
  lend_cv_.notify_all();  // parked readers see closing_
  for (auto& r : readers) ::shutdown(r.first, SHUT_RDWR);
  for (auto& r : readers) {
    if (r.second.joinable()) r.second.join();
    ::close(r.first);
  }
  if (kick_fd_ >= 0) ::close(kick_fd_);
}

void data_plane::attach(const caf::actor& a, sink s) {
  std::lock_guard<std::mutex> g(mu_);
  local_[a.id()] = local_actor{a.address(), s ? std::make_shared<sink>(std::move(s)) : nullptr};
}

void data_plane::detach(caf::actor_id id) {
  std::lock_guard<std::mutex> g(mu_);
  local_.erase(id);
}

data_plane_stats data_plane::stats() const {
  data_plane_stats s;
  s.frames_sent = sent_;
  s.frames_received = received_;
  s.bytes_sent = bytes_sent_;
  s.bytes_received = bytes_received_;
  s.frames_dropped = dropped_;
  s.links_failed = failed_;
  s.frames_refused = refused_;
  s.lends = lends_;
  s.activations_sent = act_sent_;
  s.activations_received = act_received_;
  return s;
}

bool data_plane::should_ask(const std::string& peer) {
  std::shared_ptr<link> l;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (closing_) return false;
    auto& slot = links_[peer];
    if (!slot) slot = std::make_shared<link>();
    l = slot;
  }
  std::lock_guard<std::mutex> g(l->mu);
  if (l->st != link::state::none || l->failures >= max_failures) return false;
  l->st = link::state::asking;
  return true;
}

void data_plane::ask_failed(const std::string& peer) {
  std::shared_ptr<link> l;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = links_.find(peer);
    if (it == links_.end()) return;
    l = it->second;
  }
  std::lock_guard<std::mutex> g(l->mu);
  if (l->st != link::state::asking) return;
  l->st = link::state::none;
  ++l->failures;
}

bool data_plane::link_up(const std::string& peer) {
  std::shared_ptr<link> l;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = links_.find(peer);
    if (it == links_.end()) return false;
    l = it->second;
  }
  std::lock_guard<std::mutex> g(l->mu);
  return l->st == link::state::up;
}

bool data_plane::wait_up(const std::string& peer, std::chrono::milliseconds timeout) {
  std::shared_ptr<link> l;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = links_.find(peer);
    if (it == links_.end()) return false;
    l = it->second;
  }
  std::unique_lock<std::mutex> lk(l->mu);
  l->cv.wait_for(lk, timeout, [&] { return l->st == link::state::up || l->st == link::state::none; });
  return l->st == link::state::up;
}

void data_plane::dial(const std::string& peer, const data_endpoint& ep) {
  std::shared_ptr<link> l;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = links_.find(peer);
    if (closing_ || it == links_.end()) return;
    l = it->second;
  }
  std::thread old;
  {
    std::lock_guard<std::mutex> g(l->mu);
    if (l->st != link::state::asking) return;
    l->st = link::state::dialing;
    old = std::move(l->th);
  }
  if (old.joinable()) old.join();  // the previous link's thread, which ended with it
  std::lock_guard<std::mutex> g(l->mu);
  if (l->stop) return;
  l->th = std::thread([this, l, ep] { flush_loop(l, ep); });
}

void data_plane::fail(link& l) {
  l.st = link::state::broken;
  l.cv.notify_all();
}

void data_plane::flush_loop(std::shared_ptr<link> l, data_endpoint ep) {
  using clk = std::chrono::steady_clock;
  const auto until = clk::now() + std::chrono::milliseconds(connect_ms);
  int fd = -1;
  {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const std::string port = std::to_string(ep.port);
    if (::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res) == 0 && res) {
      for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
        fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) continue;
        int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
          pollfd pf{fd, POLLOUT, 0};
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clk::now()).count();
          int err = 0;
          socklen_t el = sizeof err;
          if (left > 0 && ::poll(&pf, 1, static_cast<int>(left)) == 1 &&
              ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0)
            r = 0;
        }
        if (r != 0) {
          ::close(fd);
          fd = -1;
        }
      }
      ::freeaddrinfo(res);
    }
  }
  if (fd >= 0) {
    set_nodelay(fd);
    char hello[12];
    put_u32(hello, frame_magic);
    put_u64(hello + 4, ep.key);
    size_t off = 0;
    while (off < sizeof hello) {
      const ssize_t k = ::send(fd, hello + off, sizeof hello - off, MSG_NOSIGNAL);
      if (k > 0) {
        off += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
        pollfd pf{fd, POLLOUT, 0};
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clk::now()).count();
        if (left > 0 && ::poll(&pf, 1, static_cast<int>(left)) == 1) continue;
      }
      break;
    }
    if (off < sizeof hello) {
      ::close(fd);
      fd = -1;
    }
  }
  std::unique_lock<std::mutex> lk(l->mu);
  if (fd < 0 || l->stop) {
    if (fd >= 0) ::close(fd);
    ++failed_;
    ++l->failures;
    l->st = link::state::none;
    l->cv.notify_all();
    return;
  }
  l->fd = fd;
  l->st = link::state::up;
  l->cv.notify_all();
  if (log_) log_("data plane: link to " + ep.host + ":" + std::to_string(ep.port) + " up");
  for (;;) {
    l->cv.wait(lk, [&] { return l->stop || l->st != link::state::up || !l->pending.empty(); });
    if (l->stop || l->st != link::state::up) break;
    // Flush what the senders could not write at once, in order.
    bool broke = false;
    while (!l->pending.empty() && !l->stop && l->st == link::state::up) {
      auto& front = l->pending.front();
      const ssize_t k = ::send(fd, front.data() + l->pending_off, front.size() - l->pending_off,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        l->pending_off += static_cast<size_t>(k);
        l->pending_bytes -= static_cast<size_t>(k);
        if (l->pending_off == front.size()) {
          l->pending.pop_front();
          l->pending_off = 0;
        }
        continue;
      }
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        lk.unlock();
        pollfd pf{fd, POLLOUT, 0};
        ::poll(&pf, 1, 200);  // re-checks stop at least every 200 ms
        lk.lock();
        continue;
      }
      broke = true;
      break;
    }
    if (broke) break;
  }
  // The link ends: a send failed, the socket broke, or the plane stops.
  if (!l->stop) {
    ++failed_;
    ++l->failures;
  }
  dropped_ += l->pending.size();
  l->pending.clear();
  l->pending_off = 0;
  l->pending_bytes = 0;
  l->fd = -1;
  l->st = link::state::none;
  l->cv.notify_all();
  ::close(fd);
  if (log_ && !l->stop) log_("data plane: link to " + ep.host + ":" + std::to_string(ep.port) + " ended (CAF carries its messages)");
}

bool data_plane::send_frame(const std::string& peer, const char* head, size_t head_len, const char* body2,
                            size_t len2, const char* body3, size_t len3) {
  std::shared_ptr<link> l;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = links_.find(peer);
    if (it == links_.end()) return false;
    l = it->second;
  }
  const size_t total = head_len + len2 + len3;
  std::lock_guard<std::mutex> g(l->mu);
  if (l->st != link::state::up || l->stop) return false;
  size_t written = 0;
  if (l->pending.empty()) {
    iovec iov[3] = {{const_cast<char*>(head), head_len}, {const_cast<char*>(body2), len2},
                    {const_cast<char*>(body3), len3}};
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = 3;
    ssize_t k;
    do k = ::sendmsg(l->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      fail(*l);  // the link's thread closes the socket; this message goes through CAF
      return false;
    }
    written = k > 0 ? static_cast<size_t>(k) : 0;
    // A frame larger than the socket's free buffer: the peer's reader drains
    // it at memory speed, so the rest goes out from this thread as raw TCP
    // would, waiting at most send_wait_us for room; a peer that does not
    // read (frozen) leaves the rest to the link's thread.
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(send_wait_us);
    while (written < total) {
      pollfd pf{l->fd, POLLOUT, 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
      if (::poll(&pf, 1, static_cast<int>(std::max<int64_t>(0, left))) != 1) break;
      size_t skip = written;
      iovec rest[3];
      int cnt = 0;
      for (int i = 0; i < 3; ++i) {
        if (skip >= iov[i].iov_len) {
          skip -= iov[i].iov_len;
          continue;
        }
        rest[cnt].iov_base = static_cast<char*>(iov[i].iov_base) + skip;
        rest[cnt].iov_len = iov[i].iov_len - skip;
        skip = 0;
        ++cnt;
      }
      msghdr m2{};
      m2.msg_iov = rest;
      m2.msg_iovlen = static_cast<size_t>(cnt);
      const ssize_t k2 = ::sendmsg(l->fd, &m2, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k2 > 0) written += static_cast<size_t>(k2);
      else if (k2 < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        if (written == 0) {
          fail(*l);
          return false;
        }
        fail(*l);  // part of the frame left: the stream is broken; the step's deadline re-sends it
        return true;
      }
      if (std::chrono::steady_clock::now() >= until) break;
    }
    if (written == total) {
      ++sent_;
      bytes_sent_ += total;
      return true;
    }
  } else if (l->pending_bytes + total > max_pending) {
    ++dropped_;  // a stuck peer (frozen): lost like a message to a frozen node
    return true;
  }
  // The rest waits for the link's thread, which keeps the order.
  std::vector<char> rest;
  rest.reserve(total - written);
  const char* parts[3] = {head, body2, body3};
  const size_t lens[3] = {head_len, len2, len3};
  size_t skip = written;
  for (int i = 0; i < 3; ++i) {
    if (skip >= lens[i]) {
      skip -= lens[i];
      continue;
    }
    rest.insert(rest.end(), parts[i] + skip, parts[i] + lens[i]);
    skip = 0;
  }
  l->pending_bytes += rest.size();
  l->pending.push_back(std::move(rest));
  l->cv.notify_all();
  ++sent_;
  bytes_sent_ += total;
  return true;
}

bool data_plane::send_blob(const std::string& peer, uint8_t kind, caf::actor_id dest, const char* fields,
                           const blob& x) {
  const bool damaged = !x.damaged_wire.empty();
  const size_t n = x.data.size();
  const size_t blob_len = damaged ? x.damaged_wire.size() : blob_head + n * sizeof(float);
  char head[frame_head + frame_fields + blob_head];
  put_u32(head, frame_magic);
  head[4] = static_cast<char>(kind);
  head[5] = head[6] = head[7] = 0;
  put_u64(head + 8, dest);
  put_u64(head + 16, frame_fields + blob_len);
  std::memcpy(head + frame_head, fields, frame_fields);
  bool ok;
  if (damaged) {  // the damaged wire form verbatim (fault `corrupt`)
    ok = send_frame(peer, head, frame_head + frame_fields, x.damaged_wire.data(), blob_len, nullptr, 0);
  } else if (x.q8) {  // --sync q8_0: the blocks as blob::encode writes them
    char* b = head + frame_head + frame_fields;
    const size_t qb = q8_payload_bytes(n);
    put_u64(head + 16, frame_fields + blob_head + qb);
    std::vector<char> q(qb);
    q8_pack(x.data.data(), n, q.data(), false);
    b[0] = static_cast<char>((host_big_endian() ? 1 : 0) | 2);
    const uint32_t nn = static_cast<uint32_t>(n);
    const uint64_t h = XXH64(q.data(), qb, 0);
    std::memcpy(b + 1, &nn, 4);
    std::memcpy(b + 5, &h, 8);
    ok = send_frame(peer, head, sizeof head, q.data(), qb, nullptr, 0);
  } else {
    // The blob's wire form as blob::encode writes it, without copying the floats.
    char* b = head + frame_head + frame_fields;
    b[0] = static_cast<char>(host_big_endian() ? 1 : 0);
    const uint32_t nn = static_cast<uint32_t>(n);
    const uint64_t h = XXH64(x.data.data(), n * sizeof(float), 0);
    std::memcpy(b + 1, &nn, 4);
    std::memcpy(b + 5, &h, 8);
    ok = send_frame(peer, head, sizeof head, reinterpret_cast<const char*>(x.data.data()), n * sizeof(float),
                    nullptr, 0);
  }
  if (ok && kind == kind_activation) ++act_sent_;
  return ok;
}

bool data_plane::send(const std::string& peer, caf::actor_id dest, const partial_sum& m) {
  char f[frame_fields];
  put_step_id(f, m.id);
  put_u32(f + 20, static_cast<uint32_t>(m.layer));
  put_u32(f + 24, static_cast<uint32_t>(m.phase));
  put_u32(f + 28, static_cast<uint32_t>(m.rank));
  return send_blob(peer, kind_partial_sum, dest, f, m.data);
}

bool data_plane::send(const std::string& peer, caf::actor_id dest, const activation& m) {
  char f[frame_fields];
  put_step_id(f, m.id);
  put_u32(f + 20, static_cast<uint32_t>(m.replay_until));
  put_u64(f + 24, static_cast<uint64_t>(m.compute_ns));
  return send_blob(peer, kind_activation, dest, f, m.x);
}

void data_plane::deliver_local(uint64_t dest, partial_sum&& m) {
  caf::actor to;
  std::shared_ptr<sink> take;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = local_.find(dest);
    if (it != local_.end()) {
      to = caf::actor_cast<caf::actor>(it->second.addr);
      take = it->second.take;
    }
  }
  if (!to) return;  // an actor that is gone: dropped, as CAF would
  if (take && (*take)(m)) return;
  caf::anon_send(to, std::move(m));
}

void data_plane::deliver_local(uint64_t dest, activation&& m) {
  caf::actor to;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = local_.find(dest);
    if (it != local_.end()) to = caf::actor_cast<caf::actor>(it->second.addr);
  }
  if (!to) return;  // an actor that is gone: dropped, as CAF would
  caf::anon_send(to, dp_act_atom::value, std::move(m));
}

void data_plane::accept_loop() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (closing_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      return;
    }
    set_nodelay(fd);
    std::lock_guard<std::mutex> g(mu_);
    // Reader threads of closed connections stay until the plane ends (a few per peer restart).
    readers_.emplace_back(fd, std::thread([this, fd] { read_loop(fd); }));
  }
}

void data_plane::read_loop(int fd) {
  // The dialler's key first, within the connect deadline.
  char hello[12];
  if (!read_until(fd, hello, sizeof hello,
                  std::chrono::steady_clock::now() + std::chrono::milliseconds(connect_ms)) ||
      get_u32(hello) != frame_magic || get_u64(hello + 4) != ep_.key) {
    ++refused_;
    if (log_ && !closing_) log_("data plane: refused a connection (no key, or the wrong one)");
    ::shutdown(fd, SHUT_RDWR);
    return;
  }
  // A frame is read once its first bytes are here; the rest follows at once
  // from the sender's one write. A sender frozen mid-frame must not hold the
  // reader (or a borrower) for ever: 2 s, then the connection ends.
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto in = std::make_shared<inbound>();
  in->fd = fd;
  in->wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  {
    std::lock_guard<std::mutex> g(mu_);
    inbound_.push_back(in);
  }
  if (lent_) post_eventfd(in->wake);  // lent before it was listed: park
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(lend_mu_);
      lend_cv_.wait(lk, [&] { return !lent_ || closing_; });
    }
    if (closing_ || in->dead) break;
    pollfd pf[2] = {{fd, POLLIN, 0}, {in->wake, POLLIN, 0}};
    const int r = ::poll(pf, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (pf[1].revents != 0) {  // the reading is lent (or the plane closes): park
      drain_eventfd(in->wake);
      continue;
    }
    if (pf[0].revents == 0) continue;
    std::lock_guard<std::mutex> g(in->rd);
    if (in->dead) break;
    if (lent_ || !readable_now(fd)) continue;  // the borrower read it
    if (!read_frame(fd)) {
      in->dead = true;
      break;
    }
  }
  in->dead = true;
  ::shutdown(fd, SHUT_RDWR);
}

bool data_plane::read_frame(int fd) {
  const bool host_big = host_big_endian();
  char head[frame_head + frame_fields + blob_head];
  if (!read_full(fd, head, frame_head)) return false;
  const uint8_t kind = static_cast<uint8_t>(head[4]);
  const uint64_t dest = get_u64(head + 8);
  const uint64_t body = get_u64(head + 16);
  if (get_u32(head) != frame_magic || (kind != kind_partial_sum && kind != kind_activation) ||
      body < frame_fields + blob_head || body > max_body) {
    ++refused_;
    return false;
  }
  char* f = head + frame_head;
  if (!read_full(fd, f, frame_fields + blob_head)) return false;
  // The blob as blob::decode reads it: the sender's byte order, the count,
  // the checksum of the payload as sent.
  const char* b = f + frame_fields;
  const uint8_t flags = static_cast<uint8_t>(b[0]);
  const bool swap = ((flags & 1) != 0) != host_big;
  const bool q8 = (flags & 2) != 0;
  uint32_t n;
  uint64_t h;
  std::memcpy(&n, b + 1, 4);
  std::memcpy(&h, b + 5, 8);
  if (swap) {
    n = __builtin_bswap32(n);
    h = __builtin_bswap64(h);
  }
  const uint64_t payload = q8 ? q8_payload_bytes(n) : static_cast<uint64_t>(n) * 4;
  if ((flags & ~3u) != 0 || body != frame_fields + blob_head + payload) {
    ++refused_;  // the frame's length disagrees with its blob: the stream cannot be trusted
    return false;
  }
  blob x;
  if (q8) {  // --sync q8_0 blocks (blob::encode's flags bit 1)
    std::vector<char> q(payload);
    if (!read_full(fd, q.data(), q.size())) return false;
    if (XXH64(q.data(), q.size(), 0) != h) {
      x.status = 1;
    } else {
      x.data.resize(n);
      q8_unpack(q.data(), n, x.data.data(), swap);
      x.q8 = true;
    }
  } else {
    x.data.resize(n);
    if (!read_full(fd, reinterpret_cast<char*>(x.data.data()), static_cast<size_t>(n) * 4)) return false;
    if (XXH64(x.data.data(), static_cast<size_t>(n) * 4, 0) != h) {
      x.data.clear();
      x.status = 1;
    } else if (swap) {
      for (auto& v : x.data) {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        u = __builtin_bswap32(u);
        std::memcpy(&v, &u, 4);
      }
    }
  }
  ++received_;
  bytes_received_ += frame_head + body;
  step_id id;
  id.session = get_u64(f);
  id.epoch = get_u32(f + 8);
  id.pos0 = static_cast<int32_t>(get_u32(f + 12));
  id.count = static_cast<int32_t>(get_u32(f + 16));
  if (kind == kind_activation) {
    activation a;
    a.id = id;
    a.replay_until = static_cast<int32_t>(get_u32(f + 20));
    a.compute_ns = static_cast<int64_t>(get_u64(f + 24));
    a.x = std::move(x);
    ++act_received_;
    deliver_local(dest, std::move(a));
    return true;
  }
  partial_sum m;
  m.id = id;
  m.layer = static_cast<int32_t>(get_u32(f + 20));
  m.phase = static_cast<int32_t>(get_u32(f + 24));
  m.rank = static_cast<int32_t>(get_u32(f + 28));
  m.data = std::move(x);
  deliver_local(dest, std::move(m));
  return true;
}

bool data_plane::lend() {
  {
    std::lock_guard<std::mutex> g(lend_mu_);
    if (lent_ || closing_) return false;
    lent_ = true;
  }
  if (lends_.fetch_add(1) == 0 && log_)
    log_("data plane: reading lent to a fused job (a partial sum wakes only the thread that waits for it)");
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& in : inbound_)
    if (!in->dead) post_eventfd(in->wake);
  return true;
}

void data_plane::give_back() {
  {
    std::lock_guard<std::mutex> g(lend_mu_);
    lent_ = false;
  }
  lend_cv_.notify_all();
}

void data_plane::kick() {
  if (kick_fd_ >= 0) post_eventfd(kick_fd_);
}

void data_plane::pump(std::chrono::milliseconds timeout) {
  std::vector<std::shared_ptr<inbound>> ins;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& in : inbound_)
      if (!in->dead) ins.push_back(in);
  }
  std::vector<pollfd> pf;
  for (const auto& in : ins) pf.push_back({in->fd, POLLIN, 0});
  pf.push_back({kick_fd_, POLLIN, 0});
  const int r = ::poll(pf.data(), pf.size(), static_cast<int>(timeout.count()));
  if (r <= 0) return;
  if (pf.back().revents != 0) drain_eventfd(kick_fd_);
  for (size_t i = 0; i < ins.size(); ++i) {
    if (pf[i].revents == 0) continue;
    auto& in = *ins[i];
    std::lock_guard<std::mutex> g(in.rd);
    if (in.dead) continue;
    // Every frame already here (a peer may have sent the next layer's too).
    while (readable_now(in.fd))
      if (!read_frame(in.fd)) {
        in.dead = true;
        ::shutdown(in.fd, SHUT_RDWR);  // its reader thread sees the end once the reading is given back
        break;
      }
  }
}

}  // namespace cellshard::actors
