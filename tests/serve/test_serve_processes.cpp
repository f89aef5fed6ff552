// `cellshard serve` as a process, with real clients (curl, and cpp-httplib's
// client where a test must act in the middle of a stream): completions equal
// to `run`, streaming events, faults of node daemons during a stream,
// cancellation, and the bad-request table of issue #22. Model: stories260K.
#include "tests/serve/serve_support.hpp"
#include "base/parse.hpp"

#include <atomic>
#include <cstdlib>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>
#include <unistd.h>

using namespace cellshard;
using json = nlohmann::json;

namespace {

struct models {
  std::string dir, model, tok;
};

models copy_models(const std::string& name) {
  models m;
  m.dir = test::private_models(test::temp_dir(name));
  m.model = m.dir + "/stories260K.bin";
  m.tok = m.dir + "/tok512.bin";
  return m;
}

std::vector<std::string> serve_args(const models& m, std::vector<std::string> extra) {
  std::vector<std::string> a = {test::cellshard_bin(), "serve", "-m", m.model, "-z", m.tok, "--listen", "127.0.0.1:0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

/// curl from PATH (run_command does not search it).
std::string curl_bin() {
  for (const char* d : {"/usr/bin/curl", "/usr/local/bin/curl", "/bin/curl"})
    if (::access(d, X_OK) == 0) return d;
  FAIL("curl is not installed (scripts/install-deps.sh installs it)");
  return "";
}

std::string url(int port, const std::string& path) { return "http://127.0.0.1:" + std::to_string(port) + path; }

/// curl -sS (-N) POST with a JSON body; returns stdout (the -w line appended: "\nHTTP <code>").
test::command_result curl_post(int port, const std::string& path, const std::string& body, bool stream = false) {
  std::vector<std::string> a = {curl_bin(), "-sS", "-X", "POST", url(port, path), "-H", "Content-Type: application/json",
                                "--data-binary", body, "-w", "\nHTTP %{http_code}"};
  if (stream) a.insert(a.begin() + 1, "-N");
  return test::run_command(a, 120);
}

/// Splits curl's output into the body and the status code written by -w.
std::pair<std::string, int> body_status(const std::string& out) {
  const size_t k = out.rfind("\nHTTP ");
  if (k == std::string::npos) return {out, -1};
  return {out.substr(0, k), parse_uint<int>(std::string_view(out).substr(k + 6)).value_or(-1)};
}

std::string metrics_of(int port) {
  httplib::Client cli("127.0.0.1", port);
  auto r = cli.Get("/metrics");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  return r->body;
}

double sum_of(const std::map<std::string, double>& m, const std::string& prefix) {
  double s = 0;
  for (const auto& kv : m)
    if (kv.first.rfind(prefix, 0) == 0) s += kv.second;
  return s;
}

/// A streamed completion through cpp-httplib's client; `on_event(id)` runs for
/// each token event and returns false to close the connection.
struct stream_result {
  std::vector<test::sse_event> events;
  int status = 0;
  bool completed = false;
};
stream_result stream(int port, const json& body, const std::function<bool(int)>& on_event = {}) {
  stream_result out;
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(120, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  std::string buf;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    buf.append(d, n);
    size_t k;
    while ((k = buf.find("\n\n")) != std::string::npos) {
      auto evs = test::parse_sse(buf.substr(0, k + 2));
      buf.erase(0, k + 2);
      for (auto& e : evs) {
        out.events.push_back(e);
        if (e.id >= 0 && on_event && !on_event(e.id)) return false;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  out.completed = cli.send(req, res, err);
  out.status = res.status;
  return out;
}

/// Token events have consecutive ids 0..n-1; the stream ends with [DONE].
void check_events(const std::vector<test::sse_event>& events, int* tokens) {
  int next = 0;
  for (const auto& e : events)
    if (e.id >= 0) {
      REQUIRE(e.id == next);
      ++next;
    }
  REQUIRE(!events.empty());
  CHECK(events.back().data == "[DONE]");
  *tokens = next;
}

/// Polls `pred` (a cheap HTTP query) up to `deadline_s`: the state of another
/// process can only be observed, not awaited.
bool eventually(const std::function<bool()>& pred, double deadline_s = 30) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

}  // namespace

TEST_CASE("serve: a completion at temperature 0 equals run -t 0 (curl, not streamed)", "[serve][processes]") {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-equals-run");
  const std::string prompt = "Once upon a time";
  auto run = test::run_command({test::cellshard_bin(), "run", "-m", m.model, "-z", m.tok, "-i", prompt, "-n", "0", "-t", "0"});
  REQUIRE(run.status == 0);
  REQUIRE(run.out.size() > 100);
  test::child srv(serve_args(m, {"--nodes", "3"}), test::temp_dir("serve-equals-run") + "/serve.err");
  // echo: the prompt as the tokenizer decodes it, then the completion = run's stdout (without its final newline).
  auto [body, status] = body_status(
      curl_post(srv.port(), "/v1/completions",
                json{{"prompt", prompt}, {"max_tokens", 1000}, {"temperature", 0}, {"echo", true}}.dump())
          .out);
  INFO(body << "\n" << srv.log());
  REQUIRE(status == 200);
  const auto j = json::parse(body);
  CHECK(j["object"] == "text_completion");
  CHECK(j["model"] == "stories260K");
  CHECK(j["choices"].size() == 1);
  CHECK(j["choices"][0]["text"].get<std::string>() + "\n" == run.out);
  const int completion = j["usage"]["completion_tokens"];
  const int prompt_tokens = j["usage"]["prompt_tokens"];
  CHECK(j["usage"]["total_tokens"] == completion + prompt_tokens);
  // Without echo: only what was generated (run's output after the prompt's pieces).
  auto [body2, status2] = body_status(
      curl_post(srv.port(), "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 1000}, {"temperature", 0}}.dump())
          .out);
  REQUIRE(status2 == 200);
  const std::string text = json::parse(body2)["choices"][0]["text"];
  REQUIRE(text.size() > 50);
  CHECK(run.out.size() > text.size());
  CHECK(run.out.compare(run.out.size() - text.size() - 1, text.size(), text) == 0);
  // max_tokens bounds the generated tokens exactly.
  auto [body3, status3] = body_status(
      curl_post(srv.port(), "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 7}, {"temperature", 0}}.dump()).out);
  REQUIRE(status3 == 200);
  const auto j3 = json::parse(body3);
  CHECK(j3["usage"]["completion_tokens"] == 7);
  CHECK(j3["choices"][0]["finish_reason"] == "length");
  CHECK(text.rfind(j3["choices"][0]["text"].get<std::string>(), 0) == 0);
  // GET /v1/models names the loaded model, GET /v1/models/ID gives it, and a
  // request naming it is the same as one without a model.
  auto models_out = test::run_command({curl_bin(), "-sS", url(srv.port(), "/v1/models")});
  const auto ml = json::parse(models_out.out);
  CHECK(ml["data"][0]["id"] == "stories260K");
  auto [one, one_status] = body_status(
      test::run_command({curl_bin(), "-sS", url(srv.port(), "/v1/models/stories260K"), "-w", "\nHTTP %{http_code}"}).out);
  CHECK(one_status == 200);
  CHECK(json::parse(one) == ml["data"][0]);
  auto [named, named_status] = body_status(
      curl_post(srv.port(), "/v1/completions",
                json{{"model", "stories260K"}, {"prompt", prompt}, {"max_tokens", 7}, {"temperature", 0}}.dump())
          .out);
  CHECK(named_status == 200);
  CHECK(json::parse(named)["choices"][0]["text"] == j3["choices"][0]["text"]);
  CHECK(srv.terminate() == 0);
}

TEST_CASE("serve: chat completions use the model's chat format (--chat-format, else the GGUF's template)",
          "[serve][processes]") {
  if (!test::have_shared()) return;
  const std::string gguf = test::shared_file("models/gguf/stories260K.gguf");
  const std::string dir = test::temp_dir("serve-chat-format");
  // The ids run --chat feeds for this conversation in ChatML, and joined (the file has no template).
  auto ids_of = [&](const std::string& text) {
    auto t = test::run_command({test::cellshard_bin(), "tokenize", "-m", gguf, "-i", text});
    REQUIRE(t.status == 0);
    int n = 0;
    for (char c : t.out) n += c == ' ';
    return n + 1;
  };
  const int chatml = ids_of("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nOnce upon<|im_end|>\n"
                            "<|im_start|>assistant\n");
  const int joined = ids_of("Be brief.\nOnce upon");
  REQUIRE(chatml != joined);
  const std::string body =
      json{{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Once upon"}}}},
           {"max_tokens", 2},
           {"temperature", 0}}
          .dump();
  for (auto [flags, want] : {std::pair<std::vector<std::string>, int>{{"--chat-format", "chatml"}, chatml},
                             {{}, joined}}) {
    std::vector<std::string> a = {test::cellshard_bin(), "serve", "-m", gguf, "--listen", "127.0.0.1:0"};
    a.insert(a.end(), flags.begin(), flags.end());
    test::child srv(a, dir + "/serve.err");
    auto [out, status] = body_status(curl_post(srv.port(), "/v1/chat/completions", body).out);
    INFO(out << "\n" << srv.log());
    REQUIRE(status == 200);
    CHECK(json::parse(out)["usage"]["prompt_tokens"] == want);
    CHECK(srv.terminate() == 0);
  }
  auto bad = test::run_command({test::cellshard_bin(), "serve", "-m", gguf, "--listen", "127.0.0.1:0",
                                "--chat-format", "vicuna"});
  CHECK(bad.status == 2);
  CHECK_THAT(bad.err, Catch::Contains("--chat-format: chat format 'vicuna' is not known"));
}

TEST_CASE("serve: streamed completions over curl: one event per token, consecutive ids, [DONE]", "[serve][processes]") {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-stream");
  test::child srv(serve_args(m, {"--nodes", "2"}), test::temp_dir("serve-stream") + "/serve.err");
  const json req = {{"prompt", "The little dog"}, {"max_tokens", 40}, {"temperature", 0.8}, {"seed", 42}};
  auto [plain, st] = body_status(curl_post(srv.port(), "/v1/completions", req.dump()).out);
  REQUIRE(st == 200);
  const auto pj = json::parse(plain);
  json sreq = req;
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  auto [sbody, sst] = body_status(curl_post(srv.port(), "/v1/completions", sreq.dump(), true).out);
  INFO(sbody);
  REQUIRE(sst == 200);
  const auto events = test::parse_sse(sbody);
  int tokens = 0;
  check_events(events, &tokens);
  // The same seed gives the same text, streamed or not; one event per generated token.
  CHECK(test::stream_text(events) == pj["choices"][0]["text"].get<std::string>());
  CHECK(tokens == pj["usage"]["completion_tokens"].get<int>());
  // Before [DONE]: a chunk with the finish reason, then the usage chunk.
  REQUIRE(events.size() >= 3);
  const auto fin = json::parse(events[events.size() - 3].data);
  CHECK(fin["choices"][0]["finish_reason"] == pj["choices"][0]["finish_reason"]);
  const auto usage = json::parse(events[events.size() - 2].data);
  CHECK(usage["usage"]["completion_tokens"] == tokens);
  // Chat, streamed: the first chunk carries the role, the text equals the
  // non-streamed answer for the same seed.
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                     {"max_tokens", 30}, {"temperature", 0.8}, {"seed", 9}};
  auto [cplain, cst] = body_status(curl_post(srv.port(), "/v1/chat/completions", chat.dump()).out);
  REQUIRE(cst == 200);
  const auto cj = json::parse(cplain);
  CHECK(cj["object"] == "chat.completion");
  CHECK(cj["choices"][0]["message"]["role"] == "assistant");
  json cs = chat;
  cs["stream"] = true;
  auto [cbody, cst2] = body_status(curl_post(srv.port(), "/v1/chat/completions", cs.dump(), true).out);
  REQUIRE(cst2 == 200);
  const auto cevents = test::parse_sse(cbody);
  int ctokens = 0;
  check_events(cevents, &ctokens);
  CHECK(json::parse(cevents[0].data)["choices"][0]["delta"]["role"] == "assistant");
  CHECK(test::stream_text(cevents) == cj["choices"][0]["message"]["content"].get<std::string>());
  CHECK(ctokens == cj["usage"]["completion_tokens"].get<int>());
  // /metrics counted them.
  const auto mt = test::parse_metrics(metrics_of(srv.port()));
  CHECK(mt.at("cellshard_tokens_total{kind=\"completion\"}") == pj["usage"]["completion_tokens"].get<int>() + tokens +
                                                                      cj["usage"]["completion_tokens"].get<int>() + ctokens);
  CHECK(mt.at("cellshard_ttft_seconds_count") == 4);
  CHECK(mt.at("cellshard_sessions_active") == 0);
}

TEST_CASE("serve --cluster: cancellation frees every daemon's KV cache, and a SIGKILL and a SIGSTOP during a stream "
          "leave its text unchanged",
          "[serve][processes]") {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-daemons");
  const std::string dir = test::temp_dir("serve-daemons");
  // 3 working daemons and 2 spares (one for the killed node, one for the frozen one).
  std::vector<std::unique_ptr<test::child>> nodes;
  json cluster = {{"nodes", json::array()}};
  for (int i = 0; i < 5; ++i) {
    nodes.push_back(std::make_unique<test::child>(
        std::vector<std::string>{test::cellshard_bin(), "node", "--listen", "127.0.0.1:0", "--models", m.dir},
        dir + "/node-" + std::to_string(i) + ".err"));
    cluster["nodes"].push_back({{"host", "127.0.0.1"}, {"port", nodes.back()->port()}, {"spare", i >= 3}});
  }
  std::ofstream(dir + "/cluster.json") << cluster.dump();
  test::child srv(serve_args(m, {"--cluster", dir + "/cluster.json"}), dir + "/serve.err");
  INFO(srv.log());

  // Cancellation: the client closes the connection after 5 tokens.
  auto before = test::parse_metrics(metrics_of(srv.port()));
  const json longreq = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"temperature", 0}, {"stream", true}};
  auto cut = stream(srv.port(), longreq, [](int id) { return id < 4; });
  CHECK(!cut.completed);
  int seen = 0;
  for (const auto& e : cut.events) seen += e.id >= 0;
  CHECK(seen == 5);
  std::map<std::string, double> after;
  CHECK(eventually([&] {
    after = test::parse_metrics(metrics_of(srv.port()));
    return after["cellshard_sessions_active"] == 0 && sum_of(after, "cellshard_shard_sessions") == 0 &&
           sum_of(after, "cellshard_shard_kv_bytes") == sum_of(before, "cellshard_shard_kv_bytes");
  }));
  CHECK(after["cellshard_cancelled_total"] == 1);
  for (int n = 0; n < 5; ++n) {
    const std::string key = "cellshard_node_memory_bytes{node=\"" + std::to_string(n) + "\"}";
    CHECK(after[key] == before[key]);  // every daemon's KV memory back to its level
  }
  // No shard computes for the cancelled session any more: its kernel time stands still.
  const auto later = test::parse_metrics(metrics_of(srv.port()));
  CHECK(sum_of(later, "cellshard_shard_compute_seconds_total") == sum_of(after, "cellshard_shard_compute_seconds_total"));
  // It stopped early: far fewer positions computed than the 400 asked for would take.
  CHECK(after["cellshard_tokens_total{kind=\"completion\"}"] < 50);

  // The fault-free text for seed 7, then the same request while daemon 1 is
  // SIGKILLed (at token 10) and daemon 2 SIGSTOPped (at token 30).
  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 120}, {"temperature", 0.8}, {"seed", 7},
                    {"stream", true}};
  auto ref = stream(srv.port(), req);
  REQUIRE(ref.completed);
  int ref_tokens = 0;
  check_events(ref.events, &ref_tokens);
  REQUIRE(ref_tokens >= 40);
  auto faulted = stream(srv.port(), req, [&](int id) {
    if (id == 10) nodes[1]->signal(SIGKILL);
    if (id == 30) nodes[2]->signal(SIGSTOP);
    return true;
  });
  INFO(srv.log());
  REQUIRE(faulted.completed);
  int tokens = 0;
  check_events(faulted.events, &tokens);  // no token repeated or lost
  CHECK(tokens == ref_tokens);
  CHECK(test::stream_text(faulted.events) == test::stream_text(ref.events));
  auto mt = test::parse_metrics(metrics_of(srv.port()));
  CHECK(mt["cellshard_recoveries_total"] >= 2);
  httplib::Client cli("127.0.0.1", srv.port());
  auto h = cli.Get("/health");
  REQUIRE(h);
  const auto hj = json::parse(h->body);
  CHECK(hj["status"] == "degraded");
  CHECK(hj["nodes_down"] == json::array({1, 2}));
  nodes[2]->signal(SIGCONT);
  CHECK(srv.terminate() == 0);
}

// `--fault` on serve means what it means on run, counting the positions of
// the first session that reaches them: here the first stream meets a crash,
// a node slowed for every step after position 10 and a node frozen for ever,
// in process. Its text and token indices equal those of the next stream with
// the same seed (which meets no fault: they have fired) and those of a server
// started without faults; /metrics and the page's view show the recoveries.
TEST_CASE("serve --fault: a crash, a freeze and a slow node during a stream leave its text unchanged",
          "[serve][processes]") {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-fault-flags");
  const std::string dir = test::temp_dir("serve-fault-flags");
  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 80}, {"temperature", 0.8}, {"seed", 11},
                    {"stream", true}};
  std::string clean_text;
  int clean_tokens = 0;
  {
    test::child clean(serve_args(m, {"--nodes", "3"}), dir + "/clean.err");
    auto r = stream(clean.port(), req);
    REQUIRE(r.completed);
    check_events(r.events, &clean_tokens);
    clean_text = test::stream_text(r.events);
    CHECK(clean.terminate() == 0);
  }
  REQUIRE(clean_tokens == 80);
  test::child srv(serve_args(m, {"--nodes", "3", "--spares", "2", "--fault", "slow:node=0:step=10:ms=2", "--fault",
                                 "crash:node=1:step=20", "--fault", "silence:node=2:step=40"}),
                  dir + "/serve.err");
  INFO(srv.log());
  auto faulted = stream(srv.port(), req);
  REQUIRE(faulted.completed);
  int tokens = 0;
  check_events(faulted.events, &tokens);  // consecutive indices: no token repeated or lost
  CHECK(tokens == clean_tokens);
  CHECK(test::stream_text(faulted.events) == clean_text);
  // The faults fired during the first session: the crash (restarted in place:
  // the node is alive in process) and the freeze (moved to a spare) are
  // recovered now; the slow node needed no restart.
  auto mt = test::parse_metrics(metrics_of(srv.port()));
  CHECK(mt["cellshard_recoveries_total"] == 2);
  CHECK(mt["cellshard_faults_total{kind=\"slow\"}"] == 1);
  CHECK(mt["cellshard_faults_total{kind=\"crash\"}"] == 1);
  CHECK(mt["cellshard_faults_total{kind=\"silence\"}"] == 1);
  CHECK(mt["cellshard_fault_detect_seconds_count"] == 2);
  CHECK(mt["cellshard_fault_recover_seconds_count"] == 2);
  httplib::Client cli("127.0.0.1", srv.port());
  auto view = cli.Get("/v1/cluster");
  REQUIRE(view);
  const auto faults = json::parse(view->body)["faults"];
  INFO(faults.dump());
  REQUIRE(faults.size() == 3);
  const json want[] = {{{"kind", "slow"}, {"node", 0}, {"step", 10}, {"restarted", false}, {"recovered", false}},
                       {{"kind", "crash"}, {"node", 1}, {"step", 20}, {"restarted", true}, {"recovered", true},
                        {"moved_to_node", 1}},
                       {{"kind", "silence"}, {"node", 2}, {"step", 40}, {"restarted", true}, {"recovered", true},
                        {"moved_to_node", 3}}};
  for (size_t i = 0; i < 3; ++i) {
    for (const auto& kv : want[i].items()) CHECK(faults[i][kv.key()] == kv.value());
    if (want[i]["recovered"] == true) {
      CHECK(faults[i]["detect_ms"].get<double>() >= 0);
      CHECK(faults[i]["recover_ms"].get<double>() >= 0);
    }
  }
  // The frozen node lost its shard; the slowed one still holds its shard and is up.
  auto h = cli.Get("/health");
  REQUIRE(h);
  CHECK(json::parse(h->body)["status"] == "degraded");
  CHECK(json::parse(h->body)["nodes_down"] == json::array({2}));
  // The next session meets no fault and streams the same text.
  auto again = stream(srv.port(), req);
  REQUIRE(again.completed);
  CHECK(test::stream_text(again.events) == clean_text);
  CHECK(test::parse_metrics(metrics_of(srv.port()))["cellshard_recoveries_total"] == 2);
  CHECK(srv.terminate() == 0);
}

// Batch invariance through the API: four streams with their own seeds are
// sent at once (each waits, after its first token, until all four have one,
// so that all four sessions have started before any client reads on) and
// each streams the text the same request gives alone. How many sessions
// overlap in the pipeline depends on the machine's speed (a session may end
// while its client waits): it is reported, not asserted.
TEST_CASE("serve: concurrent sessions with a seed each stream the text each gives alone", "[serve][processes]") {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-concurrent");
  test::child srv(serve_args(m, {"--nodes", "3", "--max-sessions", "4"}), test::temp_dir("serve-concurrent") + "/serve.err");
  INFO(srv.log());
  auto req = [](int seed) {
    return json{{"prompt", "Once upon a time"}, {"max_tokens", 60}, {"temperature", 0.9}, {"seed", seed}};
  };
  std::vector<std::string> alone;
  for (int seed = 1; seed <= 4; ++seed) {
    auto [body, st] = body_status(curl_post(srv.port(), "/v1/completions", req(seed).dump()).out);
    REQUIRE(st == 200);
    alone.push_back(json::parse(body)["choices"][0]["text"]);
  }
  REQUIRE(alone[0] != alone[1]);
  std::mutex mu;
  std::condition_variable cv;
  int started = 0;
  double active_together = -1;
  std::vector<stream_result> together(4);
  std::vector<std::thread> clients;
  for (int k = 0; k < 4; ++k)
    clients.emplace_back([&, k] {
      json r = req(k + 1);
      r["stream"] = true;
      together[k] = stream(srv.port(), r, [&](int id) {
        if (id != 0) return true;
        std::unique_lock<std::mutex> lock(mu);
        if (++started == 4) {
          active_together = test::parse_metrics(metrics_of(srv.port()))["cellshard_sessions_active"];
          cv.notify_all();
        }
        cv.wait_for(lock, std::chrono::seconds(60), [&] { return started == 4; });
        return true;
      });
    });
  for (auto& t : clients) t.join();
  WARN("sessions active when all four had their first token: " << active_together);
  for (int k = 0; k < 4; ++k) {
    REQUIRE(together[k].completed);
    int tokens = 0;
    check_events(together[k].events, &tokens);
    CHECK(tokens == 60);
    CHECK(test::stream_text(together[k].events) == alone[k]);
  }
  // Without --allow-fault-injection there is no fault route.
  httplib::Client cli("127.0.0.1", srv.port());
  auto f = cli.Post("/v1/cluster/fault", R"({"node":1,"kind":"crash"})", "application/json");
  REQUIRE(f);
  CHECK(f->status == 404);
  CHECK(srv.terminate() == 0);
}

// The page's freeze button is POST /v1/cluster/fault {"kind": "freeze"}: in
// process, node 1's shard goes silent at its next step, which is in the next
// stream; that stream has the fault-free text, the shard moved to the spare.
TEST_CASE("serve --allow-fault-injection: a freeze injected through the API, recovered on the spare in the next stream",
          "[serve][processes]") {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-inject-freeze");
  test::child srv(serve_args(m, {"--nodes", "3", "--spares", "1", "--allow-fault-injection"}),
                  test::temp_dir("serve-inject-freeze") + "/serve.err");
  INFO(srv.log());
  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 60}, {"temperature", 0.8}, {"seed", 5},
                    {"stream", true}};
  auto ref = stream(srv.port(), req);
  REQUIRE(ref.completed);
  httplib::Client cli("127.0.0.1", srv.port());
  auto bad = cli.Post("/v1/cluster/fault", R"({"node":1,"kind":"melt"})", "application/json");
  REQUIRE(bad);
  CHECK(bad->status == 400);
  auto r = cli.Post("/v1/cluster/fault", R"({"node":1,"kind":"freeze"})", "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
  auto frozen = stream(srv.port(), req);
  REQUIRE(frozen.completed);
  int tokens = 0;
  check_events(frozen.events, &tokens);
  CHECK(tokens == 60);
  CHECK(test::stream_text(frozen.events) == test::stream_text(ref.events));
  auto view = cli.Get("/v1/cluster");
  REQUIRE(view);
  const auto faults = json::parse(view->body)["faults"];
  INFO(faults.dump());
  REQUIRE(faults.size() == 1);
  CHECK(faults[0]["node"] == 1);
  CHECK(faults[0]["recovered"] == true);
  CHECK(faults[0]["moved_to_node"] == 3);
  auto h = cli.Get("/health");
  REQUIRE(h);
  CHECK(json::parse(h->body)["nodes_down"] == json::array({1}));
  CHECK(srv.terminate() == 0);
}

// HTTPS with --tls-cert/--tls-key (certificates from `cellshard certs`),
// checked by curl against the CA, with --api-key; plain HTTP to it fails.
TEST_CASE("serve --tls-cert/--tls-key: HTTPS for curl, streamed and not, with an API key", "[serve][processes]") {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-https");
  const std::string dir = test::temp_dir("serve-https");
  auto certs = test::run_command({test::cellshard_bin(), "certs", dir + "/pki", "--force"}, 60);
  INFO(certs.err);
  REQUIRE(certs.status == 0);
  test::child srv(serve_args(m, {"--tls-cert", dir + "/pki/node.pem", "--tls-key", dir + "/pki/node.key", "--api-key",
                                 "sesame"}),
                  dir + "/serve.err");
  INFO(srv.log());
  const std::string base = "https://127.0.0.1:" + std::to_string(srv.port());
  auto post = [&](const json& body, bool stream) {
    std::vector<std::string> a = {curl_bin(), "-sS", "--cacert", dir + "/pki/ca.pem", "-X", "POST",
                                  base + "/v1/completions", "-H", "Content-Type: application/json", "-H",
                                  "Authorization: Bearer sesame", "--data-binary", body.dump(), "-w",
                                  "\nHTTP %{http_code}"};
    if (stream) a.insert(a.begin() + 1, "-N");
    return body_status(test::run_command(a, 120).out);
  };
  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 20}, {"temperature", 0.8}, {"seed", 3}};
  auto [plain, st] = post(req, false);
  INFO(plain);
  REQUIRE(st == 200);
  const auto pj = json::parse(plain);
  CHECK(pj["usage"]["completion_tokens"] == 20);
  json sreq = req;
  sreq["stream"] = true;
  auto [sbody, sst] = post(sreq, true);
  REQUIRE(sst == 200);
  const auto events = test::parse_sse(sbody);
  int tokens = 0;
  check_events(events, &tokens);
  CHECK(tokens == 20);
  CHECK(test::stream_text(events) == pj["choices"][0]["text"].get<std::string>());
  // Plain HTTP on the HTTPS port gets no answer.
  auto insecure = test::run_command({curl_bin(), "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                                     "http://127.0.0.1:" + std::to_string(srv.port()) + "/health"});
  CHECK(insecure.out == "000");
  CHECK(srv.terminate() == 0);
}

// ---- The bad-request table: each row is a test; after each, a good request still works.

namespace {

struct bad_case {
  std::vector<std::string> extra;  // serve flags
  std::string method = "POST", path = "/v1/completions", body;
  int status = 400;
  std::string code;                // error.code expected ("" = not checked)
  std::string param;               // error.param expected ("" = not checked)
};

void check_bad_request(const std::string& name, const bad_case& c) {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-bad-" + name);
  test::child srv(serve_args(m, c.extra), test::temp_dir("serve-bad-" + name) + "/serve.err");
  httplib::Client cli("127.0.0.1", srv.port());
  auto r = c.method == "GET" ? cli.Get(c.path.c_str()) : cli.Post(c.path.c_str(), c.body, "application/json");
  REQUIRE(r);
  INFO(r->body);
  CHECK(r->status == c.status);
  const auto j = json::parse(r->body);
  REQUIRE(j.contains("error"));
  CHECK(j["error"]["message"].get<std::string>().size() > 10);
  CHECK(j["error"].contains("type"));
  if (!c.code.empty()) CHECK(j["error"]["code"] == c.code);
  if (!c.param.empty()) CHECK(j["error"]["param"] == c.param);
  // Nothing else is affected.
  auto ok = cli.Post("/v1/completions", R"({"prompt":"Hi","max_tokens":3,"temperature":0})", "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(json::parse(ok->body)["usage"]["completion_tokens"] == 3);
  CHECK(srv.terminate() == 0);
}

}  // namespace

TEST_CASE("serve bad request: malformed JSON is 400", "[serve][processes]") {
  check_bad_request("json", {{}, "POST", "/v1/completions", "{\"prompt\": \"Hi\",", 400, "", ""});
}
TEST_CASE("serve bad request: a bad field is 400 naming it", "[serve][processes]") {
  check_bad_request("field", {{}, "POST", "/v1/chat/completions",
                              R"({"messages":[{"role":"user","content":"Hi"}],"temperature":"hot"})", 400, "",
                              "temperature"});
}
TEST_CASE("serve bad request: n other than 1 is 400", "[serve][processes]") {
  check_bad_request("n", {{}, "POST", "/v1/completions", R"({"prompt":"Hi","n":3})", 400, "", "n"});
}
TEST_CASE("serve bad request: an unknown model is 404", "[serve][processes]") {
  check_bad_request("model", {{}, "POST", "/v1/completions", R"({"prompt":"Hi","model":"gpt-4"})", 404,
                              "model_not_found", "model"});
}
TEST_CASE("serve bad request: retrieving an unknown model is 404", "[serve][processes]") {
  check_bad_request("model-get", {{}, "GET", "/v1/models/gpt-4", "", 404, "model_not_found", "model"});
}
TEST_CASE("serve bad request: an unknown route is 404", "[serve][processes]") {
  check_bad_request("route", {{}, "GET", "/v1/engines", "", 404, "unknown_url", ""});
}
TEST_CASE("serve bad request: a known route with another method is 405", "[serve][processes]") {
  // It was 404 "no route GET /v1/completions".
  check_bad_request("method", {{}, "GET", "/v1/completions", "", 405, "method_not_allowed", ""});
}
TEST_CASE("serve bad request: a body over --max-body is 413", "[serve][processes]") {
  check_bad_request("large", {{"--max-body", "2000"}, "POST", "/v1/completions",
                              json{{"prompt", std::string(3000, 'a')}}.dump(), 413, "request_too_large", ""});
}
TEST_CASE("serve bad request: a prompt longer than the context is 422", "[serve][processes]") {
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += "Once upon a time ";  // ~1200 tokens, the context is 512
  check_bad_request("context", {{}, "POST", "/v1/completions", json{{"prompt", prompt}}.dump(), 422,
                                "context_length_exceeded", "prompt"});
}
TEST_CASE("serve bad request: a wrong API key is 401", "[serve][processes]") {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-bad-key");
  test::child srv(serve_args(m, {"--api-key", "sesame"}), test::temp_dir("serve-bad-key") + "/serve.err");
  httplib::Client cli("127.0.0.1", srv.port());
  auto r = cli.Post("/v1/completions", R"({"prompt":"Hi","max_tokens":2})", "application/json");
  REQUIRE(r);
  CHECK(r->status == 401);
  CHECK(json::parse(r->body)["error"]["code"] == "invalid_api_key");
  auto ok = cli.Post("/v1/completions", httplib::Headers{{"Authorization", "Bearer sesame"}},
                     R"({"prompt":"Hi","max_tokens":2})", "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(cli.Get("/health")->status == 200);  // health needs no key
}

TEST_CASE("serve bad request: beyond --max-sessions is 429 with Retry-After, and the running stream is unaffected",
          "[serve][processes]") {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-bad-429");
  test::child srv(serve_args(m, {"--max-sessions", "1", "--nodes", "2"}), test::temp_dir("serve-bad-429") + "/serve.err");
  std::mutex mu;
  std::condition_variable cv;
  bool started = false, rejected = false;
  stream_result first;
  std::thread t([&] {
    first = stream(srv.port(), {{"prompt", "Once upon a time"}, {"max_tokens", 60}, {"temperature", 0}, {"stream", true}},
                   [&](int id) {
                     std::unique_lock<std::mutex> lock(mu);
                     if (id == 0) {
                       started = true;
                       cv.notify_all();
                       // Hold the session open until the second request was answered.
                       cv.wait_for(lock, std::chrono::seconds(30), [&] { return rejected; });
                     }
                     return true;
                   });
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return started; }));
  }
  httplib::Client cli("127.0.0.1", srv.port());
  auto r = cli.Post("/v1/completions", R"({"prompt":"Hi","max_tokens":2})", "application/json");
  {
    std::lock_guard<std::mutex> lock(mu);
    rejected = true;
    cv.notify_all();
  }
  t.join();
  REQUIRE(r);
  CHECK(r->status == 429);
  CHECK(r->get_header_value("Retry-After") == "1");
  CHECK(json::parse(r->body)["error"]["type"] == "rate_limit_error");
  REQUIRE(first.completed);
  int tokens = 0;
  check_events(first.events, &tokens);
  CHECK(tokens == 60);
}

TEST_CASE("serve bad request: with no capacity left (the only daemon killed, no spare) is 503", "[serve][processes]") {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-bad-503");
  const std::string dir = test::temp_dir("serve-bad-503");
  test::child node({test::cellshard_bin(), "node", "--listen", "127.0.0.1:0", "--models", m.dir}, dir + "/node.err");
  std::ofstream(dir + "/cluster.json") << json{{"nodes", {{{"host", "127.0.0.1"}, {"port", node.port()}}}}}.dump();
  test::child srv(serve_args(m, {"--cluster", dir + "/cluster.json"}), dir + "/serve.err");
  httplib::Client cli("127.0.0.1", srv.port());
  auto ok = cli.Post("/v1/completions", R"({"prompt":"Hi","max_tokens":3})", "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
  node.signal(SIGKILL);
  INFO(srv.log());
  // The runtime notices the loss (heartbeats, or the next request's step).
  std::shared_ptr<httplib::Response> last;
  CHECK(eventually([&] {
    auto r = cli.Post("/v1/completions", R"({"prompt":"Hi","max_tokens":3})", "application/json");
    if (r) last = std::make_shared<httplib::Response>(*r);
    return r && r->status == 503;
  }, 60));
  REQUIRE(last);
  CHECK(json::parse(last->body)["error"]["code"] == "cluster_failed");
  auto h = cli.Get("/health");
  REQUIRE(h);
  CHECK(h->status == 503);
  CHECK(json::parse(h->body)["status"] == "failed");
}

// SIGTERM stops serve and node cleanly (exit 0) also when OpenBLAS runs a
// worker pool: its threads start before main() with no signal mask, and serve
// (which waited for the signal on a watcher thread) was ended by the default
// action instead, status 143 (tools/stop_signals.hpp). ctest sets
// OPENBLAS_NUM_THREADS=1; the children here get 2. node took the signal on its
// main thread and was not affected; its case guards the new handler.
TEST_CASE("serve and node stop cleanly on SIGTERM with an OpenBLAS thread pool", "[serve][processes]") {
  if (!test::have_shared()) return;
  const auto m = copy_models("serve-sigterm");
  const std::string dir = test::temp_dir("serve-sigterm");
  // Inherited by the children started below; restored when the case ends.
  struct env_guard {
    const char* old = std::getenv("OPENBLAS_NUM_THREADS");
    std::string saved = old ? old : "";
    env_guard() { ::setenv("OPENBLAS_NUM_THREADS", "2", 1); }
    ~env_guard() {
      if (old) ::setenv("OPENBLAS_NUM_THREADS", saved.c_str(), 1);
      else ::unsetenv("OPENBLAS_NUM_THREADS");
    }
  } env;
  {
    test::child srv(serve_args(m, {}), dir + "/serve.err");
    test::child node({test::cellshard_bin(), "node", "--listen", "127.0.0.1:0", "--models", m.dir}, dir + "/node.err");
    httplib::Client cli("127.0.0.1", srv.port());
    auto ok = cli.Post("/v1/completions", R"({"prompt":"Hi","max_tokens":3,"temperature":0})", "application/json");
    REQUIRE(ok);
    CHECK(ok->status == 200);
    INFO(srv.log());
    CHECK(srv.terminate() == 0);
    CHECK_THAT(srv.log(), Catch::Contains("stopped (SIGTERM)"));
    INFO(node.log());
    CHECK(node.terminate() == 0);
    CHECK_THAT(node.log(), Catch::Contains("signal 15, stopping"));
  }
}

// A byte-level BPE vocabulary (Llama 3's) splits characters over tokens and
// can sample bytes that never form one: the server used to die on the first
// such byte in a stream (nlohmann's type_error 316) and answer 500 without
// one. Random weights with the 128,256-token vocabulary and a hot
// temperature produce both within 60 tokens.
TEST_CASE("serve: generated bytes that are not UTF-8 neither break the stream nor the server", "[serve][processes]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("serve-utf8");
  const std::string model = dir + "/l3.bin";
  auto syn = test::run_command({test::cellshard_bin(), "synth", "--config", "custom", "--vocab", "128256", "--dim", "64",
                                "--hidden", "128", "--layers", "1", "--heads", "4", "--kv-heads", "4", "--seq-len",
                                "256", "-o", model},
                               120);
  REQUIRE(syn.status == 0);
  const std::string vocab = test::shared_file("models/gguf/ggml-vocab-llama-bpe.gguf");
  test::child srv({test::cellshard_bin(), "serve", "-m", model, "-z", vocab, "--listen", "127.0.0.1:0"},
                  dir + "/serve.err");
  int replaced = 0;
  for (int seed : {1, 3, 8}) {
    const json req = {{"prompt", "Hi"}, {"max_tokens", 60}, {"temperature", 1.5}, {"seed", seed}};
    auto [plain, st] = body_status(curl_post(srv.port(), "/v1/completions", req.dump()).out);
    INFO("seed " << seed << ": " << plain << "\n" << srv.log());
    REQUIRE(st == 200);
    const auto pj = json::parse(plain);  // throws on invalid UTF-8: the body is valid
    const std::string text = pj["choices"][0]["text"].get<std::string>();
    if (text.find("\xEF\xBF\xBD") != std::string::npos) ++replaced;
    json sreq = req;
    sreq["stream"] = true;
    auto [sbody, sst] = body_status(curl_post(srv.port(), "/v1/completions", sreq.dump(), true).out);
    REQUIRE(sst == 200);
    const auto events = test::parse_sse(sbody);
    int tokens = 0;
    check_events(events, &tokens);
    // Every event is JSON; a character split over tokens arrives whole, so
    // the streamed text equals the non-streamed one byte for byte.
    CHECK(test::stream_text(events) == text);
    CHECK(tokens == pj["usage"]["completion_tokens"].get<int>());
  }
  // At least one seed sampled bytes that are no character (else this test
  // would not exercise the case): they arrive as U+FFFD.
  CHECK(replaced > 0);
  // The server is still there.
  httplib::Client cli("127.0.0.1", srv.port());
  auto alive = cli.Get("/v1/models");
  REQUIRE(alive);
  CHECK(alive->status == 200);
}
