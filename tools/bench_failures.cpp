// `cellshard bench failures` (issue #25): the planner's failure model against
// a real run. Node daemons on loopback serve a closed loop of --batch
// sessions for --duration seconds, first without faults, then with one
// working daemon SIGKILLed (or SIGSTOPped: a machine that falls silent) every
// --every seconds, spares taking over. Measured: goodput (tokens delivered
// per second) with and without failures, and per failure the detection
// (signal -> the runtime's decision) and the stall (signal -> the next token
// after the recovery). Simulated: topologies::simulate (plan --simulate) on
// the plan of the same model, nodes, topology and batch, with the failure
// rate set to one per --every over the used nodes, once with the planner's
// default assumptions and once with the measured detection time. Compared:
// goodput with failures as a fraction of fault-free goodput (the absolute
// tokens/s of the plan depends on its calibration, not on the failure
// model), and the downtime per failure.
#include "actors/cluster.hpp"
#include "actors/local_daemons.hpp"
#include "actors/remote.hpp"
#include "base/percentile.hpp"
#include "model/synth.hpp"
#include "topologies/model_presets.hpp"
#include "topologies/plan_sim.hpp"
#include "topologies/planner.hpp"
#include "tools/bench.hpp"
#include "tools/common.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sys/stat.h>
#include <thread>

