// The direct-kernel ops depthwise_conv2d, filter2d and trilinear_interpolation,
// called through the public C++ API (dispatcher and autograd kernels). Forward
// and every gradient are compared with PyTorch's float64 reference on the CPU:
//   depthwise_conv2d        torch::conv2d with groups = C;
//   filter2d                F::pad of every plane, then a valid torch::conv2d;
//   trilinear_interpolation the corner-weight formula written with torch ops.
// Each test of a TEST_P suite runs on the CPU and on CUDA (skipped without a GPU).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <torch/nn/functional/padding.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "test_support.h"

namespace {

using namespace customconv_test;
using torch::autograd::grad;

// Tolerances against the float64 reference of the same (rounded) values. The
// absolute part is relative to the largest magnitude of the expected tensor
// (at least 1), so that long sums keep the same relative accuracy.
struct Tolerance {
  at::ScalarType dtype;
  double rtol, atol;
};
constexpr Tolerance kF64{at::kDouble, 1e-9, 1e-10};
constexpr Tolerance kF32{at::kFloat, 1e-4, 1e-5};
constexpr Tolerance kF16{at::kHalf, 2e-3, 1e-3};
constexpr Tolerance kBF16{at::kBFloat16, 1e-2, 2e-3};

::testing::AssertionResult close_to(const at::Tensor& actual, const at::Tensor& expected,
                                    const Tolerance& tol) {
  double scale = 1;
  if (expected.defined() && expected.numel() > 0) {
    scale = std::max(scale, expected.detach().abs().max().item<double>());
  }
  return all_close(actual, expected, tol.rtol, tol.atol * scale);
}

const torch::Device kCpu(torch::kCPU);
const torch::Device kCuda(torch::kCUDA, 0);

// A new leaf requiring grad with the values of `v` on `device` (never `v`
// itself, which Tensor::to returns when nothing changes).
at::Tensor leaf_on(const at::Tensor& v, torch::Device device) {
  return v.detach().to(device).clone().requires_grad_();
}

// ---------------------------------------------------------------- shared machinery

// The tensor arguments of one call; an undefined entry is an absent optional.
using Args = std::vector<at::Tensor>;
using OpFn = std::function<at::Tensor(const Args&)>;
// Gives argument `i` (already on the device, in the dtype) another memory layout.
using Relayout = std::function<at::Tensor(const at::Tensor&, size_t)>;

// Runs `op` on `values` (float64 CPU tensors) moved to `device` in
// `tol.dtype`, and `reference` on float64 CPU copies of those rounded values;
// compares the outputs and, when `backward`, the gradients of every defined
// argument (torch::autograd::grad with one random grad_output).
void expect_matches_reference(const Args& values, const std::vector<std::string>& names,
                              torch::Device device, const Tolerance& tol, bool backward,
                              const OpFn& op, const OpFn& reference,
                              const Relayout& relayout = nullptr) {
  SCOPED_TRACE(std::string("dtype ") + c10::toString(tol.dtype) + " on " + device.str());
  Args args(values.size()), ref_args(values.size());
  std::vector<at::Tensor> leaves, ref_leaves;
  std::vector<std::string> leaf_names;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!values[i].defined()) continue;
    at::Tensor v = values[i].to(device, tol.dtype);
    if (relayout) v = relayout(v, i);
    args[i] = v.detach().requires_grad_(backward);
    ref_args[i] = args[i].detach().to(kCpu, at::kDouble).requires_grad_(backward);
    leaves.push_back(args[i]);
    ref_leaves.push_back(ref_args[i]);
    leaf_names.push_back(names[i]);
  }
  const at::Tensor out = op(args);
  const at::Tensor ref = reference(ref_args);
  EXPECT_EQ(out.device(), device);
  EXPECT_EQ(out.scalar_type(), tol.dtype);
  EXPECT_TRUE(close_to(out, ref, tol)) << "output";
  if (!backward) return;

  ASSERT_TRUE(out.requires_grad());
  const at::Tensor go = torch::randn(out.sizes(), torch::kDouble).to(device, tol.dtype);
  const auto grads = grad({out}, leaves, {go});
  const auto ref_grads = grad({ref}, ref_leaves, {go.to(kCpu, at::kDouble)});
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::string name = "grad " + leaf_names[i];
    EXPECT_EQ(grads[i].device(), device) << name;
    EXPECT_EQ(grads[i].scalar_type(), tol.dtype) << name;
    EXPECT_TRUE(close_to(grads[i], ref_grads[i], tol)) << name;
  }
}

// The gradients of every argument, computed twice from the same values on
// `device` in `dtype`, are bitwise identical.
void expect_gradients_reproducible(const Args& values, torch::Device device, at::ScalarType dtype,
                                   const OpFn& op) {
  SCOPED_TRACE(std::string("dtype ") + c10::toString(dtype) + " on " + device.str());
  Args args;
  for (const auto& v : values) args.push_back(v.to(device, dtype).detach().requires_grad_());
  auto run = [&](const at::Tensor& go) {
    const at::Tensor out = op(args);
    return grad({out}, args, {go});
  };
  const at::Tensor out = op(args);
  const at::Tensor go = torch::randn(out.sizes(), torch::kDouble).to(device, dtype);
  const auto first = run(go), second = run(go);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(at::equal(first[i], second[i])) << "gradient of argument " << i;
  }
}

// Suites whose tests run on each device type: "cpu" always, "cuda" skipped
// where no GPU is present.
class OnDevice : public ::testing::TestWithParam<c10::DeviceType> {
 protected:
  void SetUp() override {
    seed_ = seed_for_current_test();
    if (is_cuda() && !torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
  bool is_cuda() const { return GetParam() == c10::kCUDA; }
  torch::Device device() const { return is_cuda() ? kCuda : kCpu; }
  at::TensorOptions options(at::ScalarType dtype = at::kFloat) const {
    return at::TensorOptions().device(device()).dtype(dtype);
  }
  // float32 and bfloat16 everywhere, float16 on CUDA.
  std::vector<Tolerance> reduced_precisions() const {
    if (is_cuda()) return {kF32, kF16, kBF16};
    return {kF32, kBF16};
  }
  void synchronize() const {
    if (is_cuda()) torch::cuda::synchronize();
  }

  uint64_t seed_ = 0;
};

std::string device_name(const ::testing::TestParamInfo<c10::DeviceType>& info) {
  return info.param == c10::kCUDA ? "cuda" : "cpu";
}

#define INSTANTIATE_ON_DEVICES(suite) \
  INSTANTIATE_TEST_SUITE_P(Devices, suite, ::testing::Values(c10::kCPU, c10::kCUDA), device_name)

// ---------------------------------------------------------------- registration

std::string schema_string(const char* name) {
  const auto op = c10::Dispatcher::singleton().findSchema({name, ""});
  if (!op.has_value()) return std::string("<no schema for ") + name + ">";
  std::ostringstream s;
  s << op->schema();
  return s.str();
}

const char* const kDirectOps[] = {"customconv::depthwise_conv2d",
                                  "customconv::depthwise_conv2d_grad_input",
                                  "customconv::depthwise_conv2d_grad_weight",
                                  "customconv::depthwise_conv2d_grad_weight_bias",
                                  "customconv::filter2d",
                                  "customconv::filter2d_grad_input",
                                  "customconv::filter2d_grad_kernel",
                                  "customconv::trilinear_interpolation",
                                  "customconv::trilinear_interpolation_backward",
                                  "customconv::trilinear_interpolation_with_derivatives",
                                  "customconv::trilinear_interpolation_backward_from_derivatives",
                                  "customconv::trilinear_interpolation_grad_feats"};

TEST(DirectOpRegistrationTest, PublicOpsHaveTheDocumentedSchemas) {
  EXPECT_EQ(schema_string("customconv::depthwise_conv2d"),
            "customconv::depthwise_conv2d(Tensor input, Tensor weight, Tensor? bias=None, "
            "int[2] stride=1, int[2] padding=0, int[2] dilation=1) -> Tensor");
  EXPECT_EQ(schema_string("customconv::filter2d"),
            "customconv::filter2d(Tensor input, Tensor kernel, str border=\"zeros\") -> Tensor");
  EXPECT_EQ(schema_string("customconv::trilinear_interpolation"),
            "customconv::trilinear_interpolation(Tensor feats, Tensor points) -> Tensor");
}

TEST(DirectOpRegistrationTest, BackwardOpsAreOpsOfTheirOwn) {
  EXPECT_EQ(schema_string("customconv::depthwise_conv2d_grad_input"),
            "customconv::depthwise_conv2d_grad_input(Tensor grad_output, Tensor input, "
            "Tensor weight, int[2] stride, int[2] padding, int[2] dilation) -> Tensor");
  EXPECT_EQ(schema_string("customconv::depthwise_conv2d_grad_weight"),
            "customconv::depthwise_conv2d_grad_weight(Tensor grad_output, Tensor input, "
            "Tensor weight, int[2] stride, int[2] padding, int[2] dilation) -> Tensor");
  EXPECT_EQ(schema_string("customconv::depthwise_conv2d_grad_weight_bias"),
            "customconv::depthwise_conv2d_grad_weight_bias(Tensor grad_output, Tensor input, "
            "Tensor weight, int[2] stride, int[2] padding, int[2] dilation) -> (Tensor, Tensor)");
  EXPECT_EQ(schema_string("customconv::filter2d_grad_input"),
            "customconv::filter2d_grad_input(Tensor grad_output, Tensor kernel, str border) "
            "-> Tensor");
  EXPECT_EQ(schema_string("customconv::filter2d_grad_kernel"),
            "customconv::filter2d_grad_kernel(Tensor grad_output, Tensor input, Tensor kernel, "
            "str border) -> Tensor");
  EXPECT_EQ(schema_string("customconv::trilinear_interpolation_backward"),
            "customconv::trilinear_interpolation_backward(Tensor grad_output, Tensor feats, "
            "Tensor points) -> (Tensor, Tensor)");
  EXPECT_EQ(schema_string("customconv::trilinear_interpolation_with_derivatives"),
            "customconv::trilinear_interpolation_with_derivatives(Tensor feats, Tensor points) "
            "-> (Tensor, Tensor)");
  EXPECT_EQ(schema_string("customconv::trilinear_interpolation_backward_from_derivatives"),
            "customconv::trilinear_interpolation_backward_from_derivatives(Tensor grad_output, "
            "Tensor derivatives, Tensor points) -> (Tensor, Tensor)");
  EXPECT_EQ(schema_string("customconv::trilinear_interpolation_grad_feats"),
            "customconv::trilinear_interpolation_grad_feats(Tensor grad_output, Tensor points) "
            "-> Tensor");
}

TEST(DirectOpRegistrationTest, EveryOpHasCpuAutogradAndMetaKernels) {
  for (const char* name : kDirectOps) {
    SCOPED_TRACE(name);
    const auto op = c10::Dispatcher::singleton().findSchema({name, ""});
    ASSERT_TRUE(op.has_value());
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::CPU));
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::Meta));
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::AutogradCPU) ||
                op->hasKernelForDispatchKey(c10::DispatchKey::Autograd));
    EXPECT_TRUE(op->hasTag(at::Tag::pt2_compliant_tag));
  }
}

