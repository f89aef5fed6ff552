// tests/support.hpp: locating ../shared (models and llama2.c fixtures) and the
// built binaries. When ../shared is missing the test is skipped with a message;
// when the environment variable CI is set it fails instead (DEVELOPERS.md).
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace cellshard::test {

/// Path of a file under ../shared ("models/stories260K.bin"), or "" when the
/// shared folder is missing (after WARNing, or FAILing when CI is set).
std::string shared_file(const std::string& rel);

/// True when ../shared is present; otherwise WARN (or FAIL under CI).
bool have_shared();

/// Reads a fixture .ids file: comma-separated ids on one line.
std::vector<int> read_ids(const std::string& path);
std::string read_file(const std::string& path);
/// Writes `text` to `path` (REQUIREs that every byte was written).
void write_file(const std::string& path, const std::string& text);

/// llama.cpp's greedy runs of one model in
/// models/gguf/gguf-small-reference-ids.json (generation without an EOS
/// stop): the prompt text and the whole id sequence (the prompt's ids, BOS
/// first, then the generated ids); `ids_file` is that sequence written as a
/// fixture .ids line under `dir` (for --expect-ids). Empty when ../shared is
/// missing.
struct reference_run {
  std::string prompt;
  std::vector<int> ids;
  std::string ids_file;
};
std::vector<reference_run> gguf_reference_runs(const std::string& model, const std::string& dir);
/// The whole id sequence of llama.cpp's greedy run of `model` on `prompt` in
/// that file (FAILs when there is none).
std::vector<int> gguf_reference_ids(const std::string& model, const std::string& prompt);

/// Little-endian fields of the project's file formats (docs/formats.md),
/// whatever the host's byte order: tests that patch or read a file's bytes
/// use these, so that they also pass on a big-endian CPU (docs/cell.md).
void put_le32(uint8_t* p, uint32_t v);
uint32_t get_le32(const uint8_t* p);
float get_le_f32(const uint8_t* p);

/// The cellshard executable built in this tree.
std::string cellshard_bin();

struct command_result {
  int status = -1;       // exit status (or -1 when it did not exit normally)
  std::string out;       // stdout
  std::string err;       // stderr
};
/// Runs `args` (argv, no shell) with a deadline; kills it past `timeout_s`.
command_result run_command(const std::vector<std::string>& args, double timeout_s = 120);
/// The ids a command wrote with --ids-out `path`, after REQUIRing that it
/// exited 0 (its stderr in the failure message).
std::vector<int> ids_written(const command_result& r, const std::string& path);

/// A fresh directory under the build tree's tmp/ for one test.
std::string temp_dir(const std::string& name);

/// One llama2.c fixture case: its name and run.c's flags.
struct fixture_case {
  std::string name;
  std::string prompt;   // "" = none
  int steps;
  float temperature;
  float topp;
  unsigned long long seed;
};
const std::vector<fixture_case>& fixture_cases();

}  // namespace cellshard::test
