// The sampler against independent arithmetic of run.c's rules.
#include "model/sampler.hpp"
#include "tests/support.hpp"

#include <cmath>

using namespace cellshard;

TEST_CASE("xorshift64* matches hand-computed values", "[sampler]") {
  uint64_t s = 42;
  // Reference computed step by step from run.c's definition.
  uint64_t x = 42;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  const uint32_t want = static_cast<uint32_t>((x * 0x2545F4914F6CDD1Dull) >> 32);
  CHECK(model::sampler::random_u32(s) == want);
  CHECK(s == x);
  uint64_t s2 = 42;
  CHECK(model::sampler::random_f32(s2) == static_cast<float>(want >> 8) / 16777216.0f);
}

TEST_CASE("argmax takes the lowest index on ties", "[sampler]") {
  float l[] = {0.1f, 0.7f, 0.7f, 0.2f};
  model::sampler smp(4, {0.0f, 0.9f, 1});
  CHECK(smp.sample(l) == 1);
}

TEST_CASE("top-p keeps the nucleus and samples within it", "[sampler]") {
  // Probabilities after softmax of log(p): 0.5, 0.3, 0.15, 0.05. With topp 0.7
  // the nucleus is {0, 1} (0.5 + 0.3 = 0.8 > 0.7): tokens 2 and 3 never come.
  const float probs[] = {0.5f, 0.3f, 0.15f, 0.05f};
  model::sampler smp(4, {1.0f, 0.7f, 12345});
  int counts[4] = {0, 0, 0, 0};
  for (int i = 0; i < 2000; ++i) {
    float l[4];
    for (int k = 0; k < 4; ++k) l[k] = std::log(probs[k]);
    counts[smp.sample(l)]++;
  }
  CHECK(counts[2] == 0);
  CHECK(counts[3] == 0);
  // Within the nucleus token 0 has 0.5/0.8 = 62.5%: 2000 draws land within 5%.
  CHECK(counts[0] > 1150);
  CHECK(counts[0] < 1350);
}

TEST_CASE("full-distribution sampling follows the coin", "[sampler]") {
  // topp >= 1 samples the CDF directly: reproduce the coin and the choice.
  model::sampler smp(3, {1.0f, 1.0f, 777});
  uint64_t st = 777;
  const float coin = model::sampler::random_f32(st);
  float l[3] = {0.0f, 0.0f, 0.0f};  // uniform: 1/3 each
  const int want = coin < 1.0f / 3 ? 0 : (coin < 2.0f / 3 ? 1 : 2);
  CHECK(smp.sample(l) == want);
  CHECK(smp.rng_state() == st);
}
