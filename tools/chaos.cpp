// `cellshard chaos`: R runs with random fault plans drawn from a seed, each
// checked against a fault-free reference run of the same placement. A run is
// diverged when it finished with other ids than the reference, hung when it
// did not finish within its deadline, failed when it ended with a clear error
// (e.g. no spare left). Diverged and hung runs must be 0.
#include "actors/cluster.hpp"
#include "supervision/fault_plan.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

namespace cellshard::tools {

namespace {

struct chaos_opts {
  std::string model, tokenizer, prompt, topology = "pipeline", profile = "host", link, json_out;
  int steps = 128;
  float temperature = 1.0f, topp = 0.9f;
  unsigned long long seed_gen = 42;  // -s: generation seed
  int runs = 20;
  unsigned long long seed = 1;       // --seed: fault plans
  int faults_per_run = 1;
  int nodes = 4, spares = 2;
  int step_timeout_min_ms = 500;
  int deadline_s = 120;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::round(q * (v.size() - 1)))];
}

/// Draws one fault: any kind, on a working shard, at a position the reference reached.
supervision::fault_plan draw(std::mt19937_64& rng, int shards, int positions) {
  using K = supervision::fault_kind;
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  supervision::fault_plan f;
  f.kind = static_cast<K>(uni(0, static_cast<int>(K::count) - 1));
  f.node = static_cast<uint32_t>(uni(0, shards - 1));
  f.step = static_cast<uint64_t>(uni(0, std::max(0, positions - 2)));
  switch (f.kind) {
    case K::crash: break;
    case K::silence:
      if (uni(0, 1)) f.duration_ms = static_cast<uint64_t>(uni(100, 2000));
      break;
    case K::slow:
      f.duration_ms = static_cast<uint64_t>(uni(1, 10));
      f.count = static_cast<uint32_t>(uni(1, 20));
      break;
    case K::drop: f.count = static_cast<uint32_t>(uni(1, 2)); break;
    case K::delay:
      f.duration_ms = static_cast<uint64_t>(uni(1, 50));
      f.count = static_cast<uint32_t>(uni(1, 3));
      break;
    case K::corrupt: f.count = static_cast<uint32_t>(uni(1, 2)); break;
    case K::partition: f.duration_ms = static_cast<uint64_t>(uni(50, 1500)); break;
    default: break;
  }
  return f;
}

