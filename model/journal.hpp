// model/journal.hpp: the session journal (`run --journal FILE`, `run --resume
// FILE`; docs/formats.md, "Session journal"). JSON lines: a header with the
// sampling parameters, the model and tokenizer (paths, names, XXH64 digests)
// and the prompt's ids, then one line per token with its position, id and the
// sampler's RNG state after it. Every line carries a running digest of the
// journal so far, so a reader finds a deleted, inserted, edited or cut line
// and names it.
//
// The digest chain (XXH64, seed = the previous digest):
//   d_1 = XXH64(the header's fields without "digest", as nlohmann::json::dump()
//         writes the object journal_header_line() builds from them, seed 0)
//                                                -> the header's "digest"
//   d_k = XXH64("<pos> <token> <rng>" in decimal, seed d_{k-1})   -> line k's
// Digests are written as model::format_digest prints them ("0x" + 16 hex).
// The chain detects accidents and edits by hand; it is not a MAC (whoever
// edits a line can recompute the chain). A journal cut at a line boundary is a
// valid journal of a run killed there, and resuming it gives the same ids.
//
// Thread safety: a journal_writer is used by one thread at a time (the
// session actor); parse/read functions are pure.
#pragma once

#include "model/result.hpp"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cellshard::model {

/// The journal format version this library writes and reads.
inline constexpr int journal_version = 2;

struct journal_header {
  int steps = 0;                 // forward passes, prompt included (normalised: 1..seq_len)
  float temperature = 0, topp = 0;
  uint64_t seed = 0;             // the seed in effect (normalised: never 0)
  std::string model;             // file name of the model (no folder)
  std::string model_path;        // absolute path the run opened (empty: built-in model)
  uint64_t model_digest = 0;     // XXH64 of the whole model file
  std::string tokenizer, tokenizer_path;
  uint64_t tokenizer_digest = 0;
  std::vector<int> prompt_tokens;  // BOS first
  /// The context length the run opened the model with (--ctx; 0 = the
  /// file's). Written only when > 0, so journals written before the field
  /// existed (and runs without --ctx) keep their header and digest.
  int ctx = 0;
};

struct journal_entry {
  int pos = 0;       // position of the token in the ids (BOS is position 0; the first line is position 1)
  int token = 0;
  uint64_t rng = 0;  // sampler RNG state after this token
};

struct journal {
  journal_header header;
  std::vector<journal_entry> entries;  // positions 1, 2, ... without gaps, at most header.steps
  uint64_t digest = 0;                 // running digest after the last line
};

/// Parses and verifies a journal's text. `name` prefixes every error, which
/// names the line (1-based) and what was expected: a missing or foreign
/// header, a line that is not JSON or was cut, a position out of sequence (a
/// line deleted, duplicated or moved), a digest that does not match (an edited
/// line), a missing or ill-typed field.
result<journal> parse_journal(std::string_view text, const std::string& name);
/// Reads `path` and parses it (errors name the path).
result<journal> read_journal(const std::string& path);

/// Appends verified lines to a journal file. Every line is flushed as written;
/// every write, flush and close is checked, and the first failure is returned
/// (naming the file and the errno text) by that call and every later one.
class journal_writer {
public:
  /// Creates (truncates) `path` and writes the header line.
  static result<std::unique_ptr<journal_writer>> create(const std::string& path, const journal_header& h);
  /// Opens `path`, which holds the verified journal `j`, to continue it: the
  /// next line must be position j.entries.size() + 1.
  static result<std::unique_ptr<journal_writer>> resume(const std::string& path, const journal& j);
  ~journal_writer();
  journal_writer(const journal_writer&) = delete;
  journal_writer& operator=(const journal_writer&) = delete;

  result<void> append(const journal_entry& e);
  result<void> close();
  const std::string& path() const { return path_; }

private:
  journal_writer() = default;
  result<void> write_line(const std::string& line);
  std::string path_;
  std::FILE* f_ = nullptr;
  uint64_t digest_ = 0;
  int next_pos_ = 1;
  std::string error_;
};

/// The header line's JSON text for `h` (with its digest), and that digest.
std::string journal_header_line(const journal_header& h, uint64_t* digest = nullptr);
/// The token line for `e` after running digest `prev`, and the new digest.
std::string journal_entry_line(const journal_entry& e, uint64_t prev, uint64_t* digest = nullptr);

}  // namespace cellshard::model
