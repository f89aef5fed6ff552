#include "actors/tls.hpp"

#include "base/parse.hpp"

#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/sec.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509err.h>
#include <openssl/x509_vfy.h>

#include <cstdio>
#include <memory>

namespace cellshard::actors {

namespace {

std::string ssl_errors() {
  std::string msg;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!msg.empty()) msg += "; ";
    msg += buf;
  }
  return msg.empty() ? "no reason given" : msg;
}

bool readable(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  std::fclose(f);
  return true;
}

// Refuses to prompt for a passphrase (OpenSSL's default reads the terminal).
int no_passphrase(char*, int, int, void*) { return 0; }

struct ctx_deleter {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
struct store_ctx_deleter {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};

}  // namespace

result<void> check_tls_flags(const tls_files& t) {
  if (!t.requested()) return {};
  std::string missing;
  auto need = [&](const std::string& v, const char* flag) {
    if (v.empty()) missing += (missing.empty() ? "" : ", ") + std::string(flag);
  };
  need(t.cert, "--tls-cert");
  need(t.key, "--tls-key");
  need(t.ca, "--tls-ca");
  if (!missing.empty())
    return make_error("TLS needs --tls-cert, --tls-key and --tls-ca together (mutual TLS); missing " +
                      missing);
  return {};
}

result<void> validate_tls(const tls_files& t) {
  auto flags = check_tls_flags(t);
  if (!flags || !t.requested()) return flags;
  for (auto [path, flag] : {std::pair{t.cert, "--tls-cert"}, {t.key, "--tls-key"}, {t.ca, "--tls-ca"}})
    if (!readable(path)) return make_error(std::string(flag) + ": cannot read " + path);
  ERR_clear_error();
  std::unique_ptr<SSL_CTX, ctx_deleter> ctx(SSL_CTX_new(TLS_method()));
  if (!ctx) return make_error("TLS: cannot create an OpenSSL context: " + ssl_errors());
  SSL_CTX_set_default_passwd_cb(ctx.get(), no_passphrase);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), t.cert.c_str()) != 1)
    return make_error("--tls-cert: " + t.cert + " is not a PEM certificate: " + ssl_errors());
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), t.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH)
      return make_error("--tls-key: " + t.key + " does not belong to the certificate " + t.cert + ": " +
                        ssl_errors());
    return make_error("--tls-key: cannot load the private key " + t.key +
                      " (PEM, unencrypted): " + ssl_errors());
  }
  if (SSL_CTX_check_private_key(ctx.get()) != 1)
    return make_error("--tls-key: " + t.key + " does not belong to the certificate " + t.cert + ": " +
                      ssl_errors());
  if (SSL_CTX_load_verify_locations(ctx.get(), t.ca.c_str(), nullptr) != 1)
    return make_error("--tls-ca: " + t.ca + " holds no usable CA certificate: " + ssl_errors());
  // Our own certificate must verify against the CA every peer trusts, or every
  // peer would refuse us (the same check the peers' OpenSSL will make).
  X509* cert = SSL_CTX_get0_certificate(ctx.get());
  STACK_OF(X509)* chain = nullptr;
  SSL_CTX_get0_chain_certs(ctx.get(), &chain);
  std::unique_ptr<X509_STORE_CTX, store_ctx_deleter> sc(X509_STORE_CTX_new());
  if (!cert || !sc || X509_STORE_CTX_init(sc.get(), SSL_CTX_get_cert_store(ctx.get()), cert, chain) != 1)
    return make_error("TLS: cannot check " + t.cert + ": " + ssl_errors());
  if (X509_verify_cert(sc.get()) != 1)
    return make_error("--tls-cert: " + t.cert + " does not verify against the CA in " + t.ca + ": " +
                      X509_verify_cert_error_string(X509_STORE_CTX_get_error(sc.get())));
  return {};
}

void set_idle_wake(caf::actor_system_config& cfg) {
  cfg.set("work-stealing.moderate-poll-attempts", size_t{0});
}