TEST(DirectOpRegistrationTest, EveryOpHasACudaKernel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const char* name : kDirectOps) {
    const auto op = c10::Dispatcher::singleton().findSchema({name, ""});
    ASSERT_TRUE(op.has_value()) << name;
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::CUDA)) << name;
  }
}

// ================================================================ depthwise_conv2d

// A depthwise convolution as a ConvConfig: groups == channels, k == c * m.
ConvConfig depthwise(int64_t n, int64_t c, int64_t m, int64_t h, int64_t w, int64_t kh, int64_t kw,
                     std::vector<int64_t> stride, std::vector<int64_t> padding,
                     std::vector<int64_t> dilation, bool bias) {
  ConvConfig config{n, c, h, w, /*k=*/c * m, kh, kw, {}, {}, {}, /*groups=*/c, bias};
  config.stride = std::move(stride);
  config.padding = std::move(padding);
  config.dilation = std::move(dilation);
  return config;
}

// 1x1 to 31x31 and non-square kernels, multipliers 1 to 4, strides larger
// than the kernel, dilations, paddings up to "same", a kernel larger than the
// unpadded input, a 1x1 image, batch 1 and batch 0.
std::vector<ConvConfig> fixed_depthwise_configs() {
  return {
      depthwise(2, 3, 1, 9, 11, 3, 3, {1, 1}, {1, 1}, {1, 1}, true),
      depthwise(2, 4, 2, 10, 7, 3, 2, {2, 1}, {1, 2}, {1, 1}, false),
      depthwise(1, 2, 3, 12, 13, 5, 5, {1, 2}, {2, 1}, {2, 3}, true),
      depthwise(3, 4, 4, 8, 8, 1, 1, {1, 1}, {0, 0}, {1, 1}, true),
      depthwise(2, 3, 1, 40, 37, 31, 31, {1, 1}, {15, 15}, {1, 1}, true),
      depthwise(1, 2, 2, 33, 35, 31, 7, {2, 3}, {0, 3}, {1, 1}, false),
      depthwise(1, 2, 1, 6, 7, 1, 31, {1, 1}, {0, 13}, {1, 1}, true),
      depthwise(2, 2, 2, 3, 3, 5, 5, {1, 1}, {2, 2}, {1, 1}, false),
      depthwise(2, 3, 1, 8, 9, 2, 2, {3, 3}, {0, 0}, {1, 1}, true),
      depthwise(1, 1, 4, 1, 1, 1, 1, {1, 1}, {0, 0}, {1, 1}, true),
      depthwise(1, 4, 3, 20, 20, 7, 7, {2, 2}, {3, 3}, {2, 2}, true),
      depthwise(0, 3, 2, 8, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, true),
      depthwise(0, 2, 1, 6, 6, 3, 1, {2, 1}, {0, 0}, {1, 1}, false),
  };
}

// Random valid depthwise configurations: kernels 1 to 31 along each axis
// (smaller ones more often), multipliers 1 to 4, stride 1 to 3, padding 0 to
// 3, dilation 1 to 3 (1 to 2 for large kernels), batch 0 to 2, bias or not.
std::vector<ConvConfig> random_depthwise_configs(uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto kernel = [&] { return pick(0, 2) == 0 ? pick(1, 31) : pick(1, 5); };
  std::vector<ConvConfig> configs;
  for (int i = 0; i < count; ++i) {
    const int64_t kh = kernel(), kw = kernel();
    std::vector<int64_t> dilation{pick(1, kh > 9 ? 2 : 3), pick(1, kw > 9 ? 2 : 3)};
    std::vector<int64_t> padding{pick(0, 3), pick(0, 3)};
    const int64_t eh = dilation[0] * (kh - 1) + 1, ew = dilation[1] * (kw - 1) + 1;
    const int64_t h = std::max<int64_t>(1, eh - 2 * padding[0]) + pick(0, 8);
    const int64_t w = std::max<int64_t>(1, ew - 2 * padding[1]) + pick(0, 8);
    configs.push_back(depthwise(pick(0, 2), pick(1, 4), pick(1, 4), h, w, kh, kw,
                                {pick(1, 3), pick(1, 3)}, padding, dilation, pick(0, 1) == 1));
  }
  return configs;
}

at::Tensor call_depthwise(const ConvConfig& c, const Args& a) {
  return customconv::depthwise_conv2d(a[0], a[1], optional_bias(a[2]), c.stride, c.padding,
                                      c.dilation);
}

void expect_depthwise_matches(const ConvConfig& c, torch::Device device, const Tolerance& tol,
                              bool backward, const Relayout& relayout = nullptr) {
  SCOPED_TRACE(c.describe());
  const ConvTensors t = make_conv_tensors(c);
  expect_matches_reference(
      {t.input, t.weight, t.bias}, {"input", "weight", "bias"}, device, tol, backward,
      [&](const Args& a) { return call_depthwise(c, a); },
      [&](const Args& a) { return reference_conv2d(c, a[0], a[1], a[2]); }, relayout);
}

class DepthwiseConv2dTest : public OnDevice {};
INSTANTIATE_ON_DEVICES(DepthwiseConv2dTest);

TEST_P(DepthwiseConv2dTest, MatchesGroupedTorchConv2dOnFixedConfigs) {
  for (const auto& c : fixed_depthwise_configs()) {
    expect_depthwise_matches(c, device(), kF64, /*backward=*/true);
  }
}

TEST_P(DepthwiseConv2dTest, MatchesGroupedTorchConv2dOnRandomConfigs) {
  for (const auto& c : random_depthwise_configs(seed_, 40)) {
    expect_depthwise_matches(c, device(), kF64, /*backward=*/true);
  }
}

TEST_P(DepthwiseConv2dTest, MatchesWithinToleranceInReducedPrecision) {
  auto configs = fixed_depthwise_configs();
  for (const auto& c : random_depthwise_configs(seed_, 8)) configs.push_back(c);
  for (const auto& tol : reduced_precisions()) {
    for (const auto& c : configs) expect_depthwise_matches(c, device(), tol, /*backward=*/true);
  }
}

TEST_P(DepthwiseConv2dTest, AcceptsNonContiguousInputWeightAndBias) {
  // Channels-last input, a strided weight, every other bias element; then an
  // input sliced along H and W (storage offset, skipping strides).
  const Relayout strided = [](const at::Tensor& t, size_t i) {
    if (i == 0) return t.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
    return torch::stack({t, torch::zeros_like(t)}, -1).select(-1, 0);
  };
  const Relayout sliced = [](const at::Tensor& t, size_t i) {
    if (i != 0) return t;
    const at::Tensor big =
        torch::zeros({t.size(0), t.size(1), 2 * t.size(2), t.size(3) + 3}, t.options());
    at::Tensor view = big.slice(2, 0, 2 * t.size(2), 2).slice(3, 3);
    view.copy_(t);
    return view;
  };
  {
    const at::Tensor probe = strided(torch::zeros({2, 3, 4, 5}, options()), 0);
    EXPECT_FALSE(probe.is_contiguous());
    EXPECT_FALSE(strided(torch::zeros({6, 1, 3, 3}, options()), 1).is_contiguous());
    EXPECT_FALSE(strided(torch::zeros({6}, options()), 2).is_contiguous());
    EXPECT_FALSE(sliced(torch::zeros({2, 3, 4, 5}, options()), 0).is_contiguous());
  }
  for (const auto& c : {depthwise(2, 3, 2, 9, 8, 3, 5, {2, 1}, {1, 2}, {1, 2}, true),
                        depthwise(1, 4, 1, 12, 10, 7, 7, {1, 1}, {3, 3}, {1, 1}, true)}) {
    expect_depthwise_matches(c, device(), kF64, true, strided);
    expect_depthwise_matches(c, device(), kF64, true, sliced);
  }
}

TEST_P(DepthwiseConv2dTest, AcceptsUnbatchedInput) {
  const ConvConfig c = depthwise(1, 3, 2, 9, 8, 3, 3, {1, 2}, {1, 0}, {1, 1}, true);
  SCOPED_TRACE(c.describe());
  const ConvTensors t = make_conv_tensors(c);
  expect_matches_reference(
      {t.input[0], t.weight, t.bias}, {"input", "weight", "bias"}, device(), kF64, true,
      [&](const Args& a) {
        const at::Tensor out = call_depthwise(c, a);
        EXPECT_EQ(out.dim(), 3);
        return out;
      },
      [&](const Args& a) { return reference_conv2d(c, a[0], a[1], a[2]); });
}

