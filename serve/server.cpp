#include "serve/server.hpp"

#include "serve/metrics.hpp"
#include "serve/openai.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <utility>

namespace cellshard::serve {

namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

/// One request's session as the HTTP side sees it: the pieces the cluster
/// delivered and not yet consumed, and the outcome once it ended.
struct generation {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t id = 0;
  int echo_left = 0;               // prompt pieces still to come (they are not generated text)
  std::string echo;                // those pieces, concatenated
  std::deque<std::string> pieces;  // generated pieces not yet consumed
  int generated = 0;               // generated tokens delivered so far
  bool done = false;
  actors::session_outcome outcome;
  clock_type::time_point start, last;
};

}  // namespace

struct server::impl {
  impl(actors::cluster& c, server_options o, fault_action f)
      : cluster(c), opts(std::move(o)), inject(std::move(f)),
        ttft(exponential_buckets(0.001, 2, 16)), tpot(exponential_buckets(0.0001, 2, 16)) {}

  actors::cluster& cluster;
  server_options opts;
  fault_action inject;
  std::unique_ptr<httplib::Server> http;
  std::string address;
  clock_type::time_point t0 = clock_type::now();

  std::atomic<int> active{0};
  std::atomic<uint64_t> prompt_tokens{0}, completion_tokens{0}, rejected{0}, cancelled{0};
  histogram ttft, tpot;
  std::mutex mu;                                   // guards the members below
  std::map<std::pair<std::string, int>, uint64_t> requests;  // (route, status) -> count
  std::deque<clock_type::time_point> recent;      // generated tokens of the last 5 s
  std::mt19937_64 seeds{std::random_device{}()};

  void count(const std::string& route, int status) {
    std::lock_guard<std::mutex> lock(mu);
    ++requests[{route, status}];
  }
  void token_seen(clock_type::time_point t) {
    std::lock_guard<std::mutex> lock(mu);
    recent.push_back(t);
    while (!recent.empty() && t - recent.front() > std::chrono::seconds(5)) recent.pop_front();
  }
  double tokens_per_s() {
    std::lock_guard<std::mutex> lock(mu);
    const auto now = clock_type::now();
    while (!recent.empty() && now - recent.front() > std::chrono::seconds(5)) recent.pop_front();
    const double window = std::min(5.0, std::chrono::duration<double>(now - t0).count());
    return window > 0 ? recent.size() / window : 0;
  }
  uint64_t next_seed() {
    std::lock_guard<std::mutex> lock(mu);
    uint64_t s = 0;
    while (s == 0) s = seeds() >> 1;
    return s;
  }

  void send_error(httplib::Response& res, const api_error& e) {
    res.status = e.status;
    res.set_content(dump_json(error_body(e)), "application/json");
  }

  /// The model object of GET /v1/models and GET /v1/models/{id}.
  json model_object() const {
    return {{"id", opts.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "cellshard"}};
  }
  /// A request may name the model it wants: "" (or no `model`) means the
  /// loaded one, its id means it too, any other name is OpenAI's 404
  /// model_not_found (docs/serve.md, "The model name"). The same rule for
  /// both completion routes and GET /v1/models/{id}.
  bool serves(const std::string& name) const { return name.empty() || name == opts.model_id; }
  api_error model_not_found(const std::string& name) const {
    return {404, "the model '" + name + "' does not exist; this server runs '" + opts.model_id +
                     "' (GET /v1/models; leave model out to use it)",
            "invalid_request_error", "model", "model_not_found"};
  }

  json health();
  std::string metrics();
  json cluster_view();
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
};

json server::impl::health() {
  json j;
  const std::string failure = cluster.failure();
  std::set<int> down;
  std::set<int> recovering;
  for (const auto& f : cluster.faults()) {
    if (f.node < 0) continue;
    // A restart decided and not yet done. A fault that needs none (slow,
    // delay, a silence shorter than the deadline) leaves its node up.
    if (f.decided_ns != 0 && f.recovered_ns == 0) recovering.insert(f.node);
    if (f.moved_to_node >= 0 && f.moved_to_node != f.node) down.insert(f.node);
  }
  const auto now = cluster.current_nodes();
  for (int n : now) down.erase(n);  // a node that holds a shard again is up
  for (int n : recovering) down.insert(n);
  j["status"] = !failure.empty() ? "failed" : down.empty() ? "ready" : "degraded";
  j["nodes_down"] = down;
  if (!failure.empty()) j["error"] = failure;
  j["sessions"] = active.load();
  j["max_sessions"] = opts.max_sessions;
  j["model"] = opts.model_id;
  return j;
}

