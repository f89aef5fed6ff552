// `cellshard bench load` (issue #17): what it costs a node to get its slice.
//   load.open_place  time and bytes read to open a model and build one
//                    shard's weights (stage `--stage` of `--stages` pipeline
//                    stages), from the slice alone (the manifest's bytes,
//                    pread into the sparse image, verified in place:
//                    model::open_slice_file) against the whole
//                    file (mmap, the XXH64 of the whole file the fingerprint
//                    used to need, shard_weights::make) in the same run.
//                    Times are with the file in the page cache (both sides
//                    alike); the bytes are the point.
//   load.ship        a daemon (`cellshard node`, loopback) with an empty
//                    --models folder and a fresh --cache gets the slice from
//                    this process (cold: shipped; MB/s of the slice), then
//                    the same daemon restarted on the same cache (cached: 0
//                    bytes shipped), against a daemon that reads it from its
//                    own copy of the file (--models) in the same run. Time
//                    is the daemon's, spawn arrival to the shard's weights
//                    built (shard_spawned::reload_ns).
//   load.ship_transfer  the transfer alone of the cold shipment (the
//                    daemon's "need" answer to its last chunk stored,
//                    shard_spawned::ship_ns) with `--window` chunks in
//                    flight, against a fresh daemon shipped the same slice
//                    with `--baseline-window` chunks in flight (default 1:
//                    one round trip per chunk) in the same run.
// Models: --model (repeatable), default ../shared's stories260K.bin and
// llama2-small-f32.gguf plus a synthetic stories15m .bin (60 MB) written to
// a temporary folder, so the figures are not all noise.
#include "actors/host.hpp"
#include "actors/local_daemons.hpp"
#include "actors/messages.hpp"
#include "actors/remote.hpp"
#include "model/manifest.hpp"
#include "model/synth.hpp"
#include "model/tokenizer.hpp"
#include "model/transformer.hpp"
#include "tools/bench.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sys/stat.h>
#include <unistd.h>

