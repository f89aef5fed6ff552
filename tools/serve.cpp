// `cellshard serve`: an OpenAI-compatible HTTP API and a live page in front
// of a cluster (serve/server.hpp, docs/serve.md). The cluster is the one
// `run` would start with the same flags (tools/cluster_flags.hpp); node
// daemons come from --cluster FILE, or --processes N starts N local ones
// (actors/local_daemons.hpp) whose processes the page can kill and freeze.
#include "serve/server.hpp"
#include "supervision/fault_plan.hpp"
#include "base/parse.hpp"
#include "tools/cluster_flags.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"
#include "tools/stop_signals.hpp"
#include "actors/local_daemons.hpp"
#include "tools/serve.hpp"

#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>
#include <pthread.h>
#include <thread>
#include <unistd.h>

namespace cellshard::tools {

using actors::daemon_models_dir;
using actors::local_daemon_options;
using actors::local_daemons;

namespace {

struct serve_opts {
  std::string model, tokenizer;
  std::string listen = "127.0.0.1:8080";
  int max_sessions = 8;
  std::string api_key, tls_cert, tls_key;
  size_t max_body = 1 << 20;
  bool allow_fault_injection = false;
  int processes = 0;  // local node daemons to start (0: none)
  std::string chat_format, json_out;
  cluster_flags cf;
};

int do_serve(serve_opts o) {
  const size_t colon = o.listen.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw cli_error("--listen: expected HOST:PORT (port 0 = a free one), got '" + o.listen + "'", 2);
  serve::server_options so;
  so.host = o.listen.substr(0, colon);
  if (so.host.size() > 2 && so.host.front() == '[' && so.host.back() == ']') so.host = so.host.substr(1, so.host.size() - 2);
  const auto port = parse_uint<int>(std::string_view(o.listen).substr(colon + 1));  // base/parse.hpp
  if (!port || *port > 65535)
    throw cli_error("--listen: port '" + o.listen.substr(colon + 1) + "' is not in 0..65535", 2);
  so.port = *port;
  if (o.max_sessions < 1) throw cli_error("--max-sessions: need at least 1", 2);
  if (o.tls_cert.empty() != o.tls_key.empty()) throw cli_error("--tls-cert and --tls-key go together (HTTPS)", 2);

  if (!o.chat_format.empty())
    if (auto f = model::chat::parse_format(o.chat_format); !f) throw cli_error("--chat-format: " + f.message(), 2);

  apply_kernel_flags(o.cf);
  loaded_model lm = load_model(o.model, o.tokenizer, false, o.cf.ctx);
  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  // /v1/chat/completions lays out messages as run --chat does.
  auto chat_format = model::chat::format_for(o.chat_format, o.model);
  if (!chat_format) throw cli_error(chat_format.message());
  so.chat_format = *chat_format;
  std::fprintf(stderr, "chat format: %s\n", model::chat::to_string(so.chat_format));

  // --processes N: local daemons this process starts (and the page may signal).
  std::unique_ptr<local_daemons> daemons;
  if (o.processes > 0) {
    if (!o.cf.cluster.empty()) throw cli_error("--processes starts its own daemons: drop --cluster", 2);
    local_daemon_options lo;
    auto dir = daemon_models_dir(lm.file->path(), lm.tok->name());
    if (!dir) throw cli_error("--processes: " + dir.message());
    lo.models_dir = *dir;
    lo.profile = o.cf.profile == "host" ? "" : o.cf.profile;
    lo.memory = o.cf.memory;
    auto d = local_daemons::start(o.processes, o.cf.spares, lo);
    if (!d) throw cli_error(d.message());
    daemons = std::move(*d);
    o.cf.cluster = daemons->log_dir() + "/cluster.json";
    auto w = daemons->write_cluster_file(o.cf.cluster);
    if (!w) throw cli_error(w.message());
  }
  // SIGINT/SIGTERM stop the server, whichever thread takes them
  // (tools/stop_signals.hpp); the watcher below waits for them.
  stop_signals stop;
  std::signal(SIGPIPE, SIG_IGN);  // a client gone during a TLS write
  actors::cluster_options co = make_cluster_options(o.cf, lm, o.max_sessions);
  co.fault_injection = o.allow_fault_injection && !daemons;
  auto c = actors::cluster::start(co);
  if (!c) throw cli_error(c.message(), exit_status_of(c.code()));
  actors::cluster& cluster = **c;
  if (o.cf.print_placement) std::fprintf(stderr, "%s", topologies::to_string(cluster.placement()).c_str());

  so.api_key = o.api_key;
  so.tls_cert = o.tls_cert;
  so.tls_key = o.tls_key;
  so.max_sessions = o.max_sessions;
  so.max_body_bytes = o.max_body;
  so.allow_fault_injection = o.allow_fault_injection;
  so.model_id = model_id_of(lm.file->path());
  serve::fault_action inject;
  if (o.allow_fault_injection) {
    inject = node_fault_action(daemons.get(), &cluster);
  }

  int stopped_by = 0;
  {
    serve::server srv(cluster, so, inject);
    auto addr = srv.bind();
    if (!addr) throw cli_error(addr.message());
    // --json: the address for scripts, written once the server is bound and
    // before the `listening` line (whoever read that line finds the file).
    if (!o.json_out.empty())
      write_text(o.json_out, nlohmann::json{{"listening", *addr}, {"pid", ::getpid()}, {"model", so.model_id},
                                            {"scheme", so.tls_cert.empty() ? "http" : "https"}}
                                 .dump() + "\n");
    std::printf("listening %s\n", addr->c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "serving %s on %s://%s (max %d sessions)%s\n", so.model_id.c_str(),
                 so.tls_cert.empty() ? "http" : "https", addr->c_str(), so.max_sessions,
                 so.allow_fault_injection ? ", fault injection on" : "");
    std::thread watcher([&] {
      stopped_by = stop.wait();  // 0: cancelled, the server ended by itself
      srv.stop();
    });
    srv.run();
    stop.cancel();  // ends the watcher's wait when no signal came
    watcher.join();
    // Sessions still running end before the server's counters go away.
    cluster.shutdown();
  }
  if (daemons) daemons->thaw_all();
  std::fprintf(stderr, "stopped (%s)\n", stopped_by == SIGINT ? "SIGINT" : stopped_by == SIGTERM ? "SIGTERM" : "server ended");
  return 0;
}

}  // namespace

std::string model_id_of(const std::string& path) {
  std::string name = path.substr(path.rfind('/') + 1);
  const size_t dot = name.rfind('.');
  if (dot != std::string::npos && dot > 0) name = name.substr(0, dot);
  return name;
}

serve::fault_action node_fault_action(local_daemons* dm, actors::cluster* cl) {
  return [dm, cl](int node, const std::string& kind) -> result<void> {
    const auto nodes = cl->current_nodes();
    std::vector<int> indices;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i] == node) indices.push_back(static_cast<int>(i));
    if (indices.empty()) return make_error("node " + std::to_string(node) + " holds no shard now");
    if (dm) {  // a real process: SIGKILL or SIGSTOP it
      if (node >= dm->size()) return make_error("node " + std::to_string(node) + " is not one of the daemons");
      auto r = kind == "crash" ? dm->kill(node) : dm->freeze(node);
      if (!r) return r.err();
      return {};
    }
    for (int i : indices) {
      supervision::fault_plan p;
      p.kind = kind == "crash" ? supervision::fault_kind::crash : supervision::fault_kind::silence;
      p.node = static_cast<uint32_t>(i);
      p.step = 0;  // its next step
      auto r = cl->inject(p);
      if (!r) return r;
    }
    return {};
  };
}