json server::impl::cluster_view() {
  json j;
  const auto& plan = cluster.placement();
  const auto current = cluster.current_nodes();
  const auto memory = cluster.node_memory();
  const auto stats = cluster.shard_statistics(std::chrono::milliseconds(200));
  const auto faults = cluster.faults();
  const json h = health();
  std::set<int> down(h["nodes_down"].begin(), h["nodes_down"].end());
  j["model"] = opts.model_id;
  j["status"] = h["status"];
  j["sessions"] = active.load();
  j["max_sessions"] = opts.max_sessions;
  j["tokens_per_s"] = tokens_per_s();
  j["tokens_total"] = completion_tokens.load();
  j["fault_injection"] = opts.allow_fault_injection && static_cast<bool>(inject);
  j["uptime_s"] = seconds_since(t0);
  // Nodes: every node of the placement (shards and spares), with what runs there now.
  std::map<int, json> nodes;
  auto node = [&](int n) -> json& {
    auto& e = nodes[n];
    if (e.is_null())
      e = {{"node", n}, {"role", ""}, {"memory_bytes", n < static_cast<int>(memory.size()) ? memory[n] : 0},
           {"state", down.count(n) ? "down" : "up"}, {"shards", json::array()}};
    return e;
  };
  json placement = json::array();
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const auto& sh = plan.shards[i];
    const int now = i < current.size() ? current[i] : sh.node;
    std::string role = "stage " + std::to_string(sh.stage) + (sh.group_size > 1 ? " rank " + std::to_string(sh.rank) : "");
    auto& n = node(now);
    n["role"] = n["role"].get<std::string>().empty() ? role : n["role"].get<std::string>() + ", " + role;
    n["shards"].push_back(static_cast<int>(i));
    json p = {{"index", i}, {"stage", sh.stage}, {"rank", sh.rank}, {"node", now}, {"placed_on", sh.node},
              {"layers", std::to_string(sh.layers.begin) + ".." + std::to_string(sh.layers.end)}, {"embedding", sh.has_embedding}, {"classifier", sh.has_classifier}};
    if (i < stats.size() && stats[i]) {
      p["kv_bytes"] = stats[i]->kv_bytes;
      p["sessions"] = stats[i]->sessions;
      p["compute_s"] = stats[i]->compute_ns / 1e9;
      p["bytes_sent"] = stats[i]->bytes_sent;
      p["bytes_received"] = stats[i]->bytes_received;
      p["answering"] = true;
    } else {
      p["answering"] = false;
    }
    placement.push_back(p);
  }
  for (const auto& sp : plan.spares) {
    auto& n = node(sp.node);
    if (n["role"].get<std::string>().empty()) n["role"] = "spare";
  }
  for (const auto& f : faults)
    if (f.node >= 0) node(f.node);  // a node that lost its shard is still listed (down)
  json nl = json::array();
  for (auto& kv : nodes) nl.push_back(kv.second);
  j["nodes"] = nl;
  j["placement"] = placement;
  json fl = json::array();
  for (const auto& f : faults)
    fl.push_back({{"kind", f.kind}, {"index", f.index}, {"node", f.node}, {"step", f.step},
                  {"detect_ms", f.detect_ms}, {"recover_ms", f.recover_ms}, {"moved_to_node", f.moved_to_node},
                  {"replayed_positions", f.replayed_positions}, {"restarted", f.decided_ns != 0},
                  {"recovered", f.recovered_ns != 0}});
  j["faults"] = fl;
  return j;
}

