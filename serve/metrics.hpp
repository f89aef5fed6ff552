// serve/metrics.hpp: a Prometheus histogram (cumulative buckets, sum, count)
// and the text exposition of one, as the Prometheus text format 0.0.4 has it:
//   NAME_bucket{le="0.005"} 3 ... NAME_bucket{le="+Inf"} N, NAME_sum S, NAME_count N.
// Units are the caller's (serve uses seconds, as Prometheus recommends).
// Thread safety: observe() and render() may run concurrently (one mutex).
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace cellshard::serve {

class histogram {
public:
  /// `bounds`: upper bounds of the buckets, increasing (+Inf is implicit).
  explicit histogram(std::vector<double> bounds);
  void observe(double v);
  /// "# HELP", "# TYPE" and the sample lines of metric `name`.
  std::string render(const std::string& name, const std::string& help) const;
  /// Number of observations so far.
  uint64_t count() const;

private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), the last is +Inf
  double sum_ = 0;
  uint64_t n_ = 0;
};

/// Exponential bucket bounds: start, start*factor, ... (count of them).
std::vector<double> exponential_buckets(double start, double factor, int count);

}  // namespace cellshard::serve
