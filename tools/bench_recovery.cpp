// `cellshard bench recovery`: detection and recovery time of the in-process
// runtime against the checkpoint interval K and the context length (the
// position at which the fault fires), for pipeline and tensor placements,
// crash (restart in place) and silence (move to a spare). The baseline is the
// fault-free time per output token of the same placement in the same run, so
// recover_ms / tpot says how many tokens' worth of time a recovery costs.
#include "actors/cluster.hpp"
#include "supervision/fault_plan.hpp"
#include "tools/bench.hpp"
#include "tools/common.hpp"

#include <algorithm>
#include <cstdio>

namespace cellshard::tools {

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
            bench_row r;
            r.name = name;
            r.params = params;
            r.value = v;
            r.unit = unit;
            if (ratio) {
              r.baseline = tpot;
              r.baseline_name = "fault-free TPOT of the same placement";
              r.ratio = tpot > 0 ? v / tpot : 0;
            }
            rows.push_back(r);
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

}  // namespace cellshard::tools
