// Shared by the GoogleTest files: seeding, tensor comparison, error checks and
// the convolution configurations the ops are compared on.
#pragma once

#include <customconv/customconv.h>

#include <gtest/gtest.h>
#include <torch/nn/functional/fold.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace customconv_test {

// Seeds torch's generator from the running test's full name, so each test
// draws its own inputs and a failure replays exactly.
inline uint64_t seed_for_current_test() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      info == nullptr ? "" : std::string(info->test_suite_name()) + "." + info->name();
  const uint64_t seed = std::hash<std::string>{}(name) & 0x7fffffffffffULL;
  torch::manual_seed(seed);
  return seed;
}

// `actual` equals `expected` elementwise within atol + rtol * |expected|
// (compared in float64 on the CPU), with the same shape; NaN never matches.
inline ::testing::AssertionResult all_close(const at::Tensor& actual, const at::Tensor& expected,
                                            double rtol, double atol) {
  if (!actual.defined() || !expected.defined()) {
    return ::testing::AssertionFailure()
           << "undefined tensor (actual defined: " << actual.defined()
           << ", expected defined: " << expected.defined() << ")";
  }
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.sizes() << " but expected " << expected.sizes();
  }
  if (actual.numel() == 0) return ::testing::AssertionSuccess();
  const at::Tensor a = actual.detach().to(at::kCPU, at::kDouble);
  const at::Tensor e = expected.detach().to(at::kCPU, at::kDouble);
  const at::Tensor diff = (a - e).abs();
  const at::Tensor ok = diff.le(e.abs().mul(rtol).add(atol));
  if (ok.all().item<bool>()) return ::testing::AssertionSuccess();
  const int64_t bad = ok.logical_not().sum().item<int64_t>();
  const int64_t worst = diff.nan_to_num(std::numeric_limits<double>::infinity()).argmax().item<int64_t>();
  return ::testing::AssertionFailure()
         << bad << " of " << a.numel() << " elements differ beyond rtol=" << rtol
         << " atol=" << atol << "; largest difference " << diff.reshape(-1)[worst].item<double>()
         << " at flat index " << worst << " (actual " << a.reshape(-1)[worst].item<double>()
         << ", expected " << e.reshape(-1)[worst].item<double>() << ")";
}

