// The phi accrual detector on injected time. Expected numbers were computed
// independently (Python, Akka's two-branch formula
//   e = exp(-y (1.5976 + 0.070566 y^2));
//   phi = -log10(e / (1 + e)) if t > mean else -log10(1 - 1 / (1 + e)))
// and are pinned here as literals.
#include "supervision/phi_accrual.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>

using namespace cellshard::supervision;
using namespace std::chrono_literals;
using time_point = phi_accrual_detector::time_point;

namespace {

const time_point t0 = time_point{} + 1h;

// Deterministic jitter: a 64-bit LCG (Knuth's MMIX constants), top bits.
struct lcg {
  std::uint64_t s;
  std::uint32_t next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::uint32_t>(s >> 33);
  }
};

}  // namespace

TEST_CASE("phi formula matches independently computed values", "[phi]") {
  CHECK(phi_accrual_detector::phi(100, 100, 50) == Approx(0.3010299956639812).epsilon(1e-12));
  CHECK(phi_accrual_detector::phi(200, 100, 50) == Approx(1.6428278854871123).epsilon(1e-12));
  CHECK(phi_accrual_detector::phi(50, 100, 50) == Approx(0.0750330321409399).epsilon(1e-12));
  CHECK(phi_accrual_detector::phi(300, 100, 50) == Approx(4.736694582705181).epsilon(1e-12));
  CHECK(phi_accrual_detector::phi(400, 100, 50) == Approx(10.782600858295707).epsilon(1e-12));
  CHECK(phi_accrual_detector::phi(150, 100, 25) == Approx(1.6428278854871123).epsilon(1e-12));
  // Near the mean the logistic approximation tracks the exact normal tail:
  // -log10(0.5 erfc(2 / sqrt 2)) = 1.6430160801409368.
  CHECK(phi_accrual_detector::phi(200, 100, 50) == Approx(1.6430160801409368).epsilon(2e-4));
  // Far tails stay finite (no overflow to inf) and monotone.
  double far = phi_accrual_detector::phi(1e6, 100, 50);
  CHECK(std::isfinite(far));
  CHECK(far > phi_accrual_detector::phi(1e5, 100, 50));
  CHECK(phi_accrual_detector::phi(-1e6, 100, 50) >= 0.0);
}

TEST_CASE("phi from a heartbeat history", "[phi]") {
  phi_accrual_config cfg;
  cfg.min_std_deviation = 1ms;  // let the real spread show
  phi_accrual_detector d{cfg};
  CHECK(d.phi(t0) == 0.0);      // nothing heard yet: healthy
  CHECK(d.samples() == 2);      // seeds 75 and 125 ms
  CHECK(d.mean_ms() == Approx(100.0));
  CHECK(d.std_dev_ms() == Approx(25.0));
  // Arrivals at 0, 80, 200, 300, 390, 500 ms: intervals 80, 120, 100, 90, 110.
  for (auto ms : {0, 80, 200, 300, 390, 500}) d.heartbeat(t0 + std::chrono::milliseconds(ms));
  REQUIRE(d.samples() == 7);
  CHECK(d.mean_ms() == Approx(100.0));
  CHECK(d.std_dev_ms() == Approx(17.928429140015883));
  CHECK(d.phi(t0 + 650ms) == Approx(2.600843689875054).epsilon(1e-9));
  CHECK(d.phi(t0 + 630ms) == Approx(1.325605982243265).epsilon(1e-9));
  CHECK(d.is_available(t0 + 650ms));
}

TEST_CASE("a silent peer is suspected 361 ms after its last heartbeat with the defaults",
          "[phi]") {
  phi_accrual_detector d;  // 100 ms estimate, threshold 8, min std-dev 50 ms, window 200
  time_point t = t0;
  for (int i = 0; i < 100; ++i, t += 100ms) d.heartbeat(t);
  time_point last = t - 100ms;
  // Mean 100 ms exactly (seeds 75/125 balance), std-dev clamped to 50 ms: the
  // crossing of phi = 8 solves to 361.2993 ms (bisection of Akka's formula).
  auto suspected_at = last;
  for (auto now = last; now < last + 2s; now += 100us) {
    if (!d.is_available(now)) {
      suspected_at = now;
      break;
    }
  }
  auto after = std::chrono::duration<double, std::milli>(suspected_at - last).count();
  CHECK(after == Approx(361.3).margin(0.1));
  CHECK(after < 1000.0);
  CHECK(d.phi(last + 361ms) < 8.0);
  CHECK(d.phi(last + 362ms) >= 8.0);
}

TEST_CASE("a peer with jittery live heartbeats is never suspected", "[phi]") {
  phi_accrual_detector d;
  lcg rng{42};
  time_point t = t0;
  double max_phi = 0;
  for (int i = 0; i < 20000; ++i) {  // ~2000 s of heartbeats, 100 ms +- 40 ms
    auto gap = std::chrono::milliseconds(60 + rng.next() % 81);
    // The worst moment is just before the next arrival.
    max_phi = std::max(max_phi, d.phi(t + gap - 1us));
    REQUIRE(d.is_available(t + gap - 1us));
    t += gap;
    d.heartbeat(t);
  }
  CHECK(d.samples() == 200);  // window full
  CHECK(d.mean_ms() == Approx(100.0).margin(5.0));
  CHECK(max_phi < 1.5);  // far below the threshold of 8
}

TEST_CASE("a long pause does not widen the distribution", "[phi]") {
  phi_accrual_detector d;
  time_point t = t0;
  for (int i = 0; i < 50; ++i, t += 100ms) d.heartbeat(t);
  double mean_before = d.mean_ms();
  auto n = d.samples();
  t += 5s;           // suspected by now
  REQUIRE_FALSE(d.is_available(t));
  d.heartbeat(t);    // comes back: the 5.1 s interval is not recorded
  CHECK(d.samples() == n);
  CHECK(d.mean_ms() == mean_before);
  CHECK(d.is_available(t + 100ms));
}

TEST_CASE("acceptable pause shifts the mean", "[phi]") {
  phi_accrual_config cfg;
  cfg.acceptable_heartbeat_pause = 200ms;
  phi_accrual_detector d{cfg};
  d.heartbeat(t0);
  // mean 100 + 200, std max(25, 50) = 50.
  CHECK(d.phi(t0 + 400ms) == Approx(phi_accrual_detector::phi(400, 300, 50)));
  CHECK(d.phi(t0 + 400ms) == Approx(1.6428278854871123));
}

TEST_CASE("detector config validation", "[phi]") {
  CHECK(validate(phi_accrual_config{}).ok());
  phi_accrual_config c;
  c.threshold = 0;
  CHECK(validate(c).message() == "phi accrual: threshold must be > 0 (got 0.000000)");
  c = {};
  c.max_sample_size = 0;
  CHECK(validate(c).message() == "phi accrual: max_sample_size (window) must be >= 1");
  c = {};
  c.min_std_deviation = 0ms;
  CHECK_FALSE(validate(c).ok());
  c = {};
  c.first_heartbeat_estimate = -1ms;
  CHECK_FALSE(validate(c).ok());
}