TEST_P(DepthwiseConv2dTest, DefaultsAndSingleValuesMeanBothAxes) {
  const at::Tensor x = torch::randn({2, 3, 9, 10}, torch::kDouble);
  const at::Tensor w = torch::randn({6, 1, 3, 3}, torch::kDouble);
  const at::Tensor xd = x.to(device()), wd = w.to(device());
  EXPECT_TRUE(close_to(customconv::depthwise_conv2d(xd, wd),
                       torch::conv2d(x, w, {}, 1, c10::IntArrayRef(0), 1, 3), kF64));
  EXPECT_TRUE(close_to(customconv::depthwise_conv2d(xd, wd, std::nullopt, 2, 1, 2),
                       torch::conv2d(x, w, {}, {2, 2}, {1, 1}, {2, 2}, 3), kF64));
}

TEST_P(DepthwiseConv2dTest, BackwardOpsComputeTheGradientsOfGroupedTorchConv2d) {
  for (const auto& c : {depthwise(2, 3, 2, 9, 8, 3, 5, {2, 1}, {1, 2}, {1, 2}, true),
                        depthwise(1, 2, 3, 11, 12, 9, 9, {1, 1}, {4, 4}, {1, 1}, true),
                        depthwise(0, 2, 1, 6, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, true)}) {
    SCOPED_TRACE(c.describe());
    const ConvTensors t = make_conv_tensors(c);
    const at::Tensor rx = t.input.clone().requires_grad_(), rw = t.weight.clone().requires_grad_(),
                     rb = t.bias.clone().requires_grad_();
    const at::Tensor ref = reference_conv2d(c, rx, rw, rb);
    const at::Tensor go = torch::randn(ref.sizes(), torch::kDouble);
    const auto rg = grad({ref}, {rx, rw, rb}, {go});
    const at::Tensor x = t.input.to(device()), w = t.weight.to(device()), g = go.to(device());
    EXPECT_TRUE(close_to(
        customconv::detail::depthwise_conv2d_grad_input(g, x, w, c.stride, c.padding, c.dilation),
        rg[0], kF64))
        << "grad input";
    EXPECT_TRUE(close_to(
        customconv::detail::depthwise_conv2d_grad_weight(g, x, w, c.stride, c.padding, c.dilation),
        rg[1], kF64))
        << "grad weight";
    EXPECT_TRUE(close_to(customconv::detail::conv2d_grad_bias(g), rg[2], kF64)) << "grad bias";
    const auto [gw, gb] = customconv::detail::depthwise_conv2d_grad_weight_bias(
        g, x, w, c.stride, c.padding, c.dilation);
    EXPECT_TRUE(close_to(gw, rg[1], kF64)) << "grad weight (with bias)";
    EXPECT_TRUE(close_to(gb, rg[2], kF64)) << "grad bias (with weight)";
  }
}

TEST_P(DepthwiseConv2dTest, TensorBackwardFillsGradOfEveryLeaf) {
  const ConvConfig c = depthwise(3, 4, 2, 8, 9, 3, 2, {1, 2}, {1, 1}, {2, 1}, true);
  const ConvTensors t = make_conv_tensors(c);
  const at::Tensor x = leaf_on(t.input, device()), w = leaf_on(t.weight, device()),
                   b = leaf_on(t.bias, device());
  // sum() hands the backward an expanded (stride 0) grad_output.
  customconv::depthwise_conv2d(x, w, b, c.stride, c.padding, c.dilation).sum().backward();
  const at::Tensor rx = leaf_on(t.input, kCpu), rw = leaf_on(t.weight, kCpu),
                   rb = leaf_on(t.bias, kCpu);
  reference_conv2d(c, rx, rw, rb).sum().backward();
  EXPECT_TRUE(close_to(x.grad(), rx.grad(), kF64)) << "input";
  EXPECT_TRUE(close_to(w.grad(), rw.grad(), kF64)) << "weight";
  EXPECT_TRUE(close_to(b.grad(), rb.grad(), kF64)) << "bias";
}

TEST_P(DepthwiseConv2dTest, GradientsAreBitwiseIdenticalAcrossRuns) {
  // Many output positions per weight tap: the weight gradient is a long reduction.
  const ConvConfig c = depthwise(4, 8, 2, 64, 64, 5, 5, {1, 1}, {2, 2}, {1, 1}, true);
  const ConvTensors t = make_conv_tensors(c);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    expect_gradients_reproducible({t.input, t.weight, t.bias}, device(), dtype,
                                  [&](const Args& a) { return call_depthwise(c, a); });
  }
}

TEST_P(DepthwiseConv2dTest, DoubleBackwardIsRefusedWithAClearError) {
  const at::Tensor x = torch::randn({2, 3, 6, 6}, options(at::kDouble)).requires_grad_();
  const at::Tensor w = torch::randn({6, 1, 3, 3}, options(at::kDouble)).requires_grad_();
  const at::Tensor out = customconv::depthwise_conv2d(x, w);
  const at::Tensor go = torch::randn(out.sizes(), options(at::kDouble));
  const at::Tensor gx = grad({out}, {x}, {go}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  EXPECT_C10_ERROR_MENTIONING(grad({gx.pow(2).sum()}, {w}, {}, /*retain_graph=*/true),
                              "double backward");
  const at::Tensor gw = grad({out}, {w}, {go}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  EXPECT_C10_ERROR_MENTIONING(grad({gw.pow(2).sum()}, {x}, {}, /*retain_graph=*/true),
                              "double backward");
}

// ---------------------------------------------------------------- depthwise_conv2d errors

class DepthwiseConv2dErrorTest : public OnDevice {
 protected:
  void SetUp() override {
    OnDevice::SetUp();
    if (IsSkipped()) return;
    x = torch::randn({2, 4, 8, 8}, options());
    w = torch::randn({8, 1, 3, 3}, options());  // multiplier 2
    b = torch::randn({8}, options());
  }
  at::Tensor x, w, b;
};
INSTANTIATE_ON_DEVICES(DepthwiseConv2dErrorTest);

TEST_P(DepthwiseConv2dErrorTest, ValidArgumentsOfTheFixtureWork) {
  EXPECT_TRUE(close_to(customconv::depthwise_conv2d(x, w, b, 1, 1, 1),
                       torch::conv2d(x.cpu().to(at::kDouble), w.cpu().to(at::kDouble),
                                     b.cpu().to(at::kDouble), {1, 1}, {1, 1}, {1, 1}, 4),
                       kF32));
}

TEST_P(DepthwiseConv2dErrorTest, RejectsInputAndWeightOfWrongDims) {
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x[0][0], w, b), "input");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x.unsqueeze(0), w, b), "input");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w[0], b), "weight");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w.unsqueeze(0), b), "weight");
}

TEST_P(DepthwiseConv2dErrorTest, RejectsWeightWithMoreThanOneChannelPerGroup) {
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x, torch::randn({8, 2, 3, 3}, options()), b),
      "weight must be (C*m, 1, kh, kw)");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x, torch::randn({8, 4, 3, 3}, options()), b),
      "weight must be (C*m, 1, kh, kw)");
}

TEST_P(DepthwiseConv2dErrorTest, RejectsWeightCountThatIsNotAPositiveMultipleOfChannels) {
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x, torch::randn({6, 1, 3, 3}, options()), std::nullopt),
      "weight.size(0)");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x, torch::randn({2, 1, 3, 3}, options()), std::nullopt),
      "multiple of the input channels");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x, torch::randn({0, 1, 3, 3}, options()), std::nullopt),
      "weight.size(0)");
}

TEST_P(DepthwiseConv2dErrorTest, RejectsInputWithoutChannels) {
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(torch::randn({2, 0, 8, 8}, options()), w, std::nullopt),
      "input must have at least one channel");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(torch::randn({0, 8, 8}, options()), w, std::nullopt),
      "input must have at least one channel");
}

TEST_P(DepthwiseConv2dErrorTest, RejectsEmptyKernel) {
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x, torch::randn({8, 1, 0, 3}, options()), b), "kernel_size");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x, torch::randn({8, 1, 3, 0}, options()), b), "kernel_size");
}

TEST_P(DepthwiseConv2dErrorTest, RejectsBadStridePaddingAndDilation) {
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, 0), "stride");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, {1, -1}), "stride");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, 1, -1), "padding");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, 1, {0, -2}), "padding");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, 1, 0, 0), "dilation");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, 1, 0, {1, -1}), "dilation");
}

TEST_P(DepthwiseConv2dErrorTest, RejectsArgumentListsOfWrongLength) {
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, {1, 1, 1}), "stride");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, 1, std::vector<int64_t>{}),
                              "padding");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, 1, 0, {1, 1, 1}), "dilation");
}

TEST_P(DepthwiseConv2dErrorTest, RejectsKernelLargerThanPaddedInput) {
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x, torch::randn({8, 1, 9, 3}, options()), b), "output size");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x, torch::randn({8, 1, 3, 11}, options()), b, 1, 1),
      "output size");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, 1, 0, {4, 1}), "output size");
}

TEST_P(DepthwiseConv2dErrorTest, RejectsHugeDilationAndPaddingWithoutOverflow) {
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, 1, 0, {int64_t{1} << 40, 1}),
                              "dilat");
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2 + 1;
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b, 1, 0, {1, huge}), "dilation");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x, w, b, 1, {std::numeric_limits<int64_t>::max() / 2, 0}),
      "padding");
}

