// model/sampler.hpp: next-token sampling exactly as llama2.c run.c does it:
// temperature 0 = argmax (lowest index wins ties); otherwise logits / T,
// softmax, one coin from xorshift64* (run.c random_f32), then the full
// distribution when topp <= 0 or topp >= 1, else top-p (nucleus) with run.c's
// cutoff (1 - topp) / (n - 1), descending sort and truncation.
// The RNG state is plain data so a session can checkpoint and journal it.
// Not thread-safe: one sampler per session.
#pragma once

#include <cstdint>
#include <vector>

namespace cellshard::model {

struct sampler_params {
  float temperature = 1.0f;
  float topp = 0.9f;
  uint64_t seed = 0;  // run.c: 0 means "from the clock" (resolved by the caller)
};

class sampler {
public:
  sampler(int vocab_size, sampler_params p);
  /// Samples from `logits` [vocab_size]; modifies logits in place (as run.c).
  int sample(float* logits);

  uint64_t rng_state() const { return state_; }
  void set_rng_state(uint64_t s) { state_ = s; }
  const sampler_params& params() const { return p_; }

  /// run.c random_u32 / random_f32 (xorshift64*), exposed for tests.
  static uint32_t random_u32(uint64_t& state);
  static float random_f32(uint64_t& state);

private:
  int vocab_;
  sampler_params p_;
  uint64_t state_;
  struct prob_index {
    float prob;
    int index;
  };
  std::vector<prob_index> probindex_;
};

int argmax(const float* p, int n);

}  // namespace cellshard::model
