// tests/serve/serve_support.hpp: child processes for the serve tests: a
// `cellshard serve` or `cellshard node` started with its first stdout line
// (`listening HOST:PORT`) read under a deadline, stderr to a file, stopped
// (SIGKILL, then reaped) by the destructor; and small HTTP helpers.
#pragma once

#include "tests/support.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <map>
#include <string>
#include <sys/types.h>
#include <vector>

namespace cellshard::test {

class child {
public:
  /// Starts `args` (argv[0] = the program); waits at most `deadline_s` for
  /// the `listening HOST:PORT` line. REQUIREs that it came.
  child(const std::vector<std::string>& args, const std::string& err_path, double deadline_s = 60);
  ~child();
  child(const child&) = delete;
  child& operator=(const child&) = delete;
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  void signal(int sig);
  /// SIGTERM, then waits up to `deadline_s` for the exit; returns the exit
  /// status (-1: it had to be SIGKILLed, or ended by a signal).
  int terminate(double deadline_s = 20);
  std::string log() const;

private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
  std::string err_path_;
};

/// One SSE event of a streamed completion.
struct sse_event {
  int id = -1;         // the "id:" field (-1: none)
  std::string data;    // the "data:" field
};

/// Splits a text/event-stream body into events (comments dropped).
std::vector<sse_event> parse_sse(const std::string& body);

/// Parses the Prometheus text: "name{labels}" -> value (every sample line).
std::map<std::string, double> parse_metrics(const std::string& text);

/// The text of the streamed completion events (completions: choices[0].text;
/// chat: choices[0].delta.content), in order.
std::string stream_text(const std::vector<sse_event>& events);

/// A private copy of stories260K and tok512 in `dir`/models (returns the folder).
std::string private_models(const std::string& dir);

}  // namespace cellshard::test