std::string server::impl::metrics() {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  char buf[128];
  auto num = [&](double v) {
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return std::string(buf);
  };
  line("# HELP cellshard_requests_total HTTP requests by route and status code.");
  line("# TYPE cellshard_requests_total counter");
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& kv : requests)
      line("cellshard_requests_total{route=\"" + kv.first.first + "\",code=\"" + std::to_string(kv.first.second) +
           "\"} " + std::to_string(kv.second));
  }
  line("# HELP cellshard_tokens_total Tokens processed: prompt (BOS included) and completion (generated).");
  line("# TYPE cellshard_tokens_total counter");
  line("cellshard_tokens_total{kind=\"prompt\"} " + std::to_string(prompt_tokens.load()));
  line("cellshard_tokens_total{kind=\"completion\"} " + std::to_string(completion_tokens.load()));
  line("# HELP cellshard_sessions_active Generation sessions running now.");
  line("# TYPE cellshard_sessions_active gauge");
  line("cellshard_sessions_active " + std::to_string(active.load()));
  line("# HELP cellshard_sessions_max Sessions allowed at once (--max-sessions).");
  line("# TYPE cellshard_sessions_max gauge");
  line("cellshard_sessions_max " + std::to_string(opts.max_sessions));
  line("# HELP cellshard_rejected_total Requests refused with 429 (max sessions reached).");
  line("# TYPE cellshard_rejected_total counter");
  line("cellshard_rejected_total " + std::to_string(rejected.load()));
  line("# HELP cellshard_cancelled_total Sessions cancelled because their client went away.");
  line("# TYPE cellshard_cancelled_total counter");
  line("cellshard_cancelled_total " + std::to_string(cancelled.load()));
  out += ttft.render("cellshard_ttft_seconds", "Time to first token: request received -> first generated token.");
  out += tpot.render("cellshard_tpot_seconds", "Time per output token: between consecutive generated tokens.");
  const auto faults = cluster.faults();
  histogram detect(exponential_buckets(0.0001, 2, 18)), recover(exponential_buckets(0.0001, 2, 18));
  uint64_t recoveries = 0;
  std::map<std::string, uint64_t> by_kind;
  for (const auto& f : faults) {
    ++by_kind[f.kind];
    if (f.detect_ms >= 0) detect.observe(f.detect_ms / 1e3);
    if (f.recovered_ns != 0) {
      ++recoveries;
      if (f.recover_ms >= 0) recover.observe(f.recover_ms / 1e3);
    }
  }
  line("# HELP cellshard_faults_total Faults seen (injected or observed) by kind.");
  line("# TYPE cellshard_faults_total counter");
  for (const auto& kv : by_kind) line("cellshard_faults_total{kind=\"" + kv.first + "\"} " + std::to_string(kv.second));
  line("# HELP cellshard_recoveries_total Faults recovered from (the next token was delivered).");
  line("# TYPE cellshard_recoveries_total counter");
  line("cellshard_recoveries_total " + std::to_string(recoveries));
  out += detect.render("cellshard_fault_detect_seconds", "Fault fired -> the runtime decided to restart or move the shard.");
  out += recover.render("cellshard_fault_recover_seconds", "Restart decision -> next token delivered.");
  const json h = health();
  line("# HELP cellshard_nodes_down Nodes lost or recovering.");
  line("# TYPE cellshard_nodes_down gauge");
  line("cellshard_nodes_down " + std::to_string(h["nodes_down"].size()));
  line("# HELP cellshard_ready 1 when the cluster serves with every node, 0.5 degraded, 0 failed.");
  line("# TYPE cellshard_ready gauge");
  line(std::string("cellshard_ready ") + (h["status"] == "ready" ? "1" : h["status"] == "degraded" ? "0.5" : "0"));
  const auto memory = cluster.node_memory();
  line("# HELP cellshard_node_memory_bytes Bytes in use on each node (weights and KV caches).");
  line("# TYPE cellshard_node_memory_bytes gauge");
  for (size_t n = 0; n < memory.size(); ++n)
    line("cellshard_node_memory_bytes{node=\"" + std::to_string(n) + "\"} " + std::to_string(memory[n]));
  const auto stats = cluster.shard_statistics(std::chrono::milliseconds(200));
  std::map<int, std::pair<uint64_t, uint64_t>> bytes;  // node -> sent, received
  for (const auto& s : stats)
    if (s) {
      bytes[s->node].first += s->bytes_sent;
      bytes[s->node].second += s->bytes_received;
    }
  line("# HELP cellshard_node_bytes_sent_total Payload bytes sent by the shards on each node.");
  line("# TYPE cellshard_node_bytes_sent_total counter");
  for (const auto& kv : bytes)
    line("cellshard_node_bytes_sent_total{node=\"" + std::to_string(kv.first) + "\"} " + std::to_string(kv.second.first));
  line("# HELP cellshard_node_bytes_received_total Payload bytes received by the shards on each node.");
  line("# TYPE cellshard_node_bytes_received_total counter");
  for (const auto& kv : bytes)
    line("cellshard_node_bytes_received_total{node=\"" + std::to_string(kv.first) + "\"} " +
         std::to_string(kv.second.second));
  line("# HELP cellshard_shard_kv_bytes KV cache bytes each shard holds (by placement index).");
  line("# TYPE cellshard_shard_kv_bytes gauge");
  for (const auto& s : stats)
    if (s) line("cellshard_shard_kv_bytes{index=\"" + std::to_string(s->index) + "\",node=\"" + std::to_string(s->node) +
                "\"} " + std::to_string(s->kv_bytes));
  line("# HELP cellshard_shard_sessions Sessions with a KV cache on each shard.");
  line("# TYPE cellshard_shard_sessions gauge");
  for (const auto& s : stats)
    if (s) line("cellshard_shard_sessions{index=\"" + std::to_string(s->index) + "\"} " + std::to_string(s->sessions));
  line("# HELP cellshard_shard_compute_seconds_total Kernel time of each shard (grows only while it computes steps).");
  line("# TYPE cellshard_shard_compute_seconds_total counter");
  for (const auto& s : stats)
    if (s) line("cellshard_shard_compute_seconds_total{index=\"" + std::to_string(s->index) + "\"} " + num(s->compute_ns / 1e9));
  line("# HELP cellshard_shard_up 1 when the shard answered the statistics request within 200 ms.");
  line("# TYPE cellshard_shard_up gauge");
  for (size_t i = 0; i < stats.size(); ++i)
    line("cellshard_shard_up{index=\"" + std::to_string(i) + "\"} " + (stats[i] ? "1" : "0"));
  line("# HELP cellshard_tokens_per_second Generated tokens per second over the last 5 s.");
  line("# TYPE cellshard_tokens_per_second gauge");
  line("cellshard_tokens_per_second " + num(tokens_per_s()));
  return out;
}

