// `cellshard bench recovery`: detection and recovery time of the in-process
// runtime against the checkpoint interval K and the context length (the
// position at which the fault fires), for pipeline and tensor placements,
// crash (restart in place) and silence (move to a spare). The baseline is the
// fault-free time per output token of the same placement in the same run, so
// recover_ms / tpot says how many tokens' worth of time a recovery costs.
//
// With --processes (run_recovery_process_bench below) the nodes are node
// daemon processes and the faults are real: SIGKILL and SIGSTOP from outside.
#include "actors/cluster.hpp"
#include "actors/remote.hpp"
#include "supervision/fault_plan.hpp"
#include "base/percentile.hpp"
#include "base/spawn.hpp"
#include "tools/bench.hpp"
#include "tools/common.hpp"
#include "actors/local_daemons.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace cellshard::tools {

using actors::daemon_models_dir;
using actors::local_daemon_options;
using actors::local_daemons;

namespace {

/// One row; with `ratio`, measured against the fault-free TPOT `tpot`.
bench_row row_against_tpot(const std::string& name, const std::map<std::string, std::string>& params, double v,
                           const std::string& unit, bool ratio, double tpot, const std::string& baseline_name) {
  bench_row r;
  r.name = name;
  r.params = params;
  r.value = v;
  r.unit = unit;
  if (ratio) {
    r.baseline = tpot;
    r.baseline_name = baseline_name;
    r.ratio = tpot > 0 ? v / tpot : 0;
  }
  return r;
}

}  // namespace

int run_recovery_bench(const recovery_bench_options& o, std::vector<bench_row>& rows) {
  loaded_model lm = load_model(o.model, o.tokenizer);
  const int seq_len = lm.file->cfg().seq_len;
  for (const std::string topo : {"pipeline", "tensor"}) {
    // Fault-free baseline of this placement.
    actors::cluster_options base;
    base.file = lm.file;
    base.tok = lm.tok;
    base.nodes = o.nodes;
    base.spares = 1;
    base.topology = topo;
    double tpot = 0;
    {
      auto c = actors::cluster::start(base);
      if (!c) throw cli_error(c.message());
      model::generation_params gp;
      gp.steps = std::min(seq_len, 128);
      gp.sampling = {0.0f, 0.9f, 1};
      auto out = (*c)->generate(gp);
      if (!out || !out->ok) throw cli_error("baseline run failed");
      auto v = out->result.step_ms;
      std::sort(v.begin(), v.end());
      tpot = v[v.size() / 2];
    }
    for (const std::string kind : {"crash", "silence"}) {
      for (int K : o.checkpoint_every) {
        for (int ctx : o.contexts) {
          if (ctx + 8 > seq_len) continue;
          actors::cluster_options co = base;
          co.checkpoint_every = K;
          auto f = supervision::parse_fault_spec(kind + ":node=1:step=" + std::to_string(ctx));
          if (!f) throw cli_error(f.message());
          co.faults = {*f};
          auto c = actors::cluster::start(co);
          if (!c) throw cli_error(c.message());
          model::generation_params gp;
          gp.steps = ctx + 8;
          gp.sampling = {0.0f, 0.9f, 1};
          auto out = (*c)->generate(gp);
          if (!out || !out->ok)
            throw cli_error("run with " + kind + " at " + std::to_string(ctx) + " failed: " +
                            (out ? out->error : out.message()));
          const auto faults = (*c)->faults();
          if (faults.empty() || out->recoveries.empty()) {
            std::fprintf(stderr, "  skipped %s %s at %d: generation ended (BOS) at position %zu first\n",
                         topo.c_str(), kind.c_str(), ctx, out->result.ids.size() - 1);
            continue;
          }
          const auto& fr = faults.front();
          const auto& rec = out->recoveries.front();
          std::map<std::string, std::string> params = {{"topology", topo},
                                                       {"fault", kind},
                                                       {"K", std::to_string(K)},
                                                       {"position", std::to_string(ctx)}};
          auto add = [&](const std::string& name, double v, const std::string& unit, bool ratio) {
            rows.push_back(row_against_tpot(name, params, v, unit, ratio, tpot, "fault-free TPOT of the same placement"));
          };
          add("recovery.detect", fr.detect_ms, "ms", true);
          add("recovery.recover", fr.recover_ms, "ms", true);
          add("recovery.replayed", rec.replayed_positions, "positions", false);
          std::fprintf(stderr, "  %-8s %-7s K=%-3d at %-3d: detect %7.2f ms, recover %6.2f ms, replayed %d\n",
                       topo.c_str(), kind.c_str(), K, ctx, fr.detect_ms, fr.recover_ms,
                       rec.replayed_positions);
        }
      }
    }
  }
  return 0;
}

namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// One generation over the daemons, with an optional signal at the at-th token.
struct process_trace {
  std::string label;                 // "baseline", "kill", "stop"
  bool ok = false;
  std::string error;
  std::vector<int> ids;
  std::vector<double> step_ms;
  int64_t t0_ns = 0;                 // just before generate()
  std::vector<int64_t> token_ns;     // each delivered token
  int target_index = -1, target_daemon = -1;
  int64_t fired_ns = 0;              // the signal (0: none sent)
  std::string fire_error;
  std::vector<actors::fault_record> faults;
  int suspicions = 0;                // suspected nodes that answered a probe (not restarted)
  std::vector<actors::recovery_record> recoveries;
  // Derived (fault runs): -1 when unknown.
  double detect_ms = -1, recover_ms = -1, stall_ms = -1;
  int replayed = -1;
  int64_t decided_ns = 0, recovered_ns = 0;
  std::string record_kind;
};

process_trace run_over_daemons(local_daemons& d, const loaded_model& lm, const recovery_process_bench_options& o,
                               const model::generation_params& gp, const std::string& kind, int index) {
  process_trace t;
  t.label = kind.empty() ? "baseline" : kind;
  t.target_index = index;
  actors::cluster_options co;
  co.file = lm.file;
  co.tok = lm.tok;
  co.topology = o.topology;
  co.checkpoint_every = o.checkpoint_every;
  if (o.pace_ms > 0)
    co.faults = {supervision::parse_fault_spec("slow:node=0:step=0:ms=" + std::to_string(o.pace_ms)).value()};
  co.host = std::make_shared<actors::remote_host>(d.entries(), actors::remote_options{});
  std::mutex mu;
  {
    auto c = actors::cluster::start(co);
    if (!c) {
      t.error = "cluster start: " + c.message();
      return t;
    }
    auto wired = (*c)->stats();
    if (!wired) {
      t.error = "wiring check: " + wired.message();
      return t;
    }
    if (!kind.empty()) {
      const auto nodes = (*c)->current_nodes();
      if (index < 0 || index >= static_cast<int>(nodes.size())) {
        t.error = "placement index " + std::to_string(index) + " does not exist (" +
                  std::to_string(nodes.size()) + " shards)";
        return t;
      }
      t.target_daemon = nodes[static_cast<size_t>(index)];
    }
    const int sig = kind == "kill" ? SIGKILL : SIGSTOP;
    auto on_token = [&](uint64_t, int, const std::string&) {
      const int64_t now = steady_ns();
      std::lock_guard<std::mutex> lk(mu);
      t.token_ns.push_back(now);
      if (!kind.empty() && static_cast<int>(t.token_ns.size()) == o.at) {
        auto r = d.signal(t.target_daemon, sig);  // ::kill only: does not block this CAF thread
        if (r)
          t.fired_ns = *r;
        else
          t.fire_error = r.message();
      }
    };
    t.t0_ns = steady_ns();
    auto out = (*c)->generate(gp, on_token, std::chrono::seconds(o.deadline_s));
    if (kind == "stop" && t.target_daemon >= 0) d.thaw(t.target_daemon);  // after the run
    std::lock_guard<std::mutex> lk(mu);  // late callbacks (none expected) wait here
    if (!out) {
      t.error = "no outcome within " + std::to_string(o.deadline_s) + " s: " + out.message();
    } else {
      t.ok = out->ok;
      t.error = out->error;
      t.ids = out->result.ids;
      t.step_ms = out->result.step_ms;
      t.recoveries = out->recoveries;
    }
    t.faults = (*c)->faults();
    t.suspicions = static_cast<int>((*c)->suspicions().size());
  }
  d.reap();
  const std::string ends = d.unexpected_ends();
  if (!ends.empty()) {
    t.ok = false;
    t.error += (t.error.empty() ? "" : "; ") + ends;
    for (int i = 0; i < d.size(); ++i)
      if (!d.alive(i) && i != t.target_daemon) {
        auto r = d.restart(i);
        if (!r) t.error += "; restarting " + d.describe(i) + ": " + r.message();
      }
  }
  if (!kind.empty() && t.target_daemon >= 0) {
    // A fresh daemon in its place, so that the next run has the full cluster.
    auto r = d.restart(t.target_daemon);
    if (!r && t.error.empty()) t.error = "restarting " + d.describe(t.target_daemon) + ": " + r.message();
    if (!r) t.ok = false;
  }
  if (!kind.empty() && t.fired_ns > 0) {
    // The runtime's record of this failure: the first one on the target
    // daemon (node-down / node-silent), else the first that is not pacing.
    const actors::fault_record* rec = nullptr;
    for (const auto& f : t.faults)
      if (f.kind != "slow" && f.node == t.target_daemon && f.decided_ns > 0) {
        rec = &f;
        break;
      }
    if (!rec)
      for (const auto& f : t.faults)
        if (f.kind != "slow" && f.decided_ns > 0) {
          rec = &f;
          break;
        }
    if (rec) {
      t.record_kind = rec->kind;
      t.decided_ns = rec->decided_ns;
      t.recovered_ns = rec->recovered_ns;
      t.detect_ms = (rec->decided_ns - t.fired_ns) / 1e6;
      t.recover_ms = rec->recovered_ns > 0 ? (rec->recovered_ns - rec->decided_ns) / 1e6 : rec->recover_ms;
      t.replayed = rec->replayed_positions;
    }
    if (t.replayed < 0 && !t.recoveries.empty()) t.replayed = t.recoveries.front().replayed_positions;
    for (int64_t ns : t.token_ns)
      if (ns > t.fired_ns) {
        // The first token delivered after the signal that needed the
        // recovery: after the decision when there is one.
        if (t.decided_ns > 0 && ns < t.decided_ns) continue;
        t.stall_ms = (ns - t.fired_ns) / 1e6;
        break;
      }
  }
  return t;
}

