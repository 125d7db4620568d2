// Comparing the model's outputs with the expected ones.
#include "compare.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "model.h"
#include "text.h"

namespace customconv_demo {

double max_error(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return std::max(a, b);
}

namespace {

// allclose, as torch.allclose(output, expected, rtol, atol) (equal infinities
// match, NaN never does), plus the largest absolute difference.
Comparison compare_tensor(const torch::Tensor& output, const torch::Tensor& expected,
                          Tolerance tolerance) {
  if (output.sizes() != expected.sizes() || output.scalar_type() != expected.scalar_type()) {
    return {false, 0, "is " + describe_tensor(output) + ", expected " + describe_tensor(expected)};
  }
  if (output.numel() == 0) {
    return {};
  }
  const auto out = output.to(torch::kCPU, torch::kDouble);
  const auto exp = expected.to(torch::kCPU, torch::kDouble);
  auto difference = (out - exp).abs();
  difference.masked_fill_(out == exp, 0);
  const bool close = difference.le(exp.abs() * tolerance.rtol + tolerance.atol).all().item<bool>();
  const double max_abs_error = difference.max().item<double>();
  if (close) {
    return {true, max_abs_error, ""};
  }
  return {false, max_abs_error, "differs: max abs error " + format_number(max_abs_error)};
}

}  // namespace

Comparison compare_outputs(const torch::IValue& output, const std::vector<torch::Tensor>& expected,
                           Tolerance tolerance) {
  const auto outputs = tensors_of(output, "the model's output");
  if (outputs.size() != expected.size()) {
    return {false, 0,
            "the model returned " + describe_tensors(outputs) + ", expected " +
                describe_tensors(expected)};
  }
  Comparison all;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Comparison one = compare_tensor(outputs[i], expected[i], tolerance);
    all.max_abs_error = max_error(all.max_abs_error, one.max_abs_error);
    if (!one.match && all.match) {
      all.match = false;
      all.problem = "output " + std::to_string(i) + " of " + std::to_string(outputs.size()) + " " +
                    one.problem;
    }
  }
  return all;
}

}  // namespace customconv_demo
