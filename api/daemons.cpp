// api/daemons.cpp: <cellshard/daemons.hpp> over actors::local_daemons.
#include <cellshard/daemons.hpp>

#include "actors/local_daemons.hpp"

#include <csignal>

namespace cellshard {

struct daemon_set::impl {
  std::unique_ptr<actors::local_daemons> d;
};

result<std::unique_ptr<daemon_set>> daemon_set::start(int working, int spares, const options& o) {
  if (o.binary.empty()) return make_error(error_code::invalid_argument, "daemon_set: binary: empty");
  if (o.models_dir.empty()) return make_error(error_code::invalid_argument, "daemon_set: models_dir: empty");
  if (working < 1 || spares < 0)
    return make_error(error_code::invalid_argument, "daemon_set: need at least 1 working daemon and spares >= 0, got " +
                                                        std::to_string(working) + " and " + std::to_string(spares));
  actors::local_daemon_options lo;
  lo.binary = o.binary;
  lo.models_dir = o.models_dir;
  lo.profile = to_string(o.profile);
  if (o.memory_bytes) lo.memory = std::to_string(o.memory_bytes);
  const tls_settings& t = o.tls;
  if (!t.cert_file.empty() || !t.key_file.empty() || !t.ca_file.empty())
    lo.extra_args = {"--tls-cert", t.cert_file, "--tls-key", t.key_file, "--tls-ca", t.ca_file};
  lo.log_dir = o.log_dir;
  lo.start_deadline = o.start_deadline;
  auto d = actors::local_daemons::start(working, spares, lo);
  if (!d) return make_error(d.code() == error_code::unspecified ? error_code::unavailable : d.code(), d.message());
  auto im = std::make_unique<impl>();
  im->d = std::move(*d);
  return std::unique_ptr<daemon_set>(new daemon_set(std::move(im)));
}

daemon_set::daemon_set(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
daemon_set::~daemon_set() = default;

int daemon_set::size() const { return impl_->d->size(); }
std::uint16_t daemon_set::port(int i) const { return impl_->d->port(i); }
int daemon_set::pid(int i) const { return static_cast<int>(impl_->d->pid(i)); }

result<void> daemon_set::write_cluster_file(const std::string& path) const {
  auto r = impl_->d->write_cluster_file(path);
  if (!r) return make_error(error_code::io, r.message());
  return {};
}

result<cellshard::hosts> daemon_set::hosts(const tls_settings& tls) const {
  const std::string path = impl_->d->log_dir() + "/cluster.json";
  if (auto w = write_cluster_file(path); !w) return w.err();
  return cellshard::hosts::daemons(path, tls);
}

namespace {
result<void> checked(result<int64_t> r) {
  if (!r) return make_error(error_code::invalid_argument, r.message());
  return {};
}
}  // namespace

result<void> daemon_set::kill(int i) { return checked(impl_->d->signal(i, SIGKILL)); }
result<void> daemon_set::freeze(int i) { return checked(impl_->d->signal(i, SIGSTOP)); }
result<void> daemon_set::thaw(int i) { return checked(impl_->d->signal(i, SIGCONT)); }
std::string daemon_set::log(int i, std::size_t max_bytes) const { return impl_->d->log(i, max_bytes); }

}  // namespace cellshard