TEST_P(DepthwiseConv2dErrorTest, RejectsOutputWhoseElementCountOverflows) {
  // A broadcast view: 2^60 elements without storage; the output would have
  // 2^20 * 2^10 * 2^20 * 2^20 = 2^70.
  const int64_t big = int64_t{1} << 20;
  const at::Tensor huge = torch::zeros({1, 1, 1, 1}, options()).expand({big, 1, big, big});
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(huge, torch::randn({1024, 1, 1, 1}, options())),
      "output size overflows");
}

TEST_P(DepthwiseConv2dErrorTest, RejectsBadBias) {
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, torch::randn({4}, options())),
                              "bias");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, torch::randn({8, 1}, options())),
                              "bias");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w, b.to(at::kDouble)), "bias");
}

TEST_P(DepthwiseConv2dErrorTest, RejectsMixedAndIntegerDtypes) {
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w.to(at::kDouble), b), "weight");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, w.to(at::kDouble), b), "dtype");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x.to(at::kInt), w.to(at::kInt), std::nullopt),
      "input must be float32");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(x.to(at::kLong), w.to(at::kLong), b.to(at::kLong)), "input");
}

TEST_P(DepthwiseConv2dErrorTest, ErrorsAreTheSameWhenInputsRequireGrad) {
  const at::Tensor xg = x.clone().requires_grad_(), wg = w.clone().requires_grad_();
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(xg, wg, b, 0), "stride");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::depthwise_conv2d(xg, torch::randn({6, 1, 3, 3}, options()).requires_grad_()),
      "weight.size(0)");
}

TEST_P(DepthwiseConv2dErrorTest, BackwardOpsRejectBadGradOutput) {
  using customconv::detail::depthwise_conv2d_grad_input;
  using customconv::detail::depthwise_conv2d_grad_weight;
  // The output is (2, 8, 6, 6).
  for (const at::Tensor& bad :
       {torch::randn({2, 8, 6, 5}, options()), torch::randn({2, 4, 6, 6}, options()),
        torch::randn({3, 8, 6, 6}, options()), torch::randn({8, 6, 6}, options()),
        torch::randn({2, 8, 6, 6}, options(at::kDouble))}) {
    SCOPED_TRACE(bad.sizes());
    EXPECT_C10_ERROR_MENTIONING(depthwise_conv2d_grad_input(bad, x, w, {1, 1}, {0, 0}, {1, 1}),
                                "grad_output");
    EXPECT_C10_ERROR_MENTIONING(depthwise_conv2d_grad_weight(bad, x, w, {1, 1}, {0, 0}, {1, 1}),
                                "grad_output");
  }
  // The forward's checks apply too.
  const at::Tensor go = torch::randn({2, 8, 6, 6}, options());
  EXPECT_C10_ERROR_MENTIONING(
      depthwise_conv2d_grad_weight(go, x, torch::randn({6, 1, 3, 3}, options()), {1, 1}, {0, 0},
                                   {1, 1}),
      "weight.size(0)");
  EXPECT_C10_ERROR_MENTIONING(depthwise_conv2d_grad_input(go, x, w, {0, 1}, {0, 0}, {1, 1}),
                              "stride");
  EXPECT_C10_ERROR_MENTIONING(customconv::detail::conv2d_grad_bias(go[0][0][0]), "grad_output");
}

TEST_P(DepthwiseConv2dErrorTest, NextValidCallWorksAfterAnError) {
  const at::Tensor expected = torch::conv2d(x.cpu().to(at::kDouble), w.cpu().to(at::kDouble),
                                            b.cpu().to(at::kDouble), {2, 1}, {1, 1}, {1, 2}, 4);
  auto valid_call = [&] { return customconv::depthwise_conv2d(x, w, b, {2, 1}, 1, {1, 2}); };
  EXPECT_THROW(customconv::depthwise_conv2d(x, w, b, 0), c10::Error);
  EXPECT_TRUE(close_to(valid_call(), expected, kF32)) << "after stride 0";
  EXPECT_THROW(customconv::depthwise_conv2d(x, torch::randn({6, 1, 3, 3}, options()), b),
               c10::Error);
  EXPECT_THROW(customconv::depthwise_conv2d(x, w, b, 1, 0, {int64_t{1} << 40, 1}), c10::Error);
  EXPECT_THROW(customconv::detail::depthwise_conv2d_grad_input(x, x, w, {1, 1}, {0, 0}, {1, 1}),
               c10::Error);
  synchronize();
  EXPECT_TRUE(close_to(valid_call(), expected, kF32)) << "after several errors";
  // Backward still works too.
  const at::Tensor xg = x.clone().requires_grad_();
  EXPECT_THROW(customconv::depthwise_conv2d(xg, w, b, 1, -1), c10::Error);
  const at::Tensor out = customconv::depthwise_conv2d(xg, w, b, {2, 1}, 1, {1, 2});
  const at::Tensor go = torch::randn(out.sizes(), options());
  const at::Tensor rx = x.cpu().to(at::kDouble).requires_grad_();
  const at::Tensor ref = torch::conv2d(rx, w.cpu().to(at::kDouble), b.cpu().to(at::kDouble), {2, 1},
                                       {1, 1}, {1, 2}, 4);
  EXPECT_TRUE(
      close_to(grad({out}, {xg}, {go})[0], grad({ref}, {rx}, {go.cpu().to(at::kDouble)})[0], kF32));
  synchronize();
}

// ================================================================ filter2d

const std::vector<std::string> kBorders{"zeros", "reflect", "replicate", "circular"};

// One filter2d call: input of `shape` (..., H, W), kernel (kh, kw), border.
struct Filter2dConfig {
  std::vector<int64_t> shape;
  int64_t kh, kw;
  std::string border;

  std::string describe() const {
    std::ostringstream s;
    s << "input " << c10::IntArrayRef(shape) << ", kernel (" << kh << ", " << kw << "), border "
      << border;
    return s.str();
  }
};

torch::nn::functional::PadFuncOptions::mode_t pad_mode(const std::string& border) {
  if (border == "reflect") return torch::kReflect;
  if (border == "replicate") return torch::kReplicate;
  if (border == "circular") return torch::kCircular;
  return torch::kConstant;
}

// F::pad of every (H, W) plane by (kw/2, kw/2, kh/2, kh/2) in `border`'s mode,
// then a valid torch::conv2d with the kernel as a (1, 1, kh, kw) weight.
at::Tensor reference_filter2d(const at::Tensor& input, const at::Tensor& kernel,
                              const std::string& border) {
  namespace F = torch::nn::functional;
  // No planes: an empty output that still depends on both arguments.
  if (input.numel() == 0) return input * kernel.sum();
  const int64_t h = input.size(-2), w = input.size(-1);
  const int64_t kh = kernel.size(0), kw = kernel.size(1);
  const at::Tensor planes = input.reshape({-1, 1, h, w});
  const at::Tensor padded =
      F::pad(planes, F::PadFuncOptions({kw / 2, kw / 2, kh / 2, kh / 2}).mode(pad_mode(border)));
  return torch::conv2d(padded, kernel.reshape({1, 1, kh, kw})).reshape(input.sizes());
}

void expect_filter2d_matches(const Filter2dConfig& c, torch::Device device, const Tolerance& tol,
                             bool backward, const Relayout& relayout = nullptr) {
  SCOPED_TRACE(c.describe());
  const at::Tensor input = torch::randn(c.shape, torch::kDouble);
  const at::Tensor kernel = torch::randn({c.kh, c.kw}, torch::kDouble);
  expect_matches_reference(
      {input, kernel}, {"input", "kernel"}, device, tol, backward,
      [&](const Args& a) {
        const at::Tensor out = customconv::filter2d(a[0], a[1], c.border);
        EXPECT_EQ(out.sizes(), a[0].sizes()) << "the output has the input's shape";
        return out;
      },
      [&](const Args& a) { return reference_filter2d(a[0], a[1], c.border); }, relayout);
}

// Random valid filter2d configurations: every border, odd kernel sizes 1 to 31
// along each axis (smaller ones more often, often non-square), planes from the
// smallest the border allows (smaller than the kernel for zeros, replicate and
// circular) to a few samples larger than the kernel, and 0 to 3 leading dims
// (sometimes one of them 0).
std::vector<Filter2dConfig> random_filter2d_configs(uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto odd = [&] { return 2 * (pick(0, 2) == 0 ? pick(0, 15) : pick(0, 3)) + 1; };
  std::vector<Filter2dConfig> configs;
  for (int i = 0; i < count; ++i) {
    Filter2dConfig c;
    c.border = kBorders[pick(0, 3)];
    c.kh = odd();
    c.kw = odd();
    auto plane = [&](int64_t k) {
      const int64_t pad = k / 2;
      const int64_t lo = c.border == "reflect"    ? pad + 1
                         : c.border == "circular" ? std::max<int64_t>(1, pad)
                                                  : 1;
      return lo + pick(0, k + 6);
    };
    const int64_t leading = pick(0, 3);
    const bool empty = leading > 0 && pick(0, 9) == 0;
    for (int64_t d = 0; d < leading; ++d) c.shape.push_back(empty && d == 0 ? 0 : pick(1, 3));
    c.shape.push_back(plane(c.kh));
    c.shape.push_back(plane(c.kw));
    configs.push_back(c);
  }
  return configs;
}

class Filter2dTest : public OnDevice {};
INSTANTIATE_ON_DEVICES(Filter2dTest);

TEST_P(Filter2dTest, MatchesPadThenCorrelateForEveryBorderOnRandomConfigs) {
  for (const auto& c : random_filter2d_configs(seed_, 48)) {
    expect_filter2d_matches(c, device(), kF64, /*backward=*/true);
  }
}