void server::impl::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  const std::string route = chat ? "/v1/chat/completions" : "/v1/completions";
  const auto start = clock_type::now();
  auto fail = [&](const api_error& e) {
    send_error(res, e);
    count(route, e.status);
  };
  auto parsed = parse_request(req.body, chat);
  if (!parsed.request) return fail(parsed.error);
  const completion_request r = *parsed.request;
  if (!serves(r.model)) return fail(model_not_found(r.model));
  const std::string failure = cluster.failure();
  if (!failure.empty())
    return fail({503, "no capacity left: " + failure, "server_error", "", "cluster_failed"});
  std::string prompt = r.prompt;
  bool add_bos = true;
  if (chat) {
    auto cp = chat_prompt(opts.chat_format, r.messages);
    if (!cp) return fail({400, cp.message(), "invalid_request_error", "messages"});
    prompt = cp->text;
    add_bos = cp->add_bos;
  }
  const int seq_len = cluster.config().seq_len;
  const int n_prompt = static_cast<int>(cluster.tokenizer().encode(prompt, add_bos, false).size());
  if (n_prompt > seq_len)
    return fail({422, "the prompt is " + std::to_string(n_prompt) + " tokens (BOS included); the context holds " +
                          std::to_string(seq_len) + " positions, so at most " + std::to_string(seq_len) +
                          " prompt tokens leave room to generate",
                 "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded"});
  const int room = seq_len - (n_prompt - 1);  // tokens that can be generated
  const int want = r.max_tokens ? *r.max_tokens : chat ? room : 16;
  const int max_tokens = std::min(want, room);
  if (active.fetch_add(1) >= opts.max_sessions) {
    --active;
    ++rejected;
    res.set_header("Retry-After", "1");
    return fail({429, "all " + std::to_string(opts.max_sessions) + " sessions are busy; retry later",
                 "rate_limit_error", "", "too_many_sessions"});
  }

  model::generation_params gp;
  gp.prompt = prompt;
  gp.add_bos = add_bos;
  gp.steps = n_prompt - 1 + max_tokens;
  gp.sampling.temperature = r.temperature;
  gp.sampling.topp = r.top_p;
  gp.sampling.seed = r.seed ? *r.seed : next_seed();
  auto g = std::make_shared<generation>();
  g->echo_left = n_prompt - 1;
  g->start = start;
  prompt_tokens += n_prompt;
  impl* self = this;
  auto on_token = [g, self](uint64_t, int, const std::string& piece) {
    const auto now = clock_type::now();
    std::lock_guard<std::mutex> lock(g->mu);
    if (g->echo_left > 0) {
      --g->echo_left;
      g->echo += piece;
      return;
    }
    if (g->generated == 0) self->ttft.observe(std::chrono::duration<double>(now - g->start).count());
    else self->tpot.observe(std::chrono::duration<double>(now - g->last).count());
    g->last = now;
    ++g->generated;
    ++self->completion_tokens;
    self->token_seen(now);
    g->pieces.push_back(piece);
    g->cv.notify_all();
  };
  auto on_done = [g, self](uint64_t, const actors::session_outcome& o) {
    // The slot is free before the client can see the end of its answer, so
    // that a client's next request never finds its own session still counted.
    --self->active;
    std::lock_guard<std::mutex> lock(g->mu);
    g->done = true;
    g->outcome = o;
    g->cv.notify_all();
  };
  const uint64_t id = cluster.submit(gp, on_token, on_done);
  {
    std::lock_guard<std::mutex> lock(g->mu);
    g->id = id;
  }

  const std::string rid = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(id) + "-" + std::to_string(gp.sampling.seed);
  const auto created = static_cast<int64_t>(std::time(nullptr));
  const std::string model = opts.model_id;
  // The consumer: applies stop strings, counts, decides the finish reason.
  struct consumer {
    std::string text;     // generated text (before stop trimming)
    size_t sent = 0;      // bytes of text already handed out
    int tokens = 0;       // generated tokens consumed
    bool stopped = false; // a stop string was hit
  };
  auto cons = std::make_shared<consumer>();
  const std::vector<std::string> stop = r.stop;
  // Takes one piece; returns the newly visible text.
  auto take = [cons, stop](const std::string& piece) {
    if (cons->stopped) return std::string();
    ++cons->tokens;
    cons->text += piece;
    bool hit = false;
    size_t vis = stop.empty() ? cons->text.size() : visible_length(cons->text, stop, &hit);
    if (!hit) vis = utf8_complete_length(cons->text, vis);  // a character split over tokens waits
    std::string delta = vis > cons->sent ? cons->text.substr(cons->sent, vis - cons->sent) : std::string();
    cons->sent = std::max(cons->sent, vis);
    if (hit) cons->stopped = true;
    return delta;
  };
  // At the end: what was held back and never decided (a possible start of
  // a stop string, part of a character) is text the model generated.
  auto rest = [cons]() {
    if (cons->stopped || cons->sent >= cons->text.size()) return std::string();
    std::string d = cons->text.substr(cons->sent);
    cons->sent = cons->text.size();
    return d;
  };
  auto finish_reason = [cons, max_tokens](const generation& gen) -> std::string {
    if (cons->stopped) return "stop";
    if (gen.generated >= max_tokens) return "length";
    return "stop";  // the model ended the text (sampled BOS)
  };
  auto usage = [cons, n_prompt]() {
    return json{{"prompt_tokens", n_prompt},
                {"completion_tokens", cons->tokens},
                {"total_tokens", n_prompt + cons->tokens}};
  };
  actors::cluster* cl = &cluster;
  const auto deadline = start + opts.request_deadline;

  if (!r.stream) {
    std::unique_lock<std::mutex> lock(g->mu);
    bool timed_out = false;
    while (true) {
      g->cv.wait_until(lock, deadline, [&] { return g->done || !g->pieces.empty(); });
      while (!g->pieces.empty()) {
        take(g->pieces.front());
        g->pieces.pop_front();
      }
      if (cons->stopped && !g->done) {
        lock.unlock();
        cl->cancel(id);
        lock.lock();
        break;
      }
      if (g->done) break;
      if (clock_type::now() >= deadline) {
        timed_out = true;
        break;
      }
    }
    const bool ok = cons->stopped || (g->done && g->outcome.ok);
    const std::string error = timed_out ? "the request did not finish within " +
                                              std::to_string(opts.request_deadline.count()) + " ms"
                                        : g->outcome.error;
    const std::string reason = finish_reason(*g);
    const std::string echo = g->echo;
    lock.unlock();
    if (!ok) {
      cl->cancel(id);
      const bool gone = !cl->failure().empty();
      return fail({gone ? 503 : 500, "generation failed: " + error, "server_error", "",
                   gone ? "cluster_failed" : "generation_failed"});
    }
    rest();
    const std::string text = cons->text.substr(0, cons->sent);
    json body;
    body["id"] = rid;
    body["created"] = created;
    body["model"] = model;
    if (chat) {
      body["object"] = "chat.completion";
      body["choices"] = json::array({{{"index", 0},
                                      {"message", {{"role", "assistant"}, {"content", text}}},
                                      {"logprobs", nullptr},
                                      {"finish_reason", reason}}});
    } else {
      body["object"] = "text_completion";
      body["choices"] = json::array(
          {{{"index", 0}, {"text", r.echo ? echo + text : text}, {"logprobs", nullptr}, {"finish_reason", reason}}});
    }
    body["usage"] = usage();
    body["system_fingerprint"] = nullptr;
    res.set_content(dump_json(body), "application/json");
    count(route, 200);
    return;
  }

  // Streaming: one event per generated token, "id:" = its index (0-based).
  count(route, 200);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto chunk = [rid, created, model, chat](const std::string& delta, const json& reason, bool first) {
    json c;
    c["id"] = rid;
    c["created"] = created;
    c["model"] = model;
    c["system_fingerprint"] = nullptr;
    if (chat) {
      c["object"] = "chat.completion.chunk";
      json d = json::object();
      if (first) d["role"] = "assistant";
      if (!delta.empty() || reason.is_null()) d["content"] = delta;
      c["choices"] = json::array({{{"index", 0}, {"delta", d}, {"logprobs", nullptr}, {"finish_reason", reason}}});
    } else {
      c["object"] = "text_completion";
      c["choices"] =
          json::array({{{"index", 0}, {"text", delta}, {"logprobs", nullptr}, {"finish_reason", reason}}});
    }
    return c;
  };
  struct stream_state {
    int index = 0;              // next token index
    bool first = true;          // the first chunk (chat: carries the role)
    bool finished = false;      // [DONE] written
    clock_type::time_point last_write = clock_type::now();
  };
  auto ss = std::make_shared<stream_state>();
  const bool echo = r.echo, include_usage = r.include_usage;
  res.set_chunked_content_provider(
      "text/event-stream",
      [g, cons, ss, cl, id, take, rest, chunk, finish_reason, usage, echo, include_usage, deadline](size_t,
                                                                                              httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          ss->last_write = clock_type::now();
          return sink.write(s.data(), s.size());
        };
        std::unique_lock<std::mutex> lock(g->mu);
        g->cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return g->done || !g->pieces.empty(); });
        std::deque<std::string> pieces;
        pieces.swap(g->pieces);
        const bool done = g->done;
        const bool ok = g->outcome.ok;
        const std::string error = g->outcome.error;
        const std::string echo_text = g->echo;
        lock.unlock();
        for (const auto& p : pieces) {
          if (cons->stopped) break;
          std::string delta = take(p);
          if (ss->first && echo) delta = echo_text + delta;
          const json c = chunk(delta, nullptr, ss->first);
          ss->first = false;
          if (!write("id: " + std::to_string(ss->index++) + "\ndata: " + dump_json(c) + "\n\n")) return false;
        }
        const bool timed_out = clock_type::now() >= deadline;
        if (cons->stopped || done || timed_out) {
          if (!done) cl->cancel(id);
          std::unique_lock<std::mutex> l2(g->mu);
          const std::string reason = finish_reason(*g);
          l2.unlock();
          if (!cons->stopped && (timed_out || !ok) && !done) {
            write("data: " + dump_json(error_body({504, "the request did not finish in time", "server_error"})) + "\n\n");
          } else if (!cons->stopped && done && !ok) {
            write("data: " + dump_json(error_body({500, "generation failed: " + error, "server_error"})) + "\n\n");
          } else {
            const std::string last = rest();
            if (!last.empty()) {
              // Not a token of its own: no event id (ids count tokens).
              if (!write("data: " + dump_json(chunk(last, nullptr, ss->first)) + "\n\n")) return false;
              ss->first = false;
            }
            if (!write("data: " + dump_json(chunk("", reason, ss->first)) + "\n\n")) return false;
            if (include_usage) {
              json u = chunk("", nullptr, false);
              u["choices"] = json::array();
              u["usage"] = usage();
              write("data: " + dump_json(u) + "\n\n");
            }
          }
          write("data: [DONE]\n\n");
          ss->finished = true;
          sink.done();
          return true;
        }
        // Nothing came for a while: a comment line, so that a client that
        // went away is noticed (the write fails) even while no token flows.
        if (pieces.empty() && clock_type::now() - ss->last_write > std::chrono::seconds(1))
          if (!write(": waiting\n\n")) return false;
        return true;
      },
      [g, ss, cl, id, self](bool) {
        std::lock_guard<std::mutex> lock(g->mu);
        if (!g->done) {
          cl->cancel(id);  // free every shard's KV cache now
          if (!ss->finished) ++self->cancelled;  // the client went away (not a stop string)
        }
      });
}

