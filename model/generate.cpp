#include "model/generate.hpp"

#include "base/parse.hpp"

#include <algorithm>
#include <chrono>
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
  using clock = std::chrono::steady_clock;
  generation_result out;
  auto encoded = prompt_ids(tok, params);
  if (!encoded) return encoded.err();
  const std::vector<int> prompt = std::move(*encoded);
  out.prompt_tokens = static_cast<int>(prompt.size());
  sampler smp(vocab_size, params.sampling);
  std::vector<float> logits(vocab_size);
  const auto t0 = clock::now();
  auto last = t0;
  clock::time_point first{};
  bool have_sampled = false;
  int token = prompt[0];
  out.ids.push_back(token);
  int pos = 0;
  // Positions [1, batched_end) come from one prefill call (their logits are
  // not looked at except the last one's, which samples when it ends the prompt).
  const int batched_end =
      prefill && !on_logits ? std::min(static_cast<int>(prompt.size()), params.steps) : 0;
  const float* prefilled = nullptr;
  while (pos < params.steps) {
    result<const float*> l = prefilled;
    if (pos >= 1 && pos < batched_end) {
      if (!prefilled) {
        l = prefill(prompt.data() + 1, batched_end - 1, 1);
        if (!l) return l.err();
        prefilled = *l;
      }
    } else {
      l = forward(token, pos);
    }
    if (!l) return l.err();
    if (on_logits) on_logits(pos, *l);
    int next;
    const bool sampled = pos >= static_cast<int>(prompt.size()) - 1;
    if (!sampled) {
      next = prompt[pos + 1];
    } else {
      std::copy(*l, *l + vocab_size, logits.begin());
      next = smp.sample(logits.data());
    }
    ++pos;
    out.ids.push_back(next);
    const auto now = clock::now();
    // TPOT: the time of each output token after the first (decode steps;
    // prompt positions are prefill, part of TTFT).
    if (sampled && have_sampled) out.step_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
    if (sampled && !have_sampled) {  // TTFT: start -> the first sampled token
      have_sampled = true;
      out.ttft_ms = std::chrono::duration<double, std::milli>(now - t0).count();
    }
    if (!params.ignore_eos && tok.is_stop(next)) break;
    const std::string piece = tok.decode(token, next);
    out.text += piece;
    if (on_piece) on_piece(next, piece);
    token = next;
    if (first == clock::time_point{}) first = now;
  }
  const auto end = clock::now();
  out.duration_ms = std::chrono::duration<double, std::milli>(end - t0).count();
  if (pos > 1 && first != clock::time_point{}) {
    const double s = std::chrono::duration<double>(end - first).count();
    out.tokens_per_s = s > 0 ? (pos - 1) / s : 0;
  }
  return out;
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