TEST_P(Filter2dTest, KernelsFrom1x1To31x31AndNonSquareMatchForEveryBorder) {
  const std::pair<int64_t, int64_t> kernels[] = {{1, 1}, {1, 3},  {3, 1},  {3, 3},  {5, 5},
                                                 {7, 3}, {1, 31}, {31, 1}, {15, 9}, {31, 31}};
  for (const auto& border : kBorders) {
    for (const auto& [kh, kw] : kernels) {
      expect_filter2d_matches({{2, 37, 41}, kh, kw, border}, device(), kF64, /*backward=*/true);
    }
  }
}

TEST_P(Filter2dTest, AnyLeadingDimsIncludingNoneAndEmptyKeepTheInputShape) {
  const std::vector<std::vector<int64_t>> shapes = {
      {9, 10},       {3, 9, 10}, {2, 3, 9, 10}, {2, 1, 3, 9, 10},
      {1, 1, 9, 10}, {0, 9, 10}, {2, 0, 9, 10}, {3, 0, 2, 9, 10}};
  for (const auto& border : kBorders) {
    for (const auto& shape : shapes) {
      expect_filter2d_matches({shape, 3, 5, border}, device(), kF64, /*backward=*/true);
    }
  }
}

TEST_P(Filter2dTest, PlanesSmallerThanTheKernelWorkWhereTheBorderAllowsIt) {
  const std::vector<Filter2dConfig> configs = {
      // Zeros and replicate accept any plane.
      {{2, 1, 1}, 7, 7, "zeros"},
      {{2, 2, 3}, 9, 5, "zeros"},
      {{3, 4}, 31, 31, "zeros"},
      {{2, 1, 1}, 7, 7, "replicate"},
      {{2, 2, 3}, 9, 5, "replicate"},
      {{3, 4}, 31, 31, "replicate"},
      // Circular needs padding <= plane size.
      {{2, 3, 3}, 7, 7, "circular"},
      {{1, 1, 1}, 3, 3, "circular"},
      {{2, 4, 15}, 9, 31, "circular"},
      // Reflect needs padding < plane size.
      {{2, 4, 4}, 7, 7, "reflect"},
      {{2, 2, 2}, 3, 3, "reflect"},
      {{2, 1, 5}, 1, 9, "reflect"},
      {{16, 16}, 31, 31, "reflect"},
  };
  for (const auto& c : configs) expect_filter2d_matches(c, device(), kF64, /*backward=*/true);
}

TEST_P(Filter2dTest, LargeKernelsAndTallOrManyPlanesMatch) {
  // Kernels past the shared-memory tile of the CUDA forward, a plane taller
  // than one grid dimension of tiles covers, more planes than one grid
  // dimension holds, and enough samples for a multi-block kernel gradient.
  expect_filter2d_matches({{2, 80, 90}, 45, 45, "zeros"}, device(), kF64, true);
  expect_filter2d_matches({{1, 90, 80}, 71, 71, "reflect"}, device(), kF32, true);
  expect_filter2d_matches({{(int64_t{65535} * 16) + 1, 3}, 3, 3, "replicate"}, device(), kF64,
                          true);
  expect_filter2d_matches({{70001, 3, 3}, 3, 3, "circular"}, device(), kF64, true);
  expect_filter2d_matches({{5, 300, 301}, 5, 3, "reflect"}, device(), kF64, true);
}

TEST_P(Filter2dTest, DefaultBorderIsZeros) {
  const at::Tensor x = torch::randn({2, 7, 9}, torch::kDouble);
  const at::Tensor k = torch::randn({3, 5}, torch::kDouble);
  EXPECT_TRUE(close_to(customconv::filter2d(x.to(device()), k.to(device())),
                       reference_filter2d(x, k, "zeros"), kF64));
}

TEST_P(Filter2dTest, MatchesWithinToleranceInReducedPrecision) {
  std::vector<Filter2dConfig> configs;
  for (const auto& border : kBorders) {
    configs.push_back({{2, 3, 20, 37}, 3, 3, border});
    configs.push_back({{40, 33}, 31, 31, border});
    configs.push_back({{3, 17, 45}, 9, 1, border});
  }
  for (const auto& c : random_filter2d_configs(seed_, 8)) configs.push_back(c);
  for (const auto& tol : reduced_precisions()) {
    for (const auto& c : configs) expect_filter2d_matches(c, device(), tol, /*backward=*/true);
  }
}

TEST_P(Filter2dTest, AcceptsNonContiguousInputAndKernel) {
  // Column-major planes and kernel; then every other column of a wider input
  // and a kernel with a storage offset.
  const Relayout transposed = [](const at::Tensor& t, size_t) {
    return t.transpose(-1, -2).contiguous().transpose(-1, -2);
  };
  const Relayout sliced = [](const at::Tensor& t, size_t i) {
    if (i == 0) {
      const at::Tensor interleaved = torch::stack({t, torch::zeros_like(t)}, -1).flatten(-2);
      return interleaved.slice(-1, 0, c10::nullopt, 2);
    }
    return torch::cat({torch::zeros_like(t), t}, 0).slice(0, t.size(0));
  };
  EXPECT_FALSE(transposed(torch::zeros({2, 5, 6}, options()), 0).is_contiguous());
  EXPECT_FALSE(transposed(torch::zeros({3, 5}, options()), 1).is_contiguous());
  EXPECT_FALSE(sliced(torch::zeros({2, 5, 6}, options()), 0).is_contiguous());
  for (const auto& border : kBorders) {
    for (const auto& c :
         {Filter2dConfig{{2, 3, 11, 13}, 3, 5, border}, Filter2dConfig{{12, 14}, 7, 3, border}}) {
      expect_filter2d_matches(c, device(), kF64, true, transposed);
      expect_filter2d_matches(c, device(), kF64, true, sliced);
    }
  }
}

TEST_P(Filter2dTest, BackwardOpsComputeTheGradientsOfPadThenCorrelate) {
  for (const auto& border : kBorders) {
    for (const auto& c :
         {Filter2dConfig{{2, 3, 11, 13}, 5, 3, border}, Filter2dConfig{{4, 4}, 7, 7, border}}) {
      SCOPED_TRACE(c.describe());
      const at::Tensor x = torch::randn(c.shape, torch::kDouble).requires_grad_();
      const at::Tensor k = torch::randn({c.kh, c.kw}, torch::kDouble).requires_grad_();
      const at::Tensor ref = reference_filter2d(x, k, border);
      const at::Tensor go = torch::randn(ref.sizes(), torch::kDouble);
      const auto rg = grad({ref}, {x, k}, {go});
      const at::Tensor g = go.to(device()), kd = k.detach().to(device());
      EXPECT_TRUE(close_to(customconv::detail::filter2d_grad_input(g, kd, border), rg[0], kF64))
          << "grad input";
      EXPECT_TRUE(
          close_to(customconv::detail::filter2d_grad_kernel(g, x.detach().to(device()), kd, border),
                   rg[1], kF64))
          << "grad kernel";
    }
  }
}

TEST_P(Filter2dTest, TensorBackwardFillsGradOfEveryLeaf) {
  for (const auto& border : kBorders) {
    SCOPED_TRACE(border);
    const at::Tensor x0 = torch::randn({2, 3, 9, 8}, torch::kDouble);
    const at::Tensor k0 = torch::randn({5, 3}, torch::kDouble);
    const at::Tensor x = leaf_on(x0, device()), k = leaf_on(k0, device());
    // sum() hands the backward an expanded (stride 0) grad_output.
    customconv::filter2d(x, k, border).sum().backward();
    const at::Tensor rx = leaf_on(x0, kCpu), rk = leaf_on(k0, kCpu);
    reference_filter2d(rx, rk, border).sum().backward();
    EXPECT_TRUE(close_to(x.grad(), rx.grad(), kF64)) << "input";
    EXPECT_TRUE(close_to(k.grad(), rk.grad(), kF64)) << "kernel";
  }
}

TEST_P(Filter2dTest, GradientsAreBitwiseIdenticalAcrossRuns) {
  // 4 x 300 x 300 samples: the kernel gradient is split into several partial sums.
  const at::Tensor x = torch::randn({4, 300, 300}, torch::kDouble);
  const at::Tensor k = torch::randn({7, 5}, torch::kDouble);
  for (const auto& border : kBorders) {
    SCOPED_TRACE(border);
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      expect_gradients_reproducible({x, k}, device(), dtype, [&](const Args& a) {
        return customconv::filter2d(a[0], a[1], border);
      });
    }
  }
}

TEST_P(Filter2dTest, DoubleBackwardIsRefusedWithAClearError) {
  const at::Tensor x = torch::randn({2, 6, 7}, options(at::kDouble)).requires_grad_();
  const at::Tensor k = torch::randn({3, 3}, options(at::kDouble)).requires_grad_();
  const at::Tensor out = customconv::filter2d(x, k, "reflect");
  const at::Tensor go = torch::randn(out.sizes(), options(at::kDouble));
  const at::Tensor gx = grad({out}, {x}, {go}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  EXPECT_C10_ERROR_MENTIONING(grad({gx.pow(2).sum()}, {k}, {}, /*retain_graph=*/true),
                              "double backward");
  const at::Tensor gk = grad({out}, {k}, {go}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  EXPECT_C10_ERROR_MENTIONING(grad({gk.pow(2).sum()}, {x}, {}, /*retain_graph=*/true),
                              "double backward");
}

// ---------------------------------------------------------------- filter2d errors

class Filter2dErrorTest : public OnDevice {
 protected:
  void SetUp() override {
    OnDevice::SetUp();
    if (IsSkipped()) return;
    x = torch::randn({2, 3, 8, 9}, options());
    k = torch::randn({3, 5}, options());
  }
  at::Tensor x, k;
};
INSTANTIATE_ON_DEVICES(Filter2dErrorTest);

TEST_P(Filter2dErrorTest, ValidArgumentsOfTheFixtureWork) {
  for (const auto& border : kBorders) {
    EXPECT_TRUE(close_to(
        customconv::filter2d(x, k, border),
        reference_filter2d(x.cpu().to(at::kDouble), k.cpu().to(at::kDouble), border), kF32))
        << border;
  }
}

TEST_P(Filter2dErrorTest, RejectsInputWithFewerThanTwoDims) {
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x[0][0][0], k),
                              "input must have at least 2 dims");
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x[0][0][0][0], k), "input");
}

