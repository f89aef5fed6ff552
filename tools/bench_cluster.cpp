// `cellshard bench cluster`: per-token latency and communication share of the
// in-process runtime at 1, 2, 4, 8 nodes, pipeline and tensor, on stories260K
// and a synthetic stories110m; and the raw-blob payload encoding's throughput
// against CAF's default encoding of a float vector. Every row is a ratio
// against a baseline measured in the same run (1 node; CAF's encoding).
#include "actors/cluster.hpp"
#include "actors/messages.hpp"
#include "model/synth.hpp"
#include "base/percentile.hpp"
#include "actors/run_report.hpp"
#include "tools/bench.hpp"
#include "tools/common.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

namespace cellshard::tools {

namespace {

struct encode_result {
  double blob_mbs, caf_mbs;
};

encode_result measure_encoding(size_t floats, int reps) {
  caf::actor_system_config cfg;
  actors::register_messages(cfg);
  cfg.set("scheduler.max-threads", size_t{1});
  caf::actor_system sys{cfg};
  actors::blob b;
  b.data.resize(floats);
  for (size_t i = 0; i < floats; ++i) b.data[i] = static_cast<float>(i % 1000) * 0.001f;
  std::vector<float> plain = b.data;
  using clk = std::chrono::steady_clock;
  auto time_it = [&](auto&& fn) {
    std::vector<double> s;
    for (int r = 0; r < reps; ++r) {
      auto t0 = clk::now();
      fn();
      s.push_back(std::chrono::duration<double>(clk::now() - t0).count());
    }
    return median(s);
  };
  const double bytes = 2.0 * floats * sizeof(float);  // serialise + deserialise
  const double tb = time_it([&] {
    std::vector<char> buf;
    caf::binary_serializer out{sys, buf};
    auto e1 = out(b);
    actors::blob back;
    caf::binary_deserializer in{sys, buf};
    auto e2 = in(back);
    if (e1 || e2 || back.data.size() != floats) throw cli_error("blob round trip failed");
  });
  const double tc = time_it([&] {
    std::vector<char> buf;
    caf::binary_serializer out{sys, buf};
    auto e1 = out(plain);
    std::vector<float> back;
    caf::binary_deserializer in{sys, buf};
    auto e2 = in(back);
    if (e1 || e2 || back.size() != floats) throw cli_error("CAF round trip failed");
  });
  return {bytes / tb / 1e6, bytes / tc / 1e6};
}

}  // namespace

namespace {

/// bench cluster --moe (issue #23): see cluster_bench_options::moe.
int run_moe_bench(const cluster_bench_options& o, std::vector<bench_row>& rows) {
  std::string path = o.model;
  if (path.empty()) {
    const char* candidates[] = {"../shared/models/gguf/moe-small-f32.gguf", "/work/shared/models/gguf/moe-small-f32.gguf"};
    for (const char* c : candidates)
      if (std::FILE* f = std::fopen(c, "rb")) {
        std::fclose(f);
        path = c;
        break;
      }
    if (path.empty()) throw cli_error("bench cluster --moe: give -m MODEL (a mixture of experts)", 2);
  }
  loaded_model lm = load_model(path, o.tokenizer);
  const auto& cfg = lm.file->cfg();
  if (!cfg.moe()) throw cli_error("bench cluster --moe: " + path + " is dense (0 experts)", 2);
  struct measured {
    double tok_s = 0, tpot = 0, bytes = 0, link_max = 0, share = 0, stall = 0;
    bool ok = false;
  };
  auto run = [&](const std::string& topo, int nodes, int replicas, const std::vector<supervision::fault_plan>& faults,
                 int spares) {
    measured m;
    actors::cluster_options co;
    co.file = lm.file;
    co.tok = lm.tok;
    co.nodes = nodes;
    co.spares = spares;
    co.topology = topo;
    co.expert_replicas = replicas;
    co.kernels = o.kernels;
    co.caf_threads = o.caf_threads;
    co.faults = faults;
    auto c = actors::cluster::start(co);
    if (!c) {
      std::fprintf(stderr, "skip %s R=%d: %s\n", topo.c_str(), replicas, c.message().c_str());
      return m;
    }
    model::generation_params gp;
    gp.steps = o.steps;
    gp.sampling = {0.0f, 0.9f, 1};
    std::vector<double> tps, tpot, share, stall;
    int tokens = 0;
    for (int r = 0; r < (faults.empty() ? o.reps : 1); ++r) {
      auto out = (*c)->generate(gp);
      if (!out || !out->ok) throw cli_error("bench run failed: " + (out ? out->error : out.message()));
      tps.push_back(out->result.tokens_per_s);
      tpot.push_back(median(out->result.step_ms));
      share.push_back(actors::comm_share(*out));
      const auto& s = out->result.step_ms;
      if (!s.empty()) stall.push_back(*std::max_element(s.begin(), s.end()) - median(s));
      tokens += static_cast<int>(out->result.ids.size()) - 1;
      // The shards' counters add up over the runs: the first run's share.
      if (r == 0)
        if (auto rep = actors::make_run_report(**c, *out)) m.share = rep->moe_wait_share;
    }
    auto st = (*c)->stats();
    if (!st) throw cli_error(st.message());
    double total = 0;
    for (const auto& s : *st)
      for (size_t i = 0; i < s.link_to.size(); ++i) {
        if (s.link_to[i] < 0 || s.link_to[i] == s.node) continue;  // the front end, itself
        total += static_cast<double>(s.link_bytes[i]);
        m.link_max = std::max(m.link_max, static_cast<double>(s.link_bytes[i]));
      }
    m.bytes = total / std::max(1, tokens);
    m.link_max /= std::max(1, tokens);
    m.tok_s = median(tps);
    m.tpot = median(tpot);
    m.stall = stall.empty() ? 0 : median(stall);
    m.ok = true;
    return m;
  };
  const measured one = run("pipeline:1", 1, 1, {}, 0);
  std::fprintf(stderr, "  %s one node: %.1f tok/s, tpot %.3f ms\n", path.c_str(), one.tok_s, one.tpot);
  for (int E : o.experts) {
    if (E > cfg.n_experts) continue;
    for (int R : {1, 2}) {
      if (R > E) continue;
      const std::string topo = "expert:" + std::to_string(E);
      const measured m = run(topo, 1 + E, R, {}, 0);
      if (!m.ok) continue;
      bench_row row;
      row.name = "cluster.moe.tokens_per_s";
      row.params = {{"model", path}, {"topology", topo}, {"replicas", std::to_string(R)},
                    {"steps", std::to_string(o.steps)}};
      row.value = m.tok_s;
      row.unit = "tok/s";
      row.baseline = one.tok_s;
      row.baseline_name = "one node (whole model), same run";
      row.ratio = one.tok_s > 0 ? m.tok_s / one.tok_s : 0;
      rows.push_back(row);
      bench_row b = row;
      b.name = "cluster.moe.bytes_per_token";
      b.value = m.bytes;
      b.unit = "B";
      b.baseline = -1;
      b.baseline_name = "";
      b.ratio = 0;
      rows.push_back(b);
      std::fprintf(stderr,
                   "  %-9s R=%d: %.1f tok/s (x%.2f of one node), tpot %.3f ms, %.0f B/token between nodes "
                   "(busiest link %.0f), dispatch/combine share %.2f\n",
                   topo.c_str(), R, m.tok_s, row.ratio, m.tpot, m.bytes, m.link_max, m.share);
    }
  }
  // The stall a lost expert node causes: crash and silence of expert node 1
  // (placement index 2) at position steps/2, without and with a replica.
  const int at = std::max(8, o.steps / 2);
  for (const char* kind : {"crash", "silence"})
    for (int R : {1, 2}) {
      auto plan = supervision::parse_fault_spec(std::string(kind) + ":node=2:step=" + std::to_string(at));
      if (!plan) throw cli_error(plan.message());
      const measured m = run("expert:2", 3, R, {*plan}, 1);
      if (!m.ok) continue;
      bench_row row;
      row.name = "cluster.moe.stall";
      row.params = {{"model", path}, {"topology", "expert:2"}, {"replicas", std::to_string(R)}, {"fault", kind},
                    {"position", std::to_string(at)}};
      row.value = m.stall;
      row.unit = "ms";
      row.baseline = m.tpot;
      row.baseline_name = "median token time of the same run";
      row.ratio = m.tpot > 0 ? m.stall / m.tpot : 0;
      rows.push_back(row);
      std::fprintf(stderr, "  expert:2 R=%d %s of expert node 1 at position %d: stall %.1f ms (slowest token minus "
                   "the median %.3f ms)\n", R, kind, at, m.stall, m.tpot);
    }
  return 0;
}

}  // namespace

int run_cluster_bench(const cluster_bench_options& o, std::vector<bench_row>& rows) {
  if (o.moe) return run_moe_bench(o, rows);
  if (o.overlap) return run_overlap_bench(o, rows);
  struct model_case {
    std::string name;
    std::shared_ptr<const model::model_file> file;
    std::shared_ptr<const model::tokenizer> tok;
    int steps;
  };
  std::vector<model_case> models;
  {
    loaded_model lm = load_model(o.model, o.tokenizer);
    models.push_back({lm.file->path(), lm.file, lm.tok, o.steps});
  }
  if (!o.skip_large) {
    auto cfg = model::synth_preset(o.large_config);
    if (!cfg) throw cli_error("--large-config: " + cfg.message(), 2);
    std::fprintf(stderr, "synthesising %s in memory...\n", o.large_config.c_str());
    auto f = model::model_file::from_bytes(model::synth_bytes(*cfg, 1), "synth " + o.large_config);
    if (!f) throw cli_error(f.message());
    models.push_back({"synth " + o.large_config, *f, model::tokenizer::byte_level(cfg->vocab_size),
                      o.large_steps});
  }
  // Bytes per token of the direct reduce, by (model, nodes): the baseline of
  // the scatter rows.
  std::map<std::pair<std::string, int>, std::pair<double, double>> direct_bytes;
  for (const auto& mc : models) {
    for (const char* topo : {"pipeline", "tensor"})
      for (const std::string& reduce : std::string(topo) == "tensor" ? o.reduces : std::vector<std::string>{"direct"}) {
      double base = 0;
      for (int n : o.nodes) {
        actors::cluster_options co;
        co.file = mc.file;
        co.tok = mc.tok;
        co.nodes = n;
        co.topology = topo;
        co.reduce = reduce;
        co.kernels = o.kernels;
        co.caf_threads = o.caf_threads;
        auto c = actors::cluster::start(co);
        if (!c) {
          std::fprintf(stderr, "skip %s %s %d nodes: %s\n", mc.name.c_str(), topo, n, c.message().c_str());
          continue;
        }
        model::generation_params gp;
        gp.steps = mc.steps;
        gp.sampling = {0.0f, 0.9f, 1};
        std::vector<double> tpot, share;
        int tokens = 0;
        for (int r = 0; r < o.reps; ++r) {
          auto out = (*c)->generate(gp);
          if (!out || !out->ok) throw cli_error("bench run failed: " + (out ? out->error : out.message()));
          tpot.push_back(median(out->result.step_ms));
          share.push_back(actors::comm_share(*out));
          tokens += static_cast<int>(out->result.ids.size()) - 1;
        }
        // Payload bytes between nodes (the shards' link counters): the
        // busiest single link (shard -> node) and the busiest rank's total.
        auto st = (*c)->stats();
        if (!st) throw cli_error(st.message());
        double link_max = 0, rank_max = 0;
        for (const auto& s : *st) {
          double rank = 0;
          for (size_t i = 0; i < s.link_to.size(); ++i) {
            if (s.link_to[i] < 0 || s.link_to[i] == s.node) continue;  // the front end, itself
            link_max = std::max(link_max, static_cast<double>(s.link_bytes[i]));
            rank += static_cast<double>(s.link_bytes[i]);
          }
          rank_max = std::max(rank_max, rank);
        }
        link_max /= std::max(1, tokens);
        rank_max /= std::max(1, tokens);
        const double t = median(tpot);
        if (n == o.nodes.front()) base = t;
        bench_row row;
        row.name = "cluster.tpot";
        row.params = {{"model", mc.name}, {"topology", topo}, {"nodes", std::to_string(n)},
                      {"steps", std::to_string(mc.steps)}};
        if (std::string(topo) == "tensor") row.params["reduce"] = reduce;
        row.value = t;
        row.unit = "ms";
        row.baseline = base;
        row.baseline_name = std::to_string(o.nodes.front()) + " node(s), same run";
        row.ratio = base > 0 ? t / base : 0;
        rows.push_back(row);
        bench_row cs = row;
        cs.name = "cluster.comm_share";
        cs.value = median(share);
        cs.unit = "fraction";
        cs.baseline = -1;
        cs.ratio = 0;
        rows.push_back(cs);
        std::fprintf(stderr, "  %s %-8s %-7s %d node(s): tpot %.3f ms (x%.2f of 1 node), comm share %.2f, "
                     "bytes/token busiest link %.0f, busiest rank %.0f\n",
                     mc.name.c_str(), topo, std::string(topo) == "tensor" ? reduce.c_str() : "", n, t, row.ratio,
                     cs.value, link_max, rank_max);
        if (std::string(topo) != "tensor" || n < 2) continue;
        // Bytes per token: a scatter row's baseline is the direct run of the same point.
        if (reduce == "direct") direct_bytes[{mc.name, n}] = {link_max, rank_max};
        auto d = direct_bytes.find({mc.name, n});
        const bool has_base = reduce != "direct" && d != direct_bytes.end();
        for (int k = 0; k < 2; ++k) {
          bench_row b = row;
          b.name = k == 0 ? "cluster.link_bytes_per_token" : "cluster.rank_bytes_per_token";
          b.value = k == 0 ? link_max : rank_max;
          b.unit = "B";
          b.baseline = has_base ? (k == 0 ? d->second.first : d->second.second) : -1;
          b.baseline_name = has_base ? "reduce direct, same point, same run" : "";
          b.ratio = has_base && b.baseline > 0 ? b.value / b.baseline : 0;
          rows.push_back(b);
        }
      }
      }
  }
  for (size_t floats : {size_t{256}, size_t{16384}, size_t{1} << 20}) {
    auto e = measure_encoding(floats, floats > 100000 ? 5 : 50);
    bench_row row;
    row.name = "payload.encoding";
    row.params = {{"floats", std::to_string(floats)}};
    row.value = e.blob_mbs;
    row.unit = "MB/s";
    row.baseline = e.caf_mbs;
    row.baseline_name = "CAF 0.17 default vector<float> encoding";
    row.ratio = e.blob_mbs / e.caf_mbs;
    rows.push_back(row);
  }
  return 0;
}

}  // namespace cellshard::tools
