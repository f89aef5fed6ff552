// `cellshard quantize [--type f16|bf16|q8_0|q4_0|q4_k|q6_k] [--pure] IN OUT`:
// a GGUF input gives a GGUF output with its weight matrices in the chosen
// type (the classifier as llama-quantize picks it unless --pure); an f32
// llama2.c checkpoint gives the q8_0 ("CSQ8") file of model/quant.hpp
// (docs/formats.md).
#include "kernels/types.hpp"
#include "model/checkpoint.hpp"
#include "model/gguf_model.hpp"
#include "model/quant.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <memory>
#include <utility>
#include <sys/stat.h>

namespace cellshard::tools {

void add_quantize(CLI::App& app, int& status) {
  struct opts {
    std::string in, out, json_out, type = "q8_0";
    bool pure = false;
  };
  auto o = std::make_shared<opts>();
  auto* cmd = app.add_subcommand(
      "quantize",
      "write a quantized model: GGUF in -> GGUF out (f16, bf16, q8_0, q4_0, q4_k, q6_k); llama2.c .bin -> q8_0 CSQ8");
  cmd->add_option("IN", o->in, "GGUF model, or f32 llama2.c checkpoint (.bin)")->required();
  cmd->add_option("OUT", o->out, "file to write (run it with -m OUT); must differ from IN")->required();
  cmd->add_option("--type", o->type,
                  "f16|bf16|q8_0|q4_0|q4_k|q6_k: type of the weight matrices (norms and other 1-D tensors stay "
                  "F32; q4_k and q6_k need rows that are a multiple of 256; all but q8_0 need a GGUF input)")
      ->transform(CLI::IsMember({"f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k"}, CLI::ignore_case))
      ->capture_default_str();
  cmd->add_flag("--pure", o->pure,
                "the classifier too in --type (default: as llama-quantize, q6_K for q4_0/q4_k/q6_k when its rows "
                "are a multiple of 256, else q8_0)");
  cmd->add_option("--json", o->json_out, "summary JSON to FILE (- = stdout)");
  cmd->callback([o, &status] {
    // Writing OUT over IN would destroy the input while it is still being read.
    struct stat si, so;
    if (o->in == o->out || (::stat(o->in.c_str(), &si) == 0 && ::stat(o->out.c_str(), &so) == 0 &&
                            si.st_dev == so.st_dev && si.st_ino == so.st_ino))
      throw cli_error("quantize: OUT '" + o->out + "' is the input file '" + o->in +
                          "'; expected another path (the input would be overwritten while it is read)",
                      2);
    const auto t0 = std::chrono::steady_clock::now();
    auto in = model::model_file::open(o->in);
    if (!in) throw cli_error(in.message());
    result<uint64_t> n = make_error("not written");
    if ((*in)->gguf()) {
      model::quantize_options q;
      q.pure = o->pure;
      const std::pair<const char*, kernels::dtype> names[] = {
          {"f16", kernels::dtype::f16},   {"bf16", kernels::dtype::bf16}, {"q8_0", kernels::dtype::q8_0},
          {"q4_0", kernels::dtype::q4_0}, {"q4_k", kernels::dtype::q4_k}, {"q6_k", kernels::dtype::q6_k}};
      for (const auto& n : names)
        if (o->type == n.first) q.type = n.second;
      // llama-quantize refuses a quantized input without --allow-requantize;
      // here it runs, but the loss compounds: say so (F16/BF16 inputs are the usual source).
      if ((*in)->has_non_f32()) {
        const kernels::dtype stored = (*in)->typed_layer(0).wq.type;
        if (stored != kernels::dtype::f32 && stored != kernels::dtype::f16 && stored != kernels::dtype::bf16)
          std::fprintf(stderr,
                       "note: %s stores %s matrices: they are dequantized and quantized again to %s, which loses "
                       "more than quantizing the F32/F16 original (llama-quantize refuses this without "
                       "--allow-requantize)\n",
                       o->in.c_str(), kernels::to_string(stored), o->type.c_str());
      }
      auto img = model::quantize_gguf(**in, q);
      if (!img) throw cli_error(img.message());
      std::ofstream f(o->out, std::ios::binary);
      f.write(reinterpret_cast<const char*>(img->data()), static_cast<std::streamsize>(img->size()));
      f.close();  // the last bytes reach the file here
      if (!f) throw cli_error(o->out + ": write failed: " + std::strerror(errno));
      n = static_cast<uint64_t>(img->size());
    } else {
      if (o->type != "q8_0")
        throw cli_error("quantize: --type " + o->type + " needs a GGUF input; " + o->in +
                        " is a llama2.c checkpoint (q8_0 only, written as CSQ8)", 2);
      n = model::quantize_to_file(**in, o->out);
    }
    if (!n) throw cli_error(n.message());
    // Read it back: the loader's checks (size, header, digest) on the result.
    auto back = model::model_file::open(o->out);
    if (!back) throw cli_error("wrote " + o->out + " but it does not load: " + back.message());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto& c = (*in)->cfg();
    std::fprintf(stderr, "wrote %s: %s, %s, %.2f MiB (input %.2f MiB, %.2fx smaller), %.2f s\n",
                 o->out.c_str(), o->type.c_str(), c.to_string().c_str(), *n / 1048576.0, (*in)->file_bytes() / 1048576.0,
                 static_cast<double>((*in)->file_bytes()) / static_cast<double>(*n), s);
    if (!o->json_out.empty()) {
      nlohmann::json j = {{"input", o->in},       {"output", o->out},          {"format", (*in)->gguf() ? "gguf " + o->type : std::string("q8_0")},
                          {"input_bytes", (*in)->file_bytes()}, {"output_bytes", *n},
                          {"digest", model::format_digest((*back)->digest())},    {"seconds", s}};
      write_text(o->json_out, j.dump(2) + "\n");
    }
    status = 0;
  });
}

}  // namespace cellshard::tools
