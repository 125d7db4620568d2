// The ops on the CPU, called through the public C++ API (and so through the
// dispatcher and the autograd kernels): registration, forward and backward
// against PyTorch's own conv2d / unfold / fold, argument errors, the version
// and the workspace limit.
#include "test_support.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>

#include <cctype>
#include <cstdlib>
#include <sstream>
#include <tuple>

namespace {

using namespace customconv_test;
using torch::autograd::grad;

constexpr double kF64Rtol = 1e-9, kF64Atol = 1e-10;
constexpr double kF32Rtol = 1e-4, kF32Atol = 1e-4;
constexpr double kBF16Rtol = 3e-2, kBF16Atol = 1.5e-1;

// ---------------------------------------------------------------- registration

std::string schema_string(const char* name) {
  const auto op = c10::Dispatcher::singleton().findSchema({name, ""});
  if (!op.has_value()) return std::string("<no schema for ") + name + ">";
  std::ostringstream s;
  s << op->schema();
  return s.str();
}

TEST(OpRegistrationTest, PublicOpsHaveTheDocumentedSchemas) {
  EXPECT_EQ(schema_string("customconv::conv2d"),
            "customconv::conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, "
            "int[2] padding=0, int[2] dilation=1, int groups=1) -> Tensor");
  EXPECT_EQ(schema_string("customconv::im2col"),
            "customconv::im2col(Tensor input, int[2] kernel_size, int[2] stride=1, "
            "int[2] padding=0, int[2] dilation=1) -> Tensor");
  EXPECT_EQ(schema_string("customconv::col2im"),
            "customconv::col2im(Tensor columns, int[2] output_size, int[2] kernel_size, "
            "int[2] stride=1, int[2] padding=0, int[2] dilation=1) -> Tensor");
  EXPECT_EQ(schema_string("customconv::conv2d_fused"),
            "customconv::conv2d_fused(Tensor input, Tensor weight, Tensor? bias=None, "
            "int[2] stride=1, int[2] padding=0, int[2] dilation=1, int groups=1, "
            "str activation=\"identity\", Tensor? residual=None) -> Tensor");
}

TEST(OpRegistrationTest, BackwardOpsAreOpsOfTheirOwn) {
  EXPECT_EQ(schema_string("customconv::conv2d_grad_input"),
            "customconv::conv2d_grad_input(Tensor grad_output, Tensor input, Tensor weight, "
            "int[2] stride, int[2] padding, int[2] dilation, int groups) -> Tensor");
  EXPECT_EQ(schema_string("customconv::conv2d_grad_weight"),
            "customconv::conv2d_grad_weight(Tensor grad_output, Tensor input, Tensor weight, "
            "int[2] stride, int[2] padding, int[2] dilation, int groups) -> Tensor");
  EXPECT_EQ(schema_string("customconv::conv2d_grad_bias"),
            "customconv::conv2d_grad_bias(Tensor grad_output) -> Tensor");
}

TEST(OpRegistrationTest, EveryOpHasCpuAutogradAndMetaKernels) {
  for (const char* name : {"customconv::conv2d", "customconv::conv2d_fused",
                           "customconv::im2col", "customconv::col2im",
                           "customconv::conv2d_grad_input", "customconv::conv2d_grad_weight",
                           "customconv::conv2d_grad_bias"}) {
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

// ---------------------------------------------------------------- conv2d forward

void expect_conv2d_matches_reference(const ConvConfig& c, at::ScalarType dtype, double rtol,
                                     double atol) {
  SCOPED_TRACE(c.describe());
  const ConvTensors t = make_conv_tensors(c);
  const at::Tensor x = t.input.to(dtype), w = t.weight.to(dtype);
  const at::Tensor b = c.bias ? t.bias.to(dtype) : at::Tensor();
  const at::Tensor out =
      customconv::conv2d(x, w, optional_bias(b), c.stride, c.padding, c.dilation, c.groups);
  EXPECT_EQ(out.scalar_type(), dtype);
  // The reference sees the same (rounded) values, in float64.
  const at::Tensor expected = reference_conv2d(c, x.to(at::kDouble), w.to(at::kDouble),
                                               c.bias ? b.to(at::kDouble) : at::Tensor());
  EXPECT_TRUE(all_close(out, expected, rtol, atol));
}

TEST(Conv2dTest, MatchesTorchConv2dOnFixedConfigs) {
  seed_for_current_test();
  for (const auto& c : fixed_conv_configs()) {
    expect_conv2d_matches_reference(c, at::kDouble, kF64Rtol, kF64Atol);
  }
}

TEST(Conv2dTest, MatchesTorchConv2dOnRandomConfigs) {
  const uint64_t seed = seed_for_current_test();
  for (const auto& c : random_conv_configs(seed, 40)) {
    expect_conv2d_matches_reference(c, at::kDouble, kF64Rtol, kF64Atol);
  }
}

TEST(Conv2dTest, MatchesTorchConv2dInFloat32WithinTolerance) {
  const uint64_t seed = seed_for_current_test();
  auto configs = fixed_conv_configs();
  for (const auto& c : random_conv_configs(seed, 10)) configs.push_back(c);
  for (const auto& c : configs) expect_conv2d_matches_reference(c, at::kFloat, kF32Rtol, kF32Atol);
}

TEST(Conv2dTest, MatchesTorchConv2dInBFloat16WithinTolerance) {
  seed_for_current_test();
  for (const auto& c : fixed_conv_configs()) {
    expect_conv2d_matches_reference(c, at::kBFloat16, kBF16Rtol, kBF16Atol);
  }
}

TEST(Conv2dTest, AcceptsNonContiguousInputWeightAndBias) {
  seed_for_current_test();
  const ConvConfig c{2, 4, 9, 8, 6, 3, 2, {2, 1}, {1, 1}, {1, 2}, 2, true};
  // Channels-last input, a strided slice of a wider weight, every other bias element.
  const at::Tensor x = torch::randn({c.n, c.h, c.w, c.c}, torch::kDouble).permute({0, 3, 1, 2});
  const at::Tensor w =
      torch::randn({c.k, c.c / c.groups, c.kh, 2 * c.kw}, torch::kDouble).slice(3, 0, 2 * c.kw, 2);
  const at::Tensor b = torch::randn({2 * c.k}, torch::kDouble).slice(0, 0, 2 * c.k, 2);
  ASSERT_FALSE(x.is_contiguous());
  ASSERT_FALSE(w.is_contiguous());
  ASSERT_FALSE(b.is_contiguous());
  const at::Tensor out = customconv::conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
  EXPECT_TRUE(all_close(out, reference_conv2d(c, x, w, b), kF64Rtol, kF64Atol));

  // A sliced input whose H and W strides both skip elements.
  const at::Tensor big = torch::randn({c.n, c.c, 2 * c.h, c.w + 3}, torch::kDouble);
  const at::Tensor sliced = big.slice(2, 0, 2 * c.h, 2).slice(3, 3, c.w + 3);
  ASSERT_FALSE(sliced.is_contiguous());
  EXPECT_TRUE(all_close(
      customconv::conv2d(sliced, w, b, c.stride, c.padding, c.dilation, c.groups),
      reference_conv2d(c, sliced, w, b), kF64Rtol, kF64Atol));
}

TEST(Conv2dTest, AcceptsUnbatchedInput) {
  seed_for_current_test();
  const ConvConfig c{1, 3, 7, 8, 4, 3, 3, {1, 2}, {1, 0}, {1, 1}, 1, true};
  const ConvTensors t = make_conv_tensors(c);
  const at::Tensor image = t.input[0];
  const at::Tensor out =
      customconv::conv2d(image, t.weight, t.bias, c.stride, c.padding, c.dilation, c.groups);
  EXPECT_TRUE(all_close(out, reference_conv2d(c, image, t.weight, t.bias), kF64Rtol, kF64Atol));
  EXPECT_EQ(out.dim(), 3);
}

TEST(Conv2dTest, DefaultsAndSingleValuesMeanBothAxes) {
  seed_for_current_test();
  const at::Tensor x = torch::randn({2, 3, 9, 10}, torch::kDouble);
  const at::Tensor w = torch::randn({4, 3, 3, 3}, torch::kDouble);
  EXPECT_TRUE(all_close(customconv::conv2d(x, w), torch::conv2d(x, w), kF64Rtol, kF64Atol));
  EXPECT_TRUE(all_close(customconv::conv2d(x, w, std::nullopt, 2, 1, 2),
                        torch::conv2d(x, w, {}, {2, 2}, {1, 1}, {2, 2}), kF64Rtol, kF64Atol));
}

TEST(Conv2dFusedTest, MatchesConv2dThenResidualThenActivation) {
  seed_for_current_test();
  const at::Tensor x = torch::randn({2, 4, 9, 10}, torch::kDouble);
  const at::Tensor w = torch::randn({6, 2, 3, 3}, torch::kDouble);
  const at::Tensor b = torch::randn({6}, torch::kDouble);
  const at::Tensor r = torch::randn({2, 6, 5, 10}, torch::kDouble);
  const at::Tensor pre = torch::conv2d(x, w, b, {2, 1}, {1, 1}, {1, 1}, 2);
  EXPECT_TRUE(all_close(customconv::conv2d_fused(x, w, b, {2, 1}, 1, 1, 2, "relu", r),
                        torch::relu(pre + r), kF64Rtol, kF64Atol));
  EXPECT_TRUE(all_close(customconv::conv2d_fused(x, w, b, {2, 1}, 1, 1, 2, "silu"),
                        torch::silu(pre), kF64Rtol, kF64Atol));
  EXPECT_TRUE(all_close(customconv::conv2d_fused(x, w, b, {2, 1}, 1, 1, 2), pre, kF64Rtol,
                        kF64Atol));
  EXPECT_THROW(customconv::conv2d_fused(x, w, b, {2, 1}, 1, 1, 2, "tanh"), c10::Error);
  EXPECT_THROW(customconv::conv2d_fused(x, w, b, {2, 1}, 1, 1, 2, "relu", r.narrow(3, 0, 9)),
               c10::Error);
}

// ---------------------------------------------------------------- im2col / col2im forward

TEST(Im2colTest, MatchesUnfoldOnWindowConfigs) {
  seed_for_current_test();
  for (const auto& c : window_configs()) {
    SCOPED_TRACE(c.describe());
    for (auto dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
      const at::Tensor x = torch::randn({c.n, c.c, c.h, c.w}, torch::kDouble).to(dtype);
      const at::Tensor cols = customconv::im2col(x, c.kernel_size, c.stride, c.padding, c.dilation);
      EXPECT_EQ(cols.scalar_type(), dtype);
      // A pure gather: exactly equal.
      EXPECT_TRUE(all_close(cols,
                            reference_unfold(x.to(at::kDouble), c.kernel_size, c.stride,
                                             c.padding, c.dilation),
                            0, 0))
          << c10::toString(dtype);
    }
  }
}

TEST(Im2colTest, AcceptsNonContiguousAndUnbatchedInput) {
  seed_for_current_test();
  const WindowConfig c{2, 3, 8, 7, {3, 2}, {2, 1}, {1, 1}, {1, 2}};
  const at::Tensor x = torch::randn({c.n, c.h, c.w, c.c}, torch::kDouble).permute({0, 3, 1, 2});
  ASSERT_FALSE(x.is_contiguous());
  EXPECT_TRUE(all_close(customconv::im2col(x, c.kernel_size, c.stride, c.padding, c.dilation),
                        reference_unfold(x, c.kernel_size, c.stride, c.padding, c.dilation), 0,
                        0));
  const at::Tensor image = x[1];
  const at::Tensor cols = customconv::im2col(image, c.kernel_size, c.stride, c.padding, c.dilation);
  EXPECT_TRUE(all_close(cols,
                        reference_unfold(image.unsqueeze(0), c.kernel_size, c.stride, c.padding,
                                         c.dilation)[0],
                        0, 0));
}

TEST(Col2imTest, MatchesFoldOnWindowConfigs) {
  seed_for_current_test();
  for (const auto& c : window_configs()) {
    SCOPED_TRACE(c.describe());
    const at::Tensor cols = torch::randn({c.n, c.rows(), c.length()}, torch::kDouble);
    const at::Tensor expected =
        reference_fold(cols, {c.h, c.w}, c.kernel_size, c.stride, c.padding, c.dilation);
    EXPECT_TRUE(all_close(
        customconv::col2im(cols, {c.h, c.w}, c.kernel_size, c.stride, c.padding, c.dilation),
        expected, kF64Rtol, kF64Atol));
    for (const auto& [dtype, rtol, atol] : {std::make_tuple(at::kFloat, kF32Rtol, kF32Atol),
                                            std::make_tuple(at::kBFloat16, kBF16Rtol, kBF16Atol)}) {
      const at::Tensor rounded = cols.to(dtype);
      const at::Tensor img = customconv::col2im(rounded, {c.h, c.w}, c.kernel_size, c.stride,
                                                c.padding, c.dilation);
      EXPECT_EQ(img.scalar_type(), dtype);
      EXPECT_TRUE(all_close(img,
                            reference_fold(rounded.to(at::kDouble), {c.h, c.w}, c.kernel_size,
                                           c.stride, c.padding, c.dilation),
                            rtol, atol))
          << c10::toString(dtype);
    }
  }
}

TEST(Col2imTest, AcceptsNonContiguousAndUnbatchedColumns) {
  seed_for_current_test();
  const WindowConfig c{2, 2, 7, 9, {2, 3}, {1, 2}, {1, 0}, {2, 1}};
  const at::Tensor cols =
      torch::randn({c.n, c.length(), c.rows()}, torch::kDouble).transpose(1, 2);
  ASSERT_FALSE(cols.is_contiguous());
  EXPECT_TRUE(all_close(
      customconv::col2im(cols, {c.h, c.w}, c.kernel_size, c.stride, c.padding, c.dilation),
      reference_fold(cols, {c.h, c.w}, c.kernel_size, c.stride, c.padding, c.dilation), kF64Rtol,
      kF64Atol));
  const at::Tensor one = cols[0];
  EXPECT_TRUE(all_close(
      customconv::col2im(one, {c.h, c.w}, c.kernel_size, c.stride, c.padding, c.dilation),
      reference_fold(one, {c.h, c.w}, c.kernel_size, c.stride, c.padding, c.dilation), kF64Rtol,
      kF64Atol));
}

TEST(Col2imTest, IsTheAdjointOfIm2col) {
  seed_for_current_test();
  for (const auto& c : window_configs()) {
    SCOPED_TRACE(c.describe());
    const at::Tensor x = torch::randn({c.n, c.c, c.h, c.w}, torch::kDouble);
    const at::Tensor y = torch::randn({c.n, c.rows(), c.length()}, torch::kDouble);
    // <im2col(x), y> == <x, col2im(y)>
    const double lhs =
        (customconv::im2col(x, c.kernel_size, c.stride, c.padding, c.dilation) * y)
            .sum()
            .item<double>();
    const double rhs =
        (x * customconv::col2im(y, {c.h, c.w}, c.kernel_size, c.stride, c.padding, c.dilation))
            .sum()
            .item<double>();
    EXPECT_NEAR(lhs, rhs, 1e-9 * (1 + std::abs(lhs)));
  }
}

// ---------------------------------------------------------------- backward

// Gradients of sum(conv2d(...) * grad_output) through customconv and through
// torch::conv2d, for every argument that requires grad.
void expect_conv2d_gradients_match(const ConvConfig& c, at::ScalarType dtype, double rtol,
                                   double atol) {
  SCOPED_TRACE(c.describe());
  const ConvTensors t = make_conv_tensors(c);
  auto leaf = [&](const at::Tensor& v) { return v.to(dtype).detach().requires_grad_(); };
  const at::Tensor x = leaf(t.input), w = leaf(t.weight);
  const at::Tensor b = c.bias ? leaf(t.bias) : at::Tensor();
  std::vector<at::Tensor> inputs{x, w};
  if (c.bias) inputs.push_back(b);

  const at::Tensor out =
      customconv::conv2d(x, w, optional_bias(b), c.stride, c.padding, c.dilation, c.groups);
  ASSERT_TRUE(out.requires_grad());
  const at::Tensor go = torch::randn(out.sizes(), torch::kDouble).to(dtype);
  const auto grads = grad({out}, inputs, {go});

  std::vector<at::Tensor> ref_inputs;
  for (const auto& v : inputs) ref_inputs.push_back(v.detach().to(at::kDouble).requires_grad_());
  const at::Tensor ref_out = reference_conv2d(c, ref_inputs[0], ref_inputs[1],
                                              c.bias ? ref_inputs[2] : at::Tensor());
  const auto ref_grads = grad({ref_out}, ref_inputs, {go.to(at::kDouble)});

  const char* names[] = {"grad input", "grad weight", "grad bias"};
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_EQ(grads[i].scalar_type(), dtype) << names[i];
    EXPECT_TRUE(all_close(grads[i], ref_grads[i], rtol, atol)) << names[i];
  }
}

TEST(Conv2dBackwardTest, GradientsMatchTorchConv2dOnFixedConfigs) {
  seed_for_current_test();
  for (const auto& c : fixed_conv_configs()) {
    expect_conv2d_gradients_match(c, at::kDouble, kF64Rtol, kF64Atol);
  }
}

TEST(Conv2dBackwardTest, GradientsMatchTorchConv2dOnRandomConfigs) {
  const uint64_t seed = seed_for_current_test();
  for (const auto& c : random_conv_configs(seed, 25)) {
    expect_conv2d_gradients_match(c, at::kDouble, kF64Rtol, kF64Atol);
  }
}

TEST(Conv2dBackwardTest, GradientsMatchInFloat32WithinTolerance) {
  seed_for_current_test();
  for (const auto& c : fixed_conv_configs()) {
    expect_conv2d_gradients_match(c, at::kFloat, kF32Rtol, kF32Atol);
  }
}

TEST(Conv2dBackwardTest, GradientsMatchInBFloat16WithinTolerance) {
  seed_for_current_test();
  for (const auto& c : fixed_conv_configs()) {
    expect_conv2d_gradients_match(c, at::kBFloat16, kBF16Rtol, 4 * kBF16Atol);
  }
}

TEST(Conv2dBackwardTest, TensorBackwardFillsGradOfEveryLeaf) {
  seed_for_current_test();
  const ConvConfig c{3, 4, 8, 9, 6, 3, 2, {1, 2}, {1, 1}, {2, 1}, 2, true};
  const ConvTensors t = make_conv_tensors(c);
  // A non-contiguous leaf: channels-last storage.
  const at::Tensor x = t.input.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2})
                           .requires_grad_();
  const at::Tensor w = t.weight.clone().requires_grad_();
  const at::Tensor b = t.bias.clone().requires_grad_();
  const at::Tensor go = torch::randn({c.n, c.k, c.out_h(), c.out_w()}, torch::kDouble);
  (customconv::conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups) * go).sum().backward();

  const at::Tensor rx = t.input.clone().requires_grad_(), rw = t.weight.clone().requires_grad_(),
                   rb = t.bias.clone().requires_grad_();
  (reference_conv2d(c, rx, rw, rb) * go).sum().backward();
  EXPECT_TRUE(all_close(x.grad(), rx.grad(), kF64Rtol, kF64Atol));
  EXPECT_TRUE(all_close(w.grad(), rw.grad(), kF64Rtol, kF64Atol));
  EXPECT_TRUE(all_close(b.grad(), rb.grad(), kF64Rtol, kF64Atol));
}

