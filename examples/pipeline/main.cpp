// examples/pipeline: two generation requests at once through a 4-node
// pipeline in one process. Shows the cluster API: start a cluster from
// options, submit requests that stream tokens through callbacks, wait for
// both, and read per-shard statistics.
//
//   pipeline MODEL.bin TOKENIZER.bin
//
// Prints each request's text, then its ids and the placement it ran on.
#include <actors/cluster.hpp>
#include <model/generate.hpp>
#include <topologies/placement.hpp>

#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>

int main(int argc, char** argv) {
  using namespace cellshard;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.bin TOKENIZER.bin\n", argv[0]);
    return 2;
  }
  actors::cluster_options opts;
  opts.model = argv[1];
  opts.tokenizer = argv[2];
  opts.nodes = 4;
  opts.topology = "pipeline";
  opts.sessions = 2;
  auto c = actors::cluster::start(opts);
  if (!c) {
    std::fprintf(stderr, "error: %s\n", c.message().c_str());
    return 1;
  }
  std::printf("%s", topologies::to_string((*c)->placement()).c_str());

  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::string> texts;
  std::map<uint64_t, actors::session_outcome> results;
  const char* prompts[] = {"Once upon a time", "Lily and Tom went to the park with their dog"};
  std::vector<uint64_t> ids;
  for (const char* prompt : prompts) {
    model::generation_params p;
    p.prompt = prompt;
    p.steps = 100;
    p.sampling.temperature = 0.0f;
    ids.push_back((*c)->submit(
        p,
        [&](uint64_t id, int, const std::string& piece) {
          std::lock_guard<std::mutex> lock(mu);
          texts[id] += piece;  // tokens of both requests arrive interleaved
        },
        [&](uint64_t id, const actors::session_outcome& out) {
          std::lock_guard<std::mutex> lock(mu);
          results[id] = out;
          cv.notify_all();
        }));
  }
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_for(lock, std::chrono::seconds(120), [&] { return results.size() == ids.size(); })) {
    std::fprintf(stderr, "error: requests did not finish within 120 s\n");
    return 1;
  }
  int rc = 0;
  for (uint64_t id : ids) {
    const auto& out = results[id];
    if (!out.ok) {
      std::fprintf(stderr, "request %llu failed: %s\n", static_cast<unsigned long long>(id), out.error.c_str());
      rc = 1;
      continue;
    }
    std::printf("request %llu: %s\nids: %s", static_cast<unsigned long long>(id), texts[id].c_str(),
                model::format_ids(out.result.ids).c_str());
  }
  return rc;
}
