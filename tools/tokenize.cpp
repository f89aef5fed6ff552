// `cellshard tokenize`: text -> token ids (as llama.cpp's llama-tokenize with
// its ids output), or ids -> text with --decode. Loads only the tokenizer: a
// vocabulary-only GGUF works, as does a llama2.c model with -z.
#include "base/parse.hpp"
#include "model/bundle.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <sstream>

namespace cellshard::tools {

namespace {

struct tokenize_opts {
  std::string model, tokenizer, prompt, decode, json_out;
  bool no_bos = false, no_parse_special = false;
};

std::shared_ptr<const model::tokenizer> open_tokenizer(const tokenize_opts& o) {
  if (o.model.empty() && o.tokenizer.empty()) return load_model("", "").tok;  // the default model's
  const bool gguf = model::is_gguf_path(o.model) || model::gguf::file::named_gguf(o.model);
  if (!o.model.empty() && (!gguf || !o.tokenizer.empty())) {
    // A llama2.c model, or a GGUF given another tokenizer with -z: the tokenizer
    // (-z, or tokenizer.bin beside a .bin) is checked against the model's
    // vocabulary, as run does; a tokenizer of 32000 tokens beside
    // stories260K.bin used to print ids the model does not have. A GGUF alone
    // (vocabulary-only too) reads just its own tokenizer keys.
    auto b = model::load_bundle(o.model, o.tokenizer);
    if (!b) throw cli_error(b.message());
    return b->tok;
  }
  std::string tp = o.tokenizer;
  if (tp.empty()) {
    // A name that says GGUF counts too: an empty or truncated download then
    // gets GGUF's error, not "tokenizer.bin is missing" beside it.
    if (gguf) {
      tp = o.model;
    } else {
      const auto slash = o.model.rfind('/');
      tp = (slash == std::string::npos ? std::string(".") : o.model.substr(0, slash)) + "/tokenizer.bin";
    }
  }
  auto t = model::tokenizer::open(tp);
  if (!t) throw cli_error(t.message());
  return *t;
}

int do_tokenize(const tokenize_opts& o, bool have_prompt, bool have_decode) {
  if (have_prompt == have_decode)
    throw cli_error("tokenize: give either -i TEXT (encode) or --decode \"ID ID ...\" (decode)", 2);
  auto tok = open_tokenizer(o);
  if (have_prompt) {
    const auto ids = tok->encode(o.prompt, !o.no_bos, false, !o.no_parse_special);
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
    std::printf("%s\n", line.c_str());
    if (!o.json_out.empty())
      write_text(o.json_out, nlohmann::json{{"tokenizer", tok->name()}, {"text", o.prompt}, {"ids", ids}}
                                 .dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    return 0;
  }
  std::istringstream in(o.decode);
  std::string item;
  std::vector<int> ids;
  int n = 0;
  while (in >> item) {
    for (char& c : item)
      if (c == ',') c = ' ';
    std::istringstream parts(item);
    std::string part;
    while (parts >> part) {
      const auto v = parse_uint<int>(part);  // base/parse.hpp
      if (!v || *v >= tok->vocab_size())
        throw cli_error("--decode: entry " + std::to_string(n) + " is '" + part + "', expected a token id in 0.." +
                            std::to_string(tok->vocab_size() - 1) + " (" + tok->name() + ")",
                        2);
      ids.push_back(*v);
      ++n;
    }
  }
  if (ids.empty()) throw cli_error("--decode: no token ids", 2);
  std::string text;
  int prev = -1;
  for (int id : ids) {
    // llama2.c files have no token types: their BOS and EOS pieces ("\n<s>\n")
    // are control tokens all the same, and print nothing (as in generation).
    const bool control = tok->kind() == model::tokenizer_kind::llama2c && (id == tok->bos() || id == tok->eos());
    if (!control) text += tok->decode(prev, id);
    prev = id;
  }
  std::printf("%s\n", text.c_str());
  if (!o.json_out.empty()) {
    // The text as JSON: bytes that are no UTF-8 become U+FFFD (a token may be part of a character).
    write_text(o.json_out, nlohmann::json{{"tokenizer", tok->name()}, {"ids", ids}, {"text", text}}
                               .dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
  return 0;
}

}  // namespace

void add_tokenize(CLI::App& app, int& status) {
  auto o = std::make_shared<tokenize_opts>();
  auto* cmd = app.add_subcommand("tokenize", "text to token ids (or ids to text with --decode)");
  cmd->add_option("-m,--model", o->model,
                  "model whose tokenizer to use: a GGUF (a vocabulary-only one works) or a llama2.c .bin "
                  "(then -z, default tokenizer.bin beside it)");
  cmd->add_option("-z,--tokenizer", o->tokenizer, "tokenizer file (llama2.c tokenizer.bin, or a GGUF)");
  auto* prompt = cmd->add_option("-i,--prompt", o->prompt, "text to encode; prints the ids on one line");
  cmd->add_flag("--no-bos", o->no_bos, "leave out BOS even when the model adds one");
  cmd->add_flag("--no-parse-special", o->no_parse_special,
                "GGUF: encode special tokens written in the text as plain text");
  auto* decode = cmd->add_option("--decode", o->decode, "\"ID ID ...\": print the text of these ids");
  cmd->add_option("--json", o->json_out, "{tokenizer, text, ids} to FILE (- = stdout)");
  cmd->callback([o, prompt, decode, &status] { status = do_tokenize(*o, prompt->count() > 0, decode->count() > 0); });
}

}  // namespace cellshard::tools