TEST(Conv2dBackwardTest, UnbatchedInputGradientsMatch) {
  seed_for_current_test();
  const ConvConfig c{1, 3, 7, 6, 2, 2, 3, {2, 1}, {0, 1}, {1, 1}, 1, true};
  const ConvTensors t = make_conv_tensors(c);
  const at::Tensor x = t.input[0].clone().requires_grad_();
  const at::Tensor w = t.weight.clone().requires_grad_();
  const at::Tensor b = t.bias.clone().requires_grad_();
  const at::Tensor out = customconv::conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
  const at::Tensor go = torch::randn(out.sizes(), torch::kDouble);
  const auto g = grad({out}, {x, w, b}, {go});
  const auto rx = x.detach().clone().requires_grad_(), rw = w.detach().clone().requires_grad_(),
             rb = b.detach().clone().requires_grad_();
  const auto rg = grad({reference_conv2d(c, rx, rw, rb)}, {rx, rw, rb}, {go});
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(all_close(g[i], rg[i], kF64Rtol, kF64Atol)) << i;
}

TEST(Conv2dBackwardTest, BackwardOpsCalledDirectlyMatchReference) {
  seed_for_current_test();
  for (const auto& c : fixed_conv_configs()) {
    SCOPED_TRACE(c.describe());
    const ConvTensors t = make_conv_tensors(c);
    const at::Tensor go = torch::randn({c.n, c.k, c.out_h(), c.out_w()}, torch::kDouble);
    const at::Tensor rx = t.input.clone().requires_grad_(), rw = t.weight.clone().requires_grad_();
    const at::Tensor rb = torch::randn({c.k}, torch::kDouble).requires_grad_();
    const auto rg = grad({reference_conv2d(c, rx, rw, rb)}, {rx, rw, rb}, {go});
    EXPECT_TRUE(all_close(customconv::detail::conv2d_grad_input(go, t.input, t.weight, c.stride,
                                                                c.padding, c.dilation, c.groups),
                          rg[0], kF64Rtol, kF64Atol));
    EXPECT_TRUE(all_close(customconv::detail::conv2d_grad_weight(go, t.input, t.weight, c.stride,
                                                                 c.padding, c.dilation, c.groups),
                          rg[1], kF64Rtol, kF64Atol));
    EXPECT_TRUE(all_close(customconv::detail::conv2d_grad_bias(go), rg[2], kF64Rtol, kF64Atol));
  }
}

