#include "supervision/phi_accrual.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace cellshard::supervision {

namespace {

double to_ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

constexpr auto one_us = std::chrono::nanoseconds(1000);

}  // namespace

result<void> validate(const phi_accrual_config& cfg) {
  if (!(cfg.threshold > 0))
    return make_error("phi accrual: threshold must be > 0 (got " +
                      std::to_string(cfg.threshold) + ")");
  if (cfg.max_sample_size == 0)
    return make_error("phi accrual: max_sample_size (window) must be >= 1");
  if (cfg.min_std_deviation <= std::chrono::nanoseconds::zero())
    return make_error("phi accrual: min_std_deviation must be > 0");
  if (cfg.acceptable_heartbeat_pause < std::chrono::nanoseconds::zero())
    return make_error("phi accrual: acceptable_heartbeat_pause must be >= 0");
  if (cfg.first_heartbeat_estimate <= std::chrono::nanoseconds::zero())
    return make_error("phi accrual: first_heartbeat_estimate must be > 0");
  return {};
}

phi_accrual_detector::phi_accrual_detector(phi_accrual_config cfg) : cfg_(cfg) {
  cfg_.max_sample_size = std::max<std::size_t>(cfg_.max_sample_size, 1);
  cfg_.min_std_deviation = std::max(cfg_.min_std_deviation, one_us);
  cfg_.first_heartbeat_estimate = std::max(cfg_.first_heartbeat_estimate, one_us);
  cfg_.acceptable_heartbeat_pause =
      std::max(cfg_.acceptable_heartbeat_pause, std::chrono::nanoseconds::zero());
  reset();
}

void phi_accrual_detector::reset() {
  intervals_ms_.clear();
  sum_ = sum_sq_ = 0;
  last_.reset();
  // Seed: estimate -/+ estimate/4 (Akka's first-heartbeat history).
  double mean = to_ms(cfg_.first_heartbeat_estimate);
  double sd = mean / 4;
  add_interval(mean - sd);
  add_interval(mean + sd);
}

void phi_accrual_detector::add_interval(double ms) {
  intervals_ms_.push_back(ms);
  sum_ += ms;
  sum_sq_ += ms * ms;
  while (intervals_ms_.size() > cfg_.max_sample_size) {
    double old = intervals_ms_.front();
    intervals_ms_.pop_front();
    sum_ -= old;
    sum_sq_ -= old * old;
  }
  // Running sums drift by rounding over millions of heartbeats: re-add now and then.
  if (++adds_since_resum_ >= 4096) {
    adds_since_resum_ = 0;
    sum_ = sum_sq_ = 0;
    for (double v : intervals_ms_) {
      sum_ += v;
      sum_sq_ += v * v;
    }
  }
}

void phi_accrual_detector::heartbeat(time_point now) {
  if (!last_) {
    last_ = now;
    return;
  }
  if (now < *last_) return;
  // Judge availability *before* this arrival: after a long pause the late
  // interval would otherwise widen the distribution for good.
  if (is_available(now)) add_interval(to_ms(now - *last_));
  last_ = now;
}

double phi_accrual_detector::mean_ms() const {
  return intervals_ms_.empty() ? 0.0 : sum_ / static_cast<double>(intervals_ms_.size());
}

double phi_accrual_detector::std_dev_ms() const {
  if (intervals_ms_.empty()) return 0.0;
  double n = static_cast<double>(intervals_ms_.size());
  double mean = sum_ / n;
  double var = sum_sq_ / n - mean * mean;  // population variance
  return var > 0 ? std::sqrt(var) : 0.0;
}

double phi_accrual_detector::phi(double elapsed_ms, double mean_ms, double std_ms) {
  double y = (elapsed_ms - mean_ms) / std_ms;
  double a = y * (1.5976 + 0.070566 * y * y);
  // softplus(a) = ln(1 + e^a), evaluated without overflow.
  double softplus = a > 0 ? a + std::log1p(std::exp(-a)) : std::log1p(std::exp(a));
  return softplus / std::log(10.0);
}

double phi_accrual_detector::phi(time_point now) const {
  if (!last_) return 0.0;
  double elapsed = now > *last_ ? to_ms(now - *last_) : 0.0;
  double mean = mean_ms() + to_ms(cfg_.acceptable_heartbeat_pause);
  double sd = std::max(std_dev_ms(), to_ms(cfg_.min_std_deviation));
  return phi(elapsed, mean, sd);
}

bool phi_accrual_detector::is_available(time_point now) const {
  return phi(now) < cfg_.threshold;
}

}  // namespace cellshard::supervision
