// `cellshard run`: generate text. Text streams to stdout exactly as llama2.c's
// run.c prints it; "achieved tok/s" goes to stderr.
#include "kernels/backend.hpp"
#include "model/generate.hpp"
#include "model/transformer.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
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
  auto w = model::shard_weights::make(lm.file, model::slice_spec::whole(lm.file->cfg()), *fmt);
  if (!w) throw cli_error(w.message());
  model::engine eng(*w, *be);

  model::generation_params gp;
  gp.prompt = o.prompt;
  gp.steps = o.steps;
  gp.sampling = {o.temperature, o.topp, o.seed};
  gp = model::normalise(gp, lm.file->cfg().seq_len);

  const bool json_to_stdout = o.json_out == "-";
  auto res = model::generate(
      [&](int token, int pos) -> result<const float*> { return eng.forward(token, pos); }, *lm.tok,
      lm.file->cfg().vocab_size, gp, [&](int, const std::string& piece) {
        if (o.quiet) return;
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      });
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
    j["comm_share"] = 0.0;
    j["tokens"] = static_cast<int>(res->ids.size()) - 1;
    j["duration_ms"] = res->duration_ms;
    j["nodes"] = nlohmann::json::array(
        {{{"index", 0},
          {"role", "whole model"},
          {"memory_bytes", (*w)->bytes() + lm.file->cfg().kv_cache_bytes(lm.file->cfg().seq_len)},
          {"compute_ms", res->duration_ms},
          {"bytes_sent", 0},
          {"bytes_received", 0}}});
    j["links"] = nlohmann::json::array();
    j["faults"] = nlohmann::json::array();
    j["ids"] = res->ids;
    if (!o.expect_ids.empty()) j["diverged"] = diverged;
    write_text(o.json_out, j.dump(2) + "\n");
    (void)json_to_stdout;
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
  cmd->callback([o, &status] { status = do_run(*o); });
}

}  // namespace cellshard::tools