TEST(Conv2dBackwardTest, DoubleBackwardIsRefusedWithAClearError) {
  seed_for_current_test();
  const at::Tensor x = torch::randn({2, 3, 6, 6}, torch::kDouble).requires_grad_();
  const at::Tensor w = torch::randn({4, 3, 3, 3}, torch::kDouble).requires_grad_();
  const at::Tensor out = customconv::conv2d(x, w);
  const at::Tensor gx = grad({out}, {x}, {torch::randn(out.sizes(), torch::kDouble)},
                             /*retain_graph=*/true, /*create_graph=*/true)[0];
  EXPECT_C10_ERROR_MENTIONING(grad({gx.pow(2).sum()}, {w}, {}, /*retain_graph=*/true),
                              "double backward");
}

TEST(Im2colBackwardTest, GradientMatchesUnfold) {
  seed_for_current_test();
  for (const auto& c : window_configs()) {
    SCOPED_TRACE(c.describe());
    const at::Tensor x = torch::randn({c.n, c.c, c.h, c.w}, torch::kDouble).requires_grad_();
    const at::Tensor cols = customconv::im2col(x, c.kernel_size, c.stride, c.padding, c.dilation);
    const at::Tensor go = torch::randn(cols.sizes(), torch::kDouble);
    const at::Tensor gx = grad({cols}, {x}, {go})[0];
    const at::Tensor rx = x.detach().clone().requires_grad_();
    const at::Tensor rgx = grad(
        {reference_unfold(rx, c.kernel_size, c.stride, c.padding, c.dilation)}, {rx}, {go})[0];
    EXPECT_TRUE(all_close(gx, rgx, kF64Rtol, kF64Atol));
  }
}