TEST_P(Filter2dErrorTest, RejectsKernelThatIsNot2d) {
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x, k[0]), "kernel");
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x, k.unsqueeze(0)), "kernel");
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x, k.reshape({1, 1, 3, 5})), "kernel");
}

TEST_P(Filter2dErrorTest, RejectsEvenOrEmptyKernelSizes) {
  const std::vector<std::vector<int64_t>> sizes = {{2, 3}, {3, 4}, {4, 4}, {0, 3}, {3, 0}};
  for (const auto& size : sizes) {
    EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x, torch::randn(size, options())),
                                "kernel sizes must be odd");
  }
}

TEST_P(Filter2dErrorTest, RejectsUnknownBorderListingTheValidOnes) {
  for (const char* border : {"reflection", "Zeros", "constant", "", "wrap"}) {
    SCOPED_TRACE(border);
    EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x, k, border),
                                R"("zeros", "reflect", "replicate", "circular")");
    EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x, k, border),
                                std::string("\"") + border + "\"");
  }
}

TEST_P(Filter2dErrorTest, RejectsReflectPaddingNotSmallerThanThePlane) {
  // Padding 3 along H: planes of height 3 are refused, height 4 works.
  const at::Tensor k7 = torch::randn({7, 1}, options());
  EXPECT_C10_ERROR_MENTIONING(
      customconv::filter2d(torch::randn({2, 3, 10}, options()), k7, "reflect"), "reflect");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::filter2d(torch::randn({2, 10, 2}, options()), k7.t(), "reflect"), "reflect");
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(torch::randn({1, 1}, options()),
                                                   torch::randn({3, 3}, options()), "reflect"),
                              "smaller than the plane");
  const at::Tensor x4 = torch::randn({2, 4, 10}, options());
  EXPECT_TRUE(close_to(
      customconv::filter2d(x4, k7, "reflect"),
      reference_filter2d(x4.cpu().to(at::kDouble), k7.cpu().to(at::kDouble), "reflect"), kF32));
}

TEST_P(Filter2dErrorTest, RejectsCircularPaddingLargerThanThePlane) {
  // Padding 3 along W: planes of width 2 are refused, width 3 works.
  const at::Tensor k7 = torch::randn({1, 7}, options());
  EXPECT_C10_ERROR_MENTIONING(
      customconv::filter2d(torch::randn({2, 10, 2}, options()), k7, "circular"), "circular");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::filter2d(torch::randn({2, 2, 10}, options()), k7.t(), "circular"),
      "at most the plane size");
  const at::Tensor x3 = torch::randn({2, 10, 3}, options());
  EXPECT_TRUE(close_to(
      customconv::filter2d(x3, k7, "circular"),
      reference_filter2d(x3.cpu().to(at::kDouble), k7.cpu().to(at::kDouble), "circular"), kF32));
}

TEST_P(Filter2dErrorTest, RejectsMixedAndIntegerDtypes) {
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x, k.to(at::kDouble)), "kernel");
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x, k.to(at::kDouble)), "dtype");
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x.to(at::kInt), k.to(at::kInt)),
                              "input must be float32");
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x.to(at::kLong), k.to(at::kLong)), "input");
}

TEST_P(Filter2dErrorTest, ErrorsAreTheSameWhenInputsRequireGrad) {
  const at::Tensor xg = x.clone().requires_grad_(), kg = k.clone().requires_grad_();
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(xg, kg, "mirror"), "border");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::filter2d(xg, torch::randn({2, 2}, options()).requires_grad_()), "odd");
}

TEST_P(Filter2dErrorTest, BackwardOpsRejectBadGradOutput) {
  using customconv::detail::filter2d_grad_input;
  using customconv::detail::filter2d_grad_kernel;
  for (const at::Tensor& bad :
       {torch::randn({2, 3, 8, 8}, options()), torch::randn({3, 8, 9}, options()),
        torch::randn({2, 3, 8, 9}, options(at::kDouble))}) {
    SCOPED_TRACE(bad.sizes());
    EXPECT_C10_ERROR_MENTIONING(filter2d_grad_kernel(bad, x, k, "zeros"), "grad_output");
  }
  const at::Tensor go = torch::randn({2, 3, 8, 9}, options());
  EXPECT_C10_ERROR_MENTIONING(filter2d_grad_kernel(go, x, k, "mirror"), "border");
  EXPECT_C10_ERROR_MENTIONING(filter2d_grad_kernel(go, x, k[0], "zeros"), "kernel");
  EXPECT_C10_ERROR_MENTIONING(filter2d_grad_input(go, k, "mirror"), "border");
  EXPECT_C10_ERROR_MENTIONING(filter2d_grad_input(go, torch::randn({2, 3}, options()), "zeros"),
                              "odd");
  EXPECT_C10_ERROR_MENTIONING(filter2d_grad_input(go, k.to(at::kDouble), "zeros"), "kernel");
}

TEST_P(Filter2dErrorTest, GradInputOpNamesGradOutputWhenItIsAtFault) {
  using customconv::detail::filter2d_grad_input;
  const at::Tensor go = torch::randn({2, 3, 8, 9}, options());
  EXPECT_C10_ERROR_MENTIONING(filter2d_grad_input(go[0][0][0], k, "zeros"), "grad_output");
  EXPECT_C10_ERROR_MENTIONING(filter2d_grad_input(go.to(at::kDouble), k, "zeros"), "grad_output");
  EXPECT_C10_ERROR_MENTIONING(filter2d_grad_input(go.slice(-2, 0, 2), k.reshape({5, 3}), "reflect"),
                              "grad_output");
}

TEST_P(Filter2dErrorTest, NextValidCallWorksAfterAnError) {
  const at::Tensor expected =
      reference_filter2d(x.cpu().to(at::kDouble), k.cpu().to(at::kDouble), "reflect");
  auto valid_call = [&] { return customconv::filter2d(x, k, "reflect"); };
  EXPECT_THROW(customconv::filter2d(x, k, "mirror"), c10::Error);
  EXPECT_TRUE(close_to(valid_call(), expected, kF32)) << "after an unknown border";
  EXPECT_THROW(customconv::filter2d(x, torch::randn({4, 3}, options())), c10::Error);
  EXPECT_THROW(customconv::filter2d(torch::randn({2, 2, 2}, options()), k, "reflect"), c10::Error);
  EXPECT_THROW(customconv::detail::filter2d_grad_kernel(x[0], x, k, "zeros"), c10::Error);
  synchronize();
  EXPECT_TRUE(close_to(valid_call(), expected, kF32)) << "after several errors";
  const at::Tensor kg = k.clone().requires_grad_();
  EXPECT_THROW(customconv::filter2d(x, kg, "wrap"), c10::Error);
  const at::Tensor out = customconv::filter2d(x, kg, "reflect");
  const at::Tensor go = torch::randn(out.sizes(), options());
  const at::Tensor rk = k.cpu().to(at::kDouble).requires_grad_();
  EXPECT_TRUE(close_to(grad({out}, {kg}, {go})[0],
                       grad({reference_filter2d(x.cpu().to(at::kDouble), rk, "reflect")}, {rk},
                            {go.cpu().to(at::kDouble)})[0],
                       kF32));
  synchronize();
}

// ================================================================ trilinear_interpolation

// out[n] = sum_c weight[n][c] * feats[n][c] with, for c = 4i + 2j + k and
// (u, v, w) = (points + 1) / 2, weight = (i ? u : 1-u)(j ? v : 1-v)(k ? w : 1-w).
at::Tensor reference_trilinear(const at::Tensor& feats, const at::Tensor& points) {
  const int64_t n = points.size(0);
  const at::Tensor uvw = (points + 1) / 2;
  auto pair = [&](int64_t a) {  // (N, 2): the weights of index 0 and of index 1 along axis a
    const at::Tensor t = uvw.select(1, a);
    return torch::stack({1 - t, t}, 1);
  };
  const at::Tensor weight =
      (pair(0).view({n, 2, 1, 1}) * pair(1).view({n, 1, 2, 1}) * pair(2).view({n, 1, 1, 2}))
          .reshape({n, 8});
  return (weight.unsqueeze(2) * feats).sum(1);
}

// Points: half inside the cube [-1, 1]^3, half in [-3, 3]^3 (mostly outside).
at::Tensor random_points(int64_t n) {
  const at::Tensor inside = torch::rand({n, 3}, torch::kDouble) * 2 - 1;
  const at::Tensor wide = torch::rand({n, 3}, torch::kDouble) * 6 - 3;
  const at::Tensor pick_inside = torch::rand({n, 1}, torch::kDouble) < 0.5;
  return torch::where(pick_inside, inside, wide);
}

void expect_trilinear_matches(int64_t n, int64_t f, torch::Device device, const Tolerance& tol,
                              bool backward, const Relayout& relayout = nullptr) {
  SCOPED_TRACE("N " + std::to_string(n) + ", F " + std::to_string(f));
  expect_matches_reference(
      {torch::randn({n, 8, f}, torch::kDouble), random_points(n)}, {"feats", "points"}, device, tol,
      backward, [&](const Args& a) { return customconv::trilinear_interpolation(a[0], a[1]); },
      [&](const Args& a) { return reference_trilinear(a[0], a[1]); }, relayout);
}

