#include "tools/common.hpp"

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
std::string dir_of(const std::string& p) {
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}
}  // namespace

loaded_model load_model(const std::string& model_path, const std::string& tokenizer_path,
                        bool force_swap) {
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
    auto f = model::model_file::open(mp, opts);
    if (!f) throw cli_error(f.message());
    m.file = *f;
    if (tp.empty()) tp = dir_of(mp) + "/tokenizer.bin";
    auto t = model::tokenizer::open(tp);
    if (!t) throw cli_error(t.message());
    m.tok = *t;
    m.description = mp + " with tokenizer " + tp;
  }
  if (m.tok->vocab_size() != m.file->cfg().vocab_size) {
    throw cli_error("tokenizer " + m.tok->name() + " has " + std::to_string(m.tok->vocab_size()) +
                    " tokens but model " + m.file->path() + " has vocab_size " +
                    std::to_string(m.file->cfg().vocab_size) +
                    ": they do not belong together (pass the model's tokenizer with -z)");
  }
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
  if (!out) throw cli_error(path + ": write failed");
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw cli_error(path + ": cannot read: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace cellshard::tools