server::server(actors::cluster& cluster, server_options opts, fault_action inject)
    : impl_(std::make_unique<impl>(cluster, std::move(opts), std::move(inject))) {}

server::~server() { stop(); }

int server::active_sessions() const { return impl_->active.load(); }

result<std::string> server::bind() {
  auto& im = *impl_;
  const auto& o = im.opts;
  if (o.tls_cert.empty() != o.tls_key.empty())
    return make_error("--tls-cert and --tls-key: give both (HTTPS) or neither (HTTP)");
  if (!o.tls_cert.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(o.tls_cert.c_str(), o.tls_key.c_str());
    if (!ssl->is_valid())
      return make_error("--tls-cert " + o.tls_cert + " / --tls-key " + o.tls_key +
                        ": OpenSSL could not load them (PEM certificate and matching unencrypted key expected)");
    im.http = std::move(ssl);
  } else {
    im.http = std::make_unique<httplib::Server>();
  }
  auto& http = *im.http;
  const size_t threads = static_cast<size_t>(std::max(1, o.max_sessions)) + 8;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(o.max_body_bytes);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(10, 0);
  impl* self = impl_.get();

  http.set_pre_routing_handler([self](const httplib::Request& req, httplib::Response& res) {
    const auto& key = self->opts.api_key;
    if (key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + key) return httplib::Server::HandlerResponse::Unhandled;
    self->send_error(res, {401, "missing or wrong API key (expected the header Authorization: Bearer KEY)",
                           "invalid_request_error", "", "invalid_api_key"});
    self->count(req.path, 401);
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([self](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    // A known route asked with another method (GET /v1/completions) is 405 with
    // the method it takes, not "no route".
    static const std::pair<const char*, const char*> routes[] = {
        {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/v1/cluster/fault", "POST"},
        {"/v1/models", "GET"},       {"/health", "GET"},               {"/metrics", "GET"},
        {"/v1/cluster", "GET"},      {"/", "GET"}};
    const char* allowed = nullptr;
    for (const auto& r : routes)
      if (req.path == r.first && req.method != r.second) allowed = r.second;
    if (res.status == 404 && allowed) {
      res.set_header("Allow", allowed);
      self->send_error(res, {405, req.method + " " + req.path + " is not allowed; expected " + allowed + " " + req.path,
                             "invalid_request_error", "", "method_not_allowed"});
      self->count("other", 405);
    } else if (res.status == 404) {
      self->send_error(res, {404, "no route " + req.method + " " + req.path + " (see GET /v1/models, "
                                  "POST /v1/completions, POST /v1/chat/completions, GET /health, GET /metrics)",
                             "invalid_request_error", "", "unknown_url"});
      self->count("other", 404);
    } else if (res.status == 413) {
      self->send_error(res, {413, "the request body is larger than " + std::to_string(self->opts.max_body_bytes) +
                                      " bytes", "invalid_request_error", "", "request_too_large"});
      self->count("other", 413);
    } else {
      self->send_error(res, {res.status, "HTTP error " + std::to_string(res.status), "invalid_request_error"});
    }
  });
  http.set_exception_handler([self](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    self->send_error(res, {500, "internal error on " + req.path + ": " + what, "server_error"});
  });

  http.Post("/v1/completions", [self](const httplib::Request& req, httplib::Response& res) {
    self->completion(req, res, false);
  });
  http.Post("/v1/chat/completions", [self](const httplib::Request& req, httplib::Response& res) {
    self->completion(req, res, true);
  });
  http.Get("/v1/models", [self](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json(json{{"object", "list"}, {"data", json::array({self->model_object()})}}),
                    "application/json");
    self->count("/v1/models", 200);
  });
  // OpenAI's models.retrieve: the loaded model by its id, else 404 model_not_found.
  http.Get(R"(/v1/models/([^/]+))", [self](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    if (!self->serves(name)) {
      self->send_error(res, self->model_not_found(name));
    } else {
      res.status = 200;
      res.set_content(dump_json(self->model_object()), "application/json");
    }
    self->count("/v1/models/{id}", res.status);
  });
  http.Get("/health", [self](const httplib::Request&, httplib::Response& res) {
    const json h = self->health();
    res.status = h["status"] == "failed" ? 503 : 200;
    res.set_content(dump_json(h), "application/json");
    self->count("/health", res.status);
  });
  http.Get("/metrics", [self](const httplib::Request&, httplib::Response& res) {
    res.set_content(self->metrics(), "text/plain; version=0.0.4");
    self->count("/metrics", 200);
  });
  http.Get("/v1/cluster", [self](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json(self->cluster_view()), "application/json");
  });
  if (o.allow_fault_injection && im.inject)
    http.Post("/v1/cluster/fault", [self](const httplib::Request& req, httplib::Response& res) {
      json j;
      try {
        j = json::parse(req.body);
      } catch (const std::exception& e) {
        return self->send_error(res, {400, std::string("the body is not valid JSON: ") + e.what()});
      }
      if (!j.is_object() || !j.contains("node") || !j["node"].is_number_integer() || !j.contains("kind") ||
          !j["kind"].is_string() || (j["kind"] != "crash" && j["kind"] != "freeze"))
        return self->send_error(res, {400, "expected {\"node\": integer, \"kind\": \"crash\" | \"freeze\"}"});
      auto r = self->inject(j["node"].get<int>(), j["kind"].get<std::string>());
      if (!r) return self->send_error(res, {409, r.message(), "invalid_request_error", "node"});
      res.set_content(dump_json(json{{"ok", true}}), "application/json");
    });
  http.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(page_html(), "text/html"); });

  int port = o.port;
  if (port == 0) {
    port = http.bind_to_any_port(o.host);
    if (port < 0) return make_error("--listen " + o.host + ":0: cannot bind a free port");
  } else if (!http.bind_to_port(o.host, port)) {
    return make_error("--listen " + o.host + ":" + std::to_string(port) + ": cannot bind (in use, or not a local address)");
  }
  im.address = o.host + ":" + std::to_string(port);
  return im.address;
}

void server::run() {
  if (impl_->http) impl_->http->listen_after_bind();
}

void server::stop() {
  if (impl_ && impl_->http) impl_->http->stop();
}

}  // namespace cellshard::serve
