#include "actors/session.hpp"

#include "actors/coordinator.hpp"
#include "actors/messages.hpp"
#include "model/checkpoint.hpp"
#include "model/generation.hpp"
#include "model/journal.hpp"
#include "supervision/checkpoint.hpp"

#include <caf/all.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>

namespace cellshard::actors {

namespace {

using clock_type = std::chrono::steady_clock;

struct session_state {
  session_spec spec;
  // What to compute next and what the logits mean: run.c's loop, shared
  // with model::generate (model/generation.hpp). Its step is the one in
  // flight (positions [pos, pos + n)) until its logits are accepted.
  std::optional<model::generation> gen;
  session_outcome out;
  uint32_t epoch = 0;
  uint64_t step_seq = 0;  // identifies the deadline of the step in flight
  int retries_left = 0;
  double ewma_step_ms = 0;
  double compute_ms_per_position = 0;  // measured (critical path), moving average
  uint64_t probing_seq = 0;            // the step whose probe is out (0: none)
  clock_type::time_point step_sent;
  int64_t compute_ns = 0;
  int64_t first_step_compute_ns = -1;  // -1: the first step's logits not in yet
  bool done = false;
  // Recovery:
  supervision::checkpoint_store store;  // KV deltas of every shard, off-node
  std::vector<int32_t> ckpt_end;        // per placement index
  std::vector<int32_t> trimmed;         // per stage: replay log trimmed below
  std::set<int> restarted;              // indices awaiting restore
  uint64_t recovery_seq = 0;
  std::string recovery_error;  // a restore that failed; final unless another restart comes
  bool recovering = false;
  recovery_record current;
  clock_type::time_point recovery_start;
  std::unique_ptr<model::journal_writer> journal;
  std::string journal_error;  // the first failed journal write: ends the session
  // The logits of the step in flight, joined from the last stage's vocabulary
  // slices (one per rank; issue #19): for (joined_epoch, joined_pos0), the
  // slice starts received so far and the rows they cover.
  std::vector<float> joined;
  std::set<int32_t> joined_slices;
  int joined_rows = 0;
  uint32_t joined_epoch = 0;
  int32_t joined_pos0 = -1;
  int64_t joined_compute_ns = 0;
  static inline const char* name = "cellshard.session";
};

using session_actor = caf::stateful_actor<session_state>;

double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

std::string key_of(int index) { return "shard-" + std::to_string(index); }

/// First position of the step in flight (the next to run when none is).
int pos_of(const session_state& st) { return st.gen ? st.gen->pos() : 0; }
/// Number of positions of the step in flight.
int inflight_count(const session_state& st) {
  return st.gen && !st.gen->done() ? static_cast<int>(st.gen->step().tokens.size()) : 1;
}

void finish(session_actor* self, bool ok, std::string error, bool cancelled = false) {
  auto& st = self->state;
  if (st.done) return;
  st.done = true;
  st.out.ok = ok;
  st.out.error = std::move(error);
  st.out.cancelled = cancelled;
  st.out.compute_ms = st.compute_ns / 1e6;
  st.out.first_step_compute_ms = std::max<int64_t>(0, st.first_step_compute_ns) / 1e6;
  if (st.gen) {  // duration and run.c's tokens/s, then the ids so far
    st.gen->end();
    st.out.result = std::move(st.gen->output());
  }
  for (auto& s : st.spec.shards)
    if (s) self->send(s, close_atom::value, st.spec.id);
  if (st.spec.coordinator) self->send(st.spec.coordinator, leave_atom::value, caf::actor{self});
  if (st.journal) {
    auto closed = st.journal->close();
    if (!closed && st.out.ok) {
      st.out.ok = false;
      st.out.error = closed.message();
    }
    st.journal.reset();
  }
  if (st.spec.on_done) st.spec.on_done(st.out);
  self->quit();
}

/// The deadline of the step in flight: 3 x its expected time (measured
/// compute per position x positions, plus the links' transfer time for its
/// bytes), a decode step also at least 10 x the moving average of recent
/// steps; never below step_timeout_min. Each re-send of the same step
/// doubles it; never above step_timeout. A step that is merely long does not
/// depend on this estimate: when the deadline passes, a probe that finds it
/// in progress extends it (see probe_step).
std::chrono::milliseconds deadline_of(const session_state& st, bool prefill) {
  std::chrono::milliseconds d = st.spec.step_timeout_min;
  const int n = std::max(1, inflight_count(st));
  double expected = st.compute_ms_per_position * n;
  if (st.spec.expected_transfer_ms) expected += st.spec.expected_transfer_ms(n);
  d = std::max(d, std::chrono::milliseconds(static_cast<int64_t>(3 * expected)));
  if (!prefill && st.ewma_step_ms > 0)
    d = std::max(d, std::chrono::milliseconds(static_cast<int64_t>(10 * st.ewma_step_ms)));
  const int resent = std::max(0, st.spec.max_retries - st.retries_left);
  for (int i = 0; i < resent && d < st.spec.step_timeout; ++i) d *= 2;
  return std::min(d, st.spec.step_timeout);
}

/// Sends the step in flight (positions [pos, pos + inflight.size())) and arms its deadline.
void send_step(session_actor* self) {
  auto& st = self->state;
  const model::generation_step& step = st.gen->step();
  forward_req req;
  req.id = step_id{st.spec.id, st.epoch, step.pos0, static_cast<int32_t>(step.tokens.size())};
  req.tokens.assign(step.tokens.begin(), step.tokens.end());
  req.reply_to = self;
  self->send(st.spec.entry, std::move(req));
  st.step_sent = clock_type::now();
  const uint64_t seq = ++st.step_seq;
  self->delayed_send(self, deadline_of(st, step.tokens.size() > 1), timeout_atom::value, seq);
}

/// What the session does with each token its generation emits: the journal
/// gets every one the resumed run had not written (stop tokens included),
/// the caller every one it has not seen yet (stop tokens are not printed).
void on_emitted(session_actor* self, const model::emitted_token& e) {
  auto& st = self->state;
  if (e.quiet) return;
  if (st.journal && st.journal_error.empty()) {
    auto r = st.journal->append({e.pos + 1, e.token, e.rng});  // ids[pos + 1]
    if (!r) st.journal_error = r.message();
  }
  if (!e.stop && st.spec.on_token) st.spec.on_token(e.token, e.piece);
}

void recover(session_actor* self);
void retry_step(session_actor* self, const std::string& why);

/// The deadline of step `seq` passed: ask every shard whether it works on
/// the step and when its last payload arrives. In progress (someone
/// computing, or a payload still crossing a link): wait another deadline --
/// a re-send would only start the same work again -- as long as the whole
/// wait stays under max_wait_factor x step_timeout. Otherwise -- a shard
/// that does not answer, or nobody has the step (a message was lost) --
/// re-send it.
void probe_step(session_actor* self, uint64_t seq) {
  auto& st = self->state;
  if (st.probing_seq == seq) return;
  st.probing_seq = seq;
  struct tally {
    int pending = 0;
    bool working = false;
    int64_t due = 0;
    std::string silent;  // shards that did not answer
  };
  auto t = std::make_shared<tally>();
  const uint32_t epoch = st.epoch;
  const int32_t pos0 = pos_of(st);
  auto decide = [self, seq, t] {
    auto& st = self->state;
    if (st.probing_seq == seq) st.probing_seq = 0;
    if (st.done || st.recovering || seq != st.step_seq) return;  // the step ended meanwhile
    const auto now = clock_type::now();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - st.step_sent);
    const bool in_transit = t->due > now.time_since_epoch().count();
    const auto limit = st.spec.step_timeout * st.spec.max_wait_factor;
    if (t->silent.empty() && (t->working || in_transit) && waited < limit) {
      ++st.out.extensions;
      self->delayed_send(self, std::min(deadline_of(st, inflight_count(st) > 1), limit - waited),
                         timeout_atom::value, seq);
      return;
    }
    std::string why = "no logits for position " + std::to_string(pos_of(st)) + " within " +
                      std::to_string(waited.count()) + " ms (";
    if (!t->silent.empty()) why += "no answer to the step probe from placement index " + t->silent + ")";
    else if (t->working || in_transit)
      why += "still in progress after " + std::to_string(st.spec.max_wait_factor) + " x --step-timeout-max)";
    else why += "lost: no shard works on the step and nothing is in transit)";
    st.out.resend_deadlines_ms.push_back(deadline_of(st, inflight_count(st) > 1).count());
    retry_step(self, why);
  };
  for (size_t i = 0; i < st.spec.shards.size(); ++i) {
    if (!st.spec.shards[i]) continue;
    ++t->pending;
    self->request(st.spec.shards[i], st.spec.probe_timeout, step_query_atom::value, st.spec.id, epoch, pos0)
        .then(
            [t, decide](int32_t working, int64_t due) {
              t->working = t->working || working != 0;
              t->due = std::max(t->due, due);
              if (--t->pending == 0) decide();
            },
            [t, decide, i](caf::error&) {
              t->silent += (t->silent.empty() ? "" : ", ") + std::to_string(i);
              if (--t->pending == 0) decide();
            });
  }
  if (t->pending == 0) decide();
}

/// Re-sends the step in flight in a new epoch (a payload was corrupted or a
/// message lost); past `max_retries` consecutive re-sends the session ends.
void retry_step(session_actor* self, const std::string& why) {
  auto& st = self->state;
  if (st.recovering) return;  // the recovery re-sends the step anyway
  if (st.retries_left <= 0) {
    finish(self, false, why + " (after " + std::to_string(st.spec.max_retries) + " re-sends)");
    return;
  }
  --st.retries_left;
  ++st.out.retries;
  if (!st.restarted.empty()) {
    // A recovery not confirmed by a token yet: what was lost may be its
    // replay (e.g. a partitioned shard dropped it), and re-sending the step
    // alone would run it over restored shards missing those positions.
    recover(self);
    return;
  }
  ++st.epoch;
  send_step(self);
}

// -- recovery ---------------------------------------------------------------------

void resend_inflight(session_actor* self) {
  auto& st = self->state;
  st.recovering = false;
  send_step(self);
}

/// Rebuilds positions [c, pos) in the restarted shards' stages: from the
/// upstream stage's replay log when one stage (not the first) is affected,
/// else from the token log through stages 0..last affected.
void replay(session_actor* self, int c) {
  auto& st = self->state;
  const int pos = pos_of(st);
  const int n = pos - c;
  st.current.restored_to = c;
  st.current.replayed_positions = n;
  if (n <= 0) {
    resend_inflight(self);
    return;
  }
  std::set<int> stages;
  for (int i : st.restarted) stages.insert(st.spec.stage_of[i]);
  const int last = *stages.rbegin();
  auto from_tokens = [self, c, last] {
    auto& st = self->state;
    forward_req req;
    const int pos = pos_of(st);
    req.id = step_id{st.spec.id, st.epoch, c, pos - c};
    const auto& ids = st.gen->output().ids;  // ids[p] is the token at position p
    req.tokens.assign(ids.begin() + c, ids.begin() + pos);
    req.reply_to = self;
    req.replay_until = last;
    self->send(st.spec.entry, std::move(req));
    st.current.from_upstream_log = false;
    resend_inflight(self);
  };
  if (stages.size() == 1 && last > 0) {
    const auto& head = st.spec.shards[st.spec.stages[last - 1].front()];
    const uint64_t seq = st.recovery_seq;
    self->request(head, st.spec.step_timeout, replay_atom::value, st.spec.id, st.epoch,
                  static_cast<int32_t>(c), static_cast<int32_t>(pos), static_cast<int32_t>(last))
        .then(
            [self, seq, from_tokens](bool ok) {
              if (self->state.done || seq != self->state.recovery_seq) return;
              if (!ok) {
                from_tokens();
                return;
              }
              self->state.current.from_upstream_log = true;
              resend_inflight(self);
            },
            [self, seq, from_tokens](caf::error&) {
              if (self->state.done || seq != self->state.recovery_seq) return;
              from_tokens();
            });
    return;
  }
  from_tokens();
}

/// True for an expert node of an expert placement (issue #23).
bool is_expert_node(const session_state& st, int index) {
  return index >= 0 && static_cast<size_t>(index) < st.spec.expert_node.size() &&
         st.spec.expert_node[static_cast<size_t>(index)] != 0;
}

/// Starts (or restarts) a recovery of every shard in st.restarted: new epoch,
/// restore each from its newest valid checkpoint, then replay and re-send.
void recover(session_actor* self) {
  auto& st = self->state;
  ++st.epoch;
  ++st.step_seq;  // the deadline of the abandoned step no longer applies
  const uint64_t seq = ++st.recovery_seq;
  st.recovering = true;
  st.recovery_start = clock_type::now();
  st.recovery_error.clear();
  st.current = recovery_record{};
  st.current.indices.assign(st.restarted.begin(), st.restarted.end());
  st.current.position = pos_of(st);
  auto pending = std::make_shared<int>(static_cast<int>(st.restarted.size()));
  auto c_min = std::make_shared<int>(pos_of(st));
  for (int i : st.restarted) {
    restore_req req;
    req.session = st.spec.id;
    req.epoch = st.epoch;
    auto chain = st.store.restore_deltas(key_of(i), 0, static_cast<uint64_t>(pos_of(st)));
    if (chain) {
      for (auto& part : chain->parts) {
        req.begins.push_back(static_cast<int32_t>(part.begin));
        req.ends.push_back(static_cast<int32_t>(part.end));
        blob b;
        b.data.resize(part.payload.size() / sizeof(float));
        std::memcpy(b.data.data(), part.payload.data(), b.data.size() * sizeof(float));
        req.parts.push_back(std::move(b));
      }
      if (!chain->stopped.empty()) st.current.checkpoint_note = key_of(i) + ": " + chain->stopped;
    }
    self->request(st.spec.shards[i], st.spec.step_timeout, std::move(req))
        .then(
            [self, seq, pending, c_min](restore_atom, int32_t end) {
              auto& st = self->state;
              if (st.done || seq != st.recovery_seq) return;
              *c_min = std::min(*c_min, static_cast<int>(end));
              if (--*pending == 0) replay(self, *c_min);
            },
            [self, seq, i](caf::error& e) {
              auto& st = self->state;
              if (st.done || seq != st.recovery_seq) return;
              // Often a second failure during this recovery (the shard died
              // or fell silent): its restart notice starts a new recovery.
              // If none comes within the deadline, this is the error.
              st.recovery_error = "recovery failed: placement index " + std::to_string(i) +
                                  " did not restore its KV cache: " + to_string(e);
              self->delayed_send(self, 2 * st.spec.step_timeout_min, timeout_atom::value, ++st.step_seq);
            });
  }
}

caf::behavior session_behavior(session_actor* self, session_spec spec) {
  auto& st = self->state;
  st.spec = std::move(spec);
  st.retries_left = st.spec.max_retries;
  st.ckpt_end.assign(st.spec.shards.size(), 0);
  st.trimmed.assign(st.spec.stages.size(), 0);
  if (st.spec.coordinator) self->send(st.spec.coordinator, join_atom::value, caf::actor{self});
  // The journal's header names the teacher-forced ids, so they come first.
  std::vector<int> forced = st.spec.resume_ids;
  if (forced.empty()) {
    auto encoded = model::prompt_ids(*st.spec.tok, st.spec.params);
    if (!encoded) {
      finish(self, false, encoded.message());
      return {};
    }
    forced = std::move(*encoded);
  }
  if (!st.spec.journal.empty()) {
    result<std::unique_ptr<model::journal_writer>> w = make_error("");
    if (st.spec.resumed_journal) {
      w = model::journal_writer::resume(st.spec.journal, *st.spec.resumed_journal);
    } else {
      model::journal_header h;
      h.steps = st.spec.params.steps;
      h.temperature = st.spec.params.sampling.temperature;
      h.topp = st.spec.params.sampling.topp;
      h.seed = st.spec.params.sampling.seed;
      h.model = st.spec.model_name;
      h.model_path = st.spec.model_path;
      h.model_digest = st.spec.model_digest;
      h.tokenizer = st.spec.tokenizer_name;
      h.tokenizer_path = st.spec.tokenizer_path;
      h.tokenizer_digest = st.spec.tokenizer_digest;
      h.prompt_tokens = forced;
      h.ctx = st.spec.ctx;
      w = model::journal_writer::create(st.spec.journal, h);
    }
    if (w) st.journal = std::move(*w);
    else st.journal_error = w.message();
  }
  // The prompt goes to the shards as position 0, then the rest of it in one
  // step (the shards prefill it in chunks of --batch-size), then one position
  // per step; with on_logits (--logits-out) one position per step throughout.
  model::generation_options opt;
  opt.every_logits = static_cast<bool>(st.spec.on_logits);
  opt.resume_ids = st.spec.resume_ids;
  opt.resume_rng = st.spec.resume_rng;
  opt.on_token = [self](const model::emitted_token& e) { on_emitted(self, e); };
  auto g = model::generation::start(*st.spec.tok, st.spec.vocab_size, st.spec.params, std::move(opt));
  if (!g) {
    finish(self, false, g.message());
    return {};
  }
  st.gen.emplace(std::move(*g));
  if (st.gen->done() || !st.journal_error.empty()) {
    // Every position is a prompt position (nothing to compute), or a journal
    // that cannot be written.
    self->send(self, timeout_atom::value, uint64_t{0});  // finishes below
  } else {
    send_step(self);
  }
  return {
      [=](logits_msg& m) {
        auto& st = self->state;
        if (st.done || st.recovering || m.id.epoch != st.epoch || m.id.pos0 != pos_of(st) ||
            m.id.count != inflight_count(st))
          return;  // stale
        if (!m.logits.ok()) {
          retry_step(self, "corrupt logits (checksum mismatch) for position " +
                               std::to_string(m.id.pos0 + m.id.count - 1));
          return;
        }
        const int64_t V = st.spec.vocab_size;
        const int64_t n = static_cast<int64_t>(m.logits.data.size());
        if (n == 0 || m.vocab_begin < 0 || m.vocab_begin + n > V) {
          retry_step(self, "logits for ids [" + std::to_string(m.vocab_begin) + "," +
                               std::to_string(m.vocab_begin + n) + ") of position " +
                               std::to_string(m.id.pos0 + m.id.count - 1) + ": outside the vocabulary of " +
                               std::to_string(V));
          return;
        }
        if (n != V) {
          // One slice of several: join them in id order; go on when all are in.
          if (st.joined_epoch != m.id.epoch || st.joined_pos0 != m.id.pos0) {
            st.joined.assign(static_cast<size_t>(V), 0.0f);
            st.joined_slices.clear();
            st.joined_rows = 0;
            st.joined_epoch = m.id.epoch;
            st.joined_pos0 = m.id.pos0;
            st.joined_compute_ns = 0;
          }
          if (!st.joined_slices.insert(m.vocab_begin).second) return;  // a duplicate
          std::copy(m.logits.data.begin(), m.logits.data.end(), st.joined.begin() + m.vocab_begin);
          st.joined_rows += static_cast<int>(n);
          st.joined_compute_ns = std::max(st.joined_compute_ns, m.compute_ns);
          if (st.joined_rows < V) return;
          st.joined_pos0 = -1;
          m.logits.data.swap(st.joined);
          m.compute_ns = st.joined_compute_ns;
        }
        const double step_ms = ms_since(st.step_sent);
        if (m.id.count == 1) st.ewma_step_ms = st.ewma_step_ms <= 0 ? step_ms : 0.8 * st.ewma_step_ms + 0.2 * step_ms;
        if (m.compute_ns > 0) {
          const double per = m.compute_ns / 1e6 / m.id.count;
          st.compute_ms_per_position =
              st.compute_ms_per_position <= 0 ? per : 0.8 * st.compute_ms_per_position + 0.2 * per;
        }
        st.compute_ns += m.compute_ns;
        if (st.first_step_compute_ns < 0) st.first_step_compute_ns = m.compute_ns;
        if (st.spec.on_logits) st.spec.on_logits(m.id.pos0 + m.id.count - 1, m.logits.data.data());
        st.retries_left = st.spec.max_retries;
        st.gen->complete(m.logits.data.data());  // emits the step's next tokens
        if (!st.journal_error.empty()) {
          finish(self, false, st.journal_error);
          return;
        }
        if (!st.current.indices.empty()) {  // the first step delivered after a recovery
          st.current.recover_ms = ms_since(st.recovery_start);
          st.out.recoveries.push_back(st.current);
          if (st.spec.coordinator)
            for (int i : st.current.indices)
              self->send(st.spec.coordinator, recovered_atom::value, static_cast<int32_t>(i),
                         static_cast<int32_t>(st.current.replayed_positions),
                         clock_type::now().time_since_epoch().count());
          st.current = recovery_record{};
          st.restarted.clear();
        }
        if (st.gen->done()) {
          finish(self, true, "");
          return;
        }
        send_step(self);
      },
      // A checkpoint delta of one shard: kept here, off that shard's node.
      [=](kv_delta& d) {
        auto& st = self->state;
        if (st.done || d.index < 0 || static_cast<size_t>(d.index) >= st.ckpt_end.size()) return;
        if (!d.rows.ok()) return;  // a corrupt delta is not stored: the chain ends before it
        supervision::bytes b(d.rows.data.size() * sizeof(float));
        std::memcpy(b.data(), d.rows.data.data(), b.size());
        if (!st.store.append_delta(key_of(d.index), d.begin, d.end, b)) return;
        if (d.index == st.spec.corrupt_checkpoints_of) {  // test hook
          const auto name = supervision::checkpoint_store::delta_name(key_of(d.index), d.begin, d.end);
          auto stored = st.store.backend().get(name);
          if (stored && !stored->empty()) {
            (*stored)[stored->size() / 2] ^= 0x5a;
            st.store.backend().put(name, *stored);
          }
        }
        st.ckpt_end[d.index] = d.end;
        // Every rank of the stage has checkpointed up to c: the upstream
        // stage's replay log is no longer needed below c.
        const int s = st.spec.stage_of[d.index];
        int c = d.end;
        for (int i : st.spec.stages[s])
          if (!is_expert_node(st, i)) c = std::min(c, st.ckpt_end[i]);
        if (s > 0 && c > st.trimmed[s]) {
          st.trimmed[s] = c;
          self->send(st.spec.shards[st.spec.stages[s - 1].front()], trim_atom::value, st.spec.id,
                     static_cast<int32_t>(c));
        }
      },
      [=](shard_restarted& r) {
        auto& st = self->state;
        if (st.done || r.index < 0 || static_cast<size_t>(r.index) >= st.spec.shards.size()) return;
        st.spec.shards[r.index] = r.handle;
        st.spec.entry = r.entry;
        st.restarted.insert(r.index);
        if (r.remaining > 0) return;  // the rest of the batch first: one recovery for all
        if (st.gen->done()) return;  // nothing in flight
        // Expert nodes hold no session state: nothing to restore or replay
        // (their stage shard re-sends what it had in flight there, or a
        // replica took it). Recorded as recovered with the next token.
        std::vector<int> experts;
        for (auto it = st.restarted.begin(); it != st.restarted.end();)
          if (is_expert_node(st, *it)) {
            experts.push_back(*it);
            it = st.restarted.erase(it);
          } else {
            ++it;
          }
        if (!st.restarted.empty()) {
          recover(self);
        } else if (st.current.indices.empty()) {
          st.current = recovery_record{};
          st.current.position = pos_of(st);
          st.recovery_start = clock_type::now();
        }
        for (int i : experts)
          if (std::find(st.current.indices.begin(), st.current.indices.end(), i) == st.current.indices.end())
            st.current.indices.push_back(i);
      },
      [=](cluster_failed& f) { finish(self, false, f.message); },
      [=](shard_error& e) {
        auto& st = self->state;
        if (st.done || e.id.session != st.spec.id) return;
        if (e.retry) {
          if (e.id.epoch == st.epoch) retry_step(self, e.message);  // else: already re-sent
          return;
        }
        finish(self, false, e.message);
      },
      [=](timeout_atom, uint64_t seq) {
        auto& st = self->state;
        if (st.done) return;
        if (seq == 0) {  // the all-prompt case, or a journal that cannot be written
          finish(self, st.journal_error.empty(), st.journal_error);
          return;
        }
        if (seq != st.step_seq) return;  // a past step's deadline
        // A long step, a slow link, a lost message or a fault not (yet)
        // detected: the probe tells them apart; a re-send (new epoch, the
        // old one's messages dropped on arrival) only for the last two.
        const auto waited = deadline_of(st, inflight_count(st) > 1);
        if (st.recovering) {
          finish(self, false,
                 !st.recovery_error.empty()
                     ? st.recovery_error
                     : "recovery of position " + std::to_string(pos_of(st)) + " did not finish within " +
                           std::to_string(waited.count()) + " ms");
          return;
        }
        probe_step(self, seq);
      },
      [=](cancel_atom) { finish(self, false, "cancelled", true); },
  };
}

}  // namespace

caf::actor spawn_session(caf::actor_system& sys, session_spec spec) {
  return sys.spawn(session_behavior, std::move(spec));
}

}  // namespace cellshard::actors
