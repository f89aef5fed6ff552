// `cellshard chaos`: R runs with random fault plans drawn from a seed, each
// checked against a fault-free reference run of the same placement. A run is
// diverged when it finished with other ids than the reference, hung when it
// did not finish within its deadline, failed when it ended with a clear error
// (e.g. no spare left). Diverged and hung runs must be 0.
//
// Where the nodes are:
//   --nodes N --spares K   in-process nodes (the default);
//   --cluster FILE         node daemons that run already; the plans' faults are
//                          injected inside the daemons (fault plans over daemons);
//   --processes N --spares K
//                          N + K node daemons started here (actors/local_daemons);
//                          the plans may also hold external faults:
//                            kill:node=I:step=K       SIGKILL of the daemon hosting
//                                                     placement index I when the K-th
//                                                     token is delivered;
//                            stop:node=I:step=K[:ms=D] SIGSTOP of it, SIGCONT after
//                                                     D ms (no D: after the run).
//                          Killed and stopped daemons are replaced by fresh ones
//                          before the next run, so every run has the full cluster.
// Every run has a deadline (--deadline); past it the run is hung, and over
// --processes every daemon is replaced.
#include "actors/chaos_plan.hpp"
#include "actors/chaos_run.hpp"
#include "actors/cluster.hpp"
#include "actors/run_report.hpp"
#include "actors/remote.hpp"
#include "supervision/fault_plan.hpp"
#include "tools/cluster_flags.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"
#include "tools/sampling_flags.hpp"
#include "actors/local_daemons.hpp"
#include "base/percentile.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

