#include "model/sampler.hpp"

#include "kernels/reference.hpp"

#include <algorithm>

namespace cellshard::model {

uint32_t sampler::random_u32(uint64_t& state) {
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return static_cast<uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
}

float sampler::random_f32(uint64_t& state) {
  return static_cast<float>(random_u32(state) >> 8) / 16777216.0f;
}

sampler::sampler(int vocab_size, sampler_params p)
    : vocab_(vocab_size), p_(p), state_(p.seed), probindex_(static_cast<size_t>(vocab_size)) {}

int argmax(const float* p, int n) {
  int best = 0;
  float best_p = p[0];
  for (int i = 1; i < n; ++i)
    if (p[i] > best_p) {
      best = i;
      best_p = p[i];
    }
  return best;
}

int sampler::sample(float* logits) {
  if (p_.temperature == 0.0f) return argmax(logits, vocab_);
  for (int q = 0; q < vocab_; ++q) logits[q] /= p_.temperature;
  kernels::ref::softmax(logits, vocab_);
  const float coin = random_f32(state_);
  if (p_.topp <= 0.0f || p_.topp >= 1.0f) {
    float cdf = 0.0f;
    for (int i = 0; i < vocab_; ++i) {
      cdf += logits[i];
      if (coin < cdf) return i;
    }
    return vocab_ - 1;
  }
  // Top-p: keep tokens with prob >= (1 - topp) / (n - 1) (they cannot be part
  // of the nucleus otherwise), sort descending, cut where the cumulative
  // probability first exceeds topp, sample within.
  int n0 = 0;
  const float cutoff = (1.0f - p_.topp) / static_cast<float>(vocab_ - 1);
  for (int i = 0; i < vocab_; ++i)
    if (logits[i] >= cutoff) probindex_[n0++] = {logits[i], i};
  // run.c uses qsort, which glibc implements as a stable merge sort for
  // arrays this small; stable_sort gives the same order for equal probs.
  std::stable_sort(probindex_.begin(), probindex_.begin() + n0,
                   [](const prob_index& a, const prob_index& b) { return a.prob > b.prob; });
  float cumulative = 0.0f;
  int last = n0 - 1;
  for (int i = 0; i < n0; ++i) {
    cumulative += probindex_[i].prob;
    if (cumulative > p_.topp) {
      last = i;
      break;
    }
  }
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (int i = 0; i <= last; ++i) {
    cdf += probindex_[i].prob;
    if (r < cdf) return probindex_[i].index;
  }
  return probindex_[last].index;
}

}  // namespace cellshard::model
