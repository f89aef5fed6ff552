// The public API's one error channel (include/cellshard/cluster.hpp): a
// generation that is cancelled (by its callback or by cancel(id)) or that
// cannot recover is an error with its code and the partial output, and the
// partial output is a prefix of what the same request gives untouched.
// The token callback sees every position after BOS (the prompt's tokens,
// then the sampled ones). In-process nodes, stories260K from ../shared, greedy.
#include "tests/support.hpp"

#include <cellshard/cluster.hpp>

#include <algorithm>
#include <future>

namespace {

cellshard::cluster_options options() {
  cellshard::cluster_options o;
  o.model_path = cellshard::test::shared_file("models/stories260K.bin");
  o.tokenizer_path = cellshard::test::shared_file("models/tok512.bin");
  return o;
}

cellshard::generation_request request() {
  cellshard::generation_request r;
  r.prompt = "Once upon a time";
  r.steps = 80;
  r.temperature = 0;
  return r;
}

bool is_prefix(const std::vector<int>& part, const std::vector<int>& whole) {
  return part.size() <= whole.size() && std::equal(part.begin(), part.end(), whole.begin());
}

}  // namespace

TEST_CASE("public API: a callback returning false ends generate() with cancelled and the partial output", "[api]") {
  if (!cellshard::test::have_shared()) return;
  auto c = cellshard::cluster::start(options(), cellshard::hosts::in_process(2));
  if (!c) FAIL(c.message());
  auto full = (*c)->generate(request());
  REQUIRE(full);
  REQUIRE(full->ids.size() == 81);
  // The callback gets every position after BOS: the prompt's tokens, then
  // the sampled ones; the fifth sampled token cancels.
  const int forced = full->prompt_tokens - 1;
  REQUIRE(forced == 4);
  std::vector<int> seen;
  std::string pieces;  // of the sampled tokens
  auto g = (*c)->generate(request(), [&](int token, std::string_view piece) {
    seen.push_back(token);
    if (static_cast<int>(seen.size()) > forced) pieces += piece;
    return static_cast<int>(seen.size()) < forced + 5;
  });
  REQUIRE(!g);
  CHECK(g.code() == cellshard::error_code::cancelled);
  REQUIRE(seen.size() == static_cast<size_t>(forced + 5));
  CHECK(std::equal(seen.begin(), seen.end(), full->ids.begin() + 1));
  const auto& partial = g.err().partial;
  CHECK(partial.prompt_tokens == full->prompt_tokens);
  CHECK(static_cast<int>(partial.ids.size()) - partial.prompt_tokens >= 5);
  CHECK(partial.ids.size() < full->ids.size());
  CHECK(is_prefix(partial.ids, full->ids));
  // text: the prompt's pieces, then the sampled ones (what the callback got).
  INFO("text: [" << partial.text << "] sampled pieces: [" << pieces << "]");
  CHECK(partial.text.rfind("Once upon a time" + pieces, 0) == 0);
  CHECK(full->text.rfind(partial.text, 0) == 0);
}

TEST_CASE("public API: cancel(id) from a callback ends a submitted request with cancelled", "[api]") {
  if (!cellshard::test::have_shared()) return;
  auto c = cellshard::cluster::start(options(), cellshard::hosts::in_process(2));
  if (!c) FAIL(c.message());
  auto full = (*c)->generate(request());
  REQUIRE(full);
  const int forced = full->prompt_tokens - 1;  // prompt positions the callback sees first
  std::promise<cellshard::generation_result> done;
  std::promise<std::uint64_t> id;
  auto id_future = id.get_future().share();
  int seen = 0;
  (void)id.set_value((*c)->submit(
      request(),
      [&](int, std::string_view) {
        if (++seen == forced + 3) (*c)->cancel(id_future.get());  // the third sampled token
        return true;
      },
      [&](cellshard::generation_result r) { done.set_value(std::move(r)); }));
  auto f = done.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  auto g = f.get();
  REQUIRE(!g);
  CHECK(g.code() == cellshard::error_code::cancelled);
  CHECK(static_cast<int>(g.err().partial.ids.size()) - g.err().partial.prompt_tokens >= 3);
  CHECK(is_prefix(g.err().partial.ids, full->ids));
}

TEST_CASE("public API: a crash that cannot be recovered is unavailable, with the tokens before it", "[api]") {
  if (!cellshard::test::have_shared()) return;
  std::vector<int> reference;
  {
    auto c = cellshard::cluster::start(options(), cellshard::hosts::in_process(2));
    if (!c) FAIL(c.message());
    auto full = (*c)->generate(request());
    REQUIRE(full);
    reference = full->ids;
  }
  auto o = options();
  o.supervision.max_restarts = 0;  // no restart allowed, no spare
  o.faults.push_back({cellshard::fault_kind::crash, 1, 30, {}, 0});
  auto c = cellshard::cluster::start(o, cellshard::hosts::in_process(2));
  if (!c) FAIL(c.message());
  auto g = (*c)->generate(request());
  REQUIRE(!g);
  INFO(g.message());
  CHECK(g.code() == cellshard::error_code::unavailable);
  CHECK(g.message().size() > 10);
  const auto& partial = g.err().partial;
  CHECK(partial.ids.size() >= 5);
  CHECK(partial.ids.size() <= 31);  // nothing at or after the crashed position
  CHECK(is_prefix(partial.ids, reference));
}
