// `cellshard bench serve`: a bounded load test of `cellshard serve`'s HTTP
// API. C client threads each send R streamed completions (seed = request
// number, so every request's text is fixed) to a server started in this
// process (127.0.0.1, a free port), in two phases on fresh clusters: without
// faults, then with node K crashed (in process) or SIGKILLed (--processes)
// once a quarter of the requests have finished. Reported per phase:
// throughput (generated tokens/s and requests/s over the wall time), TTFT
// and TPOT p50/p99 as the clients measured them, errors (non-200, an error
// event, a missing [DONE], a gap or repeat in the token indices), and how
// many texts equal the fault-free phase's text for the same seed.
// A benchmark, not a test: it prints numbers and asserts nothing but errors = 0
// (exit status 1 otherwise).
#include "serve/server.hpp"
#include "tools/cluster_flags.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"
#include "actors/local_daemons.hpp"
#include "base/percentile.hpp"
#include "base/parse.hpp"
#include "tools/serve.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <thread>

namespace cellshard::tools {

using actors::daemon_models_dir;
using actors::local_daemon_options;
using actors::local_daemons;

namespace {

using clock_type = std::chrono::steady_clock;

struct bench_serve_opts {
  std::string model, tokenizer;
  int clients = 8, requests = 20, max_tokens = 64;
  std::string prompt = "Once upon a time";
  float temperature = 0.8f;
  int nodes = 4, spares = 1, processes = 0, kill_node = 1;
  bool skip_fault = false;
  std::string json_out;
  int caf_threads = 2;
};

struct phase_result {
  std::string name;
  double wall_s = 0;
  int requests = 0, errors = 0, tokens = 0;
  std::vector<double> ttft_ms, tpot_ms;
  std::vector<std::string> texts;  // by request number
  std::vector<std::string> error_notes;
  std::string fault_note;
};

/// One streamed completion; returns "" on success, else what went wrong.
std::string one_request(int port, const bench_serve_opts& o, int number, std::string& text, int& tokens,
                        std::vector<double>& ttft, std::vector<double>& tpot) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(120, 0);
  nlohmann::json body = {{"prompt", o.prompt},     {"max_tokens", o.max_tokens}, {"temperature", o.temperature},
                         {"seed", number + 1},     {"stream", true}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  std::string buf, problem;
  int next_index = 0;
  bool done = false;
  const auto t0 = clock_type::now();
  clock_type::time_point last;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t k;
    while ((k = buf.find("\n\n")) != std::string::npos) {
      const std::string ev = buf.substr(0, k);
      buf.erase(0, k + 2);
      int id = -1;
      std::string payload;
      size_t start = 0;
      while (start < ev.size()) {
        size_t end = ev.find('\n', start);
        if (end == std::string::npos) end = ev.size();
        const std::string line = ev.substr(start, end - start);
        if (line.rfind("id: ", 0) == 0) id = parse_uint<int>(std::string_view(line).substr(4)).value_or(-1);
        if (line.rfind("data: ", 0) == 0) payload = line.substr(6);
        start = end + 1;
      }
      if (payload.empty()) continue;
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      auto j = nlohmann::json::parse(payload, nullptr, false);
      if (j.is_discarded()) {
        problem = "an event is not JSON";
        continue;
      }
      if (j.contains("error")) {
        problem = "error event: " + j["error"].value("message", std::string());
        continue;
      }
      if (id >= 0) {
        if (id != next_index) problem = "token index " + std::to_string(id) + " where " + std::to_string(next_index) + " was due";
        ++next_index;
        const auto now = clock_type::now();
        if (id == 0) ttft.push_back(std::chrono::duration<double, std::milli>(now - t0).count());
        else tpot.push_back(std::chrono::duration<double, std::milli>(now - last).count());
        last = now;
        ++tokens;
      }
      for (const auto& c : j["choices"]) text += c.value("text", std::string());
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  if (!cli.send(req, res, err)) return "request failed: " + httplib::to_string(err);
  if (res.status != 200) return "status " + std::to_string(res.status) + ": " + res.body;
  if (!problem.empty()) return problem;
  if (!done) return "no [DONE]";
  return "";
}

phase_result run_phase(const bench_serve_opts& o, const loaded_model& lm, bool fault) {
  phase_result pr;
  pr.name = fault ? "node " + std::to_string(o.kill_node) + (o.processes ? " SIGKILLed" : " crashed") : "no fault";
  std::unique_ptr<local_daemons> daemons;
  cluster_flags cf;
  cf.caf_threads = o.caf_threads;
  cf.nodes = o.nodes;
  cf.spares = o.spares;
  if (o.processes > 0) {
    local_daemon_options lo;
    auto dir = daemon_models_dir(lm.file->path(), lm.tok->name());
    if (!dir) throw cli_error(dir.message());
    lo.models_dir = *dir;
    auto d = local_daemons::start(o.processes, o.spares, lo);
    if (!d) throw cli_error(d.message());
    daemons = std::move(*d);
    cf.cluster = daemons->log_dir() + "/cluster.json";
    auto w = daemons->write_cluster_file(cf.cluster);
    if (!w) throw cli_error(w.message());
  }
  actors::cluster_options co = make_cluster_options(cf, lm, o.clients);
  co.fault_injection = !daemons;
  auto c = actors::cluster::start(co);
  if (!c) throw cli_error(c.message());
  serve::server_options so;
  so.max_sessions = o.clients;
  so.model_id = model_id_of(lm.file->path());
  auto inject = node_fault_action(daemons.get(), c->get());
  serve::server srv(**c, so);
  auto addr = srv.bind();
  if (!addr) throw cli_error(addr.message());
  const int port = parse_uint<int>(std::string_view(*addr).substr(addr->rfind(':') + 1)).value_or(0);
  if (port <= 0) throw cli_error("bench serve: the server bound '" + *addr + "', not HOST:PORT");
  std::thread http([&] { srv.run(); });

  const int total = o.clients * o.requests;
  pr.texts.assign(total, "");
  std::atomic<int> finished{0};
  std::atomic<bool> injected{false};
  std::mutex mu;
  const auto t0 = clock_type::now();
  std::vector<std::thread> clients;
  for (int k = 0; k < o.clients; ++k)
    clients.emplace_back([&, k] {
      for (int i = 0; i < o.requests; ++i) {
        const int number = k * o.requests + i;
        std::string text;
        int tokens = 0;
        std::vector<double> ttft, tpot;
        const std::string err = one_request(port, o, number, text, tokens, ttft, tpot);
        {
          std::lock_guard<std::mutex> lock(mu);
          ++pr.requests;
          pr.tokens += tokens;
          pr.texts[number] = text;
          pr.ttft_ms.insert(pr.ttft_ms.end(), ttft.begin(), ttft.end());
          pr.tpot_ms.insert(pr.tpot_ms.end(), tpot.begin(), tpot.end());
          if (!err.empty()) {
            ++pr.errors;
            if (pr.error_notes.size() < 5) pr.error_notes.push_back("request " + std::to_string(number) + ": " + err);
          }
        }
        if (++finished >= total / 4 && fault && !injected.exchange(true)) {
          auto r = inject(o.kill_node, "crash");
          std::lock_guard<std::mutex> lock(mu);
          pr.fault_note = r ? "injected after " + std::to_string(finished.load()) + " requests" : "injection failed: " + r.message();
        }
      }
    });
  for (auto& t : clients) t.join();
  pr.wall_s = std::chrono::duration<double>(clock_type::now() - t0).count();
  for (const auto& f : (*c)->faults())
    pr.fault_note += "; " + f.kind + " of shard " + std::to_string(f.index) + " on node " + std::to_string(f.node) +
                     ": detected in " + std::to_string(static_cast<int>(f.detect_ms)) + " ms, recovered in " +
                     std::to_string(static_cast<int>(f.recover_ms)) + " ms";
  srv.stop();
  http.join();
  (*c)->shutdown();
  return pr;
}

int do_bench_serve(const bench_serve_opts& o) {
  if (o.clients < 1 || o.requests < 1 || o.max_tokens < 1)
    throw cli_error("--clients, --requests and --max-tokens must be at least 1", 2);
  loaded_model lm = load_model(o.model, o.tokenizer);
  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  std::vector<phase_result> phases;
  phases.push_back(run_phase(o, lm, false));
  if (!o.skip_fault) phases.push_back(run_phase(o, lm, true));
  const std::string where = o.processes ? std::to_string(o.processes) + " daemon processes + " +
                                              std::to_string(o.spares) + " spare(s)"
                                        : std::to_string(o.nodes) + " in-process nodes + " + std::to_string(o.spares) +
                                              " spare(s)";
  std::printf("bench serve: %d clients x %d requests, max_tokens %d, %s\n", o.clients, o.requests, o.max_tokens,
              where.c_str());
  std::printf("| phase | requests | errors | tokens | wall s | tokens/s | requests/s | TTFT p50 ms | TTFT p99 ms | "
              "TPOT p50 ms | TPOT p99 ms | texts equal to fault-free |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json rows = nlohmann::json::array();
  int errors = 0;
  for (const auto& p : phases) {
    int same = 0;
    for (size_t i = 0; i < p.texts.size(); ++i) same += p.texts[i] == phases[0].texts[i];
    std::printf("| %s | %d | %d | %d | %.2f | %.1f | %.2f | %.2f | %.2f | %.3f | %.3f | %d/%zu |\n", p.name.c_str(),
                p.requests, p.errors, p.tokens, p.wall_s, p.tokens / p.wall_s, p.requests / p.wall_s,
                percentile(p.ttft_ms, 0.5), percentile(p.ttft_ms, 0.99), percentile(p.tpot_ms, 0.5), percentile(p.tpot_ms, 0.99), same,
                p.texts.size());
    if (!p.fault_note.empty()) std::printf("  fault: %s\n", p.fault_note.c_str());
    for (const auto& e : p.error_notes) std::printf("  error: %s\n", e.c_str());
    errors += p.errors;
    rows.push_back({{"phase", p.name}, {"requests", p.requests}, {"errors", p.errors}, {"tokens", p.tokens},
                    {"wall_s", p.wall_s}, {"tokens_per_s", p.tokens / p.wall_s},
                    {"requests_per_s", p.requests / p.wall_s}, {"ttft_ms_p50", percentile(p.ttft_ms, 0.5)},
                    {"ttft_ms_p99", percentile(p.ttft_ms, 0.99)}, {"tpot_ms_p50", percentile(p.tpot_ms, 0.5)},
                    {"tpot_ms_p99", percentile(p.tpot_ms, 0.99)}, {"texts_equal_to_fault_free", same},
                    {"fault", p.fault_note}});
  }
  std::fflush(stdout);
  if (!o.json_out.empty()) write_text(o.json_out, nlohmann::json{{"rows", rows}}.dump(2) + "\n");
  return errors == 0 ? 0 : 1;
}

}  // namespace

void add_bench_serve(CLI::App& app, int& status) {
  auto* bench = app.get_subcommand("bench");
  auto o = std::make_shared<bench_serve_opts>();
  auto* cmd = bench->add_subcommand("serve", "load test of the HTTP API: C clients x R streamed completions, "
                                             "without and with a node killed during the run");
  cmd->add_option("-m,--model", o->model, "model file");
  cmd->add_option("-z,--tokenizer", o->tokenizer, "tokenizer");
  cmd->add_option("--clients", o->clients, "concurrent clients (= --max-sessions of the server)")->capture_default_str();
  cmd->add_option("--requests", o->requests, "requests per client")->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "max_tokens of each request")->capture_default_str();
  cmd->add_option("--prompt", o->prompt, "prompt of every request")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "temperature (each request's seed is its number)")
      ->capture_default_str();
  cmd->add_option("--nodes", o->nodes, "in-process nodes")->capture_default_str();
  cmd->add_option("--spares", o->spares, "spare nodes")->capture_default_str();
  cmd->add_option("--processes", o->processes, "node daemon processes instead of in-process nodes");
  cmd->add_option("--kill-node", o->kill_node, "the node crashed (or SIGKILLed) in the second phase")
      ->capture_default_str();
  cmd->add_flag("--skip-fault", o->skip_fault, "only the fault-free phase");
  cmd->add_option("--caf-threads", o->caf_threads, "CAF scheduler threads")->capture_default_str();
  cmd->add_option("--json", o->json_out, "rows as JSON to FILE (- = stdout)");
  cmd->callback([o, &status] { status = do_bench_serve(*o); });
}

}  // namespace cellshard::tools
