// compute_worker's queue order (actors/worker.hpp): post() appends, post_next()
// puts a job right behind the first queued one; what a fused tensor job that
// yields the worker relies on (actors/shard.cpp run_fused).
#include "actors/worker.hpp"

#include "tests/support.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

using cellshard::actors::compute_worker;

namespace {

/// The order jobs ran in, and a latch the first job waits on (bounded).
struct journal {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> ran;
  bool go = false;

  void add(const std::string& s) {
    std::lock_guard<std::mutex> g(mu);
    ran.push_back(s);
    cv.notify_all();
  }
  bool wait_go() {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(10), [&] { return go; });
  }
  void open() {
    std::lock_guard<std::mutex> g(mu);
    go = true;
    cv.notify_all();
  }
  bool wait_for(size_t n) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(10), [&] { return ran.size() >= n; });
  }
};

}  // namespace

TEST_CASE("compute worker: a job posted with post_next runs right after the first queued job", "[actors][worker]") {
  journal log;
  compute_worker w("test-worker", 0);
  bool waited = false;
  // A runs first and, once B and C are queued, yields: D goes behind B, before C.
  w.post([&](const std::atomic<bool>&) {
    waited = log.wait_go();
    log.add("A");
    w.post_next([&](const std::atomic<bool>&) { log.add("D"); });
  });
  w.post([&](const std::atomic<bool>&) { log.add("B"); });
  w.post([&](const std::atomic<bool>&) { log.add("C"); });
  log.open();
  REQUIRE(log.wait_for(4));
  CHECK(waited);
  CHECK(log.ran == std::vector<std::string>{"A", "B", "D", "C"});
}

TEST_CASE("compute worker: post_next with nothing queued runs the job next, and an inline worker runs it at once",
          "[actors][worker]") {
  journal log;
  {
    compute_worker w("test-worker", 0);
    w.post([&](const std::atomic<bool>&) {
      log.add("A");
      w.post_next([&](const std::atomic<bool>&) { log.add("B"); });
    });
    REQUIRE(log.wait_for(2));
    CHECK(log.ran == std::vector<std::string>{"A", "B"});
  }
  journal in;
  compute_worker w("test-inline", 0, true);
  w.post_next([&](const std::atomic<bool>&) { in.add("X"); });
  CHECK(in.ran == std::vector<std::string>{"X"});  // ran before post_next returned
  CHECK(w.pending() == 0);
}
