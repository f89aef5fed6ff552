// tools/sampling_flags.hpp: the usage check of -t/--temperature and -p/--topp
// shared by `run` and `chaos` (issue #21). Throws cli_error, exit status 2.
#pragma once

#include "tools/common.hpp"

#include <cmath>
#include <sstream>
#include <string>

namespace cellshard::tools {

/// Finite values outside the ranges keep run.c's meaning (a negative
/// temperature is greedy; top-p outside [0, 1] becomes 0.9), but NaN and
/// infinity have none: NaN compares false everywhere and would sample garbage.
inline void check_sampling_flags(double temperature, double topp) {
  auto fmt = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  if (!std::isfinite(temperature))
    throw cli_error("-t/--temperature: got " + fmt(temperature) +
                    ", expected a finite number (0 = greedy, 1 = the model's distribution)", 2);
  if (!std::isfinite(topp))
    throw cli_error("-p/--topp: got " + fmt(topp) + ", expected a finite number in [0, 1] (0.9 is usual)", 2);
}

}  // namespace cellshard::tools
