#include "model/bundle.hpp"

#include "model/gguf.hpp"

#include <fstream>

namespace cellshard::model {

result<void> check_pair(const model_file& f, const tokenizer& t) {
  if (t.vocab_size() != f.cfg().vocab_size)
    return make_error("tokenizer " + t.name() + " has " + std::to_string(t.vocab_size()) +
                      " tokens but model " + f.path() + " has vocab_size " +
                      std::to_string(f.cfg().vocab_size) +
                      ": they do not belong together (pass the model's tokenizer with -z)");
  return {};
}

bool is_gguf_path(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint8_t magic[4] = {0, 0, 0, 0};
  in.read(reinterpret_cast<char*>(magic), 4);
  return in.gcount() == 4 && gguf::file::has_magic(magic, 4);
}

result<bundle> load_bundle(const std::string& model_path, const std::string& tokenizer_path,
                           load_options opts) {
  bundle b;
  auto f = model_file::open(model_path, opts);
  if (!f) return f.err();
  b.file = *f;
  std::string tp = tokenizer_path;
  if (tp.empty() && is_gguf_path(model_path)) tp = model_path;  // its own tokenizer.ggml.* keys
  if (tp.empty()) {
    const auto slash = model_path.rfind('/');
    tp = (slash == std::string::npos ? std::string(".") : model_path.substr(0, slash)) +
         "/tokenizer.bin";
  }
  auto t = tokenizer::open(tp);
  if (!t && tokenizer_path.empty() && tp == model_path)  // a GGUF without tokenizer keys (synth --experts writes one)
    return make_error(t.message() + "; the GGUF's own tokenizer was used since no -z was given: -z FILE gives a "
                                    "tokenizer of the same vocabulary instead");
  if (!t) return t.err();
  b.tok = *t;
  auto ok = check_pair(*b.file, *b.tok);
  if (!ok) return ok.err();
  return b;
}

}  // namespace cellshard::model
