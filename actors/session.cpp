#include "actors/session.hpp"

#include "actors/messages.hpp"

#include <caf/all.hpp>

namespace cellshard::actors {

namespace {

using clock_type = std::chrono::steady_clock;

struct session_state {
  session_spec spec;
  std::vector<int> prompt;
  std::unique_ptr<model::sampler> smp;
  session_outcome out;
  int token = 0;    // the token at position pos
  int pos = 0;      // next position to run
  uint32_t epoch = 0;
  uint64_t step_seq = 0;  // identifies the deadline of the step in flight
  clock_type::time_point t0, last, first;
  bool have_first = false;
  int64_t compute_ns = 0;
  bool done = false;
  static inline const char* name = "cellshard.session";
};

using session_actor = caf::stateful_actor<session_state>;

double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

void finish(session_actor* self, bool ok, std::string error, bool cancelled = false) {
  auto& st = self->state;
  if (st.done) return;
  st.done = true;
  st.out.ok = ok;
  st.out.error = std::move(error);
  st.out.cancelled = cancelled;
  st.out.compute_ms = st.compute_ns / 1e6;
  auto& r = st.out.result;
  r.duration_ms = ms_since(st.t0);
  if (st.have_first && st.pos > 1) {
    const double s = std::chrono::duration<double>(clock_type::now() - st.first).count();
    r.tokens_per_s = s > 0 ? (st.pos - 1) / s : 0;
  }
  for (auto& s : st.spec.shards) self->send(s, close_atom::value, st.spec.id);
  if (st.spec.on_done) st.spec.on_done(st.out);
  self->quit();
}

/// Sends positions [pos, pos + count) and arms the step's deadline.
void send_step(session_actor* self, std::vector<int32_t> tokens) {
  auto& st = self->state;
  forward_req req;
  req.id = step_id{st.spec.id, st.epoch, st.pos, static_cast<int32_t>(tokens.size())};
  req.tokens = std::move(tokens);
  req.reply_to = self;
  self->send(st.spec.entry, std::move(req));
  const uint64_t seq = ++st.step_seq;
  self->delayed_send(self, st.spec.step_timeout, timeout_atom::value, seq);
}

void emit(session_actor* self, int next) {
  auto& st = self->state;
  auto& r = st.out.result;
  r.ids.push_back(next);
  const auto now = clock_type::now();
  if (r.ids.size() > 2) r.step_ms.push_back(std::chrono::duration<double, std::milli>(now - st.last).count());
  st.last = now;
  if (next == model::bos_id) return;
  const std::string piece = st.spec.tok->decode(st.token, next);
  r.text += piece;
  if (st.spec.on_token) st.spec.on_token(next, piece);
  st.token = next;
  if (!st.have_first) {
    st.have_first = true;
    st.first = now;
    r.ttft_ms = std::chrono::duration<double, std::milli>(now - st.t0).count();
  }
}

caf::behavior session_behavior(session_actor* self, session_spec spec) {
  auto& st = self->state;
  st.spec = std::move(spec);
  st.prompt = st.spec.tok->encode(st.spec.params.prompt, true, false);
  st.smp = std::make_unique<model::sampler>(st.spec.vocab_size, st.spec.params.sampling);
  st.out.result.prompt_tokens = static_cast<int>(st.prompt.size());
  st.t0 = st.last = clock_type::now();
  st.token = st.prompt[0];
  st.out.result.ids.push_back(st.token);
  // Prompt positions need no sampling: their next token is the prompt's. Emit
  // them as run.c prints them, then prefill them in one batch whose last
  // position's logits give the first sampled token.
  const int steps = st.spec.params.steps;
  const int n_prompt = static_cast<int>(st.prompt.size());
  const int batch = std::min(n_prompt, steps);
  for (int p = 0; p + 1 < n_prompt && p < steps; ++p) emit(self, st.prompt[p + 1]);
  if (n_prompt > steps) {
    // Every position is a prompt position: nothing to compute.
    st.pos = steps;
    self->send(self, timeout_atom::value, uint64_t{0});  // finishes below
  } else {
    st.token = st.prompt[0];
    std::vector<int32_t> toks(st.prompt.begin(), st.prompt.begin() + batch);
    st.token = st.prompt[batch - 1];
    send_step(self, std::move(toks));
  }
  return {
      [=](logits_msg& m) {
        auto& st = self->state;
        if (st.done || m.id.epoch != st.epoch || m.id.pos0 != st.pos) return;  // stale
        if (!m.logits.ok() || m.logits.data.size() != static_cast<size_t>(st.spec.vocab_size)) {
          finish(self, false, "corrupt logits for position " + std::to_string(m.id.pos0 + m.id.count - 1));
          return;
        }
        st.compute_ns += m.compute_ns;
        st.pos += m.id.count;
        const int next = st.smp->sample(m.logits.data.data());
        emit(self, next);
        if (next == model::bos_id || st.pos >= st.spec.params.steps) {
          finish(self, true, "");
          return;
        }
        send_step(self, {next});
      },
      [=](shard_error& e) {
        if (self->state.done || e.id.session != self->state.spec.id) return;
        finish(self, false, e.message);
      },
      [=](timeout_atom, uint64_t seq) {
        auto& st = self->state;
        if (st.done) return;
        if (seq == 0) {  // the all-prompt case
          finish(self, true, "");
          return;
        }
        if (seq != st.step_seq) return;  // a past step's deadline
        finish(self, false,
               "no logits for position " + std::to_string(st.pos) + " within " +
                   std::to_string(st.spec.step_timeout.count()) + " ms (deadline of the step)");
      },
      [=](cancel_atom) { finish(self, false, "cancelled", true); },
  };
}

}  // namespace

caf::actor spawn_session(caf::actor_system& sys, session_spec spec) {
  return sys.spawn(session_behavior, std::move(spec));
}

}  // namespace cellshard::actors
