// examples/embed: generate text through cellshard's public API from a program
// of your own. Shows: loading a llama2.c model and tokenizer, building the
// engine on a kernel backend, and receiving tokens as they are generated.
//
//   embed MODEL.bin TOKENIZER.bin [PROMPT] [STEPS]
//
// Prints the text (greedy decoding) and, last, the token ids.
#include <kernels/backend.hpp>
#include <model/generate.hpp>
#include <model/transformer.hpp>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  using namespace cellshard;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.bin TOKENIZER.bin [PROMPT] [STEPS]\n", argv[0]);
    return 2;
  }
  auto file = model::model_file::open(argv[1]);
  if (!file) {
    std::fprintf(stderr, "error: %s\n", file.message().c_str());
    return 1;
  }
  auto tok = model::tokenizer::open(argv[2]);
  if (!tok) {
    std::fprintf(stderr, "error: %s\n", tok.message().c_str());
    return 1;
  }
  auto weights = model::shard_weights::make(*file, model::slice_spec::whole((*file)->cfg()));
  if (!weights) {
    std::fprintf(stderr, "error: %s\n", weights.message().c_str());
    return 1;
  }
  model::engine eng(*weights, *kernels::find_backend("blas"));
  model::generation_params params;
  params.prompt = argc > 3 ? argv[3] : "";
  params.steps = argc > 4 ? std::stoi(argv[4]) : 64;
  params.sampling.temperature = 0.0f;  // greedy: reproducible
  params = model::normalise(params, (*file)->cfg().seq_len);
  auto res = model::generate(
      [&](int token, int pos) -> result<const float*> { return eng.forward(token, pos); }, **tok,
      (*file)->cfg().vocab_size, params, [](int, const std::string& piece) {
        std::fputs(piece.c_str(), stdout);
        std::fflush(stdout);
      });
  if (!res) {
    std::fprintf(stderr, "error: %s\n", res.message().c_str());
    return 1;
  }
  std::printf("\nids: %s", model::format_ids(res->ids).c_str());
  return 0;
}