void add_serve(CLI::App& app, int& status) {
  auto o = std::make_shared<serve_opts>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP API and live cluster page (docs/serve.md)");
  cmd->add_option("-m,--model", o->model, "model file; without it the default model lookup of CLI.md");
  cmd->add_option("-z,--tokenizer", o->tokenizer, "tokenizer (default: tokenizer.bin beside the model)");
  auto* h = "HTTP";
  cmd->add_option("--listen", o->listen, "HOST:PORT to listen on (port 0: a free one; stdout's first line says which)")
      ->capture_default_str()->group(h);
  cmd->add_option("--json", o->json_out,
                  "write {\"listening\": \"HOST:PORT\", \"pid\", \"model\", \"scheme\"} to FILE once listening")
      ->group(h);
  cmd->add_option("--max-sessions", o->max_sessions, "concurrent generation sessions (more: 429 with Retry-After)")
      ->capture_default_str()->group(h);
  cmd->add_option("--api-key", o->api_key, "require Authorization: Bearer KEY on /v1/ routes")->group(h);
  cmd->add_option("--tls-cert", o->tls_cert, "HTTPS: the server's certificate (PEM)")->group(h);
  cmd->add_option("--tls-key", o->tls_key, "HTTPS: its private key (PEM)")->group(h);
  cmd->add_option("--chat-format", o->chat_format,
                  "prompt format of /v1/chat/completions: llama2|llama3|chatml|zephyr|none (default: from the "
                  "GGUF's tokenizer.chat_template; none joins the messages' contents by newlines)");
  cmd->add_option("--max-body", o->max_body, "largest request body in bytes (more: 413)")->capture_default_str()->group(h);
  cmd->add_flag("--allow-fault-injection", o->allow_fault_injection,
                "POST /v1/cluster/fault and the page's crash/freeze buttons")->group(h);
  cmd->add_option("--processes", o->processes,
                  "start N local node daemons (plus --spares) and serve over them; the page's buttons then "
                  "SIGKILL/SIGSTOP the processes")->group("Nodes (daemons)");
  const cluster_flag_set set = add_cluster_flags(cmd, o->cf, "node-");
  cmd->callback([o, cmd, set, &status] {
    if (o->processes > 0 && cmd->count("--nodes") > 0)
      throw cli_error("--processes N starts N daemons: drop --nodes", 2);
    check_cluster_flags(cmd, set, o->cf);
    status = do_serve(*o);
  });
}

}  // namespace cellshard::tools
