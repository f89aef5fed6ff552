// `cellshard status --cluster FILE [--json FILE]`: what every node daemon of
// a cluster file holds now -- memory in use and budget, shards, sessions,
// uptime, link shaping, version, TLS, connections its guard closed (issue
// #20), its slice cache and the weight bytes shipped to it (issue #17). Each daemon is asked once (stats), through the guard dialer and TLS
// as a front end connects; an unreachable daemon is listed with the reason
// and makes the exit status 1.
#include "actors/guard.hpp"
#include "actors/messages.hpp"
#include "actors/remote.hpp"
#include "actors/tls.hpp"
#include "topologies/profile.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

namespace cellshard::tools {

namespace {

struct status_opts {
  std::string cluster, json_out, tls_cert, tls_key, tls_ca;
  int timeout_ms = 5000;
};

int do_status(const status_opts& o) {
  auto nodes = actors::parse_cluster_json(read_text(o.cluster), o.cluster);
  if (!nodes) throw cli_error(nodes.message());
  actors::net_options net;
  net.tls = {o.tls_cert, o.tls_key, o.tls_ca};
  if (auto f = actors::check_tls_flags(net.tls); !f) throw cli_error(f.message(), 2);
  caf::actor_system_config cfg;
  actors::register_messages(cfg);
  if (auto c = actors::configure_network(cfg, net); !c) throw cli_error(c.message());
  caf::actor_system sys(cfg);
  if (auto c = actors::check_network(sys, net); !c) throw cli_error(c.message());
  const bool tls = net.tls.requested();
  auto mm = actors::connector(sys, tls);
  const auto deadline = std::chrono::milliseconds(o.timeout_ms);
  caf::scoped_actor self(sys);
  nlohmann::json out = nlohmann::json::array();
  int failed = 0;
  std::printf("%-22s %-5s %-9s %-22s %6s %8s %9s %-16s %-8s %-28s %s\n", "daemon", "node", "profile",
              "memory (used/budget)", "shards", "sessions", "uptime", "link", "version", "tls/guard",
              "cache (used/max, slices, hits), shipped");
  for (const auto& n : *nodes) {
    nlohmann::json j = {{"address", n.address()}};
    std::string error;
    caf::actor daemon;
    auto local = actors::guarded_port(n.host, n.port);
    if (!local) error = local.message();
    else
      self->request(mm, deadline, caf::connect_atom::value, std::string("127.0.0.1"), *local)
          .receive(
              [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
                if (ptr) daemon = caf::actor_cast<caf::actor>(ptr);
                else error = "no cellshard node daemon published there";
              },
              [&](caf::error& e) {
                const auto g = actors::dial_error(n.host, n.port);
                error = g.empty() ? actors::describe_connect_error(sys, e) : g;
              });
    actors::node_report r;
    if (daemon)
      self->request(daemon, deadline, actors::stats_atom::value)
          .receive([&](actors::node_report& rep) { r = rep; },
                   [&](caf::error& e) { error = "no statistics: " + sys.render(e); });
    if (!error.empty()) {
      ++failed;
      j["error"] = error;
      std::printf("%-22s unreachable: %s\n", n.address().c_str(), error.c_str());
      out.push_back(j);
      continue;
    }
    j.update({{"node", r.node},
              {"profile", r.profile},
              {"used_bytes", r.used_bytes},
              {"budget_bytes", r.budget_bytes},
              {"shards", r.shards},
              {"sessions", r.sessions},
              {"clients", r.clients},
              {"uptime_s", r.uptime_ms / 1000.0},
              {"link", r.link},
              {"version", r.version},
              {"tls", r.tls},
              {"guard_rejected", r.guard_rejected},
              {"pid", r.pid},
              {"shipped_bytes", r.shipped_bytes},
              {"cache_dir", r.cache_dir},
              {"cache_bytes", r.cache_bytes},
              {"cache_max_bytes", r.cache_max},
              {"cache_entries", r.cache_entries},
              {"cache_hits", r.cache_hits}});
    out.push_back(j);
    const std::string mem = topologies::format_bytes(r.used_bytes) + " / " +
                            (r.budget_bytes ? topologies::format_bytes(r.budget_bytes) : std::string("unlimited"));
    const std::string guard = std::string(r.tls ? "mutual TLS" : "plain") + ", " +
                              std::to_string(r.guard_rejected) + " rejected";
    const std::string cache =
        r.cache_dir.empty()
            ? std::string("no cache")
            : topologies::format_bytes(r.cache_bytes) + " / " +
                  (r.cache_max ? topologies::format_bytes(r.cache_max) : std::string("unbounded")) + ", " +
                  std::to_string(r.cache_entries) + " slices, " + std::to_string(r.cache_hits) + " hits";
    std::printf("%-22s %-5d %-9s %-22s %6d %8d %8.0fs %-16s %-8s %-28s %s, %s shipped\n", n.address().c_str(), r.node,
                r.profile.c_str(), mem.c_str(), r.shards, r.sessions, r.uptime_ms / 1000.0,
                r.link.empty() ? "unshaped" : r.link.c_str(), r.version.c_str(), guard.c_str(), cache.c_str(),
                topologies::format_bytes(r.shipped_bytes).c_str());
  }
  if (!o.json_out.empty()) write_text(o.json_out, nlohmann::json{{"daemons", out}}.dump(2) + "\n");
  if (failed) throw cli_error(std::to_string(failed) + " of " + std::to_string(nodes->size()) +
                              " daemon(s) unreachable");
  return 0;
}

}  // namespace

void add_status(CLI::App& app, int& status) {
  auto o = std::make_shared<status_opts>();
  auto* cmd = app.add_subcommand("status", "memory, shards, sessions, uptime, links and version of each node daemon");
  cmd->add_option("--cluster", o->cluster, "the cluster file (as run --cluster)")->required();
  cmd->add_option("--json", o->json_out, "also write {\"daemons\": [...]} to FILE (- = stdout)");
  cmd->add_option("--tls-cert", o->tls_cert, "this side's certificate (PEM), when the daemons use TLS");
  cmd->add_option("--tls-key", o->tls_key, "its private key (PEM)");
  cmd->add_option("--tls-ca", o->tls_ca, "the CA of the daemons' certificates (PEM)");
  cmd->add_option("--timeout-ms", o->timeout_ms, "deadline per daemon")->check(CLI::Range(1, 600000))
      ->capture_default_str();
  cmd->callback([o, &status] { status = do_status(*o); });
}

}  // namespace cellshard::tools
