// The session journal's reader and writer (model/journal.hpp): a journal the
// writer produced reads back exactly; every tamper case is refused naming its
// line. One table row per tamper.
#include "model/journal.hpp"
#include "tests/support.hpp"

#include <fstream>
#include <sstream>

using namespace cellshard;

namespace {
model::journal_header sample_header() {
  model::journal_header h;
  h.steps = 40;
  h.temperature = 0.8f;
  h.topp = 0.9f;
  h.seed = 7;
  h.model = "stories260K.bin";
  h.model_path = "/models/stories260K.bin";
  h.model_digest = 0xa63dd90f31c958a4ull;
  h.tokenizer = "tok512.bin";
  h.tokenizer_path = "/models/tok512.bin";
  h.tokenizer_digest = 0x0123456789abcdefull;
  h.prompt_tokens = {1, 403, 407};
  return h;
}

/// Lines of a 10-token journal written by journal_writer (header first).
std::vector<std::string> written_lines(const std::string& dir) {
  const std::string p = dir + "/j.jsonl";
  auto w = model::journal_writer::create(p, sample_header());
  REQUIRE(w);
  for (int pos = 1; pos <= 10; ++pos) {
    const int token = pos == 1 ? 403 : pos == 2 ? 407 : 100 + pos;
    REQUIRE((*w)->append({pos, token, 1000ull * pos + 17}));
  }
  REQUIRE((*w)->close());
  std::vector<std::string> lines;
  std::istringstream in(test::read_file(p));
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}
}  // namespace

TEST_CASE("a journal reads back what its writer wrote", "[journal][unit]") {
  const auto lines = written_lines(test::temp_dir("journal-format"));
  REQUIRE(lines.size() == 11);
  auto j = model::parse_journal(join(lines), "j.jsonl");
  REQUIRE(j);
  CHECK(j->header.steps == 40);
  CHECK(j->header.temperature == 0.8f);
  CHECK(j->header.seed == 7);
  CHECK(j->header.model_path == "/models/stories260K.bin");
  CHECK(j->header.model_digest == 0xa63dd90f31c958a4ull);
  CHECK(j->header.prompt_tokens == std::vector<int>{1, 403, 407});
  REQUIRE(j->entries.size() == 10);
  CHECK(j->entries[4].pos == 5);
  CHECK(j->entries[4].token == 105);
  CHECK(j->entries[4].rng == 5017);
  // Lines keep "pos" and "token" as plain fields.
  CHECK_THAT(lines[3], Catch::StartsWith("{\"pos\": 3, \"token\": 103, \"rng\": 3017, \"digest\": \"0x"));
  // Cut at a line boundary: a valid journal of a run killed there.
  auto cut = model::parse_journal(join({lines.begin(), lines.begin() + 6}), "j.jsonl");
  REQUIRE(cut);
  CHECK(cut->entries.size() == 5);
}

TEST_CASE("a finished run's journal holds positions up to its steps, and no further", "[journal][unit]") {
  // -n 3: three forward passes give ids at positions 0..3.
  model::journal_header h = sample_header();
  h.steps = 3;
  uint64_t d = 0;
  std::string text = model::journal_header_line(h, &d) + "\n";
  for (int pos = 1; pos <= 3; ++pos) text += model::journal_entry_line({pos, pos == 1 ? 403 : pos == 2 ? 407 : 9, 5}, d, &d) + "\n";
  auto j = model::parse_journal(text, "done.jsonl");
  REQUIRE(j);
  CHECK(j->entries.size() == 3);
  text += model::journal_entry_line({4, 9, 5}, d, &d) + "\n";
  auto over = model::parse_journal(text, "done.jsonl");
  REQUIRE(!over);
  CHECK_THAT(over.message(), Catch::Contains("done.jsonl: line 5: position 4 is beyond the journal's 3 steps"));
}

TEST_CASE("a journal carries the run's --ctx, and only when it was given", "[journal][unit]") {
  model::journal_header h = sample_header();
  uint64_t d0 = 0, d1 = 0;
  const std::string plain = model::journal_header_line(h, &d0);
  CHECK_THAT(plain, !Catch::Contains("\"ctx\""));  // the header of a run without --ctx is unchanged
  h.ctx = 512;
  const std::string with = model::journal_header_line(h, &d1);
  CHECK_THAT(with, Catch::Contains("\"ctx\":512"));
  CHECK(d0 != d1);  // the digest covers it
  auto j = model::parse_journal(with + "\n", "c.jsonl");
  REQUIRE(j);
  CHECK(j->header.ctx == 512);
  auto j0 = model::parse_journal(plain + "\n", "p.jsonl");
  REQUIRE(j0);
  CHECK(j0->header.ctx == 0);
  // An edited value fails the digest; an ill-typed one is named.
  auto edited = model::parse_journal(replace(with, "\"ctx\":512", "\"ctx\":256") + "\n", "e.jsonl");
  REQUIRE(!edited);
  CHECK_THAT(edited.message(), Catch::Contains("e.jsonl: line 1: digest") && Catch::Contains("the header was edited"));
  auto bad = model::parse_journal(replace(with, "\"ctx\":512", "\"ctx\":-3") + "\n", "b.jsonl");
  REQUIRE(!bad);
  CHECK_THAT(bad.message(), Catch::Contains("b.jsonl: line 1: field \"ctx\" is -3, expected the context length"));
}