TEST(Col2imBackwardTest, GradientMatchesFold) {
  seed_for_current_test();
  for (const auto& c : window_configs()) {
    SCOPED_TRACE(c.describe());
    const at::Tensor cols =
        torch::randn({c.n, c.rows(), c.length()}, torch::kDouble).requires_grad_();
    const at::Tensor img =
        customconv::col2im(cols, {c.h, c.w}, c.kernel_size, c.stride, c.padding, c.dilation);
    const at::Tensor go = torch::randn(img.sizes(), torch::kDouble);
    const at::Tensor gc = grad({img}, {cols}, {go})[0];
    const at::Tensor rc = cols.detach().clone().requires_grad_();
    const at::Tensor rgc = grad(
        {reference_fold(rc, {c.h, c.w}, c.kernel_size, c.stride, c.padding, c.dilation)}, {rc},
        {go})[0];
    // The gradient of a sum is a gather: exactly equal.
    EXPECT_TRUE(all_close(gc, rgc, 0, 0));
  }
}

// ---------------------------------------------------------------- argument errors

class Conv2dErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_for_current_test();
    x = torch::randn({2, 4, 8, 8});
    w = torch::randn({6, 2, 3, 3});
    b = torch::randn({6});
  }
  at::Tensor x, w, b;  // valid with groups = 2
};

