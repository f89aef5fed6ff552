#include "tests/serve/serve_support.hpp"

#include "base/parse.hpp"
#include "base/spawn.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace cellshard::test {

child::child(const std::vector<std::string>& args, const std::string& err_path, double deadline_s)
    : err_path_(err_path) {
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(err >= 0);
  pid_ = spawn_child(args, -1, out[1], err);  // parent-death kill, descriptors closed (base/spawn.hpp)
  ::close(out[1]);
  ::close(err);
  REQUIRE(pid_ > 0);
  out_fd_ = out[0];
  // The first line: "listening HOST:PORT" (base/spawn.hpp).
  auto listening = read_listening_line(out_fd_, std::chrono::milliseconds(static_cast<long>(deadline_s * 1000)));
  INFO("child " << args[0] << " " << (args.size() > 1 ? args[1] : "") << ": "
                << (listening ? listening->line : listening.message()) << "\nstderr: " << log());
  REQUIRE(listening);
  port_ = listening->port;
}

child::~child() {
  if (pid_ > 0) {
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
}

void child::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

int child::terminate(double deadline_s) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    pollfd none{-1, 0, 0};
    ::poll(&none, 0, 50);  // waiting for another process to exit: nothing to synchronise with
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return -1;
}

std::string child::log() const {
  std::ifstream in(err_path_);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
}

std::vector<sse_event> parse_sse(const std::string& body) {
  std::vector<sse_event> out;
  size_t start = 0;
  while (start < body.size()) {
    size_t end = body.find("\n\n", start);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(start, end - start);
    start = end + 2;
    sse_event e;
    bool any = false;
    size_t ls = 0;
    while (ls < ev.size()) {
      size_t le = ev.find('\n', ls);
      if (le == std::string::npos) le = ev.size();
      const std::string line = ev.substr(ls, le - ls);
      ls = le + 1;
      if (line.rfind("id: ", 0) == 0) e.id = parse_uint<int>(std::string_view(line).substr(4)).value_or(-2), any = true;
      else if (line.rfind("data: ", 0) == 0) e.data = line.substr(6), any = true;
    }
    if (any) out.push_back(e);
  }
  return out;
}

std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> m;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    m[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return m;
}

std::string stream_text(const std::vector<sse_event>& events) {
  std::string text;
  for (const auto& e : events) {
    if (e.data.empty() || e.data == "[DONE]") continue;
    const auto j = nlohmann::json::parse(e.data);
    if (!j.contains("choices")) continue;
    for (const auto& c : j["choices"]) {
      if (c.contains("text")) text += c["text"].get<std::string>();
      if (c.contains("delta") && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    }
  }
  return text;
}

std::string private_models(const std::string& dir) {
  const std::string m = dir + "/models";
  ::mkdir(m.c_str(), 0755);
  for (const char* f : {"stories260K.bin", "tok512.bin"}) {
    std::ofstream out(m + "/" + f, std::ios::binary);
    out << read_file(shared_file(std::string("models/") + f));
  }
  return m;
}

}  // namespace cellshard::test
