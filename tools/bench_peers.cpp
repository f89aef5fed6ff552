// `cellshard bench peers`: cellshard's decode speed against llama2.c's run.c
// (issue #18). See tools/bench.hpp (peers_bench_options).
#include "actors/local_daemons.hpp"
#include "base/percentile.hpp"
#include "base/spawn.hpp"
#include "tools/bench.hpp"

#include "tools/common.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <memory>
#include <vector>

namespace cellshard::tools {
namespace {

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "cellshard";
  buf[n] = 0;
  return buf;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

double children_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/// Runs `cmd` under `timeout`, stdout to `out` (default: discarded), stderr
/// to `err`. Returns the exit status (124: the deadline passed); *cpu_s (if
/// given) receives the CPU seconds (user + system) the command and its
/// children used.
int sh(const std::string& cmd, const std::string& err, int deadline_s, double* cpu_s = nullptr,
       const std::string& out = "/dev/null") {
  const std::string full = "timeout " + std::to_string(deadline_s) + " sh -c " + quote(cmd) +
                           " >" + quote(out) + " 2>" + quote(err);
  const double before = children_cpu_s();
  const int rc = std::system(full.c_str());
  if (cpu_s) *cpu_s = children_cpu_s() - before;
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

/// The value after the last "achieved tok/s: " in `text`, or -1.
double achieved(const std::string& text) {
  const std::string key = "achieved tok/s: ";
  const size_t at = text.rfind(key);
  if (at == std::string::npos) return -1;
  return std::atof(text.c_str() + at + key.size());
}

/// `p` as an absolute path without symlinks (realpath), or `p` unchanged.
std::string absolute(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

std::string find_first(const std::vector<std::string>& candidates) {
  for (const auto& c : candidates)
    if (!c.empty() && exists(c)) return c;
  return "";
}


/// The value after "Prediction" ... "tokens/s: " in distributed-llama's
/// stdout, or -1.
double dllama_prediction_tps(const std::string& text) {
  const size_t pred = text.rfind("Prediction");
  if (pred == std::string::npos) return -1;
  const std::string key = "tokens/s: ";
  const size_t at = text.find(key, pred);
  if (at == std::string::npos) return -1;
  return std::atof(text.c_str() + at + key.size());
}

/// Means over distributed-llama's per-position lines "Pred X ms Sync Y ms":
/// executor time in ops and in syncs per position (ms; whole ms per line).
void dllama_split(const std::string& text, double& pred_ms, double& sync_ms) {
  pred_ms = sync_ms = 0;
  int n = 0;
  size_t at = 0;
  while ((at = text.find("Pred", at)) != std::string::npos) {
    unsigned p = 0, y = 0;
    if (std::sscanf(text.c_str() + at, "Pred %u ms Sync %u ms", &p, &y) == 2) {
      pred_ms += p;
      sync_ms += y;
      ++n;
    }
    at += 4;
  }
  if (n > 0) {
    pred_ms /= n;
    sync_ms /= n;
  }
}

std::string loadavg() {
  std::string s = slurp("/proc/loadavg");
  const size_t sp = s.find(' ', s.find(' ', s.find(' ') + 1) + 1);  // the 1, 5 and 15 minute averages
  return sp == std::string::npos ? s : s.substr(0, sp);
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then
/// closed), or 0.
uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

/// True when /proc/net/tcp lists a socket in LISTEN state on `port`.
bool listening_on(uint16_t port) {
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    unsigned addr = 0, lport = 0, raddr = 0, rport = 0, st = 0;
    if (std::sscanf(line.c_str(), " %*d: %8X:%4X %8X:%4X %2X", &addr, &lport, &raddr, &rport, &st) == 5 &&
        lport == port && st == 0x0A)
      return true;
  }
  return false;
}

/// distributed-llama worker processes, SIGKILLed and reaped by the destructor.
class dllama_workers {
public:
  ~dllama_workers() {
    for (pid_t p : pids_) {
      ::kill(p, SIGKILL);
      int st = 0;
      ::waitpid(p, &st, 0);
    }
  }
  /// Starts `n` workers (`dllama worker --host 127.0.0.1 --port P --nthreads 1
  /// --net-turbo 0`), each waited for until it listens (deadline 20 s each).
  /// Errors name the worker and its log.
  std::string start(const std::string& dllama, int n, const std::string& log_dir) {
    for (int i = 0; i < n; ++i) {
      const uint16_t port = free_port();
      if (port == 0) return "no free loopback port for dllama worker " + std::to_string(i + 1);
      const std::string log = log_dir + "/dllama-worker-" + std::to_string(i + 1) + ".log";
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) return "cannot write " + log + ": " + std::strerror(errno);
      const pid_t pid = spawn_child({dllama, "worker", "--host", "127.0.0.1", "--port", std::to_string(port),
                                     "--nthreads", "1", "--net-turbo", "0"},
                                    -1, fd, fd);
      ::close(fd);
      if (pid < 0) return std::string("cannot start dllama worker: ") + std::strerror(errno);
      pids_.push_back(pid);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      bool up = false;
      while (!up && std::chrono::steady_clock::now() < until) {
        int st = 0;
        if (::waitpid(pid, &st, WNOHANG) == pid) {
          pids_.pop_back();
          return "dllama worker " + std::to_string(i + 1) + " (port " + std::to_string(port) + ") ended at start; " +
                 log + ":\n" + slurp(log);
        }
        up = listening_on(port);
        if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polls another process, bounded
      }
      if (!up) return "dllama worker " + std::to_string(i + 1) + " did not listen on port " + std::to_string(port) +
                      " within 20 s; " + log;
      addrs_.push_back("127.0.0.1:" + std::to_string(port));
    }
    return "";
  }
  const std::vector<std::string>& addresses() const { return addrs_; }

private:
  std::vector<pid_t> pids_;
  std::vector<std::string> addrs_;
};
}  // namespace

int run_peers_bench(const peers_bench_options& o, std::vector<bench_row>& rows) {
  const std::string peers = !o.peers.empty() ? o.peers
                            : find_first({"../shared/peers/llama2.c", "../../shared/peers/llama2.c",
                                          "/work/shared/peers/llama2.c"});
  if (peers.empty() || !exists(peers + "/run.c")) {
    std::fprintf(stderr, "bench peers: llama2.c's run.c not found (%s); pass --peers DIR\n",
                 peers.empty() ? "looked in ../shared/peers/llama2.c" : (peers + "/run.c").c_str());
    return 1;
  }
  const std::string tok = !o.tokenizer.empty() ? o.tokenizer
                          : find_first({"../shared/models/tokenizer.bin",
                                        "../../shared/models/tokenizer.bin",
                                        "/work/shared/models/tokenizer.bin"});
  if (tok.empty() || !exists(tok)) {
    std::fprintf(stderr, "bench peers: tokenizer.bin (llama2.c's 32000-token vocabulary) not found; pass -z FILE\n");
    return 1;
  }
  char tmpl[] = "/tmp/cellshard-peers-XXXXXX";
  if (!::mkdtemp(tmpl)) {
    std::fprintf(stderr, "bench peers: cannot create a temporary folder: %s\n", std::strerror(errno));
    return 1;
  }
  const std::string dir = tmpl;
  const std::string self = self_exe();
  const std::string err = dir + "/stderr.txt";
  int status = 0;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "bench peers: %s\n%s", what.c_str(), slurp(err).c_str());
    status = 1;
  };
  do {
    std::fprintf(stderr, "bench peers: building run.c and runomp in %s\n", dir.c_str());
    if (sh("gcc -Ofast -march=native " + quote(peers + "/run.c") + " -lm -o " + quote(dir + "/run"), err,
           o.deadline_s) != 0) {
      fail("gcc -Ofast -march=native run.c failed");
      break;
    }
    if (sh("gcc -Ofast -march=native -fopenmp " + quote(peers + "/run.c") + " -lm -o " +
               quote(dir + "/runomp"),
           err, o.deadline_s) != 0) {
      fail("gcc -Ofast -march=native -fopenmp run.c failed");
      break;
    }
    std::string model = o.model;
    if (model.empty()) {
      model = dir + "/stories110m.bin";
      std::fprintf(stderr, "bench peers: cellshard synth --config stories110m -s 1\n");
      if (sh(quote(self) + " synth --config stories110m -s 1 -o " + quote(model), err, o.deadline_s) != 0) {
        fail("synth failed");
        break;
      }
    }
    // Every command line ends with " -n N", so that the same run with 2
    // positions (the load and one forward) can be timed for the CPU measure.
    const std::string common = " -z " + quote(tok) + " -t 0";
    const std::string ours = "OPENBLAS_NUM_THREADS=1 " + quote(self) + " run -q -m " + quote(model) + common +
                             " --kernels native";
    const std::string n_full = " -n " + std::to_string(o.steps), n_short = " -n 2";
    struct contender {
      std::string name, cmd;
      std::vector<double> tps, cpu;  // cpu: CPU seconds of the full run minus the 2-position run
      bool ok = true;
    };
    std::vector<contender> cs = {
        {"run.c", "OMP_NUM_THREADS=1 " + quote(dir + "/run") + " " + quote(model) + common, {}, {}},
        {"cellshard f32 1t", ours + " --threads 1", {}, {}},
        {"runomp 2t", "OMP_NUM_THREADS=2 " + quote(dir + "/runomp") + " " + quote(model) + common, {}, {}},
        {"cellshard f32 2t", ours + " --threads 2", {}, {}},
        {"cellshard q8_0 1t", ours + " --threads 1 --weights q8_0", {}, {}},
        {"cellshard q4_0 1t", ours + " --threads 1 --weights q4_0", {}, {}},
        {"cellshard q8_0 ggml 1t", ours + " --threads 1 --weights q8_0 --matmul ggml", {}, {}},
        {"cellshard q4_0 ggml 1t", ours + " --threads 1 --weights q4_0 --matmul ggml", {}, {}},
    };
    // Which rows (pairs of contenders) to measure: all, or --pairs.
    struct pair_def {
      const char* name;
      int subject, baseline;
      double goal;
    };
    const pair_def defs[] = {{"f32_1t", 1, 0, 1.2},       {"f32_2t", 3, 2, 1.2},
                             {"q8_0_1t", 4, 1, 2.5},      {"q4_0_1t", 5, 1, 4.0},
                             {"q8_0_ggml_1t", 6, 1, 2.5}, {"q4_0_ggml_1t", 7, 1, 4.0}};
    std::vector<bool> wanted(cs.size(), o.pairs.empty());
    for (const auto& p : o.pairs) {
      bool known = false;
      for (const auto& d : defs)
        if (p == d.name) {
          wanted[d.subject] = wanted[d.baseline] = known = true;
        }
      if (!known) throw cli_error("--pairs: unknown pair '" + p + "', expected f32_1t, f32_2t, q8_0_1t, q4_0_1t, "
                                  "q8_0_ggml_1t or q4_0_ggml_1t", 2);
    }
    for (size_t i = 0; i < cs.size(); ++i) cs[i].ok = cs[i].ok && wanted[i];
    for (int rep = 0; rep < o.repeat; ++rep) {
      for (auto& c : cs) {
        if (!c.ok) continue;
        double cpu = 0, cpu_short = 0;
        const int rc = sh(c.cmd + n_full, err, o.deadline_s, &cpu);
        const double t = achieved(slurp(err));
        if (rc != 0 || t <= 0) {
          std::fprintf(stderr, "bench peers: %s: exit %d, no 'achieved tok/s' (%s); left out\n%s", c.name.c_str(),
                       rc, c.cmd.c_str(), slurp(err).c_str());
          c.ok = false;
          continue;
        }
        if (sh(c.cmd + n_short, err, o.deadline_s, &cpu_short) != 0) cpu_short = 0;
        c.tps.push_back(t);
        c.cpu.push_back(cpu - cpu_short);
        std::fprintf(stderr, "bench peers: round %d %-24s %8.2f tok/s (wall), %7.2f s CPU (run), %7.2f s CPU after the first 2 positions\n",
                     rep + 1, c.name.c_str(), t, cpu, cpu - cpu_short);
      }
    }
    // Ratios per round (the two runs of a pair are neighbours in time), then
    // the median over rounds.
    auto ratio_row = [&](const std::string& name, const contender& a, const contender& b, double goal) {
      if (!a.ok || !b.ok || a.tps.empty() || a.tps.size() != b.tps.size()) return;
      std::vector<double> r, rc;
      for (size_t i = 0; i < a.tps.size(); ++i) {
        r.push_back(a.tps[i] / b.tps[i]);
        if (a.cpu[i] > 0) rc.push_back(b.cpu[i] / a.cpu[i]);
      }
      bench_row row;
      row.name = name;
      row.params = {{"steps", std::to_string(o.steps)},
                    {"rounds", std::to_string(a.tps.size())},
                    {"subject", a.name},
                    {"goal", std::to_string(goal).substr(0, 4) + "x"},
                    // CPU seconds of positions 3..N (a full run minus a 2-position
                    // run), baseline / subject: much less sensitive to a shared
                    // machine than wall time; meaningful for 1-thread pairs only.
                    {"cpu_ratio", rc.empty() ? "-" : std::to_string(median(rc)).substr(0, 5)}};
      row.value = median(a.tps);
      row.unit = "tok/s";
      row.baseline = median(b.tps);
      row.baseline_name = b.name;
      row.ratio = median(r);
      rows.push_back(row);
    };
    for (const auto& d : defs) ratio_row(std::string("peers_") + d.name, cs[d.subject], cs[d.baseline], d.goal);
    if (rows.empty()) status = 1;
  } while (false);
  if (!o.keep) std::system(("rm -rf " + quote(dir)).c_str());
  return status;
}

}  // namespace cellshard::tools

