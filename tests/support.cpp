#include "tests/support.hpp"

#include "base/parse.hpp"
#include "base/spawn.hpp"

#include <cstring>

#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <fcntl.h>
#include <poll.h>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace cellshard::test {

static bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

bool have_shared() {
  if (exists(std::string(CELLSHARD_SHARED_DIR) + "/fixtures/README.md")) return true;
  if (std::getenv("CI") != nullptr) {
    FAIL("../shared (models and fixtures) is missing at " CELLSHARD_SHARED_DIR
         " and CI is set: tests that need it must run");
  }
  WARN("skipped: ../shared (models and fixtures) not found at " CELLSHARD_SHARED_DIR);
  return false;
}

std::string shared_file(const std::string& rel) {
  if (!have_shared()) return "";
  return std::string(CELLSHARD_SHARED_DIR) + "/" + rel;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  INFO(path);
  REQUIRE(out.good());
}

std::vector<reference_run> gguf_reference_runs(const std::string& model, const std::string& dir) {
  std::vector<reference_run> runs;
  const std::string path = shared_file("models/gguf/gguf-small-reference-ids.json");
  if (path.empty()) return runs;
  const auto ref = nlohmann::json::parse(read_file(path));
  for (const auto& r : ref.at("runs")) {
    if (r.at("model") != model) continue;
    reference_run rr;
    rr.prompt = r.at("prompt").get<std::string>();
    rr.ids = r.at("prompt_ids").get<std::vector<int>>();
    const auto gen = r.at("generated_ids").get<std::vector<int>>();
    rr.ids.insert(rr.ids.end(), gen.begin(), gen.end());
    std::string line;
    for (int id : rr.ids) line += (line.empty() ? "" : ",") + std::to_string(id);
    rr.ids_file = dir + "/" + model + "-" + std::to_string(runs.size()) + ".ids";
    write_file(rr.ids_file, line + "\n");
    runs.push_back(std::move(rr));
  }
  return runs;
}

std::vector<int> gguf_reference_ids(const std::string& model, const std::string& prompt) {
  const auto ref = nlohmann::json::parse(read_file(shared_file("models/gguf/gguf-small-reference-ids.json")));
  for (const auto& run : ref.at("runs"))
    if (run.at("model") == model && run.at("prompt") == prompt) {
      auto ids = run.at("prompt_ids").get<std::vector<int>>();
      const auto gen = run.at("generated_ids").get<std::vector<int>>();
      ids.insert(ids.end(), gen.begin(), gen.end());
      return ids;
    }
  FAIL("no reference run of " << model << " for '" << prompt << "'");
  return {};
}

std::vector<int> ids_written(const command_result& r, const std::string& path) {
  INFO(r.err);
  REQUIRE(r.status == 0);
  return read_ids(path);
}

std::vector<int> read_ids(const std::string& path) {
  std::vector<int> ids;
  std::istringstream in(read_file(path));
  std::string tok;
  while (std::getline(in, tok, ',')) {
    while (!tok.empty() && (tok.back() == '\n' || tok.back() == '\r' || tok.back() == ' ')) tok.pop_back();
    const auto id = parse_uint<int>(tok);  // base/parse.hpp
    INFO(path << ": entry " << ids.size() << " is '" << tok << "'");
    REQUIRE(id);
    ids.push_back(*id);
  }
  return ids;
}

void put_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
float get_le_f32(const uint8_t* p) {
  const uint32_t u = get_le32(p);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string cellshard_bin() { return std::string(CELLSHARD_BINARY_DIR) + "/tools/cellshard"; }

std::string temp_dir(const std::string& name) {
  std::string base = std::string(CELLSHARD_BINARY_DIR) + "/tmp";
  ::mkdir(base.c_str(), 0755);
  std::string d = base + "/" + name + "-" + std::to_string(::getpid());
  ::mkdir(d.c_str(), 0755);
  return d;
}

command_result run_command(const std::vector<std::string>& args, double timeout_s) {
  command_result r;
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) return r;
  const pid_t pid = spawn_child(args, -1, out_pipe[1], err_pipe[1]);  // base/spawn.hpp
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    return r;
  }
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      ::kill(pid, SIGKILL);
      break;
    }
    int n = ::poll(fds, 2, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP))) {
        ssize_t k = ::read(fds[i].fd, buf, sizeof buf);
        if (k <= 0) {
          ::close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
        } else {
          (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(k));
        }
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const std::vector<fixture_case>& fixture_cases() {
  static const std::vector<fixture_case> cases = {
      {"greedy_bos_n200", "", 200, 0.0f, 0.9f, 0},
      {"greedy_prompt_once_n120", "Once upon a time", 120, 0.0f, 0.9f, 0},
      {"greedy_prompt_lily_tom_n100", "Lily and Tom went to the park with their dog", 100, 0.0f,
       0.9f, 0},
      {"topp_t1.0_p0.9_s133742_n256", "", 256, 1.0f, 0.9f, 133742},
      {"topp_t0.5_p0.95_s7_n150", "", 150, 0.5f, 0.95f, 7},
      {"mult_t0.9_p1.0_s2024_n150", "The little cat", 150, 0.9f, 1.0f, 2024},
  };
  return cases;
}

}  // namespace cellshard::test