class TrilinearInterpolationTest : public OnDevice {};
INSTANTIATE_ON_DEVICES(TrilinearInterpolationTest);

TEST_P(TrilinearInterpolationTest, MatchesCornerFormulaFromNoPointsToThousandsAndWideFeatures) {
  const std::pair<int64_t, int64_t> sizes[] = {
      {0, 5},     {0, 1},    {1, 1},     {1, 2048}, {2, 3},    {7, 2048},  {33, 2047},
      {100, 513}, {257, 31}, {1000, 33}, {3000, 1}, {4099, 3}, {2500, 64}, {31, 32}};
  for (const auto& [n, f] : sizes) expect_trilinear_matches(n, f, device(), kF64, true);
}

TEST_P(TrilinearInterpolationTest, MatchesCornerFormulaOnRandomSizes) {
  std::mt19937_64 rng(seed_);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int i = 0; i < 25; ++i) {
    // F from 1 to 2048 (odd sizes included), N up to a few thousand, at most
    // about 200k output elements per call.
    const int64_t f = pick(0, 2) == 0 ? pick(1, 2048) : pick(1, 70);
    const int64_t n = pick(0, std::min<int64_t>(3000, 200000 / f));
    expect_trilinear_matches(n, f, device(), kF64, true);
  }
}

TEST_P(TrilinearInterpolationTest, CubeCornersSelectTheirFeatureRowAndCenterAverages) {
  // Corner c = 4i + 2j + k sits at (2i - 1, 2j - 1, 2k - 1); there the output
  // is exactly feats[:, c, :] in every dtype.
  std::vector<float> corner_points;
  for (int c = 0; c < 8; ++c) {
    corner_points.insert(corner_points.end(), {float(2 * (c / 4) - 1), float(2 * (c / 2 % 2) - 1),
                                               float(2 * (c % 2) - 1)});
  }
  const at::Tensor corners = torch::tensor(corner_points).reshape({8, 3});
  const at::Tensor feats = torch::randn({8, 8, 37}, torch::kDouble);
  for (const auto& tol : {kF64, kF32, kBF16}) {
    SCOPED_TRACE(c10::toString(tol.dtype));
    const at::Tensor fd = feats.to(device(), tol.dtype);
    const at::Tensor out = customconv::trilinear_interpolation(fd, corners.to(device(), tol.dtype));
    for (int c = 0; c < 8; ++c) {
      EXPECT_TRUE(at::equal(out[c], fd[c][c])) << "corner " << c;
    }
    const at::Tensor center =
        customconv::trilinear_interpolation(fd, torch::zeros({8, 3}, options(tol.dtype)));
    EXPECT_TRUE(close_to(center, fd.to(at::kDouble).mean(1), tol)) << "center";
  }
}

TEST_P(TrilinearInterpolationTest, ExtrapolatesOutsideTheCubeWithTheSameFormula) {
  const int64_t n = 500, f = 19;
  const at::Tensor sign = torch::randint(0, 2, {n, 3}, torch::kDouble) * 2 - 1;
  const at::Tensor points = sign * (1 + torch::rand({n, 3}, torch::kDouble) * 3);  // 1 < |p| <= 4
  expect_matches_reference(
      {torch::randn({n, 8, f}, torch::kDouble), points}, {"feats", "points"}, device(), kF64, true,
      [](const Args& a) { return customconv::trilinear_interpolation(a[0], a[1]); },
      [](const Args& a) { return reference_trilinear(a[0], a[1]); });
}

TEST_P(TrilinearInterpolationTest, MatchesWithinToleranceInReducedPrecision) {
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1},     {5, 2048}, {33, 2047}, {257, 31},
                                               {1000, 33}, {3000, 3}, {0, 8}};
  for (const auto& tol : reduced_precisions()) {
    for (const auto& [n, f] : sizes) expect_trilinear_matches(n, f, device(), tol, true);
  }
}

TEST_P(TrilinearInterpolationTest, AcceptsNonContiguousFeatsAndPoints) {
  // Feats stored as (N, F, 8) and points as (3, N); then strided views.
  const Relayout transposed = [](const at::Tensor& t, size_t i) {
    if (i == 0) return t.transpose(1, 2).contiguous().transpose(1, 2);
    return t.t().contiguous().t();
  };
  const Relayout strided = [](const at::Tensor& t, size_t) {
    return torch::stack({t, torch::zeros_like(t)}, -1).select(-1, 0);
  };
  EXPECT_FALSE(transposed(torch::zeros({4, 8, 5}, options()), 0).is_contiguous());
  EXPECT_FALSE(transposed(torch::zeros({4, 3}, options()), 1).is_contiguous());
  EXPECT_FALSE(strided(torch::zeros({4, 3}, options()), 1).is_contiguous());
  const std::pair<int64_t, int64_t> sizes[] = {{37, 45}, {300, 3}};
  for (const auto& [n, f] : sizes) {
    expect_trilinear_matches(n, f, device(), kF64, true, transposed);
    expect_trilinear_matches(n, f, device(), kF64, true, strided);
  }
}

TEST_P(TrilinearInterpolationTest, DifferentiatesPointsAloneAndFeatsAlone) {
  const at::Tensor feats = torch::randn({50, 8, 9}, torch::kDouble);
  const at::Tensor points = random_points(50);
  const at::Tensor go = torch::randn({50, 9}, torch::kDouble);
  const at::Tensor rf = leaf_on(feats, kCpu), rp = leaf_on(points, kCpu);
  const auto rg = grad({reference_trilinear(rf, rp)}, {rf, rp}, {go});

  const at::Tensor p = leaf_on(points, device());
  const at::Tensor out_p = customconv::trilinear_interpolation(feats.to(device()), p);
  EXPECT_TRUE(close_to(grad({out_p}, {p}, {go.to(device())})[0], rg[1], kF64)) << "points";
  const at::Tensor f = leaf_on(feats, device());
  const at::Tensor out_f = customconv::trilinear_interpolation(f, points.to(device()));
  EXPECT_TRUE(close_to(grad({out_f}, {f}, {go.to(device())})[0], rg[0], kF64)) << "feats";
}

TEST_P(TrilinearInterpolationTest, EmptyFeaturesGiveEmptyOutputAndZeroPointGradient) {
  const at::Tensor feats = torch::randn({6, 8, 0}, options(at::kDouble)).requires_grad_();
  const at::Tensor points = torch::randn({6, 3}, options(at::kDouble)).requires_grad_();
  const at::Tensor out = customconv::trilinear_interpolation(feats, points);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{6, 0}));
  const auto g = grad({out}, {feats, points}, {torch::randn({6, 0}, options(at::kDouble))});
  EXPECT_EQ(g[0].sizes(), feats.sizes());
  EXPECT_TRUE(at::equal(g[1], torch::zeros({6, 3}, options(at::kDouble)))) << g[1];
}

TEST_P(TrilinearInterpolationTest, BackwardOpComputesBothGradients) {
  for (int64_t n : {0, 1, 200}) {
    SCOPED_TRACE(n);
    const at::Tensor rf = torch::randn({n, 8, 21}, torch::kDouble).requires_grad_();
    const at::Tensor rp = random_points(n).requires_grad_();
    const at::Tensor go = torch::randn({n, 21}, torch::kDouble);
    const auto rg = grad({reference_trilinear(rf, rp)}, {rf, rp}, {go});
    const auto [grad_feats, grad_points] = customconv::detail::trilinear_interpolation_backward(
        go.to(device()), rf.detach().to(device()), rp.detach().to(device()));
    EXPECT_TRUE(close_to(grad_feats, rg[0], kF64)) << "grad feats";
    EXPECT_TRUE(close_to(grad_points, rg[1], kF64)) << "grad points";
  }
}

TEST_P(TrilinearInterpolationTest, TrainingPairGivesTheBackwardOpsGradients) {
  for (int64_t n : {0, 1, 200}) {
    SCOPED_TRACE(n);
    const at::Tensor feats = torch::randn({n, 8, 21}, options(at::kDouble));
    const at::Tensor points = random_points(n).to(device());
    const at::Tensor go = torch::randn({n, 21}, options(at::kDouble));
    const auto [out, derivatives] =
        customconv::detail::trilinear_interpolation_with_derivatives(feats, points);
    EXPECT_EQ(derivatives.sizes(), (std::vector<int64_t>{n, 3, 21}));
    EXPECT_TRUE(at::equal(out, customconv::trilinear_interpolation(feats, points)));
    const auto [gf, gp] = customconv::detail::trilinear_interpolation_backward_from_derivatives(
        go, derivatives, points);
    const auto [want_gf, want_gp] =
        customconv::detail::trilinear_interpolation_backward(go, feats, points);
    EXPECT_TRUE(close_to(gf, want_gf, kF64)) << "grad feats";
    EXPECT_TRUE(close_to(gp, want_gp, kF64)) << "grad points";
    EXPECT_TRUE(close_to(customconv::detail::trilinear_interpolation_grad_feats(go, points),
                         want_gf, kF64))
        << "grad feats alone";
  }
}

TEST_P(TrilinearInterpolationTest, TensorBackwardFillsGradOfEveryLeaf) {
  const at::Tensor f0 = torch::randn({300, 8, 40}, torch::kDouble);
  const at::Tensor p0 = random_points(300);
  const at::Tensor f = leaf_on(f0, device()), p = leaf_on(p0, device());
  // sum() hands the backward an expanded (stride 0) grad_output.
  customconv::trilinear_interpolation(f, p).sum().backward();
  const at::Tensor rf = leaf_on(f0, kCpu), rp = leaf_on(p0, kCpu);
  reference_trilinear(rf, rp).sum().backward();
  EXPECT_TRUE(close_to(f.grad(), rf.grad(), kF64)) << "feats";
  EXPECT_TRUE(close_to(p.grad(), rp.grad(), kF64)) << "points";
}

