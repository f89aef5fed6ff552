#include "serve/metrics.hpp"

#include <algorithm>
#include <cstdio>

namespace cellshard::serve {

histogram::histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void histogram::observe(double v) {
  const size_t k = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();  // le: v <= bound
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[k];
  sum_ += v;
  ++n_;
}

uint64_t histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_;
}

std::string histogram::render(const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  char buf[96];
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    std::snprintf(buf, sizeof buf, "%.6g", bounds_[i]);
    out += name + "_bucket{le=\"" + buf + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  std::snprintf(buf, sizeof buf, "%.9g", sum_);
  out += name + "_sum " + buf + "\n" + name + "_count " + std::to_string(n_) + "\n";
  return out;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

}  // namespace cellshard::serve
