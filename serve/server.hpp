// serve/server.hpp: an OpenAI-compatible HTTP front end to a running
// actors::cluster (`cellshard serve`, docs/serve.md), on cpp-httplib.
//
// Routes:
//   POST /v1/completions, POST /v1/chat/completions   OpenAI shapes (serve/openai.hpp);
//        stream: true answers text/event-stream, one event per generated token
//        ("id: <token index>" and a chunk), then a chunk with finish_reason,
//        then "data: [DONE]"
//   GET  /v1/models          the loaded model (id = model file name without extension)
//   GET  /v1/models/{id}     that model; another id is 404 model_not_found, as a
//                            completion naming another model is
//   GET  /health             {"status": "ready"|"degraded"|"failed", "nodes_down": [...]} (503 when failed)
//   GET  /metrics            Prometheus text, names prefixed cellshard_
//   GET  /v1/cluster         the live view the page polls (nodes, placement, faults, tokens/s)
//   POST /v1/cluster/fault   {"node": N, "kind": "crash"|"freeze"}: only with allow_fault_injection
//   GET  /                   the page (serve/page.cpp)
// Each request is one session of the cluster; they run concurrently and
// share the placement. Beyond max_sessions running sessions a request gets
// 429 with Retry-After. A streaming client that goes away (a write fails)
// has its session cancelled at once: every shard drops its KV cache.
//
// Thread safety: handlers run on the HTTP library's worker threads
// (max_sessions + 8 of them); the cluster is thread-safe; the server's own
// counters are atomics or under one mutex. Errors: bind() returns a result
// naming the address; requests get OpenAI error bodies (serve/openai.hpp).
#pragma once

#include "actors/cluster.hpp"
#include "model/chat.hpp"
#include "model/result.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace cellshard::serve {

struct server_options {
  std::string host = "127.0.0.1";
  int port = 0;                       // 0: a free port
  std::string api_key;                // "" = no authentication; else "Authorization: Bearer KEY"
  std::string tls_cert, tls_key;      // both or neither: HTTPS
  int max_sessions = 8;               // concurrent generation sessions
  size_t max_body_bytes = 1 << 20;    // larger bodies: 413
  bool allow_fault_injection = false; // POST /v1/cluster/fault and the page's buttons
  std::string model_id;               // the model file's name without extension
  model::chat::format chat_format = model::chat::format::none;  // of /v1/chat/completions (model/chat.hpp)
  std::chrono::milliseconds request_deadline{std::chrono::minutes(10)};  // a whole request, at most
};

/// Injects a fault of `kind` ("crash" or "freeze") into node `node` now.
using fault_action = std::function<result<void>(int node, const std::string& kind)>;

class server {
public:
  server(actors::cluster& cluster, server_options opts, fault_action inject = {});
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Binds the socket; returns "HOST:PORT" with the port chosen.
  result<std::string> bind();
  /// Serves until stop() (from another thread or a signal handler's helper).
  void run();
  void stop();
  /// Sessions running now.
  int active_sessions() const;

  struct impl;

private:
  std::unique_ptr<impl> impl_;
};

/// The page served at "/": plain HTML and JavaScript, no external resource.
const char* page_html();

}  // namespace cellshard::serve
