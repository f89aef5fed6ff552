// `cellshard bench kernels|cluster|recovery`: measurements with a baseline
// measured in the same run, printed as ratios, with --json FILE.
#include "tools/bench.hpp"

#include "bench/kernels_bench.hpp"

#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <memory>

namespace cellshard::tools {

std::string print_rows(const std::vector<bench_row>& rows) {
  nlohmann::json j = nlohmann::json::array();
  std::printf("%-20s %-60s %14s %-9s %14s %8s\n", "name", "parameters", "value", "unit", "baseline", "ratio");
  for (const auto& r : rows) {
    std::string p;
    for (auto& kv : r.params) p += (p.empty() ? "" : " ") + kv.first + "=" + kv.second;
    if (r.baseline >= 0)
      std::printf("%-20s %-60s %14.4f %-9s %14.4f %8.3f\n", r.name.c_str(), p.c_str(), r.value,
                  r.unit.c_str(), r.baseline, r.ratio);
    else
      std::printf("%-20s %-60s %14.4f %-9s %14s %8s\n", r.name.c_str(), p.c_str(), r.value, r.unit.c_str(),
                  "-", "-");
    nlohmann::json o = {{"name", r.name}, {"params", r.params}, {"value", r.value}, {"unit", r.unit}};
    if (r.baseline >= 0) {
      o["baseline"] = r.baseline;
      o["baseline_name"] = r.baseline_name;
      o["ratio"] = r.ratio;
    }
    j.push_back(o);
  }
  return j.dump(2) + "\n";
}

void add_bench(CLI::App& app, int& status) {
  auto* bench = app.add_subcommand("bench", "measurements printed as ratios against a same-run baseline");
  bench->require_subcommand(1);
  auto ko = std::make_shared<bench::kernels_bench_options>();
  auto kjson = std::make_shared<std::string>();
  auto* kb = bench->add_subcommand("kernels", "matvec f32/q8_0/q4_0 per backend vs OpenBLAS sgemv and a read-bandwidth probe");
  kb->add_option("--rows", ko->rows, "rows of one custom shape (with --cols)");
  kb->add_option("--cols", ko->cols, "columns of one custom shape (with --rows)");
  kb->add_option("--workers,--threads", ko->workers, "threads for blas/native/spe/sgemv/probe (0 = hardware)")
      ->capture_default_str();
  kb->add_option("--backends", ko->backends, "backends to measure")->delimiter(',')->capture_default_str();
  kb->add_option("--min-seconds", ko->min_seconds, "time per measurement")->capture_default_str();
  kb->add_option("--probe-mib", ko->probe_mib, "bandwidth probe buffer (MiB)")->capture_default_str();
  kb->add_option("--isa", ko->isa, "native level: portable|avx2|avx512|avx512vnni|neon (default: the best here)");
  kb->add_flag("--cpu-time", ko->cpu_time,
               "time with thread CPU clocks instead of wall time (a shared machine; use with --threads 1)");
  kb->add_option("--json", *kjson, "rows as JSON to FILE (- = stdout)");
  kb->callback([ko, kjson, &status] {
    std::string j;
    status = bench::run_kernels_bench(*ko, std::cout, &j);
    if (!kjson->empty()) write_text(*kjson, j);
  });

  auto ro = std::make_shared<recovery_bench_options>();
  auto rjson = std::make_shared<std::string>();
  auto* rb = bench->add_subcommand("recovery", "detection and recovery time vs checkpoint interval and context");
  rb->add_option("-m,--model", ro->model, "model (default lookup as run)");
  rb->add_option("-z,--tokenizer", ro->tokenizer, "tokenizer");
  rb->add_option("--nodes", ro->nodes, "working nodes (one spare is added)")->capture_default_str();
  rb->add_option("--checkpoint-every", ro->checkpoint_every, "values of K")->delimiter(',')->capture_default_str();
  rb->add_option("--contexts", ro->contexts, "positions at which the fault fires")->delimiter(',')
      ->capture_default_str();
  rb->add_option("--json", *rjson, "rows as JSON to FILE (- = stdout)");
  // --processes: node daemon processes, SIGKILL and SIGSTOP from outside (issue #7).
  auto po = std::make_shared<recovery_process_bench_options>();
  auto* g = "Node daemon processes (--processes)";
  auto* processes = rb->add_flag("--processes", "node daemon processes on loopback: SIGKILL and SIGSTOP of a "
                                 "daemon mid-generation (issue #7); --nodes working daemons + --spares")
                        ->group(g);
  rb->add_option("--spares", po->spares, "spare daemons (with --processes)")->capture_default_str()->group(g);
  rb->add_option("--repeat", po->repeat, "kills and freezes each (with --processes)")->capture_default_str()
      ->group(g);
  rb->add_option("-n,--steps", po->steps, "positions per run, greedy (with --processes)")->capture_default_str()
      ->group(g);
  rb->add_option("--at", po->at, "signal the daemon when this many tokens were delivered (with --processes)")
      ->capture_default_str()->group(g);
  rb->add_option("--pace-ms", po->pace_ms, "slow fault on placement index 0, ms per step, so that the signal "
                 "lands mid-generation (0: unpaced)")->capture_default_str()->group(g);
  rb->add_option("--topology", po->topology, "placement over the daemons (with --processes)")
      ->capture_default_str()->group(g);
  rb->add_option("--deadline", po->deadline_s, "a run that takes longer fails (s)")->capture_default_str()
      ->group(g);
  rb->add_option("--out", po->out, "folder for the timeline CSVs, the rows JSON and recovery_timeline.png")
      ->capture_default_str()->group(g);
  rb->add_flag("--no-plot", "skip the gnuplot PNG")->group(g);
  rb->callback([ro, po, rb, processes, rjson, &status] {
    std::vector<bench_row> rows;
    if (processes->count() > 0) {
      po->model = ro->model;
      po->tokenizer = ro->tokenizer;
      if (rb->count("--nodes") > 0) po->nodes = ro->nodes;
      if (rb->count("--checkpoint-every") > 0) po->checkpoint_every = ro->checkpoint_every.front();
      po->plot = rb->count("--no-plot") == 0;
      status = run_recovery_process_bench(*po, rows);
      const std::string j = print_rows(rows);
      write_text(po->out + "/recovery_processes.json", j);
      if (!rjson->empty()) write_text(*rjson, j);
      return;
    }
    for (const char* f : {"--spares", "--repeat", "--steps", "--at", "--pace-ms", "--topology", "--deadline", "--out",
                          "--no-plot"})
      if (rb->count(f) > 0) throw cli_error(std::string(f) + " needs --processes", 2);
    status = run_recovery_bench(*ro, rows);
    const std::string j = print_rows(rows);
    if (!rjson->empty()) write_text(*rjson, j);
  });

  auto fl = std::make_shared<failures_bench_options>();
  auto fljson = std::make_shared<std::string>();
  auto* flb = bench->add_subcommand("failures", "goodput over node daemons with a daemon killed (or frozen) every "
                                   "few seconds, against the planner's failure simulation (issue #25)");
  flb->add_option("-m,--model", fl->model, "model (default: a synthetic 8-layer model written to --out)");
  flb->add_option("-z,--tokenizer", fl->tokenizer, "tokenizer (default with the synthetic model: models/tok512.bin)");
  flb->add_option("--topology", fl->topology, "placement over the daemons")->capture_default_str();
  flb->add_option("--nodes", fl->nodes, "working daemons")->capture_default_str();
  flb->add_option("--spares", fl->spares, "spare daemons (default: one per failure, plus one)");
  flb->add_option("--duration", fl->duration_s, "seconds of each phase (fault-free, with failures)")
      ->capture_default_str();
  flb->add_option("--every", fl->every_s, "seconds between two failures")->capture_default_str();
  flb->add_option("--signal", fl->signal, "kill (SIGKILL: the connection drops) or stop (SIGSTOP: silent)")
      ->capture_default_str();
  flb->add_option("--batch", fl->batch, "concurrent sessions, each running requests back to back")
      ->capture_default_str();
  flb->add_option("-n,--steps", fl->steps, "positions per request")->capture_default_str();
  flb->add_option("--checkpoint-every", fl->checkpoint_every, "positions between KV checkpoints")
      ->capture_default_str();
  flb->add_option("--rounds", fl->rounds, "pairs of phases (fault-free, with failures); the ratio is their "
                  "median")->capture_default_str();
  flb->add_option("--cpu", fl->cpu_percent,
                  "cap each daemon at PCT% of one core (a cgroup of its own, as scripts/lab.sh --cpu; needs "
                  "root), so that a killed daemon frees no CPU for the others (default: no cap)")
      ->check(CLI::Range(0.0, 10000.0));
  flb->add_option("--out", fl->out, "folder for the daemons' logs, the model and failures.json")
      ->capture_default_str();
  flb->add_option("--json", *fljson, "rows as JSON to FILE (- = stdout)");
  flb->callback([fl, fljson, &status] {
    std::vector<bench_row> rows;
    status = run_failures_bench(*fl, rows);
    const std::string j = print_rows(rows);
    write_text(fl->out + "/failures.json", j);
    if (!fljson->empty()) write_text(*fljson, j);
  });

  auto pe = std::make_shared<peers_bench_options>();
  auto pjson = std::make_shared<std::string>();
  auto* pb = bench->add_subcommand("peers", "decode tokens/s against llama2.c's run.c and its OpenMP build "
                                   "(built here with gcc -Ofast -march=native)");
  pb->add_option("-m,--model", pe->model, "f32 model (default: synth --config stories110m -s 1, made in the temp folder)");
  pb->add_option("-z,--tokenizer", pe->tokenizer, "tokenizer.bin (default ../shared/models/tokenizer.bin)");
  pb->add_option("--peers", pe->peers, "folder with llama2.c's run.c (default ../shared/peers/llama2.c)");
  pb->add_option("-n,--steps", pe->steps, "positions per run")->capture_default_str();
  pb->add_option("--repeat", pe->repeat, "rounds (median of per-round ratios)")->capture_default_str();
  pb->add_option("--deadline", pe->deadline_s, "seconds allowed per build or run")->capture_default_str();
  pb->add_flag("--keep", pe->keep, "keep the temporary folder");
  pb->add_option("--pairs", pe->pairs, "rows to measure (default all): f32_1t,f32_2t,q8_0_1t,q4_0_1t,"
                 "q8_0_ggml_1t,q4_0_ggml_1t")->delimiter(',');
  pb->add_option("--json", *pjson, "rows as JSON to FILE (- = stdout)");
  auto pc = std::make_shared<peers_cluster_bench_options>();
  auto pcluster = std::make_shared<bool>(false);
  auto pnopipe = std::make_shared<bool>(false);
  pb->add_flag("--cluster", *pcluster, "against distributed-llama over processes on loopback (built here with make "
               "dllama): cellshard daemons as a tensor group and as a pipeline at each --nodes count");
  pb->add_option("--dllama", pc->dllama, "with --cluster: distributed-llama's sources (default "
                 "../shared/peers/distributed-llama)");
  pb->add_option("--converter", pc->converter, "with --cluster: l2c_to_dllama.py (default "
                 "../shared/peers/tools/l2c_to_dllama.py)");
  pb->add_option("--config", pc->config, "with --cluster and no -m: synth preset (stories42m for a quick run)")
      ->capture_default_str();
  pb->add_option("--nodes", pc->nodes, "with --cluster: process counts (powers of two)")->delimiter(',')
      ->capture_default_str();
  pb->add_option("--out", pc->out, "with --cluster: working folder (kept; a dllama build there is reused)");
  pb->add_option("--reduce", pc->reduce, "with --cluster: cellshard's --reduce (default: run's default)");
  pb->add_option("--sync", pc->sync, "with --cluster: cellshard's --sync (f32 or q8_0); distributed-llama stays at "
                 "f32 sync (its q80 sync needs Q40 weights, the converter writes F32)")
      ->check(CLI::IsMember({"f32", "q8_0"}))
      ->capture_default_str();
  pb->add_option("--caf-idle", pc->idle, "with --cluster: idle-worker policies of cellshard's processes to compare "
                 "(poll, wake; CELLSHARD_CAF_IDLE)")->delimiter(',')->capture_default_str();
  pb->add_option("--data-plane", pc->data, "with --cluster: where the daemons' partial sums go, to compare "
                 "(socket: fused jobs that read the sockets themselves, nolend: fused jobs woken by the reader "
                 "threads, unfused: the sockets without fused jobs, caf; CELLSHARD_DATA_PLANE)")->delimiter(',')->capture_default_str();
  pb->add_flag("--no-pipeline", *pnopipe, "with --cluster: no cellshard pipeline rows");
  pb->callback([pe, pjson, pc, pcluster, pnopipe, pb, &status] {
    std::vector<bench_row> rows;
    if (*pcluster) {
      if (pb->count("--pairs") > 0) throw cli_error("--pairs does not apply to --cluster", 2);
      pc->model = pe->model;
      pc->tokenizer = pe->tokenizer;
      pc->steps = pe->steps;
      pc->repeat = pe->repeat;
      pc->deadline_s = pe->deadline_s;
      pc->keep = pe->keep;
      pc->pipeline = !*pnopipe;
      status = run_peers_cluster_bench(*pc, rows);
      const std::string j = print_rows(rows);
      if (!pjson->empty()) write_text(*pjson, j);
      return;
    }
    for (const char* f : {"--dllama", "--converter", "--config", "--nodes", "--out", "--reduce", "--no-pipeline",
                          "--caf-idle", "--sync"})
      if (pb->count(f) > 0) throw cli_error(std::string(f) + " needs --cluster", 2);
    status = run_peers_bench(*pe, rows);
    const std::string j = print_rows(rows);
    if (!pjson->empty()) write_text(*pjson, j);
  });

  auto fo = std::make_shared<prefill_bench_options>();
  auto fjson = std::make_shared<std::string>();
  auto* fb = bench->add_subcommand("prefill", "prompt tokens/s: prefill in chunks (matrix products) vs one "
                                   "position at a time, same engine, same run");
  fb->add_option("-m,--model", fo->model, "model (default: synth --config CONFIG -s 1 in memory)");
  fb->add_option("--config", fo->config, "synth preset when no -m")->capture_default_str();
  fb->add_option("--weights", fo->weights, "weight formats")->delimiter(',')->capture_default_str();
  fb->add_option("--kernels", fo->kernels, "backend")->capture_default_str();
  fb->add_option("--positions", fo->positions, "prompt positions")->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  fb->add_option("--batch-size", fo->batch_size, "positions per chunk")->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  fb->add_option("--threads", fo->threads, "kernel threads")->check(CLI::Range(1, 1024))->capture_default_str();
  fb->add_option("--repeat", fo->repeat, "rounds (median of per-round ratios)")->check(CLI::Range(1, 1000))
      ->capture_default_str();
  fb->add_flag("--cpu-time", fo->cpu_time, "time with the thread's CPU clock (with --threads 1; a shared machine)");
  fb->add_option("--json", *fjson, "rows as JSON to FILE (- = stdout)");
  fb->callback([fo, fjson, &status] {
    std::vector<bench_row> rows;
    status = run_prefill_bench(*fo, rows);
    const std::string j = print_rows(rows);
    if (!fjson->empty()) write_text(*fjson, j);
  });

  auto lo = std::make_shared<load_bench_options>();
  auto ljson = std::make_shared<std::string>();
  auto* lb = bench->add_subcommand("load", "bytes and time to open a model and place a slice, whole file vs slice; "
                                           "shipping a slice to a daemon cold and cached (issue #17)");
  lb->add_option("-m,--model", lo->models, "model file(s) (default: ../shared's stories260K.bin, "
                                           "llama2-small-f32.gguf and a synthetic stories15m)");
  lb->add_option("-z,--tokenizer", lo->tokenizer, "tokenizer of -m (default: the model itself, a GGUF)");
  lb->add_option("--stages", lo->stages, "pipeline stages the model is split into")->capture_default_str();
  lb->add_option("--stage", lo->stage, "the stage whose slice is loaded")->capture_default_str();
  lb->add_flag("--skip-ship", lo->skip_ship, "leave out the daemon shipping rows");
  lb->add_flag("--skip-synth", lo->skip_synth, "leave out the synthetic stories15m model");
  lb->add_option("--window", lo->window, "1 MiB chunks in flight when shipping a slice")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  lb->add_option("--baseline-window", lo->baseline_window, "chunks in flight of the shipping baseline (same run)")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  lb->add_option("--json", *ljson, "rows as JSON to FILE (- = stdout)");
  lb->callback([lo, ljson, &status] {
    std::vector<bench_row> rows;
    status = run_load_bench(*lo, rows);
    const std::string j = print_rows(rows);
    if (!ljson->empty()) write_text(*ljson, j);
  });

  auto co = std::make_shared<cluster_bench_options>();
  auto json = std::make_shared<std::string>();
  auto* cl = bench->add_subcommand("cluster", "per-token latency and communication share vs node count");
  cl->add_option("-m,--model", co->model, "model (default lookup as run)");
  cl->add_option("-z,--tokenizer", co->tokenizer, "tokenizer");
  cl->add_option("--nodes", co->nodes, "node counts")->delimiter(',')->capture_default_str();
  cl->add_option("-n,--steps", co->steps, "positions per run on the small model")->capture_default_str();
  cl->add_option("--large-steps", co->large_steps, "positions per run on synthetic stories110m")
      ->capture_default_str();
  cl->add_option("--reps", co->reps, "runs per point (median)")->capture_default_str();
  cl->add_flag("--skip-large", co->skip_large, "leave out the synthetic stories110m model");
  cl->add_option("--kernels", co->kernels, "kernel backend")->capture_default_str();
  cl->add_option("--caf-threads", co->caf_threads, "CAF scheduler threads")->capture_default_str();
  cl->add_option("--reduce", co->reduces, "all-reduce algorithms of the tensor rows: direct,scatter")
      ->delimiter(',')
      ->check(CLI::IsMember({"direct", "scatter"}))
      ->capture_default_str();
  cl->add_option("--large-config", co->large_config, "synth preset of the large model (stories15m|stories42m|stories110m)")
      ->capture_default_str();
  cl->add_flag("--moe", co->moe,
               "expert placements of a mixture of experts (-m, default moe-small-f32.gguf): tokens/s and bytes per "
               "token for expert:E with and without replicas, and the stall of a killed expert node");
  cl->add_option("--experts", co->experts, "expert nodes per stage for --moe")->delimiter(',')->capture_default_str();
  cl->add_flag("--overlap", co->overlap,
               "pipelines overlapping sessions (issue #19): aggregate tokens/s of N concurrent sessions against 1 "
               "(alternating rounds), in process and over local daemons, and each stage's busy share");
  cl->add_option("--sessions", co->sessions, "with --overlap: concurrent session counts (the first must be 1)")
      ->delimiter(',')
      ->capture_default_str();
  cl->add_option("--stages", co->stages, "with --overlap: pipeline stage counts")->delimiter(',')->capture_default_str();
  cl->add_option("--where", co->where, "with --overlap: inproc,daemons")
      ->delimiter(',')
      ->check(CLI::IsMember({"inproc", "daemons"}))
      ->capture_default_str();
  cl->add_option("--overlap-config", co->overlap_config, "with --overlap and no -m: synth preset (32000-token "
                 "vocabulary, with ../shared/models/tokenizer.bin)")
      ->capture_default_str();
  cl->add_option("--overlap-steps", co->overlap_steps, "with --overlap: positions per session")->capture_default_str();
  cl->add_option("--json", *json, "rows as JSON to FILE (- = stdout)");
  cl->callback([co, json, &status] {
    std::vector<bench_row> rows;
    status = run_cluster_bench(*co, rows);
    const std::string j = print_rows(rows);
    if (!json->empty()) write_text(*json, j);
  });
}

}  // namespace cellshard::tools