result<void> configure_network(caf::actor_system_config& cfg, const net_options& o) {
  auto ok = validate_tls(o.tls);
  if (!ok) return ok;
  if (o.heartbeat.count() <= 0 || o.connection_timeout.count() <= 0)
    return make_error("heartbeat and connection timeout must be positive (got " +
                      std::to_string(o.heartbeat.count()) + " ms and " +
                      std::to_string(o.connection_timeout.count()) + " ms)");
  cfg.load<caf::io::middleman>();
  cfg.set("middleman.heartbeat-interval", caf::timespan{o.heartbeat});
  cfg.set("middleman.connection-timeout", caf::timespan{o.connection_timeout});
  // Deserialise incoming messages on the middleman's own thread, not on BASP
  // worker jobs in the scheduler: a thread that blocks on a reply (a
  // scoped_actor, e.g. remote_host::spawn called from the supervision tree)
  // could otherwise be the very thread that job needs, and with 2 scheduler
  // threads both can be blocked (seen: spawn replies never delivered). It is
  // also the faster setting on 2 cores (CAF-0.17.md §3).
  cfg.set("middleman.workers", size_t{0});
  if (o.caf_threads > 0) cfg.set("scheduler.max-threads", static_cast<size_t>(o.caf_threads));
  // How idle CAF workers wait (set_idle_wake), for every process configured
  // here (daemons, front ends): wake by default; CELLSHARD_CAF_IDLE=poll
  // keeps CAF 0.17.6's sleep polling (for comparisons). Measured by `bench
  // peers --cluster --caf-idle poll,wake`: the polling workers took the
  // kernel thread's CPU (busiest daemon 18-20 ms of kernels per position
  // against 4-5 ms with wake, stories42m over 2 and 4 daemons on 2 cores),
  // and tokens/s rose 2.5-4.2x (docs/distributed.md).
  const char* idle = std::getenv("CELLSHARD_CAF_IDLE");
  const std::string policy = idle ? idle : "";
  if (policy.empty() || policy == "wake") set_idle_wake(cfg);
  else if (policy != "poll")
    return make_error("CELLSHARD_CAF_IDLE: expected poll or wake, got '" + policy + "'");
  if (o.tls.requested()) {
    cfg.load<caf::openssl::manager>();
    cfg.set("openssl.certificate", o.tls.cert);
    cfg.set("openssl.key", o.tls.key);
    cfg.set("openssl.cafile", o.tls.ca);
    // The members are what caf-openssl reads; set them too in case a key
    // name is not bound to its member in this CAF version.
    cfg.openssl_certificate = o.tls.cert;
    cfg.openssl_key = o.tls.key;
    cfg.openssl_cafile = o.tls.ca;
  }
  return {};
}

result<void> check_network(caf::actor_system& sys, const net_options& o) {
  if (!sys.has_middleman()) return make_error("the actor system runs without CAF's middleman");
  if (!o.tls.requested()) return {};
  if (!sys.has_openssl_manager())
    return make_error("TLS was requested but CAF's OpenSSL module is not loaded; refusing to start");
  if (!sys.openssl_manager().authentication_enabled())
    return make_error("TLS was requested but CAF's OpenSSL module does not authenticate peers "
                      "(it would fall back to anonymous TLS); refusing to start");
  const auto& c = sys.config();
  if (c.openssl_certificate != o.tls.cert || c.openssl_key != o.tls.key || c.openssl_cafile != o.tls.ca)
    return make_error("TLS was requested but CAF's OpenSSL module runs with other files than "
                      "--tls-cert/--tls-key/--tls-ca; refusing to start");
  return {};
}

caf::io::middleman_actor connector(caf::actor_system& sys, bool tls) {
  return tls ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
}

std::string describe_connect_error(caf::actor_system& sys, const caf::error& e) {
  std::string text = sys.render(e);
  if (e.category() != caf::atom("system")) return text;
  switch (static_cast<caf::sec>(e.code())) {
    case caf::sec::connection_timeout:
      return text + " (no heartbeat from the peer: frozen or overloaded?)";
    case caf::sec::request_timeout:
      return text + " (no answer within the deadline)";
    case caf::sec::cannot_connect_to_node:
      return text + " (nothing listening there, or unreachable)";
    case caf::sec::disconnect_during_handshake:
      return text + " (the peer closed the connection during the handshake: TLS on one side "
                    "only, or a certificate the other side does not trust)";
    case caf::sec::no_actor_published_at_port:
      return text + " (not a cellshard node daemon?)";
    default:
      return text;
  }
}

result<host_port> parse_host_port(const std::string& text, const std::string& flag) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    return make_error(flag + ": expected HOST:PORT, got '" + text + "'");
  host_port hp;
  hp.host = text.substr(0, colon);
  if (hp.host.size() > 2 && hp.host.front() == '[' && hp.host.back() == ']')
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  const std::string p = text.substr(colon + 1);
  const auto v = parse_uint<std::uint32_t>(p);  // base/parse.hpp
  if (!v) return make_error(flag + ": bad port '" + p + "' in '" + text + "'");
  if (*v > 65535) return make_error(flag + ": port " + p + " out of range in '" + text + "'");
  hp.port = static_cast<uint16_t>(*v);
  return hp;
}

}  // namespace cellshard::actors
