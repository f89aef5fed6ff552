// `cellshard run`: generate text. Text streams to stdout exactly as llama2.c's
// run.c prints it; "achieved tok/s" goes to stderr.
#include "actors/cluster.hpp"
#include "kernels/backend.hpp"
#include "model/generate.hpp"
#include "model/transformer.hpp"
#include "topologies/placement.hpp"
#include "topologies/profile.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

namespace cellshard::tools {

namespace {

struct run_opts {
  std::string model, tokenizer, prompt, kernels = "blas", weights = "f32";
  int steps = 256;
  float temperature = 1.0f, topp = 0.9f;
  unsigned long long seed = 0;
  std::string ids_out, expect_ids, json_out;
  int blas_threads = 1;
  bool quiet = false;
  // In-process nodes (issue #4): any of these selects the actor runtime.
  int nodes = 1, spares = 0, caf_threads = 2;
  std::string topology = "pipeline", profile = "host", memory;
  bool print_placement = false;
  bool use_cluster = false;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = q * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(idx)), hi = static_cast<size_t>(std::ceil(idx));
  return v[lo] + (v[hi] - v[lo]) * (idx - lo);
}

int do_run(const run_opts& o) {
  const kernels::backend* be = kernels::find_backend(o.kernels);
  if (!be) {
    std::string names;
    for (auto& n : kernels::backend_names()) names += (names.empty() ? "" : ", ") + n;
    throw cli_error("--kernels: unknown backend '" + o.kernels + "', expected one of " + names, 2);
  }
  auto fmt = model::parse_weight_format(o.weights);
  if (!fmt) throw cli_error(fmt.message(), 2);
  kernels::set_blas_threads(o.blas_threads);

  // Read --expect-ids before the long part, so a bad file fails fast.
  std::vector<int> expected;
  if (!o.expect_ids.empty()) {
    auto e = model::parse_ids(read_text(o.expect_ids), o.expect_ids);
    if (!e) throw cli_error(e.message());
    expected = *e;
  }
  loaded_model lm = load_model(o.model, o.tokenizer);
  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  model::generation_params gp;
  gp.prompt = o.prompt;
  gp.steps = o.steps;
  gp.sampling = {o.temperature, o.topp, o.seed};
  gp = model::normalise(gp, lm.file->cfg().seq_len);

  auto print_piece = [&](const std::string& piece) {
    if (o.quiet) return;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  nlohmann::json nodes_json = nlohmann::json::array(), links_json = nlohmann::json::array();
  double comm_share = 0.0;
  result<model::generation_result> res = make_error("not run");
  if (!o.use_cluster) {
    auto w = model::shard_weights::make(lm.file, model::slice_spec::whole(lm.file->cfg()), *fmt);
    if (!w) throw cli_error(w.message());
    model::engine eng(*w, *be);
    res = model::generate(
        [&](int token, int pos) -> result<const float*> { return eng.forward(token, pos); },
        *lm.tok, lm.file->cfg().vocab_size, gp,
        [&](int, const std::string& piece) { print_piece(piece); });
    if (res)
      nodes_json.push_back({{"index", 0},
                            {"role", "whole model"},
                            {"memory_bytes", (*w)->bytes() + lm.file->cfg().kv_cache_bytes(lm.file->cfg().seq_len)},
                            {"compute_ms", res->duration_ms},
                            {"bytes_sent", 0},
                            {"bytes_received", 0}});
  } else {
    actors::cluster_options co;
    co.file = lm.file;
    co.tok = lm.tok;
    co.nodes = o.nodes;
    co.spares = o.spares;
    co.topology = o.topology;
    co.profile = o.profile;
    if (!o.memory.empty()) {
      auto m = topologies::parse_memory(o.memory);
      if (!m) throw cli_error("--memory: " + m.message(), 2);
      co.memory = *m;
    }
    co.kernels = o.kernels;
    co.weights = o.weights;
    co.caf_threads = o.caf_threads;
    co.blas_threads = o.blas_threads;
    auto c = actors::cluster::start(co);
    if (!c) throw cli_error(c.message());
    if (o.print_placement) std::fprintf(stderr, "%s", topologies::to_string((*c)->placement()).c_str());
    auto out = (*c)->generate(gp, [&](uint64_t, int, const std::string& piece) { print_piece(piece); });
    if (!out) throw cli_error(out.message());
    if (!out->ok) {
      // The tokens so far are printed already; finish the line, then the error.
      if (!o.quiet) std::fputs("\n", stdout);
      if (!o.ids_out.empty()) write_text(o.ids_out, model::format_ids(out->result.ids));
      throw cli_error(out->error);
    }
    res = out->result;
    comm_share = out->result.duration_ms > 0
                     ? std::max(0.0, 1.0 - out->compute_ms / out->result.duration_ms)
                     : 0.0;
    auto st = (*c)->stats();
    if (!st) throw cli_error(st.message());
    const auto mem = (*c)->node_memory();
    const auto& plan = (*c)->placement();
    std::map<int, nlohmann::json> by_node;
    for (const auto& s : *st) {
      const auto& sh = plan.shards[s.index];
      auto& n = by_node[s.node];
      if (n.is_null())
        n = {{"index", s.node}, {"role", ""}, {"memory_bytes", mem[s.node]}, {"compute_ms", 0.0},
             {"bytes_sent", 0}, {"bytes_received", 0}};
      std::string role = "stage " + std::to_string(sh.stage) +
                         (sh.group_size > 1 ? " rank " + std::to_string(sh.rank) : "");
      n["role"] = n["role"].get<std::string>().empty() ? role : n["role"].get<std::string>() + ", " + role;
      n["compute_ms"] = n["compute_ms"].get<double>() + s.compute_ns / 1e6;
      n["bytes_sent"] = n["bytes_sent"].get<uint64_t>() + s.bytes_sent;
      n["bytes_received"] = n["bytes_received"].get<uint64_t>() + s.bytes_received;
      const int tokens = std::max<int>(1, static_cast<int>(out->result.ids.size()) - 1);
      for (size_t i = 0; i < s.link_to.size(); ++i)
        links_json.push_back({{"from", s.node},
                              {"to", s.link_to[i] < 0 ? nlohmann::json("front end") : nlohmann::json(s.link_to[i])},
                              {"bandwidth_bps", nullptr},
                              {"latency_us", nullptr},
                              {"bytes", s.link_bytes[i]},
                              {"bytes_per_token", static_cast<double>(s.link_bytes[i]) / tokens}});
    }
    for (const auto& sp : plan.spares)
      by_node[sp.node] = {{"index", sp.node}, {"role", "spare"}, {"memory_bytes", mem[sp.node]},
                          {"compute_ms", 0.0}, {"bytes_sent", 0}, {"bytes_received", 0}};
    for (auto& kv : by_node) nodes_json.push_back(kv.second);
  }
  if (!res) throw cli_error(res.message());
  if (!o.quiet) {
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }
  if (res->ids.size() > 2)
    std::fprintf(stderr, "achieved tok/s: %f\n", res->tokens_per_s);

  if (!o.ids_out.empty()) write_text(o.ids_out, model::format_ids(res->ids));

  int status = 0;
  bool diverged = false;
  if (!o.expect_ids.empty()) {
    const auto& got = res->ids;
    size_t i = 0;
    while (i < got.size() && i < expected.size() && got[i] == expected[i]) ++i;
    if (i < got.size() || i < expected.size()) {
      diverged = true;
      status = 3;
      std::string g = i < got.size() ? std::to_string(got[i]) : "end of output";
      std::string e = i < expected.size() ? std::to_string(expected[i]) : "end of expected ids";
      std::fprintf(stderr, "ids differ from %s at position %zu: got %s, expected %s\n",
                   o.expect_ids.c_str(), i, g.c_str(), e.c_str());
    }
  }

  if (!o.json_out.empty()) {
    nlohmann::json j;
    j["model"] = lm.description;
    j["kernels"] = be->name;
    j["weights"] = model::to_string(*fmt);
    j["ttft_ms"] = res->ttft_ms;
    j["tpot_ms_p50"] = percentile(res->step_ms, 0.5);
    j["tpot_ms_p99"] = percentile(res->step_ms, 0.99);
    j["tokens_per_s"] = res->tokens_per_s;
    j["comm_share"] = comm_share;
    j["tokens"] = static_cast<int>(res->ids.size()) - 1;
    j["duration_ms"] = res->duration_ms;
    j["nodes"] = nodes_json;
    j["links"] = links_json;
    j["faults"] = nlohmann::json::array();
    j["ids"] = res->ids;
    if (!o.expect_ids.empty()) j["diverged"] = diverged;
    write_text(o.json_out, j.dump(2) + "\n");
  }
  return status;
}

}  // namespace

void add_run(CLI::App& app, int& status) {
  auto o = std::make_shared<run_opts>();
  auto* cmd = app.add_subcommand("run", "generate text (llama2.c run semantics)");
  cmd->add_option("-m,--model", o->model,
                  "model file (llama2.c .bin); without it the default model lookup of CLI.md");
  cmd->add_option("-z,--tokenizer", o->tokenizer, "tokenizer (default: tokenizer.bin beside the model)");
  cmd->add_option("-i,--prompt", o->prompt, "prompt");
  cmd->add_option("-n,--steps", o->steps, "forward passes, prompt included (0 = seq_len)")
      ->capture_default_str();
  cmd->add_option("-t,--temperature", o->temperature, "0 = greedy argmax")->capture_default_str();
  cmd->add_option("-p,--topp", o->topp, "top-p (nucleus) threshold; <=0 or >=1 samples the full "
                  "distribution")->capture_default_str();
  cmd->add_option("-s,--seed", o->seed, "RNG seed (0 = from the clock)");
  cmd->add_option("--kernels", o->kernels, "kernel backend: reference|blas|spe")->capture_default_str();
  cmd->add_option("--weights", o->weights, "f32|q8_0 (q8_0 quantizes at load time)")
      ->capture_default_str();
  cmd->add_option("--blas-threads", o->blas_threads, "OpenBLAS threads (0 = OpenBLAS default)")
      ->capture_default_str();
  cmd->add_option("--ids-out", o->ids_out, "write the token ids (BOS first) to FILE");
  cmd->add_option("--expect-ids", o->expect_ids,
                  "compare the ids with FILE; on a difference exit 3 naming the position");
  cmd->add_option("--json,--metrics-out", o->json_out, "machine-readable result to FILE (- = stdout)");
  cmd->add_flag("-q,--quiet", o->quiet, "do not print the generated text");
  // In-process nodes: any of these runs the model on the actor runtime.
  auto* g = "Nodes (in process)";
  std::vector<CLI::Option*> cluster_flags = {
      cmd->add_option("--nodes", o->nodes, "in-process nodes")->group(g),
      cmd->add_option("--spares", o->spares, "extra nodes held as spares")->group(g),
      cmd->add_option("--topology", o->topology, "pipeline|tensor|hybrid:PxT")->group(g),
      cmd->add_option("--profile", o->profile, "node profile: host|ps3|ps3-slim|rpi5")->group(g),
      cmd->add_option("--memory", o->memory, "per-node memory budget, e.g. 256MiB (overrides the profile)")
          ->group(g),
      cmd->add_flag("--print-placement", o->print_placement,
                    "print the placement (placement indices, roles, memory) to stderr")->group(g),
      cmd->add_option("--caf-threads", o->caf_threads, "CAF scheduler threads")->group(g)};
  cmd->callback([o, cmd, cluster_flags, &status] {
    for (auto* f : cluster_flags)
      if (f->count() > 0) o->use_cluster = true;
    (void)cmd;
    status = do_run(*o);
  });
}

}  // namespace cellshard::tools
