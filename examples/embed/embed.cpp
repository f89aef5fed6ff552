// examples/embed/embed.cpp: generate text through cellshard's public API on a
// single node in this process. Shows: options, hosts::in_process, the token
// callback, and result<> errors.
//
//   embed MODEL.bin TOKENIZER.bin [PROMPT] [STEPS]
//
// Prints the text (greedy decoding) and, last, the token ids.
#include <cellshard/cluster.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.bin TOKENIZER.bin [PROMPT] [STEPS]\n", argv[0]);
    return 2;
  }
  cellshard::cluster_options opts;
  opts.model_path = argv[1];
  opts.tokenizer_path = argv[2];
  auto c = cellshard::cluster::start(opts, cellshard::hosts::in_process(1));
  if (!c) {
    std::fprintf(stderr, "error (%s): %s\n", cellshard::error_code_name(c.code()), c.message().c_str());
    return 1;
  }
  cellshard::generation_request req;
  req.prompt = argc > 3 ? argv[3] : "";
  req.steps = argc > 4 ? std::atoi(argv[4]) : 64;
  req.temperature = 0.0f;  // greedy: reproducible
  auto g = (*c)->generate(req, [](int, std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;  // false would cancel
  });
  if (!g) {
    std::fprintf(stderr, "\nerror (%s) after %zu tokens: %s\n", cellshard::error_code_name(g.code()),
                 g.err().partial.ids.size(), g.message().c_str());
    return 1;
  }
  std::printf("\nids: ");
  for (size_t i = 0; i < g->ids.size(); ++i) std::printf(i ? ",%d" : "%d", g->ids[i]);
  std::printf("\n");
  return 0;
}