/// The median (base/percentile.hpp), or -1 ("none") for no samples.
double median_of(std::vector<double> v) { return v.empty() ? -1 : median(std::move(v)); }

/// Token times (ms since t0) of a trace: one "token t_ms" line per token.
void write_series(const std::string& path, const process_trace& t) {
  std::ostringstream f;
  for (size_t i = 0; i < t.token_ns.size(); ++i) f << (i + 1) << " " << (t.token_ns[i] - t.t0_ns) / 1e6 << "\n";
  write_text(path, f.str());  // checked: throws naming the file
}

/// recovery_timeline.png: tokens delivered against time, one panel for the
/// crash and one for the freeze, the fault-free baseline in grey, vertical
/// marks at the signal, the decision and the first token after recovery.
void plot_timeline(const std::string& dir, const process_trace& base, const std::vector<const process_trace*>& runs,
                   int at, const std::string& title) {
  write_series(dir + "/timeline_baseline.dat", base);
  std::ostringstream gp;
  gp << "set terminal pngcairo size 960," << (300 * runs.size() + 60) << " noenhanced\n"
     << "set output '" << dir << "/recovery_timeline.png'\n"
     << "set multiplot layout " << runs.size() << ",1 title '" << title << "'\n"
     << "set grid\nset key right bottom\nset xlabel 'time since the request (ms)'\n"
     << "set ylabel 'tokens delivered'\n";
  for (const auto* r : runs) {
    write_series(dir + "/timeline_" + r->label + ".dat", *r);
    const double fired = (r->fired_ns - r->t0_ns) / 1e6;
    const double decided = r->decided_ns > 0 ? (r->decided_ns - r->t0_ns) / 1e6 : -1;
    const double first = r->stall_ms >= 0 ? fired + r->stall_ms : -1;
    const std::string what = r->label == "kill" ? "SIGKILL" : "SIGSTOP";
    gp << "unset arrow\nunset label\n";
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "set title '%s of the daemon hosting index %d at token %d: detected %.1f ms, next token %.1f ms "
                  "after the signal'\n",
                  what.c_str(), r->target_index, at, r->detect_ms, r->stall_ms);
    gp << buf;
    // A window around the event, so that milliseconds stay visible.
    const double lo = std::max(0.0, fired - 400), hi = std::max(first, decided) + 400;
    gp << "set xrange [" << lo << ":" << hi << "]\nset autoscale y\n";
    auto mark = [&](double x, const char* colour, const std::string& label, double y) {
      if (x < 0) return;
      gp << "set arrow from " << x << ", graph 0 to " << x << ", graph 1 nohead dt 2 lw 2 lc rgb '" << colour
         << "'\n";
      gp << "set label '" << label << "' at " << x << ", graph " << y << " left offset 0.5,0 tc rgb '" << colour
         << "' font ',9'\n";
    };
    mark(fired, "red", what, 0.92);
    mark(decided, "orange", "decision", 0.80);
    mark(first, "dark-green", "first token after recovery", 0.68);
    gp << "plot '" << dir << "/timeline_baseline.dat' using 2:1 with lines lw 1 lc rgb 'gray60' title 'fault-free', "
       << "'" << dir << "/timeline_" << r->label << ".dat' using 2:1 with linespoints pt 7 ps 0.4 lw 2 lc rgb "
       << "'navy' title '" << what << " at token " << at << "'\n";
  }
  gp << "unset multiplot\n";
  const std::string script = dir + "/recovery_timeline.gp";
  write_text(script, gp.str());
  const std::string cmd = "gnuplot '" + script + "' 2>&1";
  if (std::system(cmd.c_str()) != 0)
    std::fprintf(stderr, "warning: gnuplot failed for %s (is gnuplot installed? scripts/install-deps.sh)\n",
                 script.c_str());
}

}  // namespace

