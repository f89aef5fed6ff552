// `run --resume` through the binary (issue #21): a journal cut at a line
// boundary (a run killed there) resumes with exit 0 and the ids of the
// uninterrupted run, reopening the model and tokenizer it names; a gap, an
// edit or a cut line is refused naming the line; flags that conflict with the
// journal are refused, flags that agree (or are not given) are not.
#include "tests/support.hpp"

#include <fstream>
#include <sstream>

using namespace cellshard;

namespace {
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}
std::string join(const std::vector<std::string>& lines, size_t n) {
  std::string s;
  for (size_t i = 0; i < n && i < lines.size(); ++i) s += lines[i] + "\n";
  return s;
}
}  // namespace

TEST_CASE("run --resume: an intact journal resumes to the same ids, and tampered ones are refused by line",
          "[journal][cli]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("journal-resume");
  const std::string m = test::shared_file("models/stories260K.bin");
  const std::string z = test::shared_file("models/tok512.bin");
  const std::string journal = dir + "/full.jsonl", ids = dir + "/full.ids";
  // The uninterrupted run, sampled, on 2 in-process nodes.
  auto full = test::run_command({test::cellshard_bin(), "run", "-m", m, "-z", z, "--nodes", "2", "-n", "48", "-t",
                                 "0.8", "-p", "0.9", "-s", "7", "-i", "Once upon", "-q", "--journal", journal,
                                 "--ids-out", ids});
  INFO(full.err);
  REQUIRE(full.status == 0);
  const auto lines = lines_of(test::read_file(journal));
  REQUIRE(lines.size() >= 30);  // header + a token per position (unless BOS came early)
  // A run killed after 20 positions: the first 21 lines.
  auto cut_at = [&](const std::string& name, const std::string& text) {
    const std::string p = dir + "/" + name + ".jsonl";
    std::ofstream(p, std::ios::binary) << text;
    return p;
  };
  const std::string killed = join(lines, 21);

  SECTION("intact: no -m/-z, the journal names them; same ids, exit 0") {
    const std::string p = cut_at("intact", killed);
    auto r = test::run_command({test::cellshard_bin(), "run", "--nodes", "2", "-q", "--resume", p, "--expect-ids",
                                ids});
    INFO(r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.err, Catch::Contains("resuming " + p + ": 21 ids already produced"));
    // The resumed journal continues the same chain: it equals the uninterrupted one.
    CHECK(test::read_file(p) == test::read_file(journal));
  }
  SECTION("flags that agree with the journal are not conflicts") {
    const std::string p = cut_at("agree", killed);
    auto r = test::run_command({test::cellshard_bin(), "run", "-m", m, "-z", z, "--nodes", "2", "-n", "48", "-t",
                                "0.8", "-p", "0.9", "-s", "7", "-q", "--resume", p, "--expect-ids", ids});
    INFO(r.err);
    CHECK(r.status == 0);
  }
  SECTION("another model is refused naming both digests") {
    const std::string p = cut_at("other-model", killed);
    const std::string other = dir + "/other.bin";
    auto s = test::run_command({test::cellshard_bin(), "synth", "-o", other, "-s", "9"});
    REQUIRE(s.status == 0);
    auto r = test::run_command({test::cellshard_bin(), "run", "-m", other, "-z", z, "--nodes", "2", "-q",
                                "--resume", p});
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("journaled on model stories260K.bin (digest 0xa63dd90f31c958a4)") &&
                          Catch::Contains("give the model the run started with"));
  }

  struct refused {
    const char* name;
    std::string text;
    std::vector<std::string> extra_args;
    int status;
    std::vector<std::string> says;
  };
  auto edit = [&](size_t i, const std::string& from, const std::string& to) {
    auto l = lines;
    l.resize(21);
    const auto at = l[i].find(from);
    REQUIRE(at != std::string::npos);
    l[i].replace(at, from.size(), to);
    return join(l, l.size());
  };
  auto without = [&](size_t i) {
    auto l = lines;
    l.resize(21);
    l.erase(l.begin() + static_cast<long>(i));
    return join(l, l.size());
  };
  const std::string token10 = lines[10].substr(0, lines[10].find(", \"rng\""));
  const std::vector<refused> table = {
      {"a line deleted", without(8), {}, 1, {"line 9: position 9, expected 8", "gap"}},
      {"a token edited", edit(12, "\"token\": ", "\"token\": 1"), {}, 1, {"line 13:", "edited"}},
      {"cut inside a line", killed.substr(0, killed.size() - 10), {}, 1, {"line 21: cut short"}},
      {"-n conflicts", killed, {"-n", "40"}, 2, {"-n 40 conflicts with the journal's steps 48", "drop -n"}},
      {"-t conflicts", killed, {"-t", "0.7"}, 2, {"-t 0.7 conflicts with the journal's temperature 0.8"}},
      {"-p conflicts", killed, {"-p", "0.5"}, 2, {"-p 0.5 conflicts with the journal's top-p 0.9"}},
      {"-s conflicts", killed, {"-s", "8"}, 2, {"-s 8 conflicts with the journal's seed 7"}},
      {"-i conflicts", killed, {"-i", "Once upon a"}, 2, {"-i 'Once upon a' conflicts with the journal's prompt"}},
  };
  for (const auto& t : table) {
    DYNAMIC_SECTION("refused: " << t.name) {
      const std::string p = cut_at("tampered", t.text);
      std::vector<std::string> args = {test::cellshard_bin(), "run", "--nodes", "2", "-q", "--resume", p};
      args.insert(args.end(), t.extra_args.begin(), t.extra_args.end());
      auto r = test::run_command(args);
      INFO(r.err);
      CHECK(r.status == t.status);
      for (const auto& s : t.says) CHECK_THAT(r.err, Catch::Contains(s));
      CHECK(r.out.empty());  // refused before generating anything
    }
  }
}