int do_chaos(const chaos_opts& o) {
  loaded_model lm = load_model(o.model, o.tokenizer);
  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  actors::cluster_options base;
  base.file = lm.file;
  base.tok = lm.tok;
  base.nodes = o.nodes;
  base.spares = o.spares;
  base.topology = o.topology;
  base.profile = o.profile;
  base.link = o.link;
  base.step_timeout_min = std::chrono::milliseconds(o.step_timeout_min_ms);
  model::generation_params gp;
  gp.prompt = o.prompt;
  gp.steps = o.steps;
  gp.sampling = {o.temperature, o.topp, o.seed_gen};
  gp = model::normalise(gp, lm.file->cfg().seq_len);
  const auto deadline = std::chrono::seconds(o.deadline_s);

  // The fault-free reference of this placement.
  std::vector<int> reference;
  int shards = 0;
  {
    auto c = actors::cluster::start(base);
    if (!c) throw cli_error(c.message());
    shards = static_cast<int>((*c)->placement().shards.size());
    auto r = (*c)->generate(gp, {}, deadline);
    if (!r || !r->ok) throw cli_error("fault-free reference run failed: " + (r ? r->error : r.message()));
    reference = r->result.ids;
  }
  const int positions = static_cast<int>(reference.size()) - 1;
  std::fprintf(stderr, "reference: %d positions on %d shard(s), %s; %d runs, seed %llu\n", positions, shards,
               o.topology.c_str(), o.runs, o.seed);

  std::mt19937_64 rng(o.seed);
  int diverged = 0, hung = 0, failed = 0;
  std::vector<double> detect, recover;
  nlohmann::json details = nlohmann::json::array();
  std::printf("%-4s %-60s %-9s %s\n", "run", "faults", "outcome", "detail");
  for (int run = 0; run < o.runs; ++run) {
    actors::cluster_options co = base;
    std::string plan_text;
    nlohmann::json plan = nlohmann::json::array();
    for (int k = 0; k < o.faults_per_run; ++k) {
      auto f = draw(rng, shards, positions);
      co.faults.push_back(f);
      plan_text += (plan_text.empty() ? "" : " ") + supervision::to_string(f);
      plan.push_back(supervision::to_string(f));
    }
    std::string outcome, detail;
    nlohmann::json faults_json = nlohmann::json::array();
    auto c = actors::cluster::start(co);
    if (!c) {
      outcome = "failed";
      detail = c.message();
      ++failed;
    } else {
      auto r = (*c)->generate(gp, {}, deadline);
      if (!r) {
        outcome = "hung";
        detail = r.message();
        ++hung;
      } else if (!r->ok) {
        outcome = "failed";
        detail = r->error;
        ++failed;
      } else if (r->result.ids != reference) {
        size_t d = 0;
        while (d < reference.size() && d < r->result.ids.size() && reference[d] == r->result.ids[d]) ++d;
        outcome = "DIVERGED";
        detail = "first difference at position " + std::to_string(d);
        ++diverged;
      } else {
        outcome = "ok";
        detail = std::to_string(r->recoveries.size()) + " recoveries, " + std::to_string(r->retries) + " re-sends";
      }
      for (const auto& f : (*c)->faults()) {
        if (f.detect_ms >= 0) detect.push_back(f.detect_ms);
        if (f.recover_ms >= 0) recover.push_back(f.recover_ms);
        faults_json.push_back({{"kind", f.kind}, {"node", f.index}, {"step", f.step}, {"detect_ms", f.detect_ms},
                               {"recover_ms", f.recover_ms}, {"replayed_positions", f.replayed_positions}});
      }
    }
    std::printf("%-4d %-60s %-9s %s\n", run, plan_text.c_str(), outcome.c_str(), detail.c_str());
    std::fflush(stdout);
    details.push_back({{"run", run}, {"plan", plan}, {"outcome", outcome}, {"detail", detail}, {"faults", faults_json}});
  }
  nlohmann::json j = {{"runs", o.runs},
                      {"diverged_runs", diverged},
                      {"hung_runs", hung},
                      {"failed_runs", failed},
                      {"detect_ms_p50", percentile(detect, 0.5)},
                      {"detect_ms_p99", percentile(detect, 0.99)},
                      {"recover_ms_p50", percentile(recover, 0.5)},
                      {"recover_ms_p99", percentile(recover, 0.99)},
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
  cmd->add_option("-i,--prompt", o->prompt, "prompt");
  cmd->add_option("-n,--steps", o->steps, "positions per run")->capture_default_str();
  cmd->add_option("-t,--temperature", o->temperature, "temperature")->capture_default_str();
  cmd->add_option("-p,--topp", o->topp, "top-p")->capture_default_str();
  cmd->add_option("-s", o->seed_gen, "generation seed")->capture_default_str();
  cmd->add_option("--runs", o->runs, "runs")->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the fault plans")->capture_default_str();
  cmd->add_option("--faults-per-run", o->faults_per_run, "faults per run")->capture_default_str();
  cmd->add_option("--nodes", o->nodes, "in-process nodes")->capture_default_str();
  cmd->add_option("--spares", o->spares, "spare nodes")->capture_default_str();
  cmd->add_option("--topology", o->topology, "pipeline|tensor|hybrid:PxT")->capture_default_str();
  cmd->add_option("--profile", o->profile, "node profile")->capture_default_str();
  cmd->add_option("--link", o->link, "link override BANDWIDTH:LATENCY");
  cmd->add_option("--step-timeout-min", o->step_timeout_min_ms, "floor of a step's deadline (ms)")
      ->capture_default_str();
  cmd->add_option("--deadline", o->deadline_s, "a run that takes longer is hung (s)")->capture_default_str();
  cmd->add_option("--json", o->json_out, "summary JSON to FILE (- = stdout)");
  cmd->callback([o, &status] { status = do_chaos(*o); });
}

}  // namespace cellshard::tools