namespace cellshard::tools {

using actors::daemon_models_dir;
using actors::local_daemon_options;
using actors::local_daemons;
using actors::thaw_timer;

namespace {

struct chaos_opts {
  std::string model, tokenizer, prompt, topology = "pipeline", profile = "host", link, json_out;
  std::string reduce = "direct";  // --reduce: tensor groups' all-reduce (as run)
  int expert_replicas = 1;        // --expert-replicas (expert topologies, as run; issue #23)
  int steps = 128;
  float temperature = 1.0f, topp = 0.9f;
  unsigned long long seed_gen = 42;  // -s: generation seed
  int runs = 20;
  unsigned long long seed = 1;       // --seed: fault plans
  int faults_per_run = 1;
  int nodes = 4, spares = 2;
  int step_timeout_min_ms = 500, step_timeout_max_ms = 30000;
  int deadline_s = 120;
  int ctx = 0;                       // --ctx (0: the file's context length)
  std::vector<std::string> kinds;    // kinds to draw from ("" = all available)
  // Node daemons.
  std::string cluster;               // --cluster FILE
  int processes = 0;                 // --processes N (0: off)
  std::string tls_cert, tls_key, tls_ca;
  std::string daemon_logs;           // --daemon-logs DIR (processes)
};

using actors::external_fault;
using actors::fired_external;

int do_chaos(const chaos_opts& o) {
  loaded_model lm = load_model(o.model, o.tokenizer, false, o.ctx);
  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  const bool daemons_mode = o.processes > 0 || !o.cluster.empty();
  actors::cluster_options base;
  base.file = lm.file;
  base.tok = lm.tok;
  base.ctx = o.ctx;
  base.nodes = o.nodes;
  base.spares = o.spares;
  base.topology = o.topology;
  base.reduce = o.reduce;
  base.expert_replicas = o.expert_replicas;
  base.profile = o.profile;
  base.link = o.link;
  base.step_timeout_min = std::chrono::milliseconds(o.step_timeout_min_ms);
  base.step_timeout = std::chrono::milliseconds(o.step_timeout_max_ms);
  model::generation_params gp;
  gp.prompt = o.prompt;
  gp.steps = o.steps;
  gp.sampling = {o.temperature, o.topp, o.seed_gen};
  gp = model::normalise(gp, lm.file->cfg().seq_len);
  const auto deadline = std::chrono::seconds(o.deadline_s);

  // The kinds to draw from.
  const std::vector<std::string> kinds = o.kinds.empty() ? actors::default_fault_kinds(o.processes > 0) : o.kinds;

  // Node daemons: started here (--processes) or given (--cluster).
  std::unique_ptr<local_daemons> daemons;
  actors::remote_options ro;
  ro.net.tls = {o.tls_cert, o.tls_key, o.tls_ca};
  ro.default_profile = o.profile;
  if (o.processes > 0) {
    auto dir = daemon_models_dir(lm.file->path(), lm.tok->name());
    if (!dir) throw cli_error(dir.message());
    local_daemon_options lo;
    lo.models_dir = *dir;
    lo.profile = o.profile;
    lo.log_dir = o.daemon_logs;
    std::fprintf(stderr, "starting %d + %d node daemons\n", o.processes, o.spares);
    auto d = local_daemons::start(o.processes, o.spares, lo);
    if (!d) throw cli_error(d.message());
    daemons = std::move(*d);
  }
  auto make_host = [&]() -> std::shared_ptr<actors::shard_host> {
    if (daemons) return std::make_shared<actors::remote_host>(daemons->entries(), ro);
    auto h = actors::remote_host::from_file(o.cluster, ro);
    if (!h) throw cli_error(h.message());
    return *h;
  };
  // Every shard has its wiring before the first step (as run --cluster does).
  auto start_cluster = [&](const actors::cluster_options& co) -> result<std::unique_ptr<actors::cluster>> {
    auto c = actors::cluster::start(co);
    if (!c || !daemons_mode) return c;
    auto wired = (*c)->stats();
    if (!wired) return make_error("wiring check: " + wired.message());
    return c;
  };

  // The fault-free reference of this placement.
  std::vector<int> reference;
  int shards = 0;
  {
    actors::cluster_options co = base;
    if (daemons_mode) co.host = make_host();
    auto c = start_cluster(co);
    if (!c) throw cli_error(c.message(), exit_status_of(c.code()));
    shards = static_cast<int>((*c)->placement().shards.size());
    auto r = (*c)->generate(gp, {}, deadline);
    if (!r || !r->ok) throw cli_error("fault-free reference run failed: " + (r ? r->error : r.message()));
    reference = r->result.ids;
  }
  const int positions = static_cast<int>(reference.size()) - 1;
  const std::string where = o.processes > 0 ? std::to_string(o.processes) + " + " + std::to_string(o.spares) +
                                                  " daemon processes"
                            : !o.cluster.empty() ? "the daemons of " + o.cluster
                                                 : std::to_string(o.nodes) + " + " + std::to_string(o.spares) +
                                                       " in-process nodes";
  std::fprintf(stderr, "reference: %d positions on %d shard(s), %s over %s; %d runs, seed %llu\n", positions, shards,
               o.topology.c_str(), where.c_str(), o.runs, o.seed);

  std::mt19937_64 rng(o.seed);
  int diverged = 0, hung = 0, failed = 0;
  std::vector<double> detect, recover;
  nlohmann::json details = nlohmann::json::array();
  std::printf("%-4s %-60s %-9s %s\n", "run", "faults", "outcome", "detail");
  std::fflush(stdout);
  for (int run = 0; run < o.runs; ++run) {
    actors::cluster_options co = base;
    // The faults of this run (actors/chaos_plan.hpp).
    const actors::run_plan drawn = actors::draw_run_plan(rng, kinds, shards, positions, o.faults_per_run);
    co.faults = drawn.injected;
    std::vector<fired_external> externals;
    for (const auto& e : drawn.external) externals.push_back({e, -1, 0, ""});
    std::string plan_text;
    nlohmann::json plan = nlohmann::json::array();
    for (const auto& t : drawn.texts) {
      plan_text += (plan_text.empty() ? "" : " ") + t;
      plan.push_back(t);
    }
    std::string outcome, detail;
    nlohmann::json faults_json = nlohmann::json::array();
    const auto t_run = std::chrono::steady_clock::now();
    bool teardown_all = false;
    {
      if (daemons_mode) co.host = make_host();
      auto c = start_cluster(co);
      if (!c) {
        outcome = "failed";
        detail = c.message();
        ++failed;
      } else {
        std::unique_ptr<thaw_timer> timer;
        if (daemons && !externals.empty()) timer = std::make_unique<thaw_timer>(*daemons);
        std::mutex mu;
        int delivered = 0;
        actors::cluster* cl = c->get();
        // The signals due at each delivered token (actors/chaos_run.hpp).
        auto send = [&](int daemon, bool kill) { return daemons->signal(daemon, kill ? SIGKILL : SIGSTOP); };
        auto on_token = [&](uint64_t, int, const std::string&) {
          if (externals.empty()) return;
          std::lock_guard<std::mutex> lk(mu);
          ++delivered;
          for (const auto& t : actors::fire_due(externals, delivered, cl->current_nodes(), send))
            timer->add(t.daemon, t.at_ns);
        };
        auto r = (*c)->generate(gp, on_token, deadline);
        if (timer) timer->stop();
        if (daemons) daemons->thaw_all();  // stops without ms= end with the run
        std::lock_guard<std::mutex> lk(mu);
        if (!r) {
          outcome = "hung";
          detail = r.message();
          ++hung;
          teardown_all = true;
        } else if (!r->ok) {
          outcome = "failed";
          detail = r->error;
          ++failed;
        } else if (r->result.ids != reference) {
          outcome = "DIVERGED";
          detail = "first difference at position " +
                   std::to_string(actors::first_difference(reference, r->result.ids));
          ++diverged;
        } else {
          outcome = "ok";
          detail = std::to_string(r->recoveries.size()) + " recoveries, " + std::to_string(r->retries) +
                   " re-sends";
        }
        // The runtime's record of each signal (actors/chaos_run.hpp's rule).
        const auto records = cl->faults();
        const auto matched = actors::match_external_records(externals, records);
        std::set<size_t> used;  // records matched to an external fault
        for (size_t i = 0; i < externals.size(); ++i) {
          const actors::fault_record* rec = nullptr;
          if (matched[i] >= 0) {
            rec = &records[static_cast<size_t>(matched[i])];
            used.insert(static_cast<size_t>(matched[i]));
            detect.push_back(actors::external_detect_ms(externals[i], *rec));
            const double ms = actors::external_recover_ms(*rec);
            if (ms >= 0) recover.push_back(ms);
          }
          faults_json.push_back(actors::external_json(externals[i], rec));
        }
        for (size_t k = 0; k < records.size(); ++k) {
          const auto& f = records[k];
          if (used.count(k)) continue;
          if (f.detect_ms >= 0) detect.push_back(f.detect_ms);
          if (f.recover_ms >= 0) recover.push_back(f.recover_ms);
          faults_json.push_back(actors::to_json(f));
        }
      }
    }  // the cluster is shut down here
    if (daemons) {
      // The next run gets the full cluster: fresh daemons for the killed and
      // stopped ones (and for every one after a hung run).
      daemons->reap();
      const std::string ends = daemons->unexpected_ends();
      if (!ends.empty()) detail += " [" + ends + "]";
      const auto alive = [&](int i) { return daemons->alive(i); };
      for (int i : actors::daemons_to_replace(daemons->size(), alive, externals, teardown_all)) {
        auto r = daemons->restart(i);
        if (!r) throw cli_error("chaos: replacing " + daemons->describe(i) + " after run " + std::to_string(run) +
                                ": " + r.message());
      }
    }
    const double run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_run).count();
    std::printf("%-4d %-60s %-9s %s\n", run, plan_text.c_str(), outcome.c_str(), detail.c_str());
    std::fflush(stdout);
    details.push_back({{"run", run},
                       {"plan", plan},
                       {"outcome", outcome},
                       {"detail", detail},
                       {"duration_ms", run_ms},
                       {"faults", faults_json}});
  }
  nlohmann::json j = {{"runs", o.runs},
                      {"diverged_runs", diverged},
                      {"hung_runs", hung},
                      {"failed_runs", failed},
                      {"detect_ms_p50", percentile(detect, 0.5)},
                      {"detect_ms_p99", percentile(detect, 0.99)},
                      {"recover_ms_p50", percentile(recover, 0.5)},
                      {"recover_ms_p99", percentile(recover, 0.99)},
                      {"nodes", where},
                      {"details", details}};
  std::printf("runs %d: %d diverged, %d hung, %d failed with a clear error; detect p50 %.1f ms p99 %.1f ms; "
              "recover p50 %.2f ms p99 %.2f ms\n",
              o.runs, diverged, hung, failed, percentile(detect, 0.5), percentile(detect, 0.99),
              percentile(recover, 0.5), percentile(recover, 0.99));
  if (!o.json_out.empty()) write_text(o.json_out, j.dump(2) + "\n");
  return diverged + hung > 0 ? 1 : 0;
}

}  // namespace

