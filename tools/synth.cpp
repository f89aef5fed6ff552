// `cellshard synth`: write a llama2.c-format file of seeded random weights.
#include "model/checkpoint.hpp"
#include "model/synth.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <cstdio>
#include <memory>

namespace cellshard::tools {

void add_synth(CLI::App& app, int& status) {
  struct opts {
    std::string preset = "stories260k", out;
    int dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, seq_len = 0;
    bool unshared = false;
    uint64_t seed = 1;
  };
  auto o = std::make_shared<opts>();
  auto* cmd = app.add_subcommand("synth", "write a llama2.c checkpoint of seeded random weights");
  cmd->add_option("--config", o->preset,
                  "stories260k|stories15m|stories42m|stories110m|custom (custom starts from "
                  "stories260k; the shape flags override any preset)")
      ->capture_default_str();
  cmd->add_option("--dim", o->dim, "transformer width");
  cmd->add_option("--hidden", o->hidden, "FFN hidden units");
  cmd->add_option("--layers", o->layers, "layers");
  cmd->add_option("--heads", o->heads, "query heads");
  cmd->add_option("--kv-heads", o->kv_heads, "key/value heads");
  cmd->add_option("--vocab", o->vocab, "vocabulary size");
  cmd->add_option("--seq-len", o->seq_len, "context length");
  cmd->add_flag("--unshared-classifier", o->unshared, "write a separate classifier matrix");
  cmd->add_option("-s,--seed", o->seed, "seed")->capture_default_str();
  cmd->add_option("-o,--output", o->out, "output file")->required();
  cmd->callback([o, &status] {
    auto base = model::synth_preset(o->preset == "custom" ? "stories260k" : o->preset);
    if (!base) throw cli_error(base.message(), 2);
    model::config c = *base;
    if (o->dim) c.dim = o->dim;
    if (o->hidden) c.hidden_dim = o->hidden;
    if (o->layers) c.n_layers = o->layers;
    if (o->heads) c.n_heads = o->heads;
    if (o->kv_heads) c.n_kv_heads = o->kv_heads;
    if (o->vocab) c.vocab_size = o->vocab;
    if (o->seq_len) c.seq_len = o->seq_len;
    if (o->unshared) c.shared_classifier = false;
    // Validate the shape with the loader's own header check.
    int32_t raw[7] = {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                      c.shared_classifier ? c.vocab_size : -c.vocab_size, c.seq_len};
    auto chk = model::model_file::parse_header(raw, model::checkpoint_bytes(c), "synth --config");
    if (!chk) throw cli_error(chk.message(), 2);
    auto r = model::synth_file(c, o->seed, o->out);
    if (!r) throw cli_error(r.message());
    std::fprintf(stderr, "wrote %s: %s, %.1f MiB, seed %llu\n", o->out.c_str(),
                 c.to_string().c_str(), model::checkpoint_bytes(c) / 1048576.0,
                 static_cast<unsigned long long>(o->seed));
    status = 0;
  });
}

}  // namespace cellshard::tools
