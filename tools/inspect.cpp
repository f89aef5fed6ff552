// `cellshard inspect MODEL`: what a model file holds and whether it fits a set
// of nodes. Format, architecture, shapes, tensor types and sizes, tokenizer
// kind, the file digest (XXH64 of the whole file, model::format_digest), and
// the memory each node needs for --nodes/--topology/--profile (topologies/
// placement). Works on llama2.c .bin, CSQ8 q8_0 files, GGUF and
// vocabulary-only GGUF files (no placement then).
#include "model/bundle.hpp"
#include "model/checkpoint.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "topologies/placement.hpp"
#include "topologies/profile.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cstdio>
#include <fstream>
#include <map>

namespace cellshard::tools {

namespace {

struct inspect_opts {
  std::string model, tokenizer, json, topology = "pipeline", profile = "host", memory;
  int nodes = 1;
};

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  return buf;
}

uint64_t file_digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw cli_error(path + ": cannot read");
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), buf.size());
    if (in.gcount() > 0) XXH64_update(st, buf.data(), static_cast<size_t>(in.gcount()));
  }
  const uint64_t d = XXH64_digest(st);
  XXH64_freeState(st);
  return d;
}

nlohmann::json config_json(const model::config& c) {
  return {{"dim", c.dim},           {"hidden_dim", c.hidden_dim}, {"n_layers", c.n_layers},
          {"n_heads", c.n_heads},   {"n_kv_heads", c.n_kv_heads}, {"vocab_size", c.vocab_size},
          {"seq_len", c.seq_len},   {"shared_classifier", c.shared_classifier},
          {"params", c.total_params()}, {"experts", c.n_experts},
          {"experts_used", c.n_experts_used}, {"shared_expert_hidden", c.shared_hidden},
          {"active_params", c.total_params() - c.layer_params() * c.n_layers +
                                c.active_layer_params() * c.n_layers}};
}

