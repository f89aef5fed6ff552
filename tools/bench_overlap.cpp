// `cellshard bench cluster --overlap` (issue #19, "pipelines overlap"): the
// aggregate tokens/s of N concurrent sessions on a pipeline of S stages,
// against one session on the same cluster in the same run, in this process
// and over `cellshard node` daemons on loopback; and each stage's busy share
// (its shards' kernel time over the wall time of the batch).
//
// The runtime needs no scheduler for this: every session is its own actor
// with at most one step in flight at a shard, and each shard computes on its
// own worker in posting order (actors/shard.hpp), so while stage k computes
// one session's position, stage k-1 takes the next session's step. What a
// batch can gain is bounded by the stages (S) and by the cores that run them:
// on this 2-core VM, min(S, 2) at best, less what the other processes take.
//
// Rounds alternate the session counts (1, N1, N2, ..., then again), so load
// drifts hit every count alike; each point prints the median of its rounds.
// Every session's ids are checked against the first single-session run's
// (same greedy request): a batch that does not reproduce them fails the bench.
#include "actors/cluster.hpp"
#include "actors/local_daemons.hpp"
#include "actors/remote.hpp"
#include "base/percentile.hpp"
#include "model/synth.hpp"
#include "tools/bench.hpp"
#include "tools/common.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