void add_chaos(CLI::App& app, int& status) {
  auto o = std::make_shared<chaos_opts>();
  auto* cmd = app.add_subcommand("chaos", "runs with random fault plans, each checked against a fault-free run");
  cmd->add_option("-m,--model", o->model, "model (default lookup as run)");
  cmd->add_option("-z,--tokenizer", o->tokenizer, "tokenizer");
  cmd->add_option("--ctx", o->ctx, "context length N instead of the file's (as run --ctx)")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("-i,--prompt", o->prompt, "prompt");
  cmd->add_option("-n,--steps", o->steps, "positions per run")->capture_default_str();
  cmd->add_option("-t,--temperature", o->temperature, "temperature")->capture_default_str();
  cmd->add_option("-p,--topp", o->topp, "top-p")->capture_default_str();
  cmd->add_option("-s", o->seed_gen, "generation seed")->capture_default_str();
  cmd->add_option("--runs", o->runs, "runs")->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the fault plans")->capture_default_str();
  cmd->add_option("--faults-per-run", o->faults_per_run, "faults per run")->capture_default_str();
  cmd->add_option("--kinds", o->kinds,
                  "fault kinds to draw from (default: all; crash,silence,slow,drop,delay,corrupt,partition, "
                  "and with --processes kill,stop)")->delimiter(',');
  cmd->add_option("--nodes", o->nodes, "in-process nodes")->capture_default_str();
  cmd->add_option("--spares", o->spares, "spare nodes (in process, or spare daemons with --processes)")
      ->capture_default_str();
  cmd->add_option("--topology", o->topology,
                  "pipeline|tensor|hybrid:PxT|expert:E|pipeline:P,expert:E (faults are drawn over every placement "
                  "index: expert nodes too)")
      ->capture_default_str();
  cmd->add_option("--expert-replicas", o->expert_replicas, "expert topologies: holders per expert (as run)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--reduce", o->reduce, "all-reduce of tensor groups: direct|scatter (as run)")
      ->check(CLI::IsMember({"direct", "scatter"}))
      ->capture_default_str();
  cmd->add_option("--profile", o->profile, "node profile")->capture_default_str();
  cmd->add_option("--link", o->link, "link override BANDWIDTH:LATENCY");
  cmd->add_option("--step-timeout-min", o->step_timeout_min_ms, "floor of a step's deadline (ms)")
      ->check(CLI::Range(1, 24 * 3600 * 1000))
      ->capture_default_str();
  cmd->add_option("--step-timeout-max", o->step_timeout_max_ms,
                  "cap of a step's deadline and of the whole wait for one step (ms)")
      ->check(CLI::Range(1, 24 * 3600 * 1000))
      ->capture_default_str();
  cmd->add_option("--deadline", o->deadline_s, "a run that takes longer is hung (s)")->capture_default_str();
  cmd->add_option("--json", o->json_out, "summary JSON to FILE (- = stdout)");
  auto* g = "Node daemons";
  auto* cluster = cmd->add_option("--cluster", o->cluster, "node daemons that run already (cluster JSON); faults "
                                  "are injected inside them")->group(g);
  auto* processes = cmd->add_option("--processes", o->processes,
                                    "start N working node daemons (+ --spares) here; the plans may also SIGKILL "
                                    "(kill) and SIGSTOP (stop) them")->group(g);
  cmd->add_option("--daemon-logs", o->daemon_logs, "keep the started daemons' stderr in DIR (with --processes)")
      ->group(g);
  cmd->add_option("--tls-cert", o->tls_cert, "mutual TLS with the nodes of --cluster: this side's certificate")
      ->group(g);
  cmd->add_option("--tls-key", o->tls_key, "its private key (PEM)")->group(g);
  cmd->add_option("--tls-ca", o->tls_ca, "the CA that signs every node's certificate (PEM)")->group(g);
  cluster->excludes(processes);
  cmd->callback([o, cmd, &status] {
    check_sampling_flags(o->temperature, o->topp);
    if (o->runs < 1) throw cli_error("--runs: got " + std::to_string(o->runs) + ", expected at least 1", 2);
    if (o->faults_per_run < 0)
      throw cli_error("--faults-per-run: got " + std::to_string(o->faults_per_run) + ", expected 0 or more", 2);
    if (o->nodes < 1) throw cli_error("--nodes: got " + std::to_string(o->nodes) + ", expected at least 1", 2);
    if (o->spares < 0)
      throw cli_error("--spares: got " + std::to_string(o->spares) + ", expected 0 or more spare nodes", 2);
    if (o->deadline_s < 1)
      throw cli_error("--deadline: got " + std::to_string(o->deadline_s) + " s, expected at least 1", 2);
    if (!o->cluster.empty() && cmd->count("--nodes") + cmd->count("--spares") > 0)
      throw cli_error("--cluster: the nodes are the file's; drop --nodes/--spares", 2);
    if (o->processes > 0 && cmd->count("--nodes") > 0)
      throw cli_error("--processes N gives the working nodes; drop --nodes", 2);
    if (cmd->count("--processes") > 0 && o->processes < 1) throw cli_error("--processes must be at least 1", 2);
    if (o->cluster.empty() && (!o->tls_cert.empty() || !o->tls_key.empty() || !o->tls_ca.empty()))
      throw cli_error("--tls-cert/--tls-key/--tls-ca secure the connections to node daemons: they need --cluster",
                      2);
    if (!o->daemon_logs.empty() && o->processes == 0) throw cli_error("--daemon-logs needs --processes", 2);
    if (o->step_timeout_min_ms > o->step_timeout_max_ms)
      throw cli_error("--step-timeout-min (" + std::to_string(o->step_timeout_min_ms) +
                          " ms) exceeds --step-timeout-max (" + std::to_string(o->step_timeout_max_ms) + " ms)",
                      2);
    if (auto k = actors::check_fault_kinds(o->kinds, o->processes > 0); !k) throw cli_error(k.message(), 2);
    auto tls = actors::check_tls_flags({o->tls_cert, o->tls_key, o->tls_ca});
    if (!tls) throw cli_error(tls.message(), 2);
    status = do_chaos(*o);
  });
}

}  // namespace cellshard::tools
