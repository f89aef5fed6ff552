// `cellshard synth`: write a llama2.c-format file of seeded random weights.
#include "model/checkpoint.hpp"
#include "model/synth.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <cstdio>
#include <cerrno>
#include <cstring>
#include <memory>
#include <sys/statvfs.h>

namespace cellshard::tools {

namespace {
std::string human_bytes(long double b) {
  char buf[64];
  if (b >= 1099511627776.0L) std::snprintf(buf, sizeof buf, "%.1Lf TiB", b / 1099511627776.0L);
  else if (b >= 1073741824.0L) std::snprintf(buf, sizeof buf, "%.1Lf GiB", b / 1073741824.0L);
  else std::snprintf(buf, sizeof buf, "%.1Lf MiB", b / 1048576.0L);
  char n[64];
  std::snprintf(n, sizeof n, " (%.0Lf bytes)", b);
  return std::string(buf) + n;
}
}  // namespace

void add_synth(CLI::App& app, int& status) {
  struct opts {
    std::string preset = "stories260k", out;
    int dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, seq_len = 0;
    bool unshared = false;
    uint64_t seed = 1;
    uint64_t max_bytes = 64ull << 30;
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
  cmd->add_option("--max-size", o->max_bytes, "refuse shapes whose file exceeds this many bytes")
      ->capture_default_str();
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
    // The size first, in long double (a shape's size can exceed 64 bits).
    {
      const long double d = c.dim, h = c.hidden_dim, hs = c.n_heads > 0 ? c.dim / c.n_heads : 0,
                        kv = c.n_kv_heads * hs, emb = static_cast<long double>(c.vocab_size) * d;
      const long double bytes =
          28 + 4 * (emb * (c.shared_classifier ? 1 : 2) + (2 * d + 2 * d * d + 2 * d * kv + 3 * d * h) * c.n_layers +
                    d + static_cast<long double>(c.seq_len) * hs);
      if (bytes > static_cast<long double>(o->max_bytes))
        throw cli_error("synth: " + c.to_string() + " makes a file of " + human_bytes(bytes) + ", expected at most " +
                            human_bytes(o->max_bytes) + " (--max-size BYTES raises the limit)",
                        2);
    }
    // Validate the shape with the loader's own header check.
    int32_t raw[7] = {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                      c.shared_classifier ? c.vocab_size : -c.vocab_size, c.seq_len};
    auto chk = model::model_file::parse_header(raw, model::checkpoint_bytes(c), "synth --config");
    if (!chk) throw cli_error(chk.message(), 2);
    // Refuse before writing a byte: a shape beyond the limit, or beyond the
    // free space of the output's file system.
    const uint64_t bytes = model::checkpoint_bytes(c);
    {
      std::string dir = o->out;
      const auto slash = dir.find_last_of('/');
      dir = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
      struct statvfs fs;
      if (::statvfs(dir.c_str(), &fs) != 0)
        throw cli_error(o->out + ": cannot write there: " + dir + ": " + std::strerror(errno));
      const uint64_t avail = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
      if (bytes > avail)
        throw cli_error("synth: " + o->out + " would be " + human_bytes(bytes) + " but " + dir + " has only " +
                        human_bytes(avail) + " free; expected a smaller shape or another folder");
    }
    auto r = model::synth_file(c, o->seed, o->out);
    if (!r) throw cli_error(r.message());
    std::fprintf(stderr, "wrote %s: %s, %.1f MiB, seed %llu\n", o->out.c_str(),
                 c.to_string().c_str(), model::checkpoint_bytes(c) / 1048576.0,
                 static_cast<unsigned long long>(o->seed));
    status = 0;
  });
}

}  // namespace cellshard::tools