TEST_F(Conv2dErrorTest, ValidArgumentsOfTheFixtureWork) {
  EXPECT_TRUE(all_close(customconv::conv2d(x, w, b, 1, 1, 1, 2),
                        torch::conv2d(x, w, b, 1, 1, 1, 2), kF32Rtol, kF32Atol));
}

TEST_F(Conv2dErrorTest, RejectsInputAndWeightOfWrongDims) {
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x.flatten(0, 1), w, b, 1, 0, 1, 2), "input");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x.unsqueeze(0), w, b, 1, 0, 1, 2), "input");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w[0], b, 1, 0, 1, 2), "weight");
}

TEST_F(Conv2dErrorTest, RejectsChannelsNotEqualToWeightChannelsTimesGroups) {
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, 0, 1, 1), "weight.size(1) * groups");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, torch::randn({6, 3, 3, 3}), b, 1, 0, 1, 1),
                              "channels");
  // Output channels not divisible by groups.
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, torch::randn({5, 2, 3, 3}), std::nullopt, 1,
                                                 0, 1, 2),
                              "groups");
}

TEST_F(Conv2dErrorTest, RejectsNonPositiveGroups) {
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, 0, 1, 0), "groups");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, 0, 1, -2), "groups");
}

TEST_F(Conv2dErrorTest, RejectsZeroOrNegativeStride) {
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 0, 0, 1, 2), "stride");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, {1, 0}, 0, 1, 2), "stride");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, {-1, 1}, 0, 1, 2), "stride");
}

