// `cellshard bench peers`: cellshard's decode speed against llama2.c's run.c
// (issue #18). See tools/bench.hpp (peers_bench_options).
#include "base/percentile.hpp"
#include "tools/bench.hpp"

#include "tools/common.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
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

/// Runs `cmd` under `timeout`, stdout discarded, stderr to `err`. Returns the
/// exit status (124: the deadline passed); *cpu_s (if given) receives the CPU
/// seconds (user + system) the command and its children used.
int sh(const std::string& cmd, const std::string& err, int deadline_s, double* cpu_s = nullptr) {
  const std::string full = "timeout " + std::to_string(deadline_s) + " sh -c " + quote(cmd) +
                           " >/dev/null 2>" + quote(err);
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

std::string find_first(const std::vector<std::string>& candidates) {
  for (const auto& c : candidates)
    if (!c.empty() && exists(c)) return c;
  return "";
}

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
