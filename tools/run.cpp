// `cellshard run`: generate text. Text streams to stdout exactly as llama2.c's
// run.c prints it; "achieved tok/s" goes to stderr.
#include "actors/cluster.hpp"
#include "actors/remote.hpp"
#include "actors/run_report.hpp"
#include "kernels/backend.hpp"
#include "kernels/pool.hpp"
#include "kernels/spe.hpp"
#include "supervision/fault_plan.hpp"
#include "model/bundle.hpp"
#include "model/chat.hpp"
#include "model/generate.hpp"
#include "model/journal.hpp"
#include "model/gguf.hpp"
#include "model/transformer.hpp"
#include "topologies/placement.hpp"
#include "topologies/profile.hpp"
#include "tools/cluster_flags.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"
#include "tools/sampling_flags.hpp"
#include "base/percentile.hpp"
#include "base/parse.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/stat.h>
#include <unistd.h>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <sstream>

namespace cellshard::tools {

namespace {

struct run_opts {
  cluster_flags cf;  // kernels, weights, threads, nodes, daemons, faults, deadlines (shared with serve)
  std::string model, tokenizer, prompt;
  int steps = 256;
  float temperature = 1.0f, topp = 0.9f;
  unsigned long long seed = 0;
  std::string ids_out, expect_ids, json_out;
  bool quiet = false;
  int batch = 1;  // concurrent identical requests (selects the actor runtime)
  bool demo = false;  // `run` without -m and without nodes: the demo
  std::string journal, resume;  // issue #7
  std::string expect_digest;    // XXH64 of the model file, as model::format_digest prints it
  // Which of -n/-t/-p/-s/-i the command line gave (a resume refuses conflicting ones only).
  bool steps_given = false, temperature_given = false, topp_given = false, seed_given = false,
       prompt_given = false;
  // Issue #16: stop rule, logits, chat.
  bool ignore_eos = false;
  std::string logits_out;
  bool chat = false;
  std::string system, chat_format;
};

/// The prompt text run feeds: -i as is, or with --chat the messages (system,
/// then -i as the first user turn) in the chat format of --chat-format, else
/// the one the GGUF's tokenizer.chat_template names, else contents joined.
/// Sets gp.prompt and gp.add_bos; returns the format's name ("" without --chat).
std::string chat_prompt(const run_opts& o, const std::string& model_path, model::generation_params& gp) {
  if (!o.chat) {
    if (!o.system.empty() || !o.chat_format.empty())
      throw cli_error("--system and --chat-format shape a chat prompt: they need --chat", 2);
    return "";
  }
  auto fr = model::chat::format_for(o.chat_format, model_path);
  if (!fr) throw cli_error(o.chat_format.empty() ? fr.message() : "--chat-format: " + fr.message(),
                           o.chat_format.empty() ? 1 : 2);
  const model::chat::format f = *fr;
  std::vector<model::chat::message> msgs;
  if (!o.system.empty()) msgs.push_back({"system", o.system});
  msgs.push_back({"user", o.prompt});
  auto p = model::chat::apply(f, msgs);
  if (!p) throw cli_error(p.message(), 2);
  gp.prompt = p->text;
  gp.add_bos = p->add_bos;
  return model::chat::to_string(f);
}

/// --logits-out: row p = the logits after feeding position p, little-endian
/// float32, vocab values per row, rows in position order.
class logits_writer {
public:
  logits_writer(const std::string& path, int vocab) : path_(path), vocab_(vocab) {
    if (path.empty()) return;
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) throw cli_error(path + ": cannot write: " + std::strerror(errno));
  }
  ~logits_writer() {
    if (f_) std::fclose(f_);
  }
  bool active() const { return f_ != nullptr; }
  void add(int pos, const float* l) {
    if (!f_ || failed_) return;
    if (pos != rows_) {  // a replayed position after a recovery: already written
      if (pos < rows_) return;
      failed_ = true;
      return;
    }
    buf_.resize(static_cast<size_t>(vocab_) * 4);
    for (int i = 0; i < vocab_; ++i) {
      uint32_t b;
      std::memcpy(&b, &l[i], 4);
      for (int k = 0; k < 4; ++k) buf_[4 * static_cast<size_t>(i) + k] = static_cast<uint8_t>(b >> (8 * k));
    }
    if (std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) failed_ = true;
    ++rows_;
  }
  void close() {
    if (!f_) return;
    const bool bad = std::fclose(f_) != 0 || failed_;
    f_ = nullptr;
    if (bad) throw cli_error(path_ + ": writing the logits failed (disk full, or positions out of order)");
  }
  int rows() const { return rows_; }

private:
  std::string path_;
  int vocab_;
  std::FILE* f_ = nullptr;
  std::vector<uint8_t> buf_;
  int rows_ = 0;
  bool failed_ = false;
};


/// `cellshard run` without -m: the demo a newcomer sees first. 8 in-process
/// nodes with the ps3 profile in a pipeline (stories260K: 5 stages + 3
/// spares), a crash and a freeze injected mid-generation, compared with a
/// fault-free run of the same placement and seed.
int do_demo(const run_opts& o) {
  loaded_model lm = load_model("", o.tokenizer);
  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  model::generation_params gp;
  gp.prompt = o.prompt;
  gp.steps = o.steps;
  gp.sampling = {o.temperature, o.topp, o.seed};
  gp = model::normalise(gp, lm.file->cfg().seq_len);
  actors::cluster_options co;
  co.file = lm.file;
  co.tok = lm.tok;
  co.nodes = 8;
  co.profile = "ps3";
  co.topology = "pipeline";
  co.kernels = o.cf.kernels;
  co.caf_threads = o.cf.caf_threads;
  kernels::set_spe_workers(6);
  // Early enough that a sampled BOS rarely ends the run first (the synthetic
  // model's BOS comes up about once in 500 tokens), late enough to be mid-run.
  const int crash_at = std::max(2, std::min(10, gp.steps / 4)), freeze_at = std::max(3, std::min(20, gp.steps / 2));
  std::vector<int> reference;
  {
    auto c = actors::cluster::start(co);
    if (!c) throw cli_error(c.message());
    auto r = (*c)->generate(gp);
    if (!r || !r->ok) throw cli_error("fault-free run failed: " + (r ? r->error : r.message()));
    reference = r->result.ids;
  }
  co.faults = {supervision::parse_fault_spec("crash:node=1:step=" + std::to_string(crash_at)).value(),
               supervision::parse_fault_spec("silence:node=3:step=" + std::to_string(freeze_at)).value()};
  auto c = actors::cluster::start(co);
  if (!c) throw cli_error(c.message());
  const auto& plan = (*c)->placement();
  auto out = (*c)->generate(gp, [&](uint64_t, int, const std::string& piece) {
    if (o.quiet) return;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  if (!out) throw cli_error(out.message());
  if (!o.quiet) std::fputs("\n", stdout);
  if (!out->ok) throw cli_error(out->error);
  const auto& r = out->result;
  std::printf("\n--- demo: %zu ps3 nodes (256 MiB, 1 Gbit/s, 100 us), pipeline of %zu stages + %zu spares\n",
              plan.shards.size() + plan.spares.size(), plan.stages.size(), plan.spares.size());
  const auto faults = (*c)->faults();
  for (const auto& f : faults)
    std::printf("%s of placement index %d (node %d) at position %lld: detected in %.2f ms, recovered in %.2f ms, "
                "%d position(s) replayed, running on node %d\n",
                f.kind == "silence" ? "freeze" : f.kind.c_str(), f.index, f.node, static_cast<long long>(f.step),
                f.detect_ms, f.recover_ms, f.replayed_positions, f.moved_to_node);
  if (faults.size() < 2)
    std::printf("(generation ended at position %zu, before every planned fault fired)\n", r.ids.size() - 1);
  std::printf("TTFT %.2f ms, TPOT p50 %.3f ms p99 %.3f ms, %.1f tokens/s, communication share %.2f\n", r.ttft_ms,
              percentile(r.step_ms, 0.5), percentile(r.step_ms, 0.99), r.tokens_per_s,
              actors::comm_share(*out));
  const bool same = r.ids == reference;
  std::printf("identical to fault-free run: %s\n", same ? "yes" : "no");
  std::fflush(stdout);
  if (!o.ids_out.empty()) write_text(o.ids_out, model::format_ids(r.ids));
  return same ? 0 : 3;
}

/// "0x" and 16 hex digits (the prefix optional), as model::format_digest prints a digest.
uint64_t parse_digest_flag(const std::string& text, const std::string& flag) {
  std::string t = text;
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) t = t.substr(2);
  bool ok = !t.empty() && t.size() <= 16;
  for (char ch : t) ok = ok && std::isxdigit(static_cast<unsigned char>(ch));
  if (!ok)
    throw cli_error(flag + " '" + text + "': expected a 64-bit hex digest such as 0xa63dd90f31c958a4 "
                    "(XXH64 of the whole file, as `inspect` and the journal print it)", 2);
  return *parse_uint<uint64_t>(t, 16);  // base/parse.hpp; checked above
}

/// Usage checks of the flags alone, before anything is loaded: each names the
/// flag, the value given and what was expected, and exits 2.
void check_run_flags(const run_opts& o) {
  check_sampling_flags(o.temperature, o.topp);
  // Each request holds a KV cache per shard (1000 requests on stories260K: 212 MB).
  if (o.batch < 1 || o.batch > 4096)
    throw cli_error("--batch: got " + std::to_string(o.batch) + ", expected 1..4096 concurrent requests", 2);
  if (!o.expect_digest.empty()) parse_digest_flag(o.expect_digest, "--expect-digest");
}

/// A fault at a position the run never reaches would silently never fire, and
/// a chaos experiment would quietly be a fault-free one. The positions are
/// known before the run starts, so this is a usage error (exit 2), not a
/// warning. (A fault inside the range can still miss a run that ends early on
/// BOS; run --json lists the faults that fired.)
void check_fault_steps(const std::vector<supervision::fault_plan>& faults, int steps) {
  for (const auto& f : faults)
    if (f.step >= static_cast<uint64_t>(steps))
      throw cli_error("fault " + supervision::to_string(f) + ": step " + std::to_string(f.step) +
                          " is beyond the run's last position " + std::to_string(steps - 1) + " (-n " +
                          std::to_string(steps) + "), so it would never fire; expected a step below " +
                          std::to_string(steps),
                      2);
}

int do_run(run_opts o) {
  if (o.demo) return do_demo(o);
  const kernels::backend* be = &apply_kernel_flags(o.cf);
  auto fmt = model::parse_weight_format(o.cf.weights);
  if (!fmt) throw cli_error(fmt.message(), 2);

  // Read --expect-ids before the long part, so a bad file fails fast.
  std::vector<int> expected;
  if (!o.expect_ids.empty()) {
    auto e = model::parse_ids(read_text(o.expect_ids), o.expect_ids);
    if (!e) throw cli_error(e.message());
    expected = *e;
  }
  // --resume: the journal is verified first (a gap, an edit or a cut line is
  // refused with its line number); it names the model and tokenizer to reopen.
  std::shared_ptr<const model::journal> resumed;
  std::string model_path = o.model, tokenizer_path = o.tokenizer;
  if (!o.resume.empty()) {
    auto j = model::read_journal(o.resume);
    if (!j) throw cli_error(j.message());
    resumed = std::make_shared<const model::journal>(std::move(*j));
    const auto& h = resumed->header;
    if (model_path.empty()) {
      if (h.model_path.empty())
        throw cli_error(o.resume + ": the journal names no model file (" + h.model +
                        " was not opened from a file); give it with -m", 2);
      model_path = h.model_path;
      if (tokenizer_path.empty()) tokenizer_path = h.tokenizer_path;
    }
    // The context length the run opened the model with (--ctx): the model's
    // seq_len, hence the steps the journal may hold, depends on it.
    if (o.cf.ctx > 0 && o.cf.ctx != h.ctx)
      throw cli_error("--resume " + o.resume + ": --ctx " + std::to_string(o.cf.ctx) + " conflicts with the journal's " +
                          (h.ctx > 0 ? "--ctx " + std::to_string(h.ctx) : "context length (the file's own, no --ctx)") +
                          "; drop --ctx (the journal's value is used) or start a new run",
                      2);
    o.cf.ctx = h.ctx;
  }
  if (!o.journal.empty() && o.journal != o.resume) {
    // Fail before anything starts when the journal cannot be created.
    std::string dir = o.journal;
    const auto slash = dir.find_last_of('/');
    dir = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw cli_error("--journal " + o.journal + ": cannot create it: folder " + dir + " does not exist");
    if (::access(dir.c_str(), W_OK) != 0)
      throw cli_error("--journal " + o.journal + ": cannot create it in " + dir + ": " + std::strerror(errno));
  }
  loaded_model lm = load_model(model_path, tokenizer_path, false, o.cf.ctx);
  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  if (!o.expect_digest.empty()) {
    const uint64_t want = parse_digest_flag(o.expect_digest, "--expect-digest");
    if (lm.file->digest() != want)
      throw cli_error(lm.file->path() + ": digest " + model::format_digest(lm.file->digest()) + ", expected " +
                      model::format_digest(want) +
                      " (--expect-digest, XXH64 of the whole file): the file is corrupt or another version");
  }
  // --weights quantizes f32 matrices at load time; a file that stores
  // quantized ones (GGUF Q8_0/F16/..., CSQ8) runs them as stored. The flag used
  // to be ignored silently while --json reported the requested format.
  std::string weights_used = model::to_string(*fmt);
  if (lm.file->quantized() || lm.file->has_non_f32()) {
    weights_used = lm.file->quantized() ? "q8_0" : "gguf";  // inspect's names: CSQ8, each GGUF matrix as stored
    if (weights_used != o.cf.weights && o.cf.weights != "f32")
      std::fprintf(stderr,
                   "note: --weights %s is ignored: %s stores quantized matrices, which run as stored "
                   "(`cellshard quantize --type TYPE` writes another file)\n",
                   o.cf.weights.c_str(), lm.file->path().c_str());
  }
  const kernels::matmul_mode matmul = matmul_of(o.cf, lm);
  if (o.steps > lm.file->cfg().seq_len && (!resumed || o.steps_given))  // a resume takes the journal's steps
    std::fprintf(stderr, "warning: -n %d is above the context length %d; clamped to %d%s\n", o.steps,
                 lm.file->cfg().seq_len, lm.file->cfg().seq_len,
                 lm.file->gguf() ? " (--ctx N sets another context length)" : "");
  model::generation_params gp;
  gp.prompt = o.prompt;
  gp.steps = o.steps;
  gp.sampling = {o.temperature, o.topp, o.seed};
  gp.ignore_eos = o.ignore_eos;
  const std::string chat_fmt = chat_prompt(o, o.model, gp);
  if (!chat_fmt.empty()) std::fprintf(stderr, "chat format: %s\n", chat_fmt.c_str());
  gp = model::normalise(gp, lm.file->cfg().seq_len);
  actors::request_options extra;
  extra.journal = o.journal;
  if (resumed) {
    const auto& h = resumed->header;
    const std::string model_digest = model::format_digest(lm.file->digest());
    if (h.model_digest != lm.file->digest())
      throw cli_error(o.resume + ": journaled on model " + h.model + " (digest " + model::format_digest(h.model_digest) +
                      "), not on " + lm.file->path() + " (digest " + model_digest +
                      "): give the model the run started with");
    if (h.tokenizer_digest != lm.tok->digest())
      throw cli_error(o.resume + ": journaled with tokenizer " + h.tokenizer + " (digest " +
                      model::format_digest(h.tokenizer_digest) + "), not with " + lm.tok->name() + " (digest " +
                      model::format_digest(lm.tok->digest()) + "): give the tokenizer the run started with");
    // Flags given on the command line must agree with the journal (as run
    // normalises them); flags not given take the journal's values.
    auto conflict = [&](const std::string& flag, const std::string& given, const std::string& journaled) {
      throw cli_error("--resume " + o.resume + ": " + flag + " " + given + " conflicts with the journal's " +
                          journaled + "; drop " + flag + " (the journal's value is used) or start a new run",
                      2);
    };
    auto num = [](double v) {
      std::ostringstream os;
      os << v;
      return os.str();
    };
    if (o.steps_given && gp.steps != h.steps) conflict("-n", std::to_string(o.steps), "steps " + std::to_string(h.steps));
    if (o.temperature_given && gp.sampling.temperature != h.temperature)
      conflict("-t", num(o.temperature), "temperature " + num(h.temperature));
    if (o.topp_given && gp.sampling.topp != h.topp) conflict("-p", num(o.topp), "top-p " + num(h.topp));
    if (o.seed_given && o.seed != h.seed)
      conflict("-s", std::to_string(o.seed), "seed " + std::to_string(h.seed));
    if (o.prompt_given && lm.tok->encode(o.prompt, true, false) != h.prompt_tokens)
      conflict("-i", "'" + o.prompt + "'", "prompt (" + std::to_string(h.prompt_tokens.size()) + " tokens)");
    if (h.steps > lm.file->cfg().seq_len)
      throw cli_error(o.resume + ": the journal's steps " + std::to_string(h.steps) + " exceed the model's seq_len " +
                      std::to_string(lm.file->cfg().seq_len));
    gp.steps = h.steps;
    gp.sampling.temperature = h.temperature;
    gp.sampling.topp = h.topp;
    gp.sampling.seed = h.seed;
    const int vocab = lm.file->cfg().vocab_size;
    extra.resume_ids = {h.prompt_tokens.front()};
    extra.resume_rng = h.seed;
    for (size_t i = 0; i < resumed->entries.size(); ++i) {
      const auto& e = resumed->entries[i];
      if (e.token >= vocab)
        throw cli_error(o.resume + ": line " + std::to_string(i + 2) + ": token " + std::to_string(e.token) +
                        ", expected an id below the model's vocab_size " + std::to_string(vocab));
      extra.resume_ids.push_back(e.token);
      extra.resume_rng = e.rng;
    }
    for (int t : h.prompt_tokens)
      if (t >= vocab)
        throw cli_error(o.resume + ": line 1: prompt token " + std::to_string(t) +
                        ", expected ids below the model's vocab_size " + std::to_string(vocab));
    extra.resumed_journal = resumed;
    if (extra.journal.empty() || extra.journal == o.resume) {
      extra.journal = o.resume;  // keep journaling where it was
    } else {
      write_text(extra.journal, read_text(o.resume));  // the new file holds the whole journal
    }
    std::fprintf(stderr, "resuming %s: %zu ids already produced\n", o.resume.c_str(), extra.resume_ids.size());
  }
  {
    auto pi = model::prompt_ids(*lm.tok, gp);
    if (!pi) throw cli_error(pi.message(), 2);
  }
  logits_writer logits(o.logits_out, lm.file->cfg().vocab_size);

  auto print_piece = [&](const std::string& piece) {
    if (o.quiet) return;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  actors::run_report report;  // actors/run_report.hpp: what --json writes and the summary prints
  result<model::generation_result> res = make_error("not run");
  int batch_diverged = 0;  // --batch: requests whose ids differ from the first's
  if (!o.cf.use_cluster) {
    auto w = model::shard_weights::make(lm.file, model::slice_spec::whole(lm.file->cfg()), *fmt,
                                        matmul);
    if (!w) throw cli_error(w.message());
    model::engine eng(*w, *be);
    eng.set_batch_size(o.cf.batch_size);
    const int kt = o.cf.threads > 0 ? o.cf.threads : kernels::available_cpus();
    std::unique_ptr<kernels::pool> kpool;
    if (kt > 1) kpool = std::make_unique<kernels::pool>(kt);
    kernels::pool::scope use_pool(kpool.get());
    res = model::generate(
        [&](int token, int pos) -> result<const float*> { return eng.forward(token, pos); },
        *lm.tok, lm.file->cfg().vocab_size, gp,
        [&](int, const std::string& piece) { print_piece(piece); },
        logits.active() ? model::logits_fn([&](int pos, const float* l) { logits.add(pos, l); }) : model::logits_fn(),
        o.cf.batch_size > 1 ? model::prefill_fn([&](const int* t, int n, int p0) -> result<const float*> {
          return eng.prefill(t, n, p0);
        })
                         : model::prefill_fn());
    if (res) {
      actors::node_figures whole;
      whole.role = "whole model";
      whole.memory_bytes = (*w)->bytes() + lm.file->cfg().kv_cache_bytes(lm.file->cfg().seq_len);
      whole.compute_ms = res->duration_ms;
      report.nodes.push_back(whole);
    }
  } else {
    actors::cluster_options co = make_cluster_options(o.cf, lm, o.batch);
    check_fault_steps(co.faults, gp.steps);
    auto c = actors::cluster::start(co);
    if (!c) throw cli_error(c.message(), exit_status_of(c.code()));
    // Daemons whose build lacks --kernels (a cross build has no OpenBLAS) say what they run instead.
    if (auto remote = std::dynamic_pointer_cast<actors::remote_host>(co.host))
      for (const auto& note : remote->join_notes(o.cf.kernels)) std::fprintf(stderr, "note: %s\n", note.c_str());
    // Nodes that could not hold their slice, left out of the placement (issue #17).
    for (const auto& k : (*c)->skipped_nodes())
      std::fprintf(stderr, "warning: %s not used: %s\n", k.who.c_str(), k.why.c_str());
    if (o.cf.print_placement) std::fprintf(stderr, "%s", topologies::to_string((*c)->placement()).c_str());
    // The limits in effect, measured before the run (a limit not in effect
    // is the commonest mistake in such experiments).
    std::vector<actors::cluster::link_measurement> measured;
    {
      auto ml = (*c)->measure_links();
      if (!ml) throw cli_error(ml.message());
      measured = *ml;
      for (const auto& m : measured)
        if (auto w = actors::link_warning(m); !w.empty()) std::fprintf(stderr, "warning: %s\n", w.c_str());
    }
    if (logits.active()) {
      if (!o.resume.empty()) throw cli_error("--logits-out starts at position 0: it cannot follow --resume", 2);
      extra.on_logits = [&](int pos, const float* l) { logits.add(pos, l); };
    }
    // --batch B: B identical requests at once; the first one's text is printed.
    const auto wall0 = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<std::promise<actors::session_outcome>>> batched;
    for (int b = 1; b < std::max(1, o.batch); ++b) {
      auto p = std::make_shared<std::promise<actors::session_outcome>>();
      batched.push_back(p);
      (*c)->submit(gp, {}, [p](uint64_t, const actors::session_outcome& so) { p->set_value(so); });
    }
    auto out = (*c)->generate(gp, [&](uint64_t, int, const std::string& piece) { print_piece(piece); },
                              std::chrono::minutes(10), extra);
    if (!out) throw cli_error(out.message());
    int batch_tokens = out->ok ? static_cast<int>(out->result.ids.size()) - 1 : 0;
    // The requests are identical (same prompt, parameters and seed), so each
    // must give the first one's ids: sessions that share the shards (and a
    // recovery) must not leak into each other (issue #19). A difference is
    // a divergence (exit 3, as --expect-ids).
    for (size_t b = 0; b < batched.size(); ++b) {
      auto f = batched[b]->get_future();
      if (f.wait_for(std::chrono::minutes(10)) != std::future_status::ready)
        throw cli_error("a batched request did not finish within 10 minutes");
      auto so = f.get();
      if (!so.ok) throw cli_error("batched request: " + so.error);
      batch_tokens += static_cast<int>(so.result.ids.size()) - 1;
      if (out->ok && so.result.ids != out->result.ids) {
        size_t i = 0;
        while (i < so.result.ids.size() && i < out->result.ids.size() && so.result.ids[i] == out->result.ids[i]) ++i;
        std::fprintf(stderr, "batched request %zu: ids differ from the first request's at position %zu\n", b + 1, i);
        ++batch_diverged;
      }
    }
    if (o.batch > 1 && out->ok)
      std::fprintf(stderr, "batch: %d concurrent requests, %d with ids other than the first's\n", o.batch,
                   batch_diverged);
    const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    auto rep = actors::make_run_report(**c, *out, measured);
    if (!rep) throw cli_error(rep.message());
    report = std::move(*rep);
    if (!out->ok) {
      // The tokens so far are printed already; finish the line, then the error.
      if (!o.quiet) std::fputs("\n", stdout);
      if (!o.ids_out.empty()) write_text(o.ids_out, model::format_ids(out->result.ids));
      // What a script needs to see why: the error, the partial output and the faults.
      if (!o.json_out.empty()) write_text(o.json_out, actors::to_json(report).dump(2) + "\n");
      throw cli_error(out->error);
    }
    res = out->result;
    // The aggregate, unless nothing was computed (then no rate either).
    if (o.batch > 1 && wall_s > 0 && res->tokens_per_s > 0) res->tokens_per_s = batch_tokens / wall_s;
    if (!out->recoveries.empty())
      std::fprintf(stderr, "recovered %zu time(s):", out->recoveries.size());
    for (const auto& r : out->recoveries)
      std::fprintf(stderr, " [position %d: restored to %d, replayed %d %s, next token %.1f ms after the restart notice]", r.position,
                   r.restored_to, r.replayed_positions, r.from_upstream_log ? "from the upstream log" : "from tokens",
                   r.recover_ms);
    if (!out->recoveries.empty()) std::fprintf(stderr, "\n");
  }
  if (!res) throw cli_error(res.message());
  logits.close();
  if (!o.quiet) {
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }
  // run.c's line, when run.c prints it (pos > 1): positions after the first
  // over the time from the end of the first forward pass to the end of the
  // last. When the prompt fills every position (more prompt tokens than -n),
  // their next tokens are the prompt's and nothing is computed, so there is
  // no time to divide by; run.c, which computes them one by one anyway,
  // would time those passes. Say so rather than print a rate of 0.
  if (res->ids.size() > 2 && res->tokens_per_s > 0) {
    std::fprintf(stderr, "achieved tok/s: %f\n", res->tokens_per_s);
  } else if (res->ids.size() > 2) {
    const int positions = static_cast<int>(res->ids.size()) - 1;
    std::fprintf(stderr,
                 "tok/s not measured: the prompt's %d tokens fill all %d positions, so no position was "
                 "computed\n",
                 res->prompt_tokens, positions);
  }

  if (!o.ids_out.empty()) write_text(o.ids_out, model::format_ids(res->ids));

  int status = batch_diverged > 0 ? 3 : 0;
  bool diverged = batch_diverged > 0;
  if (!o.expect_ids.empty()) {
    const auto& got = res->ids;
    size_t i = 0;
    while (i < got.size() && i < expected.size() && got[i] == expected[i]) ++i;
    if (i < got.size() || i < expected.size()) {
      diverged = true;
      status = 3;
      std::string g = i < got.size() ? std::to_string(got[i]) : "end of output";
      std::string e = i < expected.size() ? std::to_string(expected[i]) : "end of expected ids";
      std::fprintf(stderr, "ids differ from %s at position %zu: got %s, expected %s\n",
                   o.expect_ids.c_str(), i, g.c_str(), e.c_str());
    }
  }

  report.model = lm.description;
  report.kernels = be->name;
  report.weights = weights_used;
  report.matmul = kernels::to_string(matmul);
  report.result = *res;
  report.batch_aggregate = o.batch > 1;
  if (!o.expect_ids.empty()) report.diverged = diverged;
  if (o.cf.use_cluster)  // a short human summary of the four metrics
    std::fprintf(stderr, "summary: %s\n", actors::summary_line(report).c_str());
  if (!o.json_out.empty()) write_text(o.json_out, actors::to_json(report).dump(2) + "\n");
  return status;
}

}  // namespace

void add_run(CLI::App& app, int& status) {
  auto o = std::make_shared<run_opts>();
  auto* cmd = app.add_subcommand("run", "generate text (llama2.c run semantics)");
  cmd->add_option("-m,--model", o->model,
                  "model file (llama2.c .bin or GGUF, told apart by magic); without it the default model lookup of CLI.md");
  cmd->add_option("-z,--tokenizer", o->tokenizer, "tokenizer (default: tokenizer.bin beside the model)");
  cmd->add_option("-i,--prompt", o->prompt, "prompt");
  cmd->add_option("-n,--steps", o->steps, "forward passes, prompt included (0 = seq_len)")
      ->capture_default_str();
  cmd->add_option("-t,--temperature", o->temperature, "0 = greedy argmax")->capture_default_str();
  cmd->add_option("-p,--topp", o->topp, "top-p (nucleus) threshold; <=0 or >=1 samples the full "
                  "distribution")->capture_default_str();
  cmd->add_option("-s,--seed", o->seed, "RNG seed (0 = from the clock)");
  cmd->add_option("--expect-digest", o->expect_digest,
                  "refuse to run unless the model file's XXH64 digest is HEX (0x and 16 hex digits, as "
                  "inspect prints it)");
  cmd->add_option("--ids-out", o->ids_out, "write the token ids (BOS first) to FILE");
  cmd->add_option("--expect-ids", o->expect_ids,
                  "compare the ids with FILE; on a difference exit 3 naming the position");
  cmd->add_option("--json,--metrics-out", o->json_out, "machine-readable result to FILE (- = stdout)");
  cmd->add_flag("-q,--quiet", o->quiet, "do not print the generated text");
  cmd->add_flag("--ignore-eos", o->ignore_eos,
                "never stop on a token (llama2.c: a sampled BOS; GGUF: EOS / end of turn): exactly -n positions");
  cmd->add_option("--logits-out", o->logits_out,
                  "write the logits after every position (prompt included) to FILE: little-endian float32, "
                  "one row of vocab values per position");
  cmd->add_flag("--chat", o->chat, "-i is the first user turn of a chat, in the model's prompt format");
  cmd->add_option("--system", o->system, "system message of --chat");
  cmd->add_option("--chat-format", o->chat_format,
                  "llama2|llama3|chatml|zephyr|none (default: from the GGUF's tokenizer.chat_template, "
                  "else none: contents joined by newlines)");
  cluster_flag_set set = add_cluster_flags(cmd, o->cf);
  // run's own flags of the actor runtime: any of these selects it too.
  auto* g = "Nodes (in process)";
  for (auto* f : {cmd->add_option("--batch", o->batch, "concurrent identical requests; tokens/s is their aggregate"),
                  cmd->add_option("--journal", o->journal,
                                  "record the token log, RNG state and sampling parameters to FILE as the run goes"),
                  cmd->add_option("--resume", o->resume,
                                  "continue the run journaled in FILE: reopens the model and tokenizer it names (-m/-z "
                                  "optional; their digests must match); -n/-t/-p/-s/-i/--ctx, if given, must agree with it")})
    set.runtime.push_back(f->group(g));
  cmd->callback([o, cmd, set, &status] {
    check_cluster_flags(cmd, set, o->cf);
    if (o->model.empty() && !o->cf.use_cluster) o->demo = true;
    check_run_flags(*o);
    o->steps_given = cmd->count("-n") > 0;
    o->temperature_given = cmd->count("-t") > 0;
    o->topp_given = cmd->count("-p") > 0;
    o->seed_given = cmd->count("-s") > 0;
    o->prompt_given = cmd->count("-i") > 0;
    status = do_run(*o);
  });
}

}  // namespace cellshard::tools