namespace cellshard::tools {

namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct failure_sample {
  int daemon = -1;
  int64_t fired_ns = 0;
  double detect_ms = -1;  // signal -> decision
  double stall_ms = -1;   // signal -> next token after the recovery
  std::string kind;       // the runtime's record (node-down, node-silent, ...)
};

struct phase_result {
  double seconds = 0;
  uint64_t tokens = 0;
  double goodput = 0;  // tokens per second
  int requests_done = 0, requests_failed = 0;
  std::string first_error;
  std::vector<failure_sample> failures;
};

/// One phase: a closed loop of o.batch sessions over the daemons for
/// o.duration_s; with `inject`, a working daemon is signalled every o.every_s.
phase_result run_phase(actors::local_daemons& d, const loaded_model& lm, const failures_bench_options& o,
                       bool inject) {
  actors::cluster_options co;
  co.file = lm.file;
  co.tok = lm.tok;
  co.topology = o.topology;
  co.checkpoint_every = o.checkpoint_every;
  co.host = std::make_shared<actors::remote_host>(d.entries(), actors::remote_options{});
  auto c = actors::cluster::start(co);
  if (!c) throw cli_error("cluster over the daemons: " + c.message());
  model::generation_params gp;
  gp.steps = o.steps;
  gp.ignore_eos = true;
  gp.sampling = {0.0f, 0.9f, 1};
  gp = model::normalise(gp, lm.file->cfg().seq_len);

  struct shared {
    std::mutex mu;
    std::condition_variable cv;
    int64_t t0 = 0, t_end = 0;
    uint64_t tokens = 0;
    int active = 0, done = 0, failed = 0;
    std::string first_error;
    bool stop = false;
  };
  auto sh = std::make_shared<shared>();
  // Held by every callback that may resubmit, so that a late one (after the
  // bounded wait below) finds it alive; sh->stop keeps it from resubmitting.
  auto start_one = std::make_shared<std::function<void()>>();
  actors::cluster* cl = c->get();
  auto on_token = [sh](uint64_t, int, const std::string&) {
    const int64_t now = steady_ns();
    std::lock_guard<std::mutex> lk(sh->mu);
    if (now <= sh->t_end) ++sh->tokens;
  };
  std::weak_ptr<std::function<void()>> weak = start_one;
  *start_one = [sh, cl, gp, on_token, weak] {
    cl->submit(gp, on_token, [sh, weak, cl](uint64_t, const actors::session_outcome& so) {
      // A failed runtime refuses every request at once: resubmitting would
      // spin (and recurse: the refusal comes back inside submit).
      const bool runtime_failed = !so.ok && !cl->failure().empty();
      bool again = false;
      {
        std::lock_guard<std::mutex> lk(sh->mu);
        --sh->active;
        if (so.ok) ++sh->done;
        else {
          ++sh->failed;
          if (sh->first_error.empty()) sh->first_error = so.error;
        }
        again = !sh->stop && !runtime_failed && steady_ns() < sh->t_end;
        if (again) ++sh->active;
      }
      if (again)
        if (auto f = weak.lock()) (*f)();
      sh->cv.notify_all();
    });
  };
  const int64_t dur_ns = static_cast<int64_t>(o.duration_s * 1e9);
  {
    std::lock_guard<std::mutex> lk(sh->mu);
    sh->t0 = steady_ns();
    sh->t_end = sh->t0 + dur_ns;
    sh->active = o.batch;
  }
  for (int b = 0; b < o.batch; ++b) (*start_one)();

  phase_result out;
  std::vector<std::pair<int, int64_t>> fired;  // daemon, ns
  const auto t0 = std::chrono::steady_clock::now();
  int k = 0;
  // Signals at every, 2 x every, ... (not at the end of the phase: its
  // recovery would fall outside the measured window).
  while (true) {
    const auto next = t0 + std::chrono::duration<double>(o.every_s * (k + 1));
    if (!inject || std::chrono::duration<double>(next - t0).count() > o.duration_s - 0.5 * o.every_s) break;
    std::this_thread::sleep_until(next);  // an experiment's schedule, not synchronisation
    // The working daemon to signal: the k-th node that holds a shard now,
    // rotating, skipping the entry node (placement index 0), which holds
    // the embedding and sees every request first.
    const auto nodes = cl->current_nodes();
    std::vector<int> working;
    for (size_t i = 1; i < nodes.size(); ++i)
      if (nodes[i] >= 0 && d.alive(nodes[i]) && !d.frozen(nodes[i]) &&
          std::find(working.begin(), working.end(), nodes[i]) == working.end())
        working.push_back(nodes[i]);
    if (working.empty()) break;
    const int target = working[static_cast<size_t>(k) % working.size()];
    auto r = d.signal(target, o.signal == "stop" ? SIGSTOP : SIGKILL);
    if (r) fired.emplace_back(target, *r);
    std::fprintf(stderr, "  t=%5.1f s: %s daemon %d\n", o.every_s * (k + 1), o.signal == "stop" ? "SIGSTOP" : "SIGKILL",
                 target);
    ++k;
  }
  std::this_thread::sleep_until(t0 + std::chrono::duration<double>(o.duration_s));
  {
    std::unique_lock<std::mutex> lk(sh->mu);
    sh->stop = true;
    out.tokens = sh->tokens;
    // The sessions still running finish their requests (bounded).
    sh->cv.wait_for(lk, std::chrono::seconds(o.deadline_s), [&] { return sh->active == 0; });
    out.requests_done = sh->done;
    out.requests_failed = sh->failed;
    out.first_error = sh->first_error;
  }
  out.seconds = o.duration_s;
  out.goodput = out.tokens / o.duration_s;
  const auto faults = cl->faults();
  for (const auto& [daemon, ns] : fired) {
    failure_sample s;
    s.daemon = daemon;
    s.fired_ns = ns;
    for (const auto& f : faults)
      if (f.node == daemon && f.decided_ns >= ns && f.kind != "slow") {
        s.kind = f.kind;
        s.detect_ms = (f.decided_ns - ns) / 1e6;
        if (f.recovered_ns > 0) s.stall_ms = (f.recovered_ns - ns) / 1e6;
        break;
      }
    out.failures.push_back(s);
  }
  (*c)->shutdown();
  c->reset();
  d.thaw_all();
  return out;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

}  // namespace

int run_failures_bench(const failures_bench_options& o, std::vector<bench_row>& rows) {
  if (o.nodes < 2) throw cli_error("--nodes must be at least 2 (a failure needs a node besides the entry)", 2);
  if (o.every_s <= 0 || o.duration_s < 2 * o.every_s)
    throw cli_error("--duration must be at least 2 x --every (at least one failure inside the window)", 2);
  if (o.signal != "kill" && o.signal != "stop") throw cli_error("--signal '" + o.signal + "': expected kill or stop", 2);
  if (o.batch < 1) throw cli_error("--batch must be at least 1", 2);
  if (::mkdir(o.out.c_str(), 0755) != 0 && errno != EEXIST)
    throw cli_error(o.out + ": cannot create: " + std::strerror(errno));
  std::string model_path = o.model, tok_path = o.tokenizer;
  if (model_path.empty()) {
    // A model that splits 8 ways (8 layers, 8 KV heads), small enough for 2 cores.
    model::config c;
    c.dim = 128;
    c.hidden_dim = 344;
    c.n_layers = 8;
    c.n_heads = 8;
    c.n_kv_heads = 8;
    c.vocab_size = 512;
    c.seq_len = 256;
    model_path = o.out + "/failures-model.bin";
    auto w = model::synth_file(c, 1, model_path);
    if (!w) throw cli_error(w.message());
    if (tok_path.empty()) tok_path = "models/tok512.bin";
    // Daemons open the tokenizer from the model's folder.
    const std::string beside = o.out + "/" + std::filesystem::path(tok_path).filename().string();
    std::error_code ec;
    std::filesystem::copy_file(tok_path, beside, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) throw cli_error(tok_path + ": cannot copy it to " + beside + ": " + ec.message());
    tok_path = beside;
  }
  loaded_model lm = load_model(model_path, tok_path);
  // Daemons open both files by name from one folder.
  auto models_dir = actors::daemon_models_dir(lm.file->path(), lm.tok->name());
  if (!models_dir) throw cli_error(models_dir.message());
  if (o.rounds < 1) throw cli_error("--rounds must be at least 1", 2);
  const int kills = static_cast<int>(o.duration_s / o.every_s);
  const int spares = o.spares >= 0 ? o.spares : kills + 1;
  actors::local_daemon_options lo;
  lo.models_dir = *models_dir;
  lo.log_dir = o.out + "/daemons";
  lo.cpu_percent = o.cpu_percent;
  std::fprintf(stderr, "starting %d + %d node daemons (logs in %s)", o.nodes, spares, lo.log_dir.c_str());
  if (o.cpu_percent > 0) std::fprintf(stderr, ", each capped at %.0f%% of a core", o.cpu_percent);
  std::fprintf(stderr, "\n");
  auto daemons = actors::local_daemons::start(o.nodes, spares, lo);
  if (!daemons) throw cli_error(daemons.message());
  auto& d = **daemons;

  // Rounds of (fault-free, with failures) on the same daemons, so that the
  // machine's load drifts over both alike; the ratio is taken per round.
  std::vector<double> ratios, detect, stall, excess, free_goodputs, fail_goodputs;
  int failed_requests = 0;
  std::string first_error;
  int failures_seen = 0;
  for (int round = 1; round <= o.rounds; ++round) {
    for (int i = 0; i < d.size(); ++i)  // the daemons killed in the last round, fresh again
      if (!d.alive(i)) {
        auto r = d.restart(i);
        if (!r) throw cli_error("restarting " + d.describe(i) + ": " + r.message());
      }
    std::fprintf(stderr, "[round %d/%d] fault-free: %s over %d daemons, %d sessions of %d positions, %.0f s\n",
                 round, o.rounds, o.topology.c_str(), o.nodes, o.batch, o.steps, o.duration_s);
    const phase_result free = run_phase(d, lm, o, false);
    std::fprintf(stderr, "      %llu tokens, %.1f tok/s, %d requests (%d failed)\n",
                 static_cast<unsigned long long>(free.tokens), free.goodput, free.requests_done,
                 free.requests_failed);
    std::fprintf(stderr, "[round %d/%d] with a %s every %.3g s\n", round, o.rounds,
                 o.signal == "stop" ? "SIGSTOP" : "SIGKILL", o.every_s);
    const phase_result fail = run_phase(d, lm, o, true);
    std::fprintf(stderr, "      %llu tokens, %.1f tok/s, %d requests (%d failed)\n",
                 static_cast<unsigned long long>(fail.tokens), fail.goodput, fail.requests_done,
                 fail.requests_failed);
    failed_requests += free.requests_failed + fail.requests_failed;
    if (first_error.empty()) first_error = !free.first_error.empty() ? free.first_error : fail.first_error;
    // A session's time per token without failures: the stall beyond it is
    // what the failure cost (the simulation's downtime of the station).
    const double tpot_ms = free.goodput > 0 ? 1e3 * o.batch / free.goodput : 0;
    for (const auto& f : fail.failures) {
      ++failures_seen;
      std::fprintf(stderr, "      daemon %d: %s, detect %.1f ms, stall %.1f ms (%.1f beyond a token's %.1f ms)\n",
                   f.daemon, f.kind.empty() ? "(no record)" : f.kind.c_str(), f.detect_ms, f.stall_ms,
                   f.stall_ms - tpot_ms, tpot_ms);
      if (f.detect_ms >= 0) detect.push_back(f.detect_ms);
      if (f.stall_ms >= 0) {
        stall.push_back(f.stall_ms);
        excess.push_back(std::max(0.0, f.stall_ms - tpot_ms));
      }
    }
    free_goodputs.push_back(free.goodput);
    fail_goodputs.push_back(fail.goodput);
    if (free.goodput > 0) ratios.push_back(fail.goodput / free.goodput);
  }
  const double measured_ratio = ratios.empty() ? 0 : median(ratios);
  const double measured_detect = mean_of(detect), measured_stall = mean_of(stall), measured_excess = mean_of(excess);
  const double free_goodput = median(free_goodputs), fail_goodput = median(fail_goodputs);

  // The simulation of the same layout.
  topologies::plan_request r;
  r.model = topologies::spec_from_config(lm.file->cfg(), lm.file->path());
  auto hw = topologies::find_hardware_preset("host");
  if (!hw) throw cli_error(hw.message());
  r.hw = *hw;
  if (r.hw.node.mem_bandwidth_gbs <= 0) r.hw.node.mem_bandwidth_gbs = 10;  // absolute rate: not compared
  r.nodes = o.nodes + spares;
  auto topo = topologies::parse_plan_topology(o.topology == "pipeline" ? "pipeline:" + std::to_string(o.nodes)
                                                                         : o.topology);
  if (!topo) throw cli_error("--topology: " + topo.message(), 2);
  r.topology = *topo;
  r.batch = o.batch;
  r.context = o.steps;
  r.assume.request_tokens = o.steps;
  r.assume.checkpoint_every = o.checkpoint_every;
  r.assume.reload_over_link = false;  // the daemons hold the model file
  r.assume.one_sequence_per_step = true;
  // The plan at the measured fault-free speed: the host preset's node rates
  // (memory bandwidth, FLOP/s) scaled until its tokens/s is the daemons'
  // (within 1%, at most 12 rounds), so that the replay it charges per failure
  // (half a checkpoint interval of the busiest node's steps) is in the
  // daemons' time, not in an uncalibrated host's. The ratios compared below
  // do not depend on it; the downtime does.
  double speed_scale = 1, planned = 0;
  for (int i = 0;; ++i) {
    auto p = topologies::plan(r);
    if (!p) throw cli_error("plan: " + p.message());
    planned = p->tokens_per_s;
    const double k = free_goodput > 0 && planned > 0 ? planned / free_goodput : 1;
    if (std::abs(k - 1) < 0.01 || i == 12) break;
    r.hw.node.mem_bandwidth_gbs /= k;
    r.hw.node.gflops /= k;
    speed_scale /= k;
  }
  std::fprintf(stderr, "plan at the measured speed: node rates x %.3g of the host preset's, %.1f tok/s (measured %.1f)\n",
               speed_scale, planned, free_goodput);
  auto sim_ratio = [&](double detect_s, double& downtime_per_failure) -> double {
    topologies::plan_request q = r;
    if (detect_s >= 0) q.assume.detect_s = detect_s;
    auto p = topologies::plan(q);
    if (!p) throw cli_error("plan: " + p.message());
    // One failure per --every over the used nodes.
    const int used = p->layout.used_nodes;
    q.hw.failures_per_year = 8766.0 * 3600.0 / (o.every_s * std::max(1, used));
    auto pf = topologies::plan(q);
    if (!pf) throw cli_error("plan: " + pf.message());
    topologies::sim_options so;
    // Many failures for a stable mean (20 x the phase: ~20 x its failures),
    // few enough events to stay under the simulation's bound.
    so.duration_s = 20 * o.duration_s;
    so.seed = 1;
    so.failure_scale = 0;
    auto base = topologies::simulate(*pf, so);
    so.failure_scale = 1;
    auto with = topologies::simulate(*pf, so);
    if (!base || !with) throw cli_error("simulate: " + (base ? with.message() : base.message()));
    if (base->stopped_early || with->stopped_early)
      throw cli_error("simulate: stopped at its event bound before " + std::to_string(so.duration_s) + " s");
    std::fprintf(stderr, "simulated (detect %.0f ms): %.1f tok/s without failures, %.1f with %llu failures in %.0f s\n",
                 q.assume.detect_s * 1e3, base->tokens_per_s, with->tokens_per_s,
                 static_cast<unsigned long long>(with->failures), with->simulated_s);
    downtime_per_failure = with->failures > 0 ? with->downtime_s / static_cast<double>(with->failures) : 0;
    return base->tokens_per_s > 0 ? with->tokens_per_s / base->tokens_per_s : 0;
  };
  double down_default = 0, down_measured = 0;
  const double ratio_default = sim_ratio(-1, down_default);
  const double ratio_measured = sim_ratio(measured_detect / 1e3, down_measured);

  std::map<std::string, std::string> common = {{"topology", o.topology},
                                               {"daemons", std::to_string(o.nodes) + "+" + std::to_string(spares)},
                                               {"signal", o.signal},
                                               {"every_s", std::to_string(o.every_s)},
                                               {"batch", std::to_string(o.batch)},
                                               {"cpu_percent", std::to_string(o.cpu_percent)}};
  auto row = [&](const std::string& name, double v, const std::string& unit, double base, const std::string& bname) {
    bench_row b;
    b.name = name;
    b.params = common;
    b.value = v;
    b.unit = unit;
    if (base >= 0) {
      b.baseline = base;
      b.baseline_name = bname;
      b.ratio = base > 0 ? v / base : 0;
    }
    rows.push_back(b);
  };
  row("failures.goodput_free", free_goodput, "tok/s", -1, "");
  row("failures.goodput_with_failures", fail_goodput, "tok/s", free_goodput, "fault-free goodput, same daemons");
  row("failures.goodput_fraction", measured_ratio, "", ratio_default,
      "simulated fraction, planner defaults (detect " + std::to_string(r.assume.detect_s * 1e3) + " ms)");
  row("failures.goodput_fraction_vs_sim_measured_detect", measured_ratio, "", ratio_measured,
      "simulated fraction with the measured detection");
  row("failures.detect_ms", measured_detect, "ms", r.assume.detect_s * 1e3, "planner detect_s");
  row("failures.stall_ms", measured_stall, "ms", -1, "");
  row("failures.stall_beyond_tpot_ms", measured_excess, "ms", down_default * 1e3,
      "simulated downtime per failure, planner defaults");
  row("failures.stall_beyond_tpot_ms_vs_sim_measured_detect", measured_excess, "ms", down_measured * 1e3,
      "simulated downtime per failure, measured detection");
  row("failures.count", static_cast<double>(failures_seen), "", -1, "");
  int status = 0;
  if (failed_requests > 0) {
    std::fprintf(stderr, "error: %d request(s) failed: %s\n", failed_requests, first_error.c_str());
    status = 1;
  }
  if (static_cast<int>(detect.size()) < failures_seen) {
    std::fprintf(stderr, "error: %d of %d failures have no record of a decision in the runtime\n",
                 failures_seen - static_cast<int>(detect.size()), failures_seen);
    status = 1;
  }
  std::fprintf(stderr,
               "goodput with failures / without (median of %d rounds): measured %.3f, simulated %.3f (planner "
               "defaults), %.3f (measured detection)\nper failure (%d): detect %.1f ms (planner %.0f ms), stall %.1f ms, "
               "%.1f ms beyond a token (simulated downtime %.1f ms with the planner's defaults, %.1f ms with the "
               "measured detection)\n",
               o.rounds, measured_ratio, ratio_default, ratio_measured, failures_seen, measured_detect,
               r.assume.detect_s * 1e3, measured_stall, measured_excess, down_default * 1e3, down_measured * 1e3);
  // Issue #25's goals, measured against simulated: goodput within 20%;
  // detection and downtime within 20% or 50 ms. The detection is checked
  // against the planner's detect_s, which models a machine that falls silent
  // (--signal stop); a killed process on a live host is found from its
  // dropped connection, which the planner does not model.
  auto within = [](double measured, double simulated, double abs_ms) {
    return std::abs(measured - simulated) <= std::max(0.2 * std::abs(simulated), abs_ms);
  };
  const bool goodput_ok = ratio_measured > 0 && std::abs(measured_ratio / ratio_measured - 1) <= 0.2;
  const bool down_ok = within(measured_excess, down_measured * 1e3, 50);
  std::fprintf(stderr, "goal goodput within 20%%: %s (%+.1f%%)\n", goodput_ok ? "met" : "NOT met",
               ratio_measured > 0 ? 100 * (measured_ratio / ratio_measured - 1) : 0.0);
  std::fprintf(stderr, "goal downtime within 20%% or 50 ms: %s (%+.1f ms)\n", down_ok ? "met" : "NOT met",
               measured_excess - down_measured * 1e3);
  if (o.signal == "stop") {
    const bool detect_ok = within(measured_detect, r.assume.detect_s * 1e3, 50);
    std::fprintf(stderr, "goal detection within 20%% or 50 ms of detect_s: %s (%+.1f ms)\n",
                 detect_ok ? "met" : "NOT met", measured_detect - r.assume.detect_s * 1e3);
  }
  return status;
}

}  // namespace cellshard::tools