// Passes when `fn` throws a c10::Error whose message contains `needle`.
template <class Fn>
::testing::AssertionResult throws_c10_error_containing(Fn&& fn, const std::string& needle) {
  try {
    fn();
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    if (message.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "c10::Error message does not mention '" << needle << "': " << message;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-c10::Error exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "threw nothing (expected an error mentioning '"
                                       << needle << "')";
}

// Passes when `fn` throws any std::exception whose message contains `needle`
// (the TorchScript interpreter may rethrow an op's c10::Error as another
// exception type that carries the op's message and the script's stack trace).
template <class Fn>
::testing::AssertionResult throws_exception_containing(Fn&& fn, const std::string& needle) {
  try {
    fn();
  } catch (const std::exception& e) {
    const std::string message = e.what();
    if (message.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "exception message does not mention '" << needle << "': " << message;
  }
  return ::testing::AssertionFailure() << "threw nothing (expected an error mentioning '"
                                       << needle << "')";
}

}  // namespace customconv_test

// The statement throws c10::Error, and the error's message contains `needle`
// (typically the name of the offending argument).
#define EXPECT_C10_ERROR_MENTIONING(statement, needle)                                      \
  do {                                                                                      \
    EXPECT_THROW(statement, c10::Error);                                                    \
    EXPECT_TRUE(::customconv_test::throws_c10_error_containing([&] { statement; }, needle)) \
        << "statement: " #statement;                                                        \
  } while (0)

namespace customconv_test {

// The restoring guard for the process-wide workspace limit: back to the
// per-device defaults where no limit was set before, else to the one set.
class WorkspaceLimitGuard {
 public:
  explicit WorkspaceLimitGuard(int64_t bytes)
      : cpu_(customconv::workspace_limit_bytes(c10::DeviceType::CPU)),
        cuda_(customconv::workspace_limit_bytes(c10::DeviceType::CUDA)) {
    customconv::set_workspace_limit_bytes(bytes);
  }
  ~WorkspaceLimitGuard() {
    customconv::set_workspace_limit_bytes(0);
    if (customconv::workspace_limit_bytes(c10::DeviceType::CPU) != cpu_ ||
        customconv::workspace_limit_bytes(c10::DeviceType::CUDA) != cuda_) {
      customconv::set_workspace_limit_bytes(cpu_);  // one limit was set for every device
    }
  }
  WorkspaceLimitGuard(const WorkspaceLimitGuard&) = delete;
  WorkspaceLimitGuard& operator=(const WorkspaceLimitGuard&) = delete;

 private:
  int64_t cpu_, cuda_;
};

// One conv2d call: input (n, c, h, w), weight (k, c/groups, kh, kw).
struct ConvConfig {
  int64_t n, c, h, w;
  int64_t k, kh, kw;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  bool bias;

  int64_t out_h() const { return (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) / stride[0] + 1; }
  int64_t out_w() const { return (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) / stride[1] + 1; }

  std::string describe() const {
    std::ostringstream s;
    s << "input (" << n << ", " << c << ", " << h << ", " << w << "), weight (" << k << ", "
      << c / groups << ", " << kh << ", " << kw << "), stride " << c10::IntArrayRef(stride)
      << ", padding " << c10::IntArrayRef(padding) << ", dilation "
      << c10::IntArrayRef(dilation) << ", groups " << groups << (bias ? ", bias" : ", no bias");
    return s.str();
  }
};

// Hand-picked configurations: square and non-square kernels, strides,
// paddings, dilations, groups (including depthwise), 1x1 kernels, a kernel
// larger than the unpadded input, bias and no bias, batch 1 and batch 0.
inline std::vector<ConvConfig> fixed_conv_configs() {
  return {
      {2, 3, 9, 11, 4, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, true},
      {2, 4, 10, 7, 6, 3, 2, {2, 1}, {1, 2}, {1, 1}, 2, false},
      {1, 6, 12, 13, 6, 3, 3, {1, 2}, {2, 1}, {2, 3}, 3, true},
      {3, 4, 8, 8, 8, 1, 1, {1, 1}, {0, 0}, {1, 1}, 4, true},
      {2, 4, 7, 6, 4, 2, 2, {2, 2}, {1, 1}, {2, 2}, 4, false},
      {1, 5, 7, 9, 3, 5, 4, {3, 2}, {2, 0}, {1, 1}, 1, true},
      {1, 2, 3, 3, 2, 5, 5, {1, 1}, {2, 2}, {1, 1}, 1, false},
      {2, 3, 6, 5, 2, 1, 3, {1, 3}, {0, 1}, {1, 2}, 1, true},
      {0, 3, 8, 8, 5, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
      {0, 4, 6, 6, 4, 3, 1, {2, 1}, {0, 0}, {1, 1}, 2, false},
  };
}

// Random valid configurations drawn from `seed` (output at least 1 x 1).
inline std::vector<ConvConfig> random_conv_configs(uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<ConvConfig> configs;
  while (static_cast<int>(configs.size()) < count) {
    ConvConfig c{};
    c.groups = pick(1, 3);
    c.n = pick(0, 3);
    c.c = c.groups * pick(1, 3);
    c.k = c.groups * pick(1, 3);
    c.kh = pick(1, 4);
    c.kw = pick(1, 4);
    c.stride = {pick(1, 3), pick(1, 3)};
    c.padding = {pick(0, 2), pick(0, 2)};
    c.dilation = {pick(1, 3), pick(1, 3)};
    c.h = pick(1, 12);
    c.w = pick(1, 12);
    c.bias = pick(0, 1) == 1;
    if (c.out_h() >= 1 && c.out_w() >= 1 &&
        c.h + 2 * c.padding[0] >= c.dilation[0] * (c.kh - 1) + 1 &&
        c.w + 2 * c.padding[1] >= c.dilation[1] * (c.kw - 1) + 1) {
      configs.push_back(c);
    }
  }
  return configs;
}

// Random (never all-zero) tensors of the configuration, float64 on the CPU.
struct ConvTensors {
  at::Tensor input, weight, bias;  // bias undefined when the config has none
};

inline ConvTensors make_conv_tensors(const ConvConfig& c) {
  ConvTensors t;
  t.input = torch::randn({c.n, c.c, c.h, c.w}, torch::kDouble);
  t.weight = torch::randn({c.k, c.c / c.groups, c.kh, c.kw}, torch::kDouble);
  if (c.bias) t.bias = torch::randn({c.k}, torch::kDouble);
  return t;
}

inline std::optional<at::Tensor> optional_bias(const at::Tensor& bias) {
  return bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
}

// PyTorch's references: torch::conv2d, F::unfold and F::fold.
inline at::Tensor reference_conv2d(const ConvConfig& c, const at::Tensor& input,
                                   const at::Tensor& weight, const at::Tensor& bias) {
  return torch::conv2d(input, weight, bias, c.stride, c.padding, c.dilation, c.groups);
}

inline at::Tensor reference_unfold(const at::Tensor& input, std::vector<int64_t> kernel_size,
                                   std::vector<int64_t> stride, std::vector<int64_t> padding,
                                   std::vector<int64_t> dilation) {
  namespace F = torch::nn::functional;
  return F::unfold(input, F::UnfoldFuncOptions(kernel_size)
                              .stride(stride)
                              .padding(padding)
                              .dilation(dilation));
}

inline at::Tensor reference_fold(const at::Tensor& columns, std::vector<int64_t> output_size,
                                 std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                                 std::vector<int64_t> padding, std::vector<int64_t> dilation) {
  namespace F = torch::nn::functional;
  return F::fold(columns, F::FoldFuncOptions(output_size, kernel_size)
                              .stride(stride)
                              .padding(padding)
                              .dilation(dilation));
}

// One im2col / col2im call: image (n, c, h, w) and the window.
struct WindowConfig {
  int64_t n, c, h, w;
  std::vector<int64_t> kernel_size, stride, padding, dilation;

  int64_t out_h() const {
    return (h + 2 * padding[0] - dilation[0] * (kernel_size[0] - 1) - 1) / stride[0] + 1;
  }
  int64_t out_w() const {
    return (w + 2 * padding[1] - dilation[1] * (kernel_size[1] - 1) - 1) / stride[1] + 1;
  }
  int64_t rows() const { return c * kernel_size[0] * kernel_size[1]; }
  int64_t length() const { return out_h() * out_w(); }

  std::string describe() const {
    std::ostringstream s;
    s << "image (" << n << ", " << c << ", " << h << ", " << w << "), kernel_size "
      << c10::IntArrayRef(kernel_size) << ", stride " << c10::IntArrayRef(stride) << ", padding "
      << c10::IntArrayRef(padding) << ", dilation " << c10::IntArrayRef(dilation);
    return s.str();
  }
};

// Overlapping and non-overlapping windows (col2im sums overlaps), gaps
// between windows (stride larger than the kernel), non-square everything,
// batch 1 and batch 0.
inline std::vector<WindowConfig> window_configs() {
  return {
      {2, 3, 8, 9, {3, 3}, {1, 1}, {1, 1}, {1, 1}},
      {1, 2, 10, 7, {2, 3}, {2, 1}, {0, 2}, {2, 1}},
      {3, 1, 9, 9, {2, 2}, {2, 2}, {0, 0}, {1, 1}},
      {2, 4, 11, 6, {1, 2}, {3, 2}, {1, 0}, {1, 3}},
      {1, 3, 5, 5, {4, 1}, {1, 2}, {2, 1}, {1, 1}},
      {2, 2, 12, 12, {3, 2}, {2, 3}, {1, 1}, {3, 2}},
      {0, 3, 6, 6, {3, 3}, {1, 1}, {1, 1}, {1, 1}},
  };
}

}  // namespace customconv_test