namespace cellshard::tools {

namespace {

using clk = std::chrono::steady_clock;

double ms_since(clk::time_point t) { return std::chrono::duration<double, std::milli>(clk::now() - t).count(); }

std::string base_name(const std::string& p) {
  const auto s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

/// Stage `stage` of `stages` equal layer ranges (the last takes the rest).
model::slice_spec stage_spec(const model::config& c, int stage, int stages) {
  auto s = model::slice_spec::whole(c);
  const int per = std::max(1, c.n_layers / stages);
  s.layer_begin = std::min(c.n_layers - 1, stage * per);
  s.layer_end = stage == stages - 1 ? c.n_layers : std::min(c.n_layers, s.layer_begin + per);
  s.embedding = stage == 0;
  s.classifier = stage == stages - 1;
  return s;
}

void open_place_rows(const std::string& path, const load_bench_options& o, std::vector<bench_row>& rows) {
  // The whole file: open (mmap), digest all of it, build the slice.
  auto t0 = clk::now();
  auto whole = model::model_file::open(path);
  if (!whole) throw cli_error("bench load: " + whole.message());
  const uint64_t d = (*whole)->digest();
  const auto spec = stage_spec((*whole)->cfg(), std::min(o.stage, o.stages - 1), o.stages);
  auto w = model::shard_weights::make(*whole, spec);
  if (!w) throw cli_error("bench load: " + w.message());
  const double whole_ms = ms_since(t0);
  const uint64_t whole_bytes = (*whole)->file_bytes();
  (void)d;
  // The front end's manifest of that slice (not timed: the front end's work).
  auto m = model::make_manifest(**whole, spec, base_name(path));
  if (!m) throw cli_error("bench load: " + m.message());
  // The slice alone, as a daemon reads it from --models: pread its ranges
  // into the sparse image, verify in place, build.
  t0 = clk::now();
  uint64_t read = 0;
  auto part = model::open_slice_file(*m, path, path, {}, &read);
  if (!part) throw cli_error("bench load: " + part.message());
  auto w2 = model::shard_weights::make(*part, spec);
  if (!w2) throw cli_error("bench load: " + w2.message());
  const double slice_ms = ms_since(t0);
  const std::map<std::string, std::string> params = {
      {"model", base_name(path)}, {"slice", "stage " + std::to_string(o.stage) + "/" + std::to_string(o.stages)}};
  auto row = [&](const std::string& name, double v, double base, const std::string& unit, const std::string& bn) {
    bench_row r;
    r.name = name;
    r.params = params;
    r.value = v;
    r.unit = unit;
    r.baseline = base;
    r.baseline_name = bn;
    r.ratio = base > 0 ? v / base : 0;
    rows.push_back(r);
  };
  row("load.bytes_read", static_cast<double>(read), static_cast<double>(whole_bytes), "bytes", "whole file");
  row("load.open_place", slice_ms, whole_ms, "ms", "whole file (mmap + XXH64 + make)");
}

/// One spawn of `spec` on a single daemon through remote_host; the daemon's figures.
actors::weight_load spawn_once(const std::vector<actors::remote_node>& nodes, const model::model_file& file,
                               const model::tokenizer& tok, const model::slice_spec& spec, int window) {
  actors::remote_options ro;
  ro.ship_window = window;
  auto host = std::make_shared<actors::remote_host>(nodes, ro);
  caf::actor_system_config cfg;
  actors::register_messages(cfg);
  if (auto r = host->configure(cfg); !r) throw cli_error("bench load: " + r.message());
  caf::actor_system sys{cfg};
  if (auto r = host->connect(sys, file, tok); !r) throw cli_error("bench load: " + r.message());
  topologies::shard placed;
  placed.index = 0;
  placed.node = 0;
  placed.layers = {spec.layer_begin, spec.layer_end};
  actors::shard_request req;
  req.placed = &placed;
  req.spec = spec;
  auto a = host->spawn(sys, req);
  if (!a) throw cli_error("bench load: " + a.message());
  caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
  auto loads = host->weight_loads();
  host->shutdown(sys);
  if (loads.empty()) throw cli_error("bench load: the spawn reported no weight figures");
  return loads.back();
}

void ship_rows(const std::string& path, const std::string& tok_path, const load_bench_options& o,
               std::vector<bench_row>& rows) {
  auto file = model::model_file::open(path);
  if (!file) throw cli_error("bench load: " + file.message());
  auto tok = model::tokenizer::open(tok_path);
  if (!tok) throw cli_error("bench load: " + tok.message());
  const auto spec = stage_spec((*file)->cfg(), std::min(o.stage, o.stages - 1), o.stages);
  char tmpl[] = "/tmp/cellshard-bench-load-XXXXXX";
  if (!::mkdtemp(tmpl)) throw cli_error("bench load: cannot make a temporary folder");
  const std::string dir = tmpl;
  const std::string empty = dir + "/empty", cache = dir + "/cache", models = dir + "/models";
  for (const auto& d : {empty, models})
    if (::mkdir(d.c_str(), 0700) != 0) throw cli_error("bench load: cannot make " + d);
  // --models copy: a symbolic link to the file under its name.
  if (::symlink(path.c_str(), (models + "/" + base_name(path)).c_str()) != 0)
    throw cli_error("bench load: cannot link the model into " + models);
  struct cleanup {
    std::string dir;
    ~cleanup() {
      const std::string cmd = "rm -rf '" + dir + "'";
      if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "bench load: could not remove %s\n", dir.c_str());
    }
  } rm{dir};
  actors::local_daemon_options lo;
  lo.models_dir = empty;
  lo.extra_args = {"--cache", cache};
  auto shipping = actors::local_daemons::start(1, 0, lo);
  if (!shipping) throw cli_error("bench load: " + shipping.message());
  const auto cold = spawn_once((*shipping)->entries(), **file, **tok, spec, o.window);
  if (auto r = (*shipping)->restart(0); !r) throw cli_error("bench load: " + r.message());
  const auto cached = spawn_once((*shipping)->entries(), **file, **tok, spec, o.window);
  actors::local_daemon_options lm;
  lm.models_dir = models;
  auto reading = actors::local_daemons::start(1, 0, lm);
  if (!reading) throw cli_error("bench load: " + reading.message());
  const auto local = spawn_once((*reading)->entries(), **file, **tok, spec, o.window);
  // The transfer's baseline: a fresh daemon and cache, --baseline-window chunks in flight.
  actors::local_daemon_options lb = lo;
  lb.extra_args = {"--cache", dir + "/cache-baseline"};
  auto base_daemon = actors::local_daemons::start(1, 0, lb);
  if (!base_daemon) throw cli_error("bench load: " + base_daemon.message());
  const auto base = spawn_once((*base_daemon)->entries(), **file, **tok, spec, o.baseline_window);
  const std::map<std::string, std::string> params = {
      {"model", base_name(path)}, {"slice", "stage " + std::to_string(o.stage) + "/" + std::to_string(o.stages)}};
  auto row = [&](const std::string& name, const actors::weight_load& w, const std::string& extra) {
    bench_row r;
    r.name = name;
    r.params = params;
    r.params["source"] = w.source;
    r.params["shipped_bytes"] = std::to_string(w.shipped_bytes);
    if (!extra.empty()) r.params["note"] = extra;
    r.value = w.reload_ms;
    r.unit = "ms";
    r.baseline = local.reload_ms;
    r.baseline_name = "slice read from its --models copy";
    r.ratio = local.reload_ms > 0 ? w.reload_ms / local.reload_ms : 0;
    rows.push_back(r);
  };
  const double mb = cold.shipped_bytes / 1e6;
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.1f MB/s, %.2f ms/MB", cold.reload_ms > 0 ? mb / (cold.reload_ms / 1e3) : 0,
                mb > 0 ? cold.reload_ms / mb : 0);
  row("load.ship_cold", cold, rate);
  row("load.ship_cached", cached, "");
  {
    auto mbps = [&](const actors::weight_load& w) { return w.ship_ms > 0 ? w.shipped_bytes / 1e6 / (w.ship_ms / 1e3) : 0.0; };
    bench_row r;
    r.name = "load.ship_transfer";
    r.params = params;
    r.params["window"] = std::to_string(o.window);
    r.params["shipped_bytes"] = std::to_string(cold.shipped_bytes);
    char note[96];
    std::snprintf(note, sizeof note, "%.1f MB/s, baseline %.1f MB/s", mbps(cold), mbps(base));
    r.params["note"] = note;
    r.value = cold.ship_ms;
    r.unit = "ms";
    r.baseline = base.ship_ms;
    r.baseline_name = "window " + std::to_string(o.baseline_window) + " (fresh daemon, same slice)";
    r.ratio = base.ship_ms > 0 ? cold.ship_ms / base.ship_ms : 0;
    rows.push_back(r);
  }
}

/// ../shared (or ../../shared, /work/shared) when it holds the models, else "".
std::string find_shared_dir() {
  for (const char* c : {"../shared", "../../shared", "/work/shared"})
    if (::access((std::string(c) + "/models/stories260K.bin").c_str(), R_OK) == 0) return c;
  return "";
}

}  // namespace