int run_recovery_process_bench(const recovery_process_bench_options& o, std::vector<bench_row>& rows) {
  if (o.repeat < 1) throw cli_error("--repeat must be at least 1", 2);
  if (o.at < 1) throw cli_error("--at must be at least 1", 2);
  if (o.nodes < 3) throw cli_error("--processes needs at least 3 working daemons (one killed, one frozen, "
                                   "one hosting the pacing)", 2);
  loaded_model lm = load_model(o.model, o.tokenizer);
  auto models_dir = daemon_models_dir(lm.file->path(), lm.tok->name());
  if (!models_dir) throw cli_error(models_dir.message());
  if (::mkdir(o.out.c_str(), 0755) != 0 && errno != EEXIST)
    throw cli_error(o.out + ": cannot create: " + std::strerror(errno));
  model::generation_params gp;
  gp.steps = o.steps;
  gp.sampling = {0.0f, 0.9f, 1};
  gp = model::normalise(gp, lm.file->cfg().seq_len);
  if (o.at + 8 > gp.steps)
    throw cli_error("--at " + std::to_string(o.at) + " leaves fewer than 8 positions of " +
                    std::to_string(gp.steps) + " after the fault", 2);

  local_daemon_options lo;
  lo.models_dir = *models_dir;
  lo.log_dir = o.out + "/daemons";
  std::fprintf(stderr, "starting %d + %d node daemons (logs in %s)\n", o.nodes, o.spares, lo.log_dir.c_str());
  auto daemons = local_daemons::start(o.nodes, o.spares, lo);
  if (!daemons) throw cli_error(daemons.message());
  auto& d = **daemons;

  const int total = 1 + 2 * o.repeat;
  int done = 0, status = 0;
  std::fprintf(stderr, "[%d/%d] fault-free baseline: %s, %d positions, paced %d ms per step\n", ++done, total,
               o.topology.c_str(), gp.steps, o.pace_ms);
  process_trace base = run_over_daemons(d, lm, o, gp, "", -1);
  if (!base.ok) throw cli_error("fault-free baseline over daemons failed: " + base.error);
  const double tpot = median_of(base.step_ms);
  if (static_cast<int>(base.token_ns.size()) < o.at + 2)
    throw cli_error("the baseline delivered only " + std::to_string(base.token_ns.size()) +
                    " tokens (BOS first?): --at " + std::to_string(o.at) + " would not be mid-generation");
  std::fprintf(stderr, "        %zu tokens, TPOT p50 %.3f ms\n", base.token_ns.size(), tpot);

  std::map<std::string, std::string> common = {{"topology", o.topology},
                                               {"daemons", std::to_string(o.nodes) + "+" + std::to_string(o.spares)},
                                               {"at_token", std::to_string(o.at)},
                                               {"pace_ms", std::to_string(o.pace_ms)}};
  {
    bench_row r;
    r.name = "recovery.proc.tpot";
    r.params = common;
    r.value = tpot;
    r.unit = "ms";
    rows.push_back(r);
  }
  std::vector<process_trace> traces;
  for (int rep = 0; rep < o.repeat; ++rep) {
    for (const std::string kind : {"kill", "stop"}) {
      const int index = kind == "kill" ? 1 : 2;
      std::fprintf(stderr, "[%d/%d] %s of the daemon hosting placement index %d at token %d (repetition %d)\n",
                   ++done, total, kind == "kill" ? "SIGKILL" : "SIGSTOP", index, o.at, rep + 1);
      process_trace t = run_over_daemons(d, lm, o, gp, kind, index);
      std::string problem;
      if (!t.ok) problem = "run failed: " + t.error;
      else if (t.fired_ns == 0) problem = "the signal was not sent" + (t.fire_error.empty() ? "" : ": " + t.fire_error);
      else if (t.ids != base.ids) {
        size_t k = 0;
        while (k < t.ids.size() && k < base.ids.size() && t.ids[k] == base.ids[k]) ++k;
        problem = "ids differ from the fault-free run at position " + std::to_string(k);
      } else if (t.decided_ns == 0)
        problem = "no fault record with a decision time for " + d.describe(t.target_daemon) + " (records: " +
                  std::to_string(t.faults.size()) + ")";
      if (!problem.empty()) {
        std::fprintf(stderr, "        error: %s\n", problem.c_str());
        status = 1;
      } else {
        std::fprintf(stderr, "        %s: detected %.2f ms after the signal, recovered %.2f ms after that, "
                     "%d positions replayed, next token %.2f ms after the signal; ids identical\n",
                     t.record_kind.c_str(), t.detect_ms, t.recover_ms, t.replayed, t.stall_ms);
      }
      auto params = common;
      params["fault"] = kind;
      params["repetition"] = std::to_string(rep + 1);
      params["index"] = std::to_string(index);
      params["ids"] = problem.empty() ? "identical" : "ERROR";
      auto add = [&](const std::string& name, double v, const std::string& unit, bool ratio) {
        rows.push_back(row_against_tpot(name, params, v, unit, ratio && tpot > 0, tpot,
                                        "fault-free TPOT over the same daemons"));
      };
      add("recovery.proc.detect", t.detect_ms, "ms", true);
      add("recovery.proc.recover", t.recover_ms, "ms", true);
      add("recovery.proc.stall", t.stall_ms, "ms", true);
      add("recovery.proc.replayed", t.replayed, "positions", false);
      traces.push_back(std::move(t));
    }
  }

  // Issue #20: busy nodes are not dead. The same generation, fault-free,
  // while a busy loop runs on every core (children of this process, killed
  // when the run ends, or when this process dies):
  // every restart in it is a false one.
  std::vector<int> false_restarts;
  std::vector<int> cleared;
  {
    const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
    for (int rep = 0; rep < o.repeat; ++rep) {
      std::fprintf(stderr, "[busy %d/%d] fault-free run with %ld busy loop(s), one per core\n", rep + 1, o.repeat,
                   cores);
      std::vector<pid_t> loops;
      for (long c = 0; c < cores; ++c) {
        // A shell's empty loop, killed after the run, or with this process
        // at once (base/spawn.hpp's parent-death kill).
        const pid_t pid = spawn_child({"/bin/sh", "-c", "while :; do :; done"});
        if (pid > 0) loops.push_back(pid);
      }
      process_trace t = run_over_daemons(d, lm, o, gp, "", -1);
      for (pid_t p : loops) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
      // Restarts only: the pacing's injected `slow` is a record too, not a restart.
      int restarts = 0;
      for (const auto& f : t.faults)
        if (f.kind != "slow" && f.kind != "delay" && f.kind != "drop" && f.kind != "corrupt") ++restarts;
      false_restarts.push_back(restarts);
      cleared.push_back(t.suspicions);
      std::fprintf(stderr, "        %s: %d restart(s), %d suspicion(s) cleared by a probe%s\n",
                   t.ok ? "done" : ("failed: " + t.error).c_str(), restarts, t.suspicions,
                   t.ok && t.ids != base.ids ? "; ids DIFFER from the fault-free run" : "");
      if (!t.ok || t.ids != base.ids) status = 1;
      auto params = common;
      params["fault"] = "busy-loops";
      params["repetition"] = std::to_string(rep + 1);
      params["busy_loops"] = std::to_string(cores);
      bench_row r;
      r.name = "recovery.proc.false_restarts";
      r.params = params;
      r.value = restarts;
      r.unit = "restarts";
      rows.push_back(r);
      r.name = "recovery.proc.suspicions_cleared";
      r.value = t.suspicions;
      r.unit = "suspicions";
      rows.push_back(r);
    }
  }

  // Goals of issue #7, over every repetition.
  struct goal {
    std::string kind, what;
    double limit_ms;
  };
  std::printf("\n");
  for (const goal& g : {goal{"kill", "a killed daemon detected in under 50 ms", 50.0},
                        goal{"stop", "a frozen daemon detected in under 1 s", 1000.0}}) {
    std::vector<double> v;
    int missing = 0;
    for (const auto& t : traces)
      if (t.label == g.kind) {
        if (t.detect_ms >= 0) v.push_back(t.detect_ms);
        else ++missing;
      }
    const double worst = v.empty() ? -1 : *std::max_element(v.begin(), v.end());
    const bool met = missing == 0 && !v.empty() && worst < g.limit_ms;
    std::printf("goal (issue #7): %s: %s (median %.2f ms, worst %.2f ms over %zu run(s)%s)\n", g.what.c_str(),
                met ? "MET" : "NOT MET", median_of(v), worst, v.size(),
                missing ? (", " + std::to_string(missing) + " without a detection").c_str() : "");
    bench_row r;
    r.name = "recovery.proc.detect.worst";
    r.params = common;
    r.params["fault"] = g.kind;
    r.params["goal_ms"] = std::to_string(static_cast<int>(g.limit_ms));
    r.params["goal"] = met ? "met" : "not met";
    r.value = worst;
    r.unit = "ms";
    r.baseline = g.limit_ms;
    r.baseline_name = "goal of issue #7";
    r.ratio = worst / g.limit_ms;
    rows.push_back(r);
  }
  {
    const int worst = false_restarts.empty() ? -1 : *std::max_element(false_restarts.begin(), false_restarts.end());
    std::vector<double> stops;
    for (const auto& t : traces)
      if (t.label == "stop" && t.detect_ms >= 0) stops.push_back(t.detect_ms);
    std::printf("goal (issue #20), side by side: SIGSTOP detected in %.2f ms median, %.2f ms worst (goal <= 1000 ms) "
                "| restarts under busy loops on every core: %d worst over %zu run(s) (goal 0): %s\n",
                median_of(stops), stops.empty() ? -1.0 : *std::max_element(stops.begin(), stops.end()), worst,
                false_restarts.size(), worst == 0 ? "MET" : "NOT MET");
    bench_row r;
    r.name = "recovery.proc.false_restarts.worst";
    r.params = common;
    r.params["goal"] = worst == 0 ? "met" : "not met";
    r.value = worst;
    r.unit = "restarts";
    rows.push_back(r);
  }
  std::printf("\n");

  // Timeline data (every trace) and the plot of the first crash and freeze.
  {
    std::ostringstream csv;
    csv << "run,fault,token,t_ms\n";
    auto dump = [&](const std::string& run, const process_trace& t) {
      for (size_t i = 0; i < t.token_ns.size(); ++i)
        csv << run << "," << t.label << "," << (i + 1) << "," << (t.token_ns[i] - t.t0_ns) / 1e6 << "\n";
    };
    dump("baseline", base);
    for (size_t i = 0; i < traces.size(); ++i) dump(std::to_string(i / 2 + 1), traces[i]);
    write_text(o.out + "/recovery_timeline.csv", csv.str());
    std::ostringstream marks;
    marks << "run,fault,event,t_ms\n";
    for (size_t i = 0; i < traces.size(); ++i) {
      const auto& t = traces[i];
      if (t.fired_ns == 0) continue;
      const std::string run = std::to_string(i / 2 + 1) + "," + t.label + ",";
      marks << run << "signal," << (t.fired_ns - t.t0_ns) / 1e6 << "\n";
      if (t.decided_ns > 0) marks << run << "decision," << (t.decided_ns - t.t0_ns) / 1e6 << "\n";
      if (t.stall_ms >= 0) marks << run << "first_token_after," << (t.fired_ns - t.t0_ns) / 1e6 + t.stall_ms << "\n";
    }
    write_text(o.out + "/recovery_marks.csv", marks.str());
  }
  if (o.plot && traces.size() >= 2 && traces[0].fired_ns > 0 && traces[1].fired_ns > 0) {
    const std::string model_name = lm.file->path().substr(lm.file->path().rfind('/') + 1);
    plot_timeline(o.out, base, {&traces[0], &traces[1]}, o.at,
                  model_name + ", " + o.topology + " over " + std::to_string(o.nodes) + " daemons + " +
                      std::to_string(o.spares) + " spares (loopback), paced " + std::to_string(o.pace_ms) +
                      " ms per step");
  }
  std::fprintf(stderr, "wrote %s/recovery_timeline.csv, recovery_marks.csv%s\n", o.out.c_str(),
               o.plot ? ", recovery_timeline.png" : "");
  return status;
}

}  // namespace cellshard::tools