TEST_F(Conv2dErrorTest, RejectsZeroDilation) {
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, 0, 0, 2), "dilation");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, 0, {1, 0}, 2), "dilation");
}

TEST_F(Conv2dErrorTest, RejectsNegativePadding) {
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, -1, 1, 2), "padding");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, {0, -3}, 1, 2), "padding");
}

TEST_F(Conv2dErrorTest, RejectsArgumentListsOfWrongLength) {
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, {1, 1, 1}, 0, 1, 2), "stride");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, std::vector<int64_t>{}, 1, 2),
                              "padding");
}

TEST_F(Conv2dErrorTest, RejectsKernelLargerThanPaddedInput) {
  // Output size would be <= 0.
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, torch::randn({6, 2, 9, 3}), b, 1, 0, 1, 2),
                              "output size");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, 0, {4, 1}, 2), "output size");
}

TEST_F(Conv2dErrorTest, RejectsHugeDilationWithoutOverflow) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, 0, {big, 1}, 2), "dilat");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, 0, {1, big}, 2), "dilat");
  // dilation * (kernel_size - 1) itself overflows 64 bits.
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2 + 1;
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, 0, {huge, 1}, 2), "dilation");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, 0, {1, int64_t{1} << 62}, 2),
                              "dilation");
}

TEST_F(Conv2dErrorTest, RejectsHugePaddingWithoutOverflow) {
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b, 1, {huge, 0}, 1, 2), "padding");
}

TEST_F(Conv2dErrorTest, RejectsBiasOfWrongSize) {
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, torch::randn({5}), 1, 0, 1, 2), "bias");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, torch::randn({6, 1}), 1, 0, 1, 2), "bias");
}

TEST_F(Conv2dErrorTest, RejectsMixedDtypes) {
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w.to(at::kDouble), b, 1, 0, 1, 2), "weight");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w.to(at::kDouble), b, 1, 0, 1, 2), "dtype");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, b.to(at::kDouble), 1, 0, 1, 2), "bias");
}

TEST_F(Conv2dErrorTest, RejectsIntegerDtype) {
  EXPECT_C10_ERROR_MENTIONING(
      customconv::conv2d(x.to(at::kLong), w.to(at::kLong), b.to(at::kLong), 1, 0, 1, 2),
      "input must be float32");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::conv2d(x.to(at::kInt), w.to(at::kInt), std::nullopt, 1, 0, 1, 2), "input");
}

TEST_F(Conv2dErrorTest, ErrorsAreTheSameWhenInputsRequireGrad) {
  const at::Tensor xg = x.clone().requires_grad_(), wg = w.clone().requires_grad_();
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(xg, wg, b, 0, 0, 1, 2), "stride");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(xg, wg, b, 1, 0, 1, 1), "weight.size(1) * groups");
}

TEST_F(Conv2dErrorTest, NextValidCallWorksAfterAnError) {
  EXPECT_THROW(customconv::conv2d(x, w, b, 0, 0, 1, 2), c10::Error);
  EXPECT_THROW(customconv::conv2d(x, w.to(at::kDouble), b, 1, 0, 1, 2), c10::Error);
  EXPECT_TRUE(all_close(customconv::conv2d(x, w, b, 1, 1, 1, 2),
                        torch::conv2d(x, w, b, 1, 1, 1, 2), kF32Rtol, kF32Atol));
}