TEST_P(TrilinearInterpolationTest, GradientsAreBitwiseIdenticalAcrossRuns) {
  const at::Tensor feats = torch::randn({3000, 8, 67}, torch::kDouble);
  const at::Tensor points = random_points(3000);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    expect_gradients_reproducible({feats, points}, device(), dtype, [](const Args& a) {
      return customconv::trilinear_interpolation(a[0], a[1]);
    });
  }
}

TEST_P(TrilinearInterpolationTest, DoubleBackwardIsRefusedWithAClearError) {
  const at::Tensor feats = torch::randn({10, 8, 4}, options(at::kDouble)).requires_grad_();
  const at::Tensor points = torch::randn({10, 3}, options(at::kDouble)).requires_grad_();
  const at::Tensor out = customconv::trilinear_interpolation(feats, points);
  const at::Tensor go = torch::randn(out.sizes(), options(at::kDouble));
  const auto g = grad({out}, {feats, points}, {go}, /*retain_graph=*/true, /*create_graph=*/true);
  EXPECT_C10_ERROR_MENTIONING(grad({g[0].pow(2).sum()}, {points}, {}, /*retain_graph=*/true),
                              "double backward");
  EXPECT_C10_ERROR_MENTIONING(grad({g[1].pow(2).sum()}, {feats}, {}, /*retain_graph=*/true),
                              "double backward");
}

// ---------------------------------------------------------------- trilinear errors

class TrilinearInterpolationErrorTest : public OnDevice {
 protected:
  void SetUp() override {
    OnDevice::SetUp();
    if (IsSkipped()) return;
    feats = torch::randn({5, 8, 7}, options());
    points = torch::rand({5, 3}, options()) * 2 - 1;
  }
  at::Tensor feats, points;
};
INSTANTIATE_ON_DEVICES(TrilinearInterpolationErrorTest);

TEST_P(TrilinearInterpolationErrorTest, ValidArgumentsOfTheFixtureWork) {
  EXPECT_TRUE(close_to(
      customconv::trilinear_interpolation(feats, points),
      reference_trilinear(feats.cpu().to(at::kDouble), points.cpu().to(at::kDouble)), kF32));
}

TEST_P(TrilinearInterpolationErrorTest, RejectsFeatsAndPointsOfWrongDims) {
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(feats[0], points), "feats");
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(feats.unsqueeze(0), points),
                              "feats");
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(feats, points[0]), "points");
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(feats, points.unsqueeze(0)),
                              "points");
}

TEST_P(TrilinearInterpolationErrorTest, RejectsFeatsWithoutEightCorners) {
  for (int64_t corners : {0, 4, 7, 9}) {
    EXPECT_C10_ERROR_MENTIONING(
        customconv::trilinear_interpolation(torch::randn({5, corners, 7}, options()), points),
        "feats must be (N, 8, F)");
  }
  // (N, F, 8) is not (N, 8, F).
  EXPECT_C10_ERROR_MENTIONING(
      customconv::trilinear_interpolation(torch::randn({5, 7, 8}, options()), points), "feats");
}

TEST_P(TrilinearInterpolationErrorTest, RejectsPointsWithoutThreeCoordinates) {
  for (int64_t coords : {0, 2, 4}) {
    EXPECT_C10_ERROR_MENTIONING(
        customconv::trilinear_interpolation(feats, torch::randn({5, coords}, options())),
        "points must be (N, 3)");
  }
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(feats, points.t()), "points");
}

TEST_P(TrilinearInterpolationErrorTest, RejectsDifferentNumbersOfCubesAndPoints) {
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(feats, points.slice(0, 0, 4)),
                              "N must match");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::trilinear_interpolation(feats, torch::randn({0, 3}, options())), "points");
}

TEST_P(TrilinearInterpolationErrorTest, RejectsMixedAndIntegerDtypes) {
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(feats, points.to(at::kDouble)),
                              "points");
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(feats, points.to(at::kDouble)),
                              "dtype");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::trilinear_interpolation(feats.to(at::kInt), points.to(at::kInt)),
      "feats must be float32");
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(feats.to(at::kLong), points),
                              "feats");
}

TEST_P(TrilinearInterpolationErrorTest, ErrorsAreTheSameWhenInputsRequireGrad) {
  const at::Tensor fg = feats.clone().requires_grad_(), pg = points.clone().requires_grad_();
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(fg, pg.slice(0, 1)),
                              "N must match");
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(fg, pg.to(at::kDouble)), "dtype");
}

TEST_P(TrilinearInterpolationErrorTest, BackwardOpRejectsBadGradOutput) {
  using customconv::detail::trilinear_interpolation_backward;
  for (const at::Tensor& bad : {torch::randn({5, 6}, options()), torch::randn({4, 7}, options()),
                                torch::randn({5, 7, 1}, options()), torch::randn({35}, options()),
                                torch::randn({5, 7}, options(at::kDouble))}) {
    SCOPED_TRACE(bad.sizes());
    EXPECT_C10_ERROR_MENTIONING(trilinear_interpolation_backward(bad, feats, points),
                                "grad_output");
  }
  // The forward's checks apply too.
  const at::Tensor go = torch::randn({5, 7}, options());
  EXPECT_C10_ERROR_MENTIONING(trilinear_interpolation_backward(go, feats, points.slice(1, 0, 2)),
                              "points must be (N, 3)");
}

TEST_P(TrilinearInterpolationErrorTest, NextValidCallWorksAfterAnError) {
  const at::Tensor expected =
      reference_trilinear(feats.cpu().to(at::kDouble), points.cpu().to(at::kDouble));
  auto valid_call = [&] { return customconv::trilinear_interpolation(feats, points); };
  EXPECT_THROW(customconv::trilinear_interpolation(feats, points.slice(0, 1)), c10::Error);
  EXPECT_TRUE(close_to(valid_call(), expected, kF32)) << "after mismatched N";
  EXPECT_THROW(customconv::trilinear_interpolation(feats.slice(1, 1), points), c10::Error);
  EXPECT_THROW(customconv::trilinear_interpolation(feats, points.to(at::kHalf)), c10::Error);
  EXPECT_THROW(customconv::detail::trilinear_interpolation_backward(feats[0], feats, points),
               c10::Error);
  synchronize();
  EXPECT_TRUE(close_to(valid_call(), expected, kF32)) << "after several errors";
  const at::Tensor pg = points.clone().requires_grad_();
  EXPECT_THROW(customconv::trilinear_interpolation(feats.slice(0, 1), pg), c10::Error);
  const at::Tensor out = customconv::trilinear_interpolation(feats, pg);
  const at::Tensor go = torch::randn(out.sizes(), options());
  const at::Tensor rp = points.cpu().to(at::kDouble).requires_grad_();
  EXPECT_TRUE(close_to(grad({out}, {pg}, {go})[0],
                       grad({reference_trilinear(feats.cpu().to(at::kDouble), rp)}, {rp},
                            {go.cpu().to(at::kDouble)})[0],
                       kF32));
  synchronize();
}

// ================================================================ CUDA only

TEST(DirectOpsCudaTest, RejectsTensorsOnDifferentDevices) {
  seed_for_current_test();
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  using namespace customconv::detail;
  const at::Tensor x = torch::randn({2, 3, 8, 8}), w = torch::randn({6, 1, 3, 3}),
                   b = torch::randn({6});
  const at::Tensor xc = x.to(kCuda), wc = w.to(kCuda), bc = b.to(kCuda);
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(xc, w, bc), "device");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(xc, w, bc), "weight");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(x, wc, b), "device");
  EXPECT_C10_ERROR_MENTIONING(customconv::depthwise_conv2d(xc, wc, b), "bias");
  const at::Tensor go = torch::randn({2, 6, 6, 6});
  EXPECT_C10_ERROR_MENTIONING(depthwise_conv2d_grad_input(go, xc, wc, {1, 1}, {0, 0}, {1, 1}),
                              "device");
  EXPECT_C10_ERROR_MENTIONING(
      depthwise_conv2d_grad_weight(go.to(kCuda), xc, w, {1, 1}, {0, 0}, {1, 1}), "device");

  const at::Tensor k = torch::randn({3, 3});
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(xc, k), "device");
  EXPECT_C10_ERROR_MENTIONING(customconv::filter2d(x, k.to(kCuda)), "kernel");
  EXPECT_C10_ERROR_MENTIONING(filter2d_grad_input(xc, k, "zeros"), "device");
  EXPECT_C10_ERROR_MENTIONING(filter2d_grad_kernel(x, xc, k.to(kCuda), "zeros"), "device");

  const at::Tensor feats = torch::randn({4, 8, 5}), points = torch::randn({4, 3});
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(feats.to(kCuda), points),
                              "device");
  EXPECT_C10_ERROR_MENTIONING(customconv::trilinear_interpolation(feats, points.to(kCuda)),
                              "points");
  EXPECT_C10_ERROR_MENTIONING(
      trilinear_interpolation_backward(torch::randn({4, 5}), feats.to(kCuda), points.to(kCuda)),
      "grad_output");
  // Valid calls afterwards.
  torch::cuda::synchronize();
  EXPECT_TRUE(close_to(customconv::depthwise_conv2d(xc, wc, bc),
                       torch::conv2d(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble), 1,
                                     c10::IntArrayRef(0), 1, 3),
                       kF32));
  EXPECT_TRUE(close_to(customconv::trilinear_interpolation(feats.to(kCuda), points.to(kCuda)),
                       reference_trilinear(feats.to(at::kDouble), points.to(at::kDouble)), kF32));
}

}  // namespace
