// `cellshard bench prefill` (issue #18): a prompt of `positions` positions fed
// to the single-node engine one position at a time (forward) and in chunks of
// --batch-size positions (engine::prefill: matrix products, each weight row
// read once per chunk), in alternation on the same weights, `repeat` rounds;
// prompt tokens/s of each and the median of the per-round ratios. Also checks
// that both left the same last logits (bit for bit), and fails if not.
#include "base/percentile.hpp"
#include "tools/bench.hpp"

#include "kernels/backend.hpp"
#include "kernels/native.hpp"
#include "kernels/pool.hpp"
#include "model/checkpoint.hpp"
#include "model/synth.hpp"
#include "model/transformer.hpp"
#include "tools/common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>

namespace cellshard::tools {

namespace {
// Seconds on the wall clock, or of this thread's CPU time (--cpu-time).
double now_s(bool cpu) {
  if (cpu) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int run_prefill_bench(const prefill_bench_options& o, std::vector<bench_row>& rows) {
  std::shared_ptr<const model::model_file> file;
  std::string model_name = o.model;
  if (o.model.empty()) {
    auto c = model::synth_preset(o.config);
    if (!c) throw cli_error("--config: " + c.message(), 2);
    std::fprintf(stderr, "bench prefill: synth --config %s -s 1 (in memory)\n", o.config.c_str());
    auto f = model::model_file::from_bytes(model::synth_bytes(*c, 1), "synth " + o.config);
    if (!f) throw cli_error(f.message());
    file = *f;
    model_name = "synth " + o.config;
  } else {
    auto f = model::model_file::open(o.model);
    if (!f) throw cli_error(f.message());
    file = *f;
  }
  const auto& cfg = file->cfg();
  const int n = std::min(o.positions, cfg.seq_len);
  if (n < 2) throw cli_error("--positions: need at least 2 (the model's seq_len is " + std::to_string(cfg.seq_len) + ")", 2);
  const kernels::backend* be = kernels::find_backend(o.kernels);
  if (!be) throw cli_error("--kernels: unknown backend '" + o.kernels + "'", 2);
  std::unique_ptr<kernels::pool> kpool;
  if (o.threads > 1) kpool = std::make_unique<kernels::pool>(o.threads);
  kernels::pool::scope use_pool(kpool.get());
  std::vector<int> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = i == 0 ? 1 : static_cast<int>((i * 7919u + 13u) % cfg.vocab_size);
  if (o.cpu_time && o.threads > 1)
    throw cli_error("--cpu-time measures the calling thread only: use it with --threads 1", 2);
  int status = 0;
  for (const auto& wname : o.weights) {
    auto fmt = model::parse_weight_format(wname);
    if (!fmt) throw cli_error(fmt.message(), 2);
    auto w = model::shard_weights::make(file, model::slice_spec::whole(cfg), *fmt);
    if (!w) throw cli_error(w.message());
    model::engine one(*w, *be), batched(*w, *be);
    batched.set_batch_size(o.batch_size);
    std::vector<double> t_one, t_batch, ratios;
    std::vector<float> last_one(cfg.vocab_size);
    bool same = true;
    for (int r = 0; r < o.repeat; ++r) {
      double t0 = now_s(o.cpu_time);
      const float* l = nullptr;
      for (int p = 0; p < n; ++p) l = one.forward(tokens[p], p);
      const double s1 = now_s(o.cpu_time) - t0;
      std::memcpy(last_one.data(), l, last_one.size() * sizeof(float));
      t0 = now_s(o.cpu_time);
      const float* lb = batched.prefill(tokens.data(), n, 0);
      const double s2 = now_s(o.cpu_time) - t0;
      same = same && std::memcmp(lb, last_one.data(), last_one.size() * sizeof(float)) == 0;
      t_one.push_back(n / s1);
      t_batch.push_back(n / s2);
      ratios.push_back(s1 / s2);
      std::fprintf(stderr, "bench prefill: %s round %d: one by one %.1f tok/s, batch %d %.1f tok/s (%.2fx)\n",
                   wname.c_str(), r + 1, n / s1, o.batch_size, n / s2, s1 / s2);
    }
    bench_row row;
    row.name = "prefill";
    row.params = {{"model", model_name},       {"weights", wname},
                  {"kernels", o.kernels},      {"threads", std::to_string(std::max(1, o.threads))},
                  {"positions", std::to_string(n)}, {"batch_size", std::to_string(o.batch_size)},
                  {"clock", o.cpu_time ? "thread CPU" : "wall"},
                  {"isa", o.kernels == "native" ? kernels::native::to_string(kernels::native::active_isa()) : "-"},
                  {"identical_logits", same ? "yes" : "NO"}};
    row.value = median(t_batch);
    row.unit = "tok/s";
    row.baseline = median(t_one);
    row.baseline_name = "one position at a time";
    row.ratio = median(ratios);
    rows.push_back(row);
    if (!same) {
      std::fprintf(stderr, "bench prefill: %s: the batched prefill's last logits differ from one at a time\n",
                   wname.c_str());
      status = 1;
    }
  }
  return status;
}

}  // namespace cellshard::tools