int do_inspect(const inspect_opts& o) {
  // Usage checks first, before the file is read. The bound is run's in-process
  // limit: a placement of 10^8 nodes ran for minutes (`plan` simulates such clusters).
  constexpr int max_nodes = 100000;
  if (o.nodes < 1 || o.nodes > max_nodes)
    throw cli_error("--nodes: got " + std::to_string(o.nodes) + ", expected 1 to " + std::to_string(max_nodes) +
                        " nodes (`plan` simulates larger clusters)",
                    2);
  nlohmann::json j;
  j["file"] = o.model;
  const bool gguf = model::is_gguf_path(o.model);
  std::shared_ptr<const model::tokenizer> tok;
  std::shared_ptr<const model::model_file> mf;
  std::string weights = "f32";
  if (gguf) {
    auto f = model::gguf::file::open(o.model);
    if (!f) throw cli_error(f.message());
    const auto& g = **f;
    j["format"] = "GGUF v" + std::to_string(g.version());
    j["architecture"] = g.has("general.architecture") ? *g.get_string("general.architecture") : std::string("none");
    if (g.has("general.name")) {
      auto n = g.get_string("general.name");
      if (n) j["name"] = *n;
    }
    nlohmann::json tensors = nlohmann::json::array();
    std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // type -> (count, bytes)
    for (const auto& t : g.tensors()) {
      const std::string ty = model::gguf::ggml_type_name(t.type);
      tensors.push_back({{"name", t.name}, {"type", ty}, {"shape", t.ne}, {"bytes", t.bytes}});
      by_type[ty].first += 1;
      by_type[ty].second += t.bytes;
    }
    j["tensors"] = tensors;
    nlohmann::json types = nlohmann::json::object();
    for (const auto& [ty, cb] : by_type) types[ty] = {{"tensors", cb.first}, {"bytes", cb.second}};
    j["tensor_types"] = types;
    if (g.has("tokenizer.ggml.model")) {
      auto t = model::tokenizer::from_gguf(g);
      if (!t) throw cli_error(t.message());
      tok = *t;
    }
    if (!g.tensors().empty()) {
      auto m = model::model_file::open(o.model);
      if (!m) throw cli_error(m.message());
      mf = *m;
    }
  } else {
    auto m = model::model_file::open(o.model);
    if (!m) throw cli_error(m.message());
    mf = *m;
    weights = mf->quantized() ? "q8_0" : "f32";
    j["format"] = mf->quantized() ? "CSQ8 (cellshard q8_0)" : "llama2.c version 0 (f32)";
    j["architecture"] = "llama";
    const auto& c = mf->cfg();
    const uint64_t d = c.dim, h = c.hidden_dim, kv = c.kv_dim(), v = c.vocab_size;
    nlohmann::json tensors = nlohmann::json::array();
    auto row_bytes = [&](uint64_t cols) {
      return mf->quantized() ? (cols + 31) / 32 * 34 : cols * 4;
    };
    auto add = [&](const std::string& name, uint64_t rows, uint64_t cols, bool matrix) {
      const bool q = matrix && mf->quantized();
      tensors.push_back({{"name", name},
                         {"type", q ? "Q8_0" : "F32"},
                         {"shape", matrix ? std::vector<uint64_t>{cols, rows} : std::vector<uint64_t>{cols}},
                         {"bytes", matrix ? rows * row_bytes(cols) : cols * 4}});
    };
    add("token_embd", v, d, true);
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      add(p + "attn_norm", 1, d, false);
      add(p + "attn_q", d, d, true);
      add(p + "attn_k", kv, d, true);
      add(p + "attn_v", kv, d, true);
      add(p + "attn_output", d, d, true);
      add(p + "ffn_norm", 1, d, false);
      add(p + "ffn_gate", h, d, true);
      add(p + "ffn_down", d, h, true);
      add(p + "ffn_up", h, d, true);
    }
    add("output_norm", 1, d, false);
    if (!c.shared_classifier) add("output", v, d, true);
    j["tensors"] = tensors;
    std::string tp = o.tokenizer;
    if (tp.empty()) {
      const auto slash = o.model.rfind('/');
      tp = (slash == std::string::npos ? std::string(".") : o.model.substr(0, slash)) + "/tokenizer.bin";
      if (!std::ifstream(tp).good()) tp.clear();
    }
    if (!tp.empty()) {
      auto t = model::tokenizer::open(tp);
      if (!t) throw cli_error(t.message());
      tok = *t;
    }
  }
  if (!o.tokenizer.empty() && gguf) {
    auto t = model::tokenizer::open(o.tokenizer);
    if (!t) throw cli_error(t.message());
    tok = *t;
  }
  j["digest"] = model::format_digest(mf ? mf->digest() : file_digest(o.model));
  if (tok) {
    j["tokenizer"] = {{"kind", tok->kind_name()},
                      {"file", tok->name()},
                      {"vocab_size", tok->vocab_size()},
                      {"bos", tok->bos()},
                      {"eos", tok->eos()},
                      {"adds_bos", tok->adds_bos()},
                      {"stop_ids", tok->stop_ids()},
                      {"digest", model::format_digest(tok->digest())}};
  } else {
    j["tokenizer"] = nullptr;
  }
  if (mf) {
    j["config"] = config_json(mf->cfg());
    auto prof = topologies::find_profile(o.profile);
    if (!prof) throw cli_error("--profile: " + prof.message(), 2);
    topologies::profile p = *prof;
    if (!o.memory.empty()) {
      auto m = topologies::parse_memory(o.memory);
      if (!m) throw cli_error("--memory: " + m.message(), 2);
      p.memory_bytes = *m;
    }
    auto strat = topologies::parse_strategy(o.topology);
    if (!strat) throw cli_error(strat.message(), 2);  // it names --topology
    topologies::placement_options po;
    po.check_memory = false;
    auto wf = topologies::find_weight_format(weights);
    if (!wf) throw cli_error(wf.message());
    po.weights = topologies::weight_format_of(*mf, *wf);
    weights = po.weights.name;  // "gguf": each matrix as stored in the file
    auto plan = topologies::place(mf->cfg(), topologies::make_nodes(o.nodes, p), *strat, po);
    if (!plan) throw cli_error(plan.message(), 2);
    nlohmann::json nodes = nlohmann::json::array();
    for (const auto& s : plan->shards)
      nodes.push_back({{"node", s.node},
                       {"stage", s.stage},
                       {"rank", s.rank},
                       {"layers", {s.layers.begin, s.layers.end}},
                       {"memory_bytes", s.memory.total()},
                       {"weights_bytes", s.memory.weights},
                       {"kv_cache_bytes", s.memory.kv_cache},
                       {"buffers_bytes", s.memory.buffers},
                       {"budget_bytes", s.budget_bytes},
                       {"fits", s.fits()}});
    j["placement"] = {{"nodes", o.nodes},
                      {"topology", topologies::to_string(plan->strat)},
                      {"profile", p.name},
                      {"weights", weights},
                      {"context", plan->options.context},
                      {"per_node", nodes},
                      {"fits", plan->fits()}};
  } else {
    j["config"] = nullptr;
    j["placement"] = nullptr;
  }

  // Human-readable summary: on stderr when the JSON goes to stdout (--json -).
  std::FILE* out = o.json == "-" ? stderr : stdout;
  std::fprintf(out, "file: %s\nformat: %s\narchitecture: %s\ndigest: %s\n", o.model.c_str(),
              j["format"].get<std::string>().c_str(), j["architecture"].get<std::string>().c_str(),
              j["digest"].get<std::string>().c_str());
  if (mf) {
    const auto& c = mf->cfg();
    std::fprintf(out, "shape: dim %d, hidden %d, %d layers, %d heads, %d kv heads, vocab %d, context %d, %s classifier, "
                "%llu parameters\n",
                c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len,
                c.shared_classifier ? "shared" : "separate", static_cast<unsigned long long>(c.total_params()));
    if (c.moe())
      std::fprintf(out, "experts: %d per layer, %d used per token, expert hidden %d%s%s, %llu active parameters\n",
                  c.n_experts, c.n_experts_used, c.hidden_dim,
                  c.shared_hidden ? (", shared expert hidden " + std::to_string(c.shared_hidden)).c_str() : "",
                  c.norm_topk ? ", top-k weights renormalised" : ", top-k weights not renormalised",
                  static_cast<unsigned long long>(j["config"]["active_params"].get<uint64_t>()));
  } else {
    std::fprintf(out, "shape: none (no tensors: a vocabulary-only file)\n");
  }
  uint64_t total = 0;
  std::map<std::string, std::pair<int, uint64_t>> types;
  for (const auto& t : j["tensors"]) {
    total += t["bytes"].get<uint64_t>();
    auto& e = types[t["type"].get<std::string>()];
    e.first += 1;
    e.second += t["bytes"].get<uint64_t>();
  }
  std::fprintf(out, "tensors: %zu, %s", j["tensors"].size(), mib(total).c_str());
  for (const auto& [ty, e] : types) std::fprintf(out, "; %s: %d (%s)", ty.c_str(), e.first, mib(e.second).c_str());
  std::fprintf(out, "\n");
  for (const auto& t : j["tensors"]) {
    std::string shape;
    for (const auto& n : t["shape"]) shape += (shape.empty() ? "" : ", ") + std::to_string(n.get<uint64_t>());
    std::fprintf(out, "  %-28s %-6s [%s] %llu bytes\n", t["name"].get<std::string>().c_str(),
                t["type"].get<std::string>().c_str(), shape.c_str(),
                static_cast<unsigned long long>(t["bytes"].get<uint64_t>()));
  }
  if (tok)
    std::fprintf(out, "tokenizer: %s, %d tokens, BOS %d%s, EOS %d (%s)\n", tok->kind_name().c_str(), tok->vocab_size(),
                tok->bos(), tok->adds_bos() ? " (added)" : "", tok->eos(), tok->name().c_str());
  else
    std::fprintf(out, "tokenizer: none found (give -z)\n");
  if (mf) {
    const auto& pl = j["placement"];
    std::fprintf(out, "memory on %d %s node(s), %s, %s weights, context %d:\n", o.nodes, pl["profile"].get<std::string>().c_str(),
                pl["topology"].get<std::string>().c_str(), weights.c_str(), pl["context"].get<int>());
    for (const auto& n : pl["per_node"])
      std::fprintf(out, "  node %d (stage %d rank %d, layers [%d,%d)): %s of %s: %s\n", n["node"].get<int>(),
                  n["stage"].get<int>(), n["rank"].get<int>(), n["layers"][0].get<int>(), n["layers"][1].get<int>(),
                  mib(n["memory_bytes"].get<uint64_t>()).c_str(), mib(n["budget_bytes"].get<uint64_t>()).c_str(),
                  n["fits"].get<bool>() ? "fits" : "DOES NOT FIT");
    std::fprintf(out, "fits: %s\n", pl["fits"].get<bool>() ? "yes" : "no");
  }
  if (!o.json.empty()) write_text(o.json, j.dump(2) + "\n");
  return 0;
}

}  // namespace

void add_inspect(CLI::App& app, int& status) {
  auto o = std::make_shared<inspect_opts>();
  auto* cmd = app.add_subcommand("inspect", "what a model file holds and whether it fits the nodes");
  cmd->add_option("model", o->model, "model file: llama2.c .bin, CSQ8 q8_0, GGUF (vocabulary-only too)")->required();
  cmd->add_option("-z,--tokenizer", o->tokenizer, "tokenizer (default: the GGUF's own, or tokenizer.bin beside a .bin)");
  cmd->add_option("--nodes", o->nodes, "nodes to place the model on (1 to 100000)")->capture_default_str();
  cmd->add_option("--topology", o->topology, "pipeline|tensor|hybrid:PxT")->capture_default_str();
  cmd->add_option("--profile", o->profile, "node profile: host|ps3|ps3-slim|rpi5")->capture_default_str();
  cmd->add_option("--memory", o->memory, "per-node memory budget, e.g. 256MiB (overrides the profile)");
  cmd->add_option("--json", o->json, "machine-readable result to FILE (- = stdout)");
  cmd->callback([o, &status] { status = do_inspect(*o); });
}

}  // namespace cellshard::tools