TEST(Conv2dBackwardErrorTest, BackwardOpsRejectGradOutputOfWrongShape) {
  seed_for_current_test();
  const at::Tensor x = torch::randn({2, 3, 6, 6}), w = torch::randn({4, 3, 3, 3});
  const at::Tensor wrong = torch::randn({2, 4, 5, 4});  // the output is (2, 4, 4, 4)
  EXPECT_C10_ERROR_MENTIONING(customconv::detail::conv2d_grad_input(wrong, x, w, {1, 1}, {0, 0},
                                                                    {1, 1}, 1),
                              "grad_output");
  EXPECT_C10_ERROR_MENTIONING(customconv::detail::conv2d_grad_weight(wrong, x, w, {1, 1}, {0, 0},
                                                                     {1, 1}, 1),
                              "grad_output");
  EXPECT_C10_ERROR_MENTIONING(customconv::detail::conv2d_grad_bias(torch::randn({4, 5})),
                              "grad_output");
  EXPECT_C10_ERROR_MENTIONING(customconv::detail::conv2d_grad_input(wrong.to(at::kDouble), x, w,
                                                                    {1, 1}, {0, 0}, {1, 1}, 1),
                              "grad_output");
}

TEST(Im2colErrorTest, RejectsInvalidArguments) {
  seed_for_current_test();
  const at::Tensor x = torch::randn({2, 3, 8, 8});
  EXPECT_C10_ERROR_MENTIONING(customconv::im2col(x[0][0], {3, 3}), "input");
  EXPECT_C10_ERROR_MENTIONING(customconv::im2col(x.to(at::kLong), {3, 3}), "input");
  EXPECT_C10_ERROR_MENTIONING(customconv::im2col(x, {0, 3}), "kernel_size");
  EXPECT_C10_ERROR_MENTIONING(customconv::im2col(x, {3, 3, 3}), "kernel_size");
  EXPECT_C10_ERROR_MENTIONING(customconv::im2col(x, {3, 3}, 0), "stride");
  EXPECT_C10_ERROR_MENTIONING(customconv::im2col(x, {3, 3}, 1, -1), "padding");
  EXPECT_C10_ERROR_MENTIONING(customconv::im2col(x, {3, 3}, 1, 0, 0), "dilation");
  EXPECT_C10_ERROR_MENTIONING(customconv::im2col(x, {9, 3}), "output size");
  EXPECT_C10_ERROR_MENTIONING(customconv::im2col(x, {3, 3}, 1, 0, {int64_t{1} << 40, 1}),
                              "dilat");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::im2col(x, {3, 3}, 1, 0, {1, std::numeric_limits<int64_t>::max()}), "dilation");
  // A valid call afterwards.
  EXPECT_TRUE(all_close(customconv::im2col(x, {3, 3}), reference_unfold(x, {3, 3}, {1, 1},
                                                                        {0, 0}, {1, 1}),
                        0, 0));
}

TEST(Col2imErrorTest, RejectsColumnsOfWrongSize) {
  seed_for_current_test();
  // (N, C*kh*kw, L) for C = 2, kernel 3x3 on 6x6: L = 16.
  const at::Tensor cols = torch::randn({2, 18, 16});
  EXPECT_C10_ERROR_MENTIONING(customconv::col2im(torch::randn({2, 18, 15}), {6, 6}, {3, 3}),
                              "columns.size(2)");
  EXPECT_C10_ERROR_MENTIONING(customconv::col2im(torch::randn({2, 17, 16}), {6, 6}, {3, 3}),
                              "columns.size(1)");
  EXPECT_C10_ERROR_MENTIONING(customconv::col2im(torch::randn({18, 15}), {6, 6}, {3, 3}),
                              "columns.size(1)");
  EXPECT_C10_ERROR_MENTIONING(customconv::col2im(cols, {6, 6}, {3, 3}, 2), "columns.size(2)");
  EXPECT_C10_ERROR_MENTIONING(customconv::col2im(cols[0][0], {6, 6}, {3, 3}), "columns");
  EXPECT_C10_ERROR_MENTIONING(customconv::col2im(cols.to(at::kInt), {6, 6}, {3, 3}), "columns");
  EXPECT_C10_ERROR_MENTIONING(customconv::col2im(cols, {0, 6}, {3, 3}), "output_size");
  EXPECT_C10_ERROR_MENTIONING(customconv::col2im(cols, {6, 6, 6}, {3, 3}), "output_size");
  EXPECT_C10_ERROR_MENTIONING(customconv::col2im(cols, {6, 6}, {3, 3}, 1, 0, 0), "dilation");
  EXPECT_C10_ERROR_MENTIONING(customconv::col2im(cols, {6, 6}, {3, 3}, 1, -1), "padding");
  EXPECT_C10_ERROR_MENTIONING(customconv::col2im(cols, {6, 6}, {3, 3}, 1, 0, {int64_t{1} << 40, 1}),
                              "dilat");
  EXPECT_TRUE(all_close(customconv::col2im(cols, {6, 6}, {3, 3}),
                        reference_fold(cols, {6, 6}, {3, 3}, {1, 1}, {0, 0}, {1, 1}), kF32Rtol,
                        kF32Atol));
}

// ---------------------------------------------------------------- version, workspace limit

TEST(VersionTest, IsMajorDotMinorDotPatch) {
  const std::string v = customconv::version();
  ASSERT_FALSE(v.empty());
  std::vector<std::string> parts(1);
  for (char ch : v) {
    if (ch == '.') {
      parts.emplace_back();
    } else {
      ASSERT_TRUE(std::isdigit(static_cast<unsigned char>(ch))) << "version " << v;
      parts.back() += ch;
    }
  }
  ASSERT_EQ(parts.size(), 3u) << "version " << v;
  for (const auto& p : parts) EXPECT_FALSE(p.empty()) << "version " << v;
}

