#include "tools/common.hpp"

#include "model/bundle.hpp"
#include "model/synth.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

namespace cellshard::tools {

namespace {
bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
}  // namespace

loaded_model load_model(const std::string& model_path, const std::string& tokenizer_path,
                        bool force_swap, int ctx) {
  loaded_model m;
  std::string mp = model_path, tp = tokenizer_path;
  if (mp.empty()) {
    const char* env = std::getenv("CELLSHARD_MODELS");
    const std::string dir = env && *env ? env : "./models";
    if (is_file(dir + "/stories260K.bin") && is_file(dir + "/tok512.bin")) {
      mp = dir + "/stories260K.bin";
      if (tp.empty()) tp = dir + "/tok512.bin";
    } else {
      // Built-in synthetic stories260K-shaped model with a byte-level tokenizer.
      auto cfg = model::synth_preset("stories260k").value();
      auto f = model::model_file::from_bytes(model::synth_bytes(cfg, 260), "built-in synthetic model");
      if (!f) throw cli_error(f.message());
      m.file = *f;
      m.tok = tp.empty() ? model::tokenizer::byte_level(cfg.vocab_size) : nullptr;
      m.description = "built-in synthetic stories260K-shaped model (random weights, seed 260) "
                      "with a byte-level tokenizer; no model files in " + dir +
                      " (set CELLSHARD_MODELS or use -m)";
      if (!m.tok) {
        auto t = model::tokenizer::open(tp);
        if (!t) throw cli_error(t.message());
        m.tok = *t;
      }
    }
  }
  if (!m.file) {
    model::load_options opts;
    opts.force_swap = force_swap;
    opts.ctx = ctx;
    auto b = model::load_bundle(mp, tp, opts);
    if (!b) throw cli_error(b.message());
    m.file = b->file;
    m.tok = b->tok;
    m.description = mp + " with tokenizer " + m.tok->name();
    return m;
  }
  auto ok = model::check_pair(*m.file, *m.tok);
  if (!ok) throw cli_error(ok.message());
  return m;
}

void write_text(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return;
  }
  std::ofstream out(path, std::ios::binary);
  if (!out) throw cli_error(path + ": cannot write: " + std::strerror(errno));
  out << text;
  out.close();  // the last buffered bytes reach the file here (a full disk fails here)
  if (!out) throw cli_error(path + ": write failed: " + std::strerror(errno));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw cli_error(path + ": cannot read: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace cellshard::tools
