// `cellshard synth`: write a llama2.c-format file of seeded random weights.
#include "model/checkpoint.hpp"
#include "model/synth.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>
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

struct synth_opts {
  std::string preset = "stories260k", out, json_out;
  int dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, seq_len = 0;
  bool unshared = false;
  int experts = 0, experts_used = 0, shared_experts = 0;
  uint64_t seed = 1;
  uint64_t max_bytes = 64ull << 30;
};

/// --json: what was written.
void write_result(const synth_opts& o, const char* format, const model::config& c, uint64_t bytes) {
  if (o.json_out.empty()) return;
  nlohmann::json cfg = {{"dim", c.dim},         {"hidden_dim", c.hidden_dim}, {"layers", c.n_layers},
                        {"heads", c.n_heads},   {"kv_heads", c.n_kv_heads},   {"vocab", c.vocab_size},
                        {"seq_len", c.seq_len}, {"experts", c.n_experts},     {"experts_used", c.n_experts_used}};
  write_text(o.json_out, nlohmann::json{{"output", o.out}, {"format", format}, {"config", cfg},
                                        {"description", c.to_string()}, {"bytes", bytes}, {"seed", o.seed}}
                             .dump(2) + "\n");
}

}  // namespace

void add_synth(CLI::App& app, int& status) {
  auto o = std::make_shared<synth_opts>();
  auto* cmd = app.add_subcommand("synth", "write a llama2.c checkpoint (GGUF with --experts) of seeded random weights");
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
  cmd->add_option("--experts", o->experts,
                  "routed experts per layer: writes a GGUF mixture-of-experts model (llama2.c has "
                  "no MoE format); --hidden is then one expert's width");
  cmd->add_option("--experts-used", o->experts_used, "experts chosen per token (default 2, at most --experts)");
  cmd->add_option("--shared-experts", o->shared_experts,
                  "shared experts of --hidden units each (architecture qwen2moe: one shared expert of "
                  "S x hidden units behind a sigmoid gate; 0 = Mixtral-style llama)");
  cmd->add_option("-s,--seed", o->seed, "seed")->capture_default_str();
  cmd->add_option("-o,--output", o->out, "output file")->required();
  cmd->add_option("--json", o->json_out, "{output, format, config, bytes, seed} to FILE (- = stdout)");
  cmd->add_option("--max-size", o->max_bytes, "refuse shapes whose file exceeds this many bytes")
      ->capture_default_str();
  cmd->callback([o, cmd, &status] {
    // A shape flag that is given must be a shape: 0 used to mean "not given"
    // and `--dim 0` silently wrote the preset's width.
    for (const auto& [flag, value] :
         {std::pair<const char*, int>{"--dim", o->dim}, {"--hidden", o->hidden}, {"--layers", o->layers},
          {"--heads", o->heads}, {"--kv-heads", o->kv_heads}, {"--vocab", o->vocab}, {"--seq-len", o->seq_len},
          {"--experts", o->experts}, {"--experts-used", o->experts_used}}) {
      if (cmd->count(flag) > 0 && value < 1)
        throw cli_error(std::string("synth: ") + flag + ": got " + std::to_string(value) +
                            ", expected a positive number (leave the flag out for the preset's value)",
                        2);
    }
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
    if (o->experts_used && !o->experts) throw cli_error("synth: --experts-used needs --experts", 2);
    if (o->shared_experts && !o->experts) throw cli_error("synth: --shared-experts needs --experts", 2);
    if (o->experts) {
      if (o->experts < 0 || o->experts > 4096)
        throw cli_error("synth: --experts is " + std::to_string(o->experts) + ", expected 1..4096", 2);
      const int used = o->experts_used ? o->experts_used : std::min(2, o->experts);
      if (used < 1 || used > o->experts)
        throw cli_error("synth: --experts-used is " + std::to_string(used) + ", expected 1..--experts (" +
                            std::to_string(o->experts) + ")",
                        2);
      if (o->shared_experts < 0 || o->shared_experts > 64)
        throw cli_error("synth: --shared-experts is " + std::to_string(o->shared_experts) + ", expected 0..64", 2);
      c.n_experts = o->experts;
      c.n_experts_used = used;
      c.shared_hidden = o->shared_experts * c.hidden_dim;
      c.norm_topk = c.shared_hidden == 0;
      c.arch = c.shared_hidden ? "qwen2moe" : "llama";
    }
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
    if (c.moe()) {
      const long double d = c.dim, h = c.hidden_dim, hs = c.n_heads > 0 ? c.dim / c.n_heads : 0,
                        kv = c.n_kv_heads * hs, emb = static_cast<long double>(c.vocab_size) * d,
                        e = c.n_experts, sh = c.shared_hidden;
      const long double bytes =
          4 * (emb * (c.shared_classifier ? 1 : 2) + d +
               (4 * d + 2 * d * d + 2 * d * kv + d * e + 3 * d * h * e + 3 * d * sh + 2 * kv + d) *
                   c.n_layers);
      if (bytes > static_cast<long double>(o->max_bytes))
        throw cli_error("synth: " + c.to_string() + " makes a file of " + human_bytes(bytes) +
                            ", expected at most " + human_bytes(o->max_bytes) +
                            " (--max-size BYTES raises the limit)",
                        2);
      // Built in memory and checked by the loader itself before a byte is written.
      auto img = model::synth_gguf(c, o->seed);
      auto chk = model::model_file::from_bytes(img, "synth --experts");
      if (!chk) throw cli_error(chk.message(), 2);
      std::FILE* f = std::fopen(o->out.c_str(), "wb");
      if (!f) throw cli_error(o->out + ": cannot create: " + std::strerror(errno));
      const bool ok = std::fwrite(img.data(), 1, img.size(), f) == img.size();
      if (std::fclose(f) != 0 || !ok) throw cli_error(o->out + ": write failed: " + std::strerror(errno));
      std::fprintf(stderr, "wrote %s: GGUF %s, %.1f MiB, seed %llu\n", o->out.c_str(),
                   (*chk)->cfg().to_string().c_str(), img.size() / 1048576.0,
                   static_cast<unsigned long long>(o->seed));
      write_result(*o, "gguf", (*chk)->cfg(), img.size());
      status = 0;
      return;
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
    write_result(*o, "llama2.c", c, model::checkpoint_bytes(c));
    status = 0;
  });
}

}  // namespace cellshard::tools