namespace cellshard::tools {

namespace {

using clk = std::chrono::steady_clock;

bool file_exists(const std::string& p) { return ::access(p.c_str(), R_OK) == 0; }

std::string absolute_path(const std::string& p) {
  char buf[4096];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

struct batch_result {
  double tok_s = 0;                 // generated tokens of every session / wall
  double wall_s = 0;
  std::vector<double> stage_busy;   // per stage: kernel time / wall
};

/// Sums compute_ns by stage.
std::vector<int64_t> compute_by_stage(const std::vector<actors::shard_stats>& st, const topologies::placement& p) {
  std::vector<int64_t> by(p.stages.size(), 0);
  for (const auto& s : st)
    if (s.index >= 0 && s.index < static_cast<int>(p.shards.size())) {
      const auto stage = static_cast<size_t>(p.shards[static_cast<size_t>(s.index)].stage);
      if (stage < by.size()) by[stage] += s.compute_ns;
    }
  return by;
}

/// Runs `n` identical requests at once; every session's ids must equal `want`
/// (when not empty). Throws cli_error on a failed or diverging session.
batch_result run_batch(actors::cluster& c, const model::generation_params& gp, int n, const std::vector<int>& want,
                       std::vector<int>* ids_out) {
  auto before = c.stats();
  if (!before) throw cli_error("stats: " + before.message());
  std::vector<std::shared_ptr<std::promise<actors::session_outcome>>> ps;
  const auto t0 = clk::now();
  for (int k = 0; k < n; ++k) {
    auto p = std::make_shared<std::promise<actors::session_outcome>>();
    ps.push_back(p);
    c.submit(gp, {}, [p](uint64_t, const actors::session_outcome& so) { p->set_value(so); });
  }
  int tokens = 0;
  for (int k = 0; k < n; ++k) {
    auto f = ps[static_cast<size_t>(k)]->get_future();
    if (f.wait_for(std::chrono::minutes(10)) != std::future_status::ready)
      throw cli_error("bench cluster --overlap: a session did not finish within 10 minutes");
    auto so = f.get();
    if (!so.ok) throw cli_error("bench cluster --overlap: session " + std::to_string(k) + " of " + std::to_string(n) +
                                ": " + so.error);
    if (!want.empty() && so.result.ids != want)
      throw cli_error("bench cluster --overlap: session " + std::to_string(k) + " of " + std::to_string(n) +
                      " concurrent: ids differ from the single session's");
    if (ids_out && k == 0) *ids_out = so.result.ids;
    tokens += static_cast<int>(so.result.ids.size()) - 1;
  }
  const double wall = std::chrono::duration<double>(clk::now() - t0).count();
  auto after = c.stats();
  if (!after) throw cli_error("stats: " + after.message());
  const auto b = compute_by_stage(*before, c.placement()), a = compute_by_stage(*after, c.placement());
  batch_result r;
  r.wall_s = wall;
  r.tok_s = wall > 0 ? tokens / wall : 0;
  for (size_t s = 0; s < a.size(); ++s) r.stage_busy.push_back(wall > 0 ? (a[s] - b[s]) / 1e9 / wall : 0);
  return r;
}

}  // namespace

int run_overlap_bench(const cluster_bench_options& o, std::vector<bench_row>& rows) {
  if (o.sessions.empty() || o.sessions.front() != 1)
    throw cli_error("--sessions: the first count must be 1 (the baseline)", 2);
  for (int n : o.sessions)
    if (n < 1 || n > 64) throw cli_error("--sessions: " + std::to_string(n) + " is not in 1..64", 2);
  for (const auto& w : o.where)
    if (w != "inproc" && w != "daemons") throw cli_error("--where: " + w + " (expected inproc or daemons)", 2);
  // The model: -m, else a synthetic preset written to a temporary folder
  // beside a link to llama2.c's tokenizer.bin (daemons open both by name).
  char tmpl[] = "/tmp/cellshard-overlap-XXXXXX";
  if (!::mkdtemp(tmpl)) throw cli_error(std::string("cannot create a temporary folder: ") + std::strerror(errno));
  const std::string dir = tmpl;
  struct cleanup {
    std::string dir;
    ~cleanup() {
      if (std::system(("rm -rf '" + dir + "'").c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());
    }
  } rm{dir};
  std::string model_path = o.model, tok_path = o.tokenizer;
  if (model_path.empty()) {
    auto cfg = model::synth_preset(o.overlap_config);
    if (!cfg) throw cli_error("--overlap-config: " + cfg.message(), 2);
    if (tok_path.empty())
      for (const char* c : {"../shared/models/tokenizer.bin", "../../shared/models/tokenizer.bin",
                            "/work/shared/models/tokenizer.bin"})
        if (file_exists(c)) {
          tok_path = c;
          break;
        }
    if (tok_path.empty()) throw cli_error("bench cluster --overlap: tokenizer.bin (32000 tokens) not found; pass -z", 2);
    model_path = dir + "/model.bin";
    const auto bytes = model::synth_bytes(*cfg, 1);
    std::FILE* f = std::fopen(model_path.c_str(), "wb");
    if (!f) throw cli_error(model_path + ": " + std::strerror(errno));
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    if (std::fclose(f) != 0 || !ok) throw cli_error(model_path + ": write failed");
    const std::string link = dir + "/tokenizer.bin";
    if (::symlink(absolute_path(tok_path).c_str(), link.c_str()) != 0)
      throw cli_error(link + ": " + std::strerror(errno));
    tok_path = link;
    std::fprintf(stderr, "bench cluster --overlap: synthetic %s (seed 1) in %s\n", o.overlap_config.c_str(), dir.c_str());
  }
  loaded_model lm = load_model(model_path, tok_path);
  model::generation_params gp;
  gp.steps = o.overlap_steps;
  gp.sampling = {0.0f, 0.9f, 1};
  int max_sessions = 1;
  for (int n : o.sessions) max_sessions = std::max(max_sessions, n);

  for (const auto& where : o.where)
    for (int stages : o.stages) {
      std::unique_ptr<actors::local_daemons> daemons;
      actors::cluster_options co;
      co.file = lm.file;
      co.tok = lm.tok;
      co.topology = "pipeline:" + std::to_string(stages);
      co.nodes = stages;
      co.kernels = o.kernels;
      co.caf_threads = o.caf_threads;
      co.sessions = max_sessions;
      if (where == "daemons") {
        auto md = actors::daemon_models_dir(lm.file->path(), lm.tok->name());
        if (!md) throw cli_error(md.message());
        actors::local_daemon_options lo;
        lo.models_dir = *md;
        auto d = actors::local_daemons::start(stages, 0, lo);
        if (!d) throw cli_error("daemons: " + d.message());
        daemons = std::move(*d);
        co.host = std::make_shared<actors::remote_host>(daemons->entries(), actors::remote_options{});
      }
      auto c = actors::cluster::start(co);
      if (!c) throw cli_error(where + " pipeline:" + std::to_string(stages) + ": " + c.message());
      // Warm-up and the reference ids: one session alone.
      std::vector<int> want;
      run_batch(**c, gp, 1, {}, &want);
      std::map<int, std::vector<double>> tps;
      std::map<int, std::vector<std::vector<double>>> busy;
      for (int r = 0; r < o.reps; ++r)
        for (int n : o.sessions) {
          const batch_result b = run_batch(**c, gp, n, want, nullptr);
          tps[n].push_back(b.tok_s);
          busy[n].push_back(b.stage_busy);
          std::fprintf(stderr, "  round %d %s pipeline:%d %2d session(s): %.1f tok/s\n", r + 1, where.c_str(), stages,
                       n, b.tok_s);
        }
      const double base = median(tps[1]);
      for (int n : o.sessions) {
        const double v = median(tps[n]);
        bench_row row;
        row.name = "cluster.overlap.tokens_per_s";
        row.params = {{"where", where}, {"topology", "pipeline"}, {"stages", std::to_string(stages)},
                      {"sessions", std::to_string(n)}, {"steps", std::to_string(gp.steps)},
                      {"model", o.model.empty() ? "synth " + o.overlap_config : o.model}};
        row.value = v;
        row.unit = "tok/s";
        row.baseline = base;
        row.baseline_name = "1 session, same cluster, alternating rounds";
        row.ratio = base > 0 ? v / base : 0;
        rows.push_back(row);
        std::string shares;
        for (int s = 0; s < stages; ++s) {
          std::vector<double> per;
          for (const auto& v2 : busy[n])
            if (static_cast<size_t>(s) < v2.size()) per.push_back(v2[static_cast<size_t>(s)]);
          bench_row b = row;
          b.name = "cluster.overlap.stage_busy";
          b.params["stage"] = std::to_string(s);
          b.value = median(per);
          b.unit = "fraction";
          b.baseline = -1;
          b.baseline_name = "";
          b.ratio = 0;
          rows.push_back(b);
          char buf[32];
          std::snprintf(buf, sizeof buf, " %.2f", b.value);
          shares += buf;
        }
        std::fprintf(stderr, "  %-7s pipeline:%d %2d session(s): %.1f tok/s aggregate (x%.2f of 1 session), stage busy "
                     "share%s\n", where.c_str(), stages, n, v, row.ratio, shares.c_str());
      }
      (*c)->shutdown();
    }
  return 0;
}

}  // namespace cellshard::tools