TEST_CASE("a continued journal keeps one digest chain", "[journal][unit]") {
  const std::string dir = test::temp_dir("journal-continue");
  const auto lines = written_lines(dir);
  const std::string p = dir + "/k.jsonl";
  std::ofstream(p) << join({lines.begin(), lines.begin() + 5});
  auto j = model::read_journal(p);
  REQUIRE(j);
  auto w = model::journal_writer::resume(p, *j);
  REQUIRE(w);
  CHECK(!(*w)->append({7, 1, 1}));  // position 5 is next, not 7
  for (int pos = 5; pos <= 10; ++pos) REQUIRE((*w)->append({pos, 100 + pos, 1000ull * pos + 17}));
  REQUIRE((*w)->close());
  // Byte for byte what the uninterrupted writer wrote.
  CHECK(test::read_file(p) == join(lines));
}

TEST_CASE("every tamper of a journal is refused naming its line", "[journal][unit]") {
  const auto lines = written_lines(test::temp_dir("journal-tamper"));
  const std::string good = join(lines);
  auto without = [&](size_t i) {
    auto l = lines;
    l.erase(l.begin() + static_cast<long>(i));
    return join(l);
  };
  auto with_line = [&](size_t i, const std::string& text) {
    auto l = lines;
    l[i] = text;
    return join(l);
  };
  auto swapped = [&](size_t a, size_t b) {
    auto l = lines;
    std::swap(l[a], l[b]);
    return join(l);
  };
  struct tamper {
    const char* name;
    std::string text;
    std::vector<std::string> says;
  };
  const std::vector<tamper> table = {
      {"a line deleted (a gap)", without(5), {"j.jsonl: line 6: position 6, expected 5", "gap"}},
      {"two lines deleted", [&] { auto l = lines; l.erase(l.begin() + 5, l.begin() + 7); return join(l); }(),
       {"line 6: position 7, expected 5", "positions 5-6 missing"}},
      {"a token edited", with_line(6, replace(lines[6], "\"token\": 106", "\"token\": 107")),
       {"j.jsonl: line 7:", "does not match the journal up to this line", "edited"}},
      {"an rng state edited", with_line(4, replace(lines[4], "\"rng\": 4017", "\"rng\": 4018")),
       {"line 5:", "does not match"}},
      {"a position edited", with_line(4, replace(lines[4], "\"pos\": 4", "\"pos\": 5")),
       {"line 5: position 5, expected 4"}},
      {"a digest edited", with_line(9, replace(lines[9], "\"digest\": \"0x", "\"digest\": \"0x0")),
       {"line 10: field \"digest\"", "expected \"0x\" and 16 hex digits"}},
      {"two lines swapped", swapped(3, 4), {"line 4: position 4, expected 3"}},
      {"a line repeated", [&] { auto l = lines; l.insert(l.begin() + 4, lines[3]); return join(l); }(),
       {"line 5: position 3, expected 4", "repeated or out of order"}},
      {"cut inside the last line", good.substr(0, good.size() - 20),
       {"line 11: cut short", "truncated inside this line"}},
      {"cut inside the header", good.substr(0, 30), {"line 1: cut short"}},
      {"the seed edited in the header", with_line(0, replace(lines[0], "\"seed\":7", "\"seed\":8")),
       {"line 1: digest", "the header was edited"}},
      {"the prompt edited in the header", with_line(0, replace(lines[0], "403,407", "403,408")),
       {"line 1:", "the header was edited"}},
      {"a prompt token edited consistently", with_line(2, replace(lines[2], "\"token\": 407", "\"token\": 406")),
       {"line 3: token 406 at prompt position 2, but the header's prompt has 407"}},
      {"an empty line inserted", [&] { auto l = lines; l.insert(l.begin() + 3, ""); return join(l); }(),
       {"line 4: empty"}},
      {"not JSON", with_line(2, "{\"pos\": 2, \"tok"), {"line 3: not JSON"}},
      {"no header", join({lines.begin() + 1, lines.end()}), {"line 1: not a cellshard journal"}},
      {"version 1", "{\"journal\":1,\"steps\":8}\n", {"line 1: journal version 1, expected 2", "no digests"}},
      {"empty file", "", {"j.jsonl: empty"}},
      {"a field of the wrong type", with_line(3, replace(lines[3], "\"token\": 103", "\"token\": \"103\"")),
       {"line 4: field \"token\" is \"103\", expected an integer >= 0"}},
  };
  for (const auto& t : table) {
    DYNAMIC_SECTION(t.name) {
      auto j = model::parse_journal(t.text, "j.jsonl");
      REQUIRE(!j);
      for (const auto& s : t.says) CHECK_THAT(j.message(), Catch::Contains(s));
    }
  }
}

TEST_CASE("a journal that cannot be written is an error, not a silent loss", "[journal][unit]") {
  auto w = model::journal_writer::create("/nonexistent/dir/j.jsonl", sample_header());
  REQUIRE(!w);
  CHECK_THAT(w.message(), Catch::Contains("journal /nonexistent/dir/j.jsonl: cannot create") &&
                              Catch::Contains("No such file or directory"));
  // A full device: every write fails, and says so.
  auto full = model::journal_writer::create("/dev/full", sample_header());
  REQUIRE(!full);
  CHECK_THAT(full.message(), Catch::Contains("journal /dev/full: write failed: No space left on device"));
}