int run_load_bench(const load_bench_options& o, std::vector<bench_row>& rows) {
  if (o.stages < 1 || o.stage < 0 || o.stage >= o.stages)
    throw cli_error("bench load: --stage must be in [0, --stages)", 2);
  std::vector<std::pair<std::string, std::string>> models;  // model, tokenizer
  for (const auto& m : o.models) models.push_back({m, o.tokenizer.empty() ? m : o.tokenizer});
  std::string synth_dir;
  if (models.empty()) {
    const std::string shared = find_shared_dir();
    if (!shared.empty()) {
      models.push_back({shared + "/models/stories260K.bin", shared + "/models/tok512.bin"});
      models.push_back({shared + "/models/gguf/llama2-small-f32.gguf", shared + "/models/gguf/llama2-small-f32.gguf"});
    }
    if (!o.skip_synth) {
      auto c = model::synth_preset("stories15m");
      if (!c) throw cli_error("bench load: " + c.message());
      char tmpl[] = "/tmp/cellshard-bench-synth-XXXXXX";
      if (!::mkdtemp(tmpl)) throw cli_error("bench load: cannot make a temporary folder");
      synth_dir = tmpl;
      const std::string p = synth_dir + "/stories15m-synth.bin";
      if (auto r = model::synth_file(*c, 1, p); !r) throw cli_error("bench load: " + r.message());
      if (!shared.empty()) models.push_back({p, shared + "/models/tokenizer.bin"});
    }
  }
  if (models.empty()) throw cli_error("bench load: no model (give -m FILE, or have ../shared)");
  for (const auto& m : models) {
    std::fprintf(stderr, "bench load: %s\n", m.first.c_str());
    open_place_rows(m.first, o, rows);
    if (!o.skip_ship) ship_rows(m.first, m.second, o, rows);
  }
  if (!synth_dir.empty()) {
    const std::string cmd = "rm -rf '" + synth_dir + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "bench load: could not remove %s\n", synth_dir.c_str());
  }
  return 0;
}

}  // namespace cellshard::tools