namespace cellshard::tools {

int run_peers_cluster_bench(const peers_cluster_bench_options& o, std::vector<bench_row>& rows) {
  const std::string src = !o.dllama.empty() ? o.dllama
                          : find_first({"../shared/peers/distributed-llama", "../../shared/peers/distributed-llama",
                                        "/work/shared/peers/distributed-llama"});
  if (src.empty() || !exists(src + "/Makefile") || !exists(src + "/src")) {
    std::fprintf(stderr, "bench peers --cluster: distributed-llama's sources (Makefile, src/) not found (%s); pass --dllama DIR\n",
                 src.empty() ? "looked in ../shared/peers/distributed-llama" : src.c_str());
    return 1;
  }
  const std::string conv = !o.converter.empty() ? o.converter
                           : find_first({"../shared/peers/tools/l2c_to_dllama.py",
                                         "../../shared/peers/tools/l2c_to_dllama.py",
                                         "/work/shared/peers/tools/l2c_to_dllama.py"});
  if (conv.empty()) {
    std::fprintf(stderr, "bench peers --cluster: l2c_to_dllama.py not found (looked in ../shared/peers/tools); pass --converter FILE\n");
    return 1;
  }
  const std::string tok = !o.tokenizer.empty() ? o.tokenizer
                          : find_first({"../shared/models/tokenizer.bin", "../../shared/models/tokenizer.bin",
                                        "/work/shared/models/tokenizer.bin"});
  if (tok.empty() || !exists(tok)) {
    std::fprintf(stderr, "bench peers --cluster: tokenizer.bin (llama2.c's 32000-token vocabulary) not found; pass -z FILE\n");
    return 1;
  }
  for (int n : o.nodes)
    if (n < 1 || (n & (n - 1)) != 0) throw cli_error("--nodes: " + std::to_string(n) +
                                                     " is not a power of two (distributed-llama needs 1, 2, 4, ...)", 2);
  std::string dir = o.out;
  bool own_dir = false;
  if (dir.empty()) {
    char tmpl[] = "/tmp/cellshard-peers-cluster-XXXXXX";
    if (!::mkdtemp(tmpl)) {
      std::fprintf(stderr, "bench peers --cluster: cannot create a temporary folder: %s\n", std::strerror(errno));
      return 1;
    }
    dir = tmpl;
    own_dir = true;
  } else if (std::system(("mkdir -p " + quote(dir)).c_str()) != 0) {
    std::fprintf(stderr, "bench peers --cluster: cannot create %s\n", dir.c_str());
    return 1;
  }
  const std::string self = self_exe();
  const std::string err = dir + "/stderr.txt", out = dir + "/stdout.txt";
  int status = 0;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "bench peers --cluster: %s\n%s", what.c_str(), slurp(err).c_str());
    status = 1;
  };
  do {
    // 1. distributed-llama, built outside our tree (its Makefile builds in place).
    const std::string bdir = dir + "/dllama-build", dllama = bdir + "/dllama";
    if (!exists(dllama)) {
      std::fprintf(stderr, "bench peers --cluster: building distributed-llama (make dllama) in %s\n", bdir.c_str());
      if (sh("mkdir -p " + quote(bdir) + " && cp -r " + quote(src + "/Makefile") + " " + quote(src + "/src") + " " +
                 quote(bdir) + " && make -C " + quote(bdir) + " -j2 dllama",
             err, o.deadline_s) != 0 || !exists(dllama)) {
        fail("make dllama failed");
        break;
      }
    }
    // 2. One model for both: the daemons find model and tokenizer by file name
    // in one folder.
    const std::string mdir = dir + "/models", model = mdir + "/model.bin", mtok = mdir + "/tokenizer.bin";
    if (std::system(("mkdir -p " + quote(mdir) + " && rm -f " + quote(model) + " " + quote(mtok)).c_str()) != 0) {
      fail("cannot prepare " + mdir);
      break;
    }
    if (!o.model.empty()) {
      if (::symlink(absolute(o.model).c_str(), model.c_str()) != 0) {
        fail("cannot link " + o.model + " as " + model + ": " + std::strerror(errno));
        break;
      }
    } else {
      std::fprintf(stderr, "bench peers --cluster: cellshard synth --config %s -s 1\n", o.config.c_str());
      if (sh(quote(self) + " synth --config " + quote(o.config) + " -s 1 -o " + quote(model), err, o.deadline_s) != 0) {
        fail("synth --config " + o.config + " failed");
        break;
      }
    }
    if (::symlink(absolute(tok).c_str(), mtok.c_str()) != 0) {
      fail("cannot link " + tok + " as " + mtok + ": " + std::strerror(errno));
      break;
    }
    const std::string dm = dir + "/model.m", dt = dir + "/model.t";
    std::fprintf(stderr, "bench peers --cluster: converting with %s\n", conv.c_str());
    if (sh("python3 " + quote(conv) + " " + quote(model) + " " + quote(dm) + " " + quote(mtok) + " " + quote(dt), err,
           o.deadline_s) != 0) {
      fail("l2c_to_dllama.py failed");
      break;
    }
    if (o.sync == "q8_0")
      std::fprintf(stderr, "bench peers --cluster: --sync q8_0: cellshard's tensor rows use --sync q8_0; "
                           "distributed-llama stays at --buffer-float-type f32, because its q80 sync needs Q40 "
                           "weights (with these F32 weights it stops: \"Unsupported CPU op code: MATMUL, quant: "
                           "Q80_F32_F32\") and the converter writes F32 only\n");
    // 3. Per process count: workers and daemons kept for all rounds.
    struct sample {
      double tps = -1, a = 0, b = 0, c = 0;  // dllama: pred, sync ms; cellshard: busiest compute ms, tpot p50, comm share
    };
    for (int n : o.nodes) {
      const std::string load0 = loadavg();
      dllama_workers workers;
      const std::string werr = workers.start(dllama, n - 1, dir);
      if (!werr.empty()) {
        fail(werr);
        break;
      }
      std::string dcmd = quote(dllama) + " inference --model " + quote(dm) + " --tokenizer " + quote(dt) +
                         " --buffer-float-type f32" +
                         " --nthreads 1 --steps " + std::to_string(o.steps) +
                         " --prompt '' --temperature 0 --net-turbo 0";
      if (!workers.addresses().empty()) {
        dcmd += " --workers";
        for (const auto& a : workers.addresses()) dcmd += " " + a;
      }
      // One set of daemons per idle-worker policy (CELLSHARD_CAF_IDLE, read
      // by actors::configure_network in every daemon and front end); the
      // idle set waits on its condition variables while the other runs.
      // The same per data path (CELLSHARD_DATA_PLANE): one set per pair.
      struct variant {
        std::string idle, data, tag;
      };
      std::vector<variant> vs;
      for (const auto& idle : o.idle)
        for (const auto& data : o.data) {
          std::string tag;
          if (o.idle.size() > 1) tag += " " + idle;
          if (o.data.size() > 1) tag += " " + data;
          vs.push_back({idle, data, tag});
        }
      std::vector<std::unique_ptr<actors::local_daemons>> sets;
      std::vector<std::string> cfiles;
      for (const auto& v : vs) {
        actors::local_daemon_options dopt;
        dopt.models_dir = mdir;
        dopt.extra_args = {"--threads", "1", "--blas-threads", "1", "-q"};
        dopt.log_dir = dir + "/daemons-" + std::to_string(n) + "-" + v.idle + "-" + v.data;
        std::system(("mkdir -p " + quote(dopt.log_dir)).c_str());
        ::setenv("CELLSHARD_CAF_IDLE", v.idle.c_str(), 1);  // no threads run here: the children inherit it
        ::setenv("CELLSHARD_DATA_PLANE", v.data.c_str(), 1);
        auto daemons = actors::local_daemons::start(n, 0, dopt);
        ::unsetenv("CELLSHARD_CAF_IDLE");
        ::unsetenv("CELLSHARD_DATA_PLANE");
        if (!daemons) {
          fail("cellshard daemons: " + daemons.message());
          break;
        }
        const std::string cfile = dir + "/cluster-" + std::to_string(n) + "-" + v.idle + "-" + v.data + ".json";
        if (auto w = (*daemons)->write_cluster_file(cfile); !w) {
          fail(w.message());
          break;
        }
        sets.push_back(std::move(*daemons));
        cfiles.push_back(cfile);
      }
      if (status != 0) break;
      struct contender {
        std::string name, cmd;
        bool dllama;
        std::vector<sample> s;
        bool ok = true;
      };
      std::vector<contender> cs = {{"distributed-llama", dcmd, true, {}}};
      for (size_t k = 0; k < vs.size(); ++k) {
        const std::string ccmd = "CELLSHARD_CAF_IDLE=" + vs[k].idle + " OPENBLAS_NUM_THREADS=1 " + quote(self) +
                                 " run -q -m " + quote(model) + " -z " + quote(mtok) + " --cluster " +
                                 quote(cfiles[k]) + " -t 0 -n " + std::to_string(o.steps) +
                                 " --kernels native --threads 1" +
                                 (o.reduce.empty() ? "" : " --reduce " + quote(o.reduce)) + " --sync " + o.sync + " --json " +
                                 quote(dir + "/run.json");
        const std::string& tag = vs[k].tag;
        if (n == 1) cs.push_back({"cellshard" + tag, ccmd, false, {}});
        else {
          cs.push_back({"cellshard tensor" + tag, ccmd + " --topology tensor", false, {}});
          if (o.pipeline) cs.push_back({"cellshard pipeline" + tag, ccmd + " --topology pipeline", false, {}});
        }
      }
      for (int rep = 0; rep < o.repeat && status == 0; ++rep) {
        std::vector<size_t> order;
        for (size_t i = 0; i < cs.size(); ++i) order.push_back(rep % 2 == 0 ? i : cs.size() - 1 - i);
        for (size_t i : order) {
          auto& c = cs[i];
          if (!c.ok) continue;
          const int rc = sh(c.cmd, err, o.deadline_s, nullptr, out);
          sample x;
          if (c.dllama) {
            const std::string text = slurp(out);
            x.tps = dllama_prediction_tps(text);
            dllama_split(text, x.a, x.b);
          } else {
            x.tps = achieved(slurp(err));
            try {
              const auto j = nlohmann::json::parse(slurp(dir + "/run.json"));
              const double tokens = std::max(1.0, j.value("tokens", 1.0));
              for (const auto& nd : j.at("nodes")) x.a = std::max(x.a, nd.value("compute_ms", 0.0) / tokens);
              x.b = j.value("tpot_ms_p50", 0.0);
              x.c = j.value("comm_share", 0.0);
            } catch (const std::exception&) {
            }
          }
          if (rc != 0 || x.tps <= 0) {
            std::fprintf(stderr, "bench peers --cluster: %d processes, %s: exit %d, no tokens/s (%s); left out\n%s%s",
                         n, c.name.c_str(), rc, c.cmd.c_str(), slurp(err).c_str(),
                         c.dllama ? slurp(out).substr(0, 4000).c_str() : "");
            c.ok = false;
            continue;
          }
          c.s.push_back(x);
          if (c.dllama)
            std::fprintf(stderr, "bench peers --cluster: %d processes, round %d, %-20s %8.2f tok/s (executor time); "
                         "per position %.1f ms ops + %.1f ms sync\n", n, rep + 1, c.name.c_str(), x.tps, x.a, x.b);
          else
            std::fprintf(stderr, "bench peers --cluster: %d processes, round %d, %-20s %8.2f tok/s (front-end wall "
                         "time); per position: tpot p50 %.1f ms, busiest node computes %.1f ms, comm share %.2f\n",
                         n, rep + 1, c.name.c_str(), x.tps, x.b, x.a, x.c);
        }
      }
      if (status != 0) break;
      const std::string load1 = loadavg();
      const auto& base = cs[0];
      for (size_t i = 1; i < cs.size(); ++i) {
        const auto& c = cs[i];
        if (!c.ok || !base.ok || c.s.empty() || c.s.size() != base.s.size()) continue;
        std::vector<double> r, tps, btps, comp, tpot, share, pred, sync;
        for (size_t k = 0; k < c.s.size(); ++k) {
          r.push_back(c.s[k].tps / base.s[k].tps);
          tps.push_back(c.s[k].tps);
          btps.push_back(base.s[k].tps);
          comp.push_back(c.s[k].a);
          tpot.push_back(c.s[k].b);
          share.push_back(c.s[k].c);
          pred.push_back(base.s[k].a);
          sync.push_back(base.s[k].b);
        }
        auto f = [](double v, int prec) {
          char b[32];
          std::snprintf(b, sizeof b, "%.*f", prec, v);
          return std::string(b);
        };
        const bool tensor = c.name.find("pipeline") == std::string::npos;
        bench_row row;
        row.name = std::string("peers_cluster_") + (n == 1 ? "1" : tensor ? "tensor" + std::to_string(n)
                                                                          : "pipeline" + std::to_string(n));
        if (o.sync != "f32") row.name += "_" + o.sync;
        for (const auto& v : vs)  // the variant's tag ends the contender's name
          if (!v.tag.empty() && c.name.size() > v.tag.size() &&
              c.name.compare(c.name.size() - v.tag.size(), v.tag.size(), v.tag) == 0) {
            std::string t = v.tag.substr(1);
            std::replace(t.begin(), t.end(), ' ', '_');
            row.name += "_" + t;
            break;
          }
        row.params = {{"processes", std::to_string(n)},
                      {"steps", std::to_string(o.steps)},
                      {"sync", o.sync},
                      {"dl_sync", "f32"},
                      {"rounds", std::to_string(c.s.size())},
                      {"goal", n >= 2 && tensor ? "1.2x" : "-"},
                      {"cs_tpot_ms", f(median(tpot), 1)},
                      {"cs_compute_ms", f(median(comp), 1)},
                      {"cs_comm_share", f(median(share), 2)},
                      {"dl_ops_ms", f(median(pred), 1)},
                      {"dl_sync_ms", f(median(sync), 1)},
                      {"load", load0 + " -> " + load1}};
        row.value = median(tps);
        row.unit = "tok/s";
        row.baseline = median(btps);
        row.baseline_name = "distributed-llama (executor time)";
        row.ratio = median(r);
        rows.push_back(row);
      }
    }
  } while (false);
  std::fprintf(stderr,
               "bench peers --cluster: distributed-llama's \"Prediction tokens/s\" counts its executor's time only "
               "(ops + syncs per forward; sampling, decoding, printing excluded); cellshard's \"achieved tok/s\" is "
               "front-end wall time from the end of the first forward to the end of the last (sampling, the logits' "
               "hop to the front end and every wait included), over N daemons plus the front end. cs_compute_ms: "
               "the busiest daemon's kernel time per position; dl_ops_ms / dl_sync_ms: distributed-llama root's ops "
               "and sync time per position.\n");
  if (rows.empty() && status == 0) status = 1;
  if (!o.keep && own_dir) std::system(("rm -rf " + quote(dir)).c_str());
  else std::fprintf(stderr, "bench peers --cluster: files kept in %s\n", dir.c_str());
  return status;
}

}  // namespace cellshard::tools
