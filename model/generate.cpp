#include "model/generate.hpp"

#include "model/generation.hpp"

#include "base/parse.hpp"

#include <algorithm>
#include <ctime>
#include <sstream>
#include <vector>

namespace cellshard::model {

generation_params normalise(generation_params p, int seq_len) {
  if (p.sampling.temperature < 0.0f) p.sampling.temperature = 0.0f;
  if (p.sampling.topp < 0.0f || p.sampling.topp > 1.0f) p.sampling.topp = 0.9f;
  if (p.steps <= 0 || p.steps > seq_len) p.steps = seq_len;
  if (p.sampling.seed == 0) p.sampling.seed = static_cast<unsigned int>(std::time(nullptr));
  return p;
}

result<std::vector<int>> prompt_ids(const tokenizer& tok, const generation_params& params) {
  std::vector<int> ids = tok.encode(params.prompt, params.add_bos, false);
  if (ids.empty())
    return make_error("the prompt encodes to no tokens and tokenizer " + tok.name() +
                      " adds no BOS: give a prompt (-i TEXT)");
  return ids;
}

result<generation_result> generate(const forward_fn& forward, const tokenizer& tok,
                                   int vocab_size, const generation_params& params,
                                   const piece_fn& on_piece, const logits_fn& on_logits,
                                   const prefill_fn& prefill) {
  // The loop itself is model::generation's (model/generation.hpp), shared
  // with the session actor of a cluster; here every step is computed in turn.
  generation_options opt;
  opt.every_logits = static_cast<bool>(on_logits);
  opt.max_prompt_positions = prefill ? 0 : 1;
  if (on_piece)
    opt.on_token = [&on_piece](const emitted_token& e) {
      if (!e.stop) on_piece(e.token, e.piece);
    };
  auto g = generation::start(tok, vocab_size, params, std::move(opt));
  if (!g) return g.err();
  std::vector<float> logits(static_cast<size_t>(vocab_size));
  while (!g->done()) {
    const generation_step& s = g->step();
    const int n = static_cast<int>(s.tokens.size());
    result<const float*> l = n == 1 ? forward(s.tokens[0], s.pos0) : prefill(s.tokens.data(), n, s.pos0);
    if (!l) return l.err();
    if (on_logits) on_logits(s.pos0 + n - 1, *l);
    std::copy(*l, *l + vocab_size, logits.begin());
    g->complete(logits.data());
  }
  g->end();
  return std::move(g->output());
}

std::string format_ids(const std::vector<int>& ids) {
  std::ostringstream os;
  for (size_t i = 0; i < ids.size(); ++i) os << (i ? "," : "") << ids[i];
  os << "\n";
  return os.str();
}

result<std::vector<int>> parse_ids(const std::string& text, const std::string& name) {
  std::vector<int> ids;
  std::istringstream in(text);
  std::string tok;
  int n = 0;
  auto space = [](char c) { return c == '\n' || c == '\r' || c == ' ' || c == '\t'; };
  while (std::getline(in, tok, ',')) {
    while (!tok.empty() && space(tok.back())) tok.pop_back();
    size_t lead = 0;
    while (lead < tok.size() && space(tok[lead])) ++lead;
    tok.erase(0, lead);
    if (tok.empty() && in.eof()) break;
    const auto id = parse_uint<int>(tok);  // base/parse.hpp
    if (!id)
      return make_error(error_code::bad_format, name + ": entry " + std::to_string(n) + " is '" + tok +
                                                    "', expected a token id (an integer from 0 to 2147483647)");
    ids.push_back(*id);
    ++n;
  }
  if (ids.empty()) return make_error(error_code::bad_format, name + ": no token ids");
  return ids;
}

}  // namespace cellshard::model
