// Comparing the model's outputs with the expected ones (allclose, as
// torch.allclose, plus the largest absolute difference).
#pragma once

#include <torch/script.h>

#include <string>
#include <vector>

#include "options.h"

namespace customconv_demo {

struct Comparison {
  bool match = true;
  double max_abs_error = 0;
  std::string problem;  // why it does not match
};

// The larger of two errors; NaN (an output that is NaN where the expected one is
// not) wins, so that it shows in the report.
double max_error(double a, double b);

Comparison compare_outputs(const torch::IValue& output, const std::vector<torch::Tensor>& expected,
                           Tolerance tolerance);

}  // namespace customconv_demo