TEST(WorkspaceLimitTest, IsPositiveAndDefaultsTo256MiBOnTheCpuAnd48OnCuda) {
  EXPECT_GT(customconv::workspace_limit_bytes(), 0);
  const char* env = std::getenv("CUSTOMCONV_WORKSPACE_MB");
  if (env == nullptr || *env == '\0') {
    EXPECT_EQ(customconv::workspace_limit_bytes(), int64_t{256} << 20);
    EXPECT_EQ(customconv::workspace_limit_bytes(c10::DeviceType::CPU), int64_t{256} << 20);
    EXPECT_EQ(customconv::workspace_limit_bytes(c10::DeviceType::CUDA), int64_t{48} << 20);
  }
}

TEST(WorkspaceLimitTest, RejectsNegativeLimits) {
  const int64_t before = customconv::workspace_limit_bytes();
  EXPECT_C10_ERROR_MENTIONING(customconv::set_workspace_limit_bytes(-1), "bytes");
  EXPECT_C10_ERROR_MENTIONING(customconv::set_workspace_limit_bytes(-(int64_t{1} << 40)), "bytes");
  EXPECT_EQ(customconv::workspace_limit_bytes(), before);
}

TEST(WorkspaceLimitTest, SetterSetsOneLimitForEveryDeviceAndZeroRestoresTheDefaults) {
  const int64_t cpu = customconv::workspace_limit_bytes(c10::DeviceType::CPU);
  const int64_t cuda = customconv::workspace_limit_bytes(c10::DeviceType::CUDA);
  {
    WorkspaceLimitGuard limit(12345);
    EXPECT_EQ(customconv::workspace_limit_bytes(c10::DeviceType::CPU), 12345);
    EXPECT_EQ(customconv::workspace_limit_bytes(c10::DeviceType::CUDA), 12345);
    const char* env = std::getenv("CUSTOMCONV_WORKSPACE_MB");
    if (env == nullptr || *env == '\0') {
      customconv::set_workspace_limit_bytes(0);
      EXPECT_EQ(customconv::workspace_limit_bytes(c10::DeviceType::CPU), int64_t{256} << 20);
      EXPECT_EQ(customconv::workspace_limit_bytes(c10::DeviceType::CUDA), int64_t{48} << 20);
    }
  }
  EXPECT_EQ(customconv::workspace_limit_bytes(c10::DeviceType::CPU), cpu);
  EXPECT_EQ(customconv::workspace_limit_bytes(c10::DeviceType::CUDA), cuda);
  {
    WorkspaceLimitGuard outer(1 << 20);
    { WorkspaceLimitGuard inner(2 << 20); }
    EXPECT_EQ(customconv::workspace_limit_bytes(c10::DeviceType::CUDA), 1 << 20);
  }
  EXPECT_EQ(customconv::workspace_limit_bytes(c10::DeviceType::CUDA), cuda);
}

// Forward and all gradients under the current limit vs the reference.
void expect_conv2d_forward_and_backward_match(const ConvConfig& c) {
  SCOPED_TRACE(c.describe());
  expect_conv2d_matches_reference(c, at::kDouble, kF64Rtol, kF64Atol);
  expect_conv2d_gradients_match(c, at::kDouble, kF64Rtol, kF64Atol);
}

TEST(WorkspaceLimitTest, OneByteLimitProcessesOneImageAtATimeWithSameResults) {
  seed_for_current_test();
  WorkspaceLimitGuard limit(1);
  expect_conv2d_forward_and_backward_match({4, 4, 9, 8, 6, 3, 2, {2, 1}, {1, 1}, {1, 2}, 2, true});
  expect_conv2d_forward_and_backward_match({3, 3, 7, 7, 3, 3, 3, {1, 1}, {1, 1}, {1, 1}, 3, false});
}

TEST(WorkspaceLimitTest, ChunksWithARemainderGiveSameResults) {
  seed_for_current_test();
  const ConvConfig c{5, 4, 9, 8, 6, 3, 2, {1, 1}, {1, 0}, {1, 1}, 2, true};
  // One image needs (C*kh*kw + K) * H_out * W_out elements: two fit, so the
  // chunks hold 2, 2 and 1 images.
  const int64_t per_image = (c.c * c.kh * c.kw + c.k) * c.out_h() * c.out_w() * sizeof(double);
  WorkspaceLimitGuard limit(2 * per_image + per_image / 2);
  expect_conv2d_forward_and_backward_match(c);
}

TEST(WorkspaceLimitTest, WholeBatchInOneChunkGivesSameResults) {
  seed_for_current_test();
  WorkspaceLimitGuard limit(int64_t{1} << 30);
  expect_conv2d_forward_and_backward_match({6, 4, 9, 8, 4, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, true});
  expect_conv2d_forward_and_backward_match({6, 4, 9, 8, 4, 1, 3, {1, 1}, {0, 1}, {1, 2}, 4, false});
}

}  // namespace
