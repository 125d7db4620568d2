// The ops on CUDA, compared with PyTorch's float64 reference computed on the
// CPU from the same values. Every test skips when no GPU is available.
#include "test_support.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <ATen/Context.h>

#if __has_include(<cuda_runtime_api.h>) && __has_include(<ATen/cuda/CUDAGraph.h>)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#define CUSTOMCONV_TEST_CUDA_RUNTIME 1
#endif

namespace {

using namespace customconv_test;
using torch::autograd::grad;

// float32 results are checked at float32's precision. conv2d follows cuDNN's
// TF32 flag for convolutions, as F.conv2d does, and PyTorch allows TF32 there
// by default; this turns it off for every test in the binary.
class IeeeFloat32Environment : public ::testing::Environment {
 public:
  void SetUp() override { at::globalContext().setAllowTF32CuDNN(false); }
};
[[maybe_unused]] ::testing::Environment* const kIeeeFloat32 =
    ::testing::AddGlobalTestEnvironment(new IeeeFloat32Environment);

constexpr double kF64Rtol = 1e-9, kF64Atol = 1e-10;

// Tolerances against the float64 reference of the same (rounded) values.
struct Tolerance {
  at::ScalarType dtype;
  double rtol, atol;
};
constexpr Tolerance kFloat64{at::kDouble, kF64Rtol, kF64Atol};
constexpr Tolerance kFloat32{at::kFloat, 1e-4, 1e-4};
constexpr Tolerance kFloat16{at::kHalf, 1e-2, 3e-2};
constexpr Tolerance kBFloat16{at::kBFloat16, 3e-2, 1.5e-1};

#define SKIP_WITHOUT_CUDA()                                        \
  do {                                                             \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

const torch::Device kCuda(torch::kCUDA, 0);

// Runs conv2d on CUDA in `tol.dtype`: output and, when `backward`, the
// gradients of input, weight and bias, all compared with the CPU float64
// reference of the same rounded values.
void expect_cuda_conv2d_matches_cpu(const ConvConfig& c, const Tolerance& tol, bool backward) {
  SCOPED_TRACE(c.describe() + " dtype " + std::string(c10::toString(tol.dtype)));
  const ConvTensors t = make_conv_tensors(c);
  auto on_cuda = [&](const at::Tensor& v) {
    return v.to(kCuda, tol.dtype).detach().requires_grad_(backward);
  };
  const at::Tensor x = on_cuda(t.input), w = on_cuda(t.weight);
  const at::Tensor b = c.bias ? on_cuda(t.bias) : at::Tensor();
  const at::Tensor out =
      customconv::conv2d(x, w, optional_bias(b), c.stride, c.padding, c.dilation, c.groups);
  EXPECT_TRUE(out.is_cuda());
  EXPECT_EQ(out.scalar_type(), tol.dtype);

  auto on_cpu = [&](const at::Tensor& v) {
    return v.detach().to(at::kCPU, at::kDouble).requires_grad_(backward);
  };
  const at::Tensor rx = on_cpu(x), rw = on_cpu(w);
  const at::Tensor rb = c.bias ? on_cpu(b) : at::Tensor();
  const at::Tensor ref = reference_conv2d(c, rx, rw, rb);
  EXPECT_TRUE(all_close(out, ref, tol.rtol, tol.atol)) << "output";
  if (!backward) return;

  const at::Tensor go = torch::randn(out.sizes(), torch::kDouble).to(tol.dtype);
  std::vector<at::Tensor> inputs{x, w}, ref_inputs{rx, rw};
  if (c.bias) {
    inputs.push_back(b);
    ref_inputs.push_back(rb);
  }
  const auto grads = grad({out}, inputs, {go.to(kCuda)});
  const auto ref_grads = grad({ref}, ref_inputs, {go.to(at::kDouble)});
  const char* names[] = {"grad input", "grad weight", "grad bias"};
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_TRUE(grads[i].is_cuda()) << names[i];
    EXPECT_EQ(grads[i].scalar_type(), tol.dtype) << names[i];
    // Gradients sum over the batch and the window positions: scale atol with them.
    EXPECT_TRUE(all_close(grads[i], ref_grads[i], tol.rtol, 4 * tol.atol)) << names[i];
  }
}

TEST(Conv2dCudaTest, MatchesCpuReferenceInFloat64) {
  const uint64_t seed = seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  auto configs = fixed_conv_configs();
  for (const auto& c : random_conv_configs(seed, 30)) configs.push_back(c);
  for (const auto& c : configs) expect_cuda_conv2d_matches_cpu(c, kFloat64, /*backward=*/false);
}

TEST(Conv2dCudaTest, MatchesCpuReferenceInFloat32Float16AndBFloat16) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  for (const auto& tol : {kFloat32, kFloat16, kBFloat16}) {
    for (const auto& c : fixed_conv_configs()) expect_cuda_conv2d_matches_cpu(c, tol, false);
  }
}

TEST(Conv2dCudaTest, GradientsMatchCpuReference) {
  const uint64_t seed = seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  auto configs = fixed_conv_configs();
  for (const auto& c : random_conv_configs(seed, 15)) configs.push_back(c);
  for (const auto& c : configs) expect_cuda_conv2d_matches_cpu(c, kFloat64, /*backward=*/true);
  for (const auto& tol : {kFloat32, kFloat16, kBFloat16}) {
    for (const auto& c : fixed_conv_configs()) expect_cuda_conv2d_matches_cpu(c, tol, true);
  }
}

TEST(Conv2dCudaTest, AcceptsNonContiguousAndUnbatchedInput) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  const ConvConfig c{2, 4, 9, 8, 6, 3, 2, {2, 1}, {1, 1}, {1, 2}, 2, true};
  const ConvTensors t = make_conv_tensors(c);
  const at::Tensor x = t.input.permute({0, 2, 3, 1}).to(kCuda).contiguous().permute({0, 3, 1, 2});
  const at::Tensor w = t.weight.to(kCuda).transpose(2, 3).contiguous().transpose(2, 3);
  ASSERT_FALSE(x.is_contiguous());
  ASSERT_FALSE(w.is_contiguous());
  const at::Tensor b = t.bias.to(kCuda);
  EXPECT_TRUE(all_close(customconv::conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups),
                        reference_conv2d(c, t.input, t.weight, t.bias), kF64Rtol, kF64Atol));
  const at::Tensor sliced = torch::randn({c.n, c.c, 2 * c.h, c.w + 2}, torch::kDouble);
  const at::Tensor view = sliced.to(kCuda).slice(2, 0, 2 * c.h, 2).slice(3, 2, c.w + 2);
  ASSERT_FALSE(view.is_contiguous());
  EXPECT_TRUE(all_close(
      customconv::conv2d(view, w, b, c.stride, c.padding, c.dilation, c.groups),
      reference_conv2d(c, sliced.slice(2, 0, 2 * c.h, 2).slice(3, 2, c.w + 2), t.weight, t.bias),
      kF64Rtol, kF64Atol));
  EXPECT_TRUE(all_close(
      customconv::conv2d(x[1], w, b, c.stride, c.padding, c.dilation, c.groups),
      reference_conv2d(c, t.input[1], t.weight, t.bias), kF64Rtol, kF64Atol));
}

TEST(Conv2dCudaTest, SmallWorkspaceLimitGivesSameResults) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  const ConvConfig c{5, 4, 9, 8, 6, 3, 2, {1, 1}, {1, 0}, {1, 1}, 2, true};
  {
    WorkspaceLimitGuard limit(1);  // one image per chunk
    expect_cuda_conv2d_matches_cpu(c, kFloat64, /*backward=*/true);
  }
  {
    const int64_t per_image = (c.c * c.kh * c.kw + c.k) * c.out_h() * c.out_w() * sizeof(double);
    WorkspaceLimitGuard limit(2 * per_image + per_image / 2);  // chunks of 2, 2 and 1 images
    expect_cuda_conv2d_matches_cpu(c, kFloat64, /*backward=*/true);
  }
}

TEST(Im2colCudaTest, MatchesUnfoldOnCpu) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  for (const auto& c : window_configs()) {
    SCOPED_TRACE(c.describe());
    for (auto dtype : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16}) {
      const at::Tensor x = torch::randn({c.n, c.c, c.h, c.w}, torch::kDouble).to(dtype);
      const at::Tensor cols =
          customconv::im2col(x.to(kCuda), c.kernel_size, c.stride, c.padding, c.dilation);
      EXPECT_TRUE(cols.is_cuda());
      EXPECT_EQ(cols.scalar_type(), dtype);
      // A gather: exactly equal in every dtype.
      EXPECT_TRUE(all_close(cols, reference_unfold(x.to(at::kDouble), c.kernel_size, c.stride,
                                                   c.padding, c.dilation),
                            0, 0))
          << c10::toString(dtype);
    }
  }
}

TEST(Col2imCudaTest, MatchesFoldOnCpu) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  for (const auto& c : window_configs()) {
    SCOPED_TRACE(c.describe());
    for (const auto& tol : {kFloat64, kFloat32, kFloat16, kBFloat16}) {
      const at::Tensor cols =
          torch::randn({c.n, c.rows(), c.length()}, torch::kDouble).to(tol.dtype);
      const at::Tensor img = customconv::col2im(cols.to(kCuda), {c.h, c.w}, c.kernel_size,
                                                c.stride, c.padding, c.dilation);
      EXPECT_TRUE(img.is_cuda());
      EXPECT_EQ(img.scalar_type(), tol.dtype);
      EXPECT_TRUE(all_close(img, reference_fold(cols.to(at::kDouble), {c.h, c.w}, c.kernel_size,
                                                c.stride, c.padding, c.dilation),
                            tol.rtol, tol.atol))
          << c10::toString(tol.dtype);
    }
  }
}

TEST(Im2colCudaTest, GradientsOfIm2colAndCol2imMatchCpuReference) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  for (const auto& c : window_configs()) {
    SCOPED_TRACE(c.describe());
    const at::Tensor x = torch::randn({c.n, c.c, c.h, c.w}, torch::kDouble);
    const at::Tensor gcols = torch::randn({c.n, c.rows(), c.length()}, torch::kDouble);
    const at::Tensor xc = x.to(kCuda).requires_grad_();
    const at::Tensor cols = customconv::im2col(xc, c.kernel_size, c.stride, c.padding, c.dilation);
    const at::Tensor gx = grad({cols}, {xc}, {gcols.to(kCuda)})[0];
    const at::Tensor rx = x.clone().requires_grad_();
    const at::Tensor rgx = grad({reference_unfold(rx, c.kernel_size, c.stride, c.padding,
                                                  c.dilation)},
                                {rx}, {gcols})[0];
    EXPECT_TRUE(all_close(gx, rgx, kF64Rtol, kF64Atol)) << "im2col";

    const at::Tensor colsc = gcols.to(kCuda).requires_grad_();
    const at::Tensor img =
        customconv::col2im(colsc, {c.h, c.w}, c.kernel_size, c.stride, c.padding, c.dilation);
    const at::Tensor gc = grad({img}, {colsc}, {x.to(kCuda)})[0];
    const at::Tensor rc = gcols.clone().requires_grad_();
    const at::Tensor rgc = grad({reference_fold(rc, {c.h, c.w}, c.kernel_size, c.stride,
                                                c.padding, c.dilation)},
                                {rc}, {x})[0];
    EXPECT_TRUE(all_close(gc, rgc, 0, 0)) << "col2im";
  }
}

TEST(CudaErrorTest, RejectsTensorsOnDifferentDevices) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  const at::Tensor x = torch::randn({2, 4, 8, 8}), w = torch::randn({6, 4, 3, 3}),
                   b = torch::randn({6});
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x.to(kCuda), w, b.to(kCuda)), "device");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x.to(kCuda), w, b.to(kCuda)), "weight");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w.to(kCuda), b), "device");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x.to(kCuda), w.to(kCuda), b), "bias");
  const at::Tensor go = torch::randn({2, 6, 6, 6});
  EXPECT_C10_ERROR_MENTIONING(
      customconv::detail::conv2d_grad_input(go, x.to(kCuda), w.to(kCuda), {1, 1}, {0, 0}, {1, 1},
                                            1),
      "device");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::detail::conv2d_grad_weight(go.to(kCuda), x.to(kCuda), w, {1, 1}, {0, 0},
                                             {1, 1}, 1),
      "device");
}

TEST(CudaErrorTest, RejectsBadArgumentsLikeTheCpu) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  const at::Tensor x = torch::randn({2, 4, 8, 8}, torch::device(kCuda));
  const at::Tensor w = torch::randn({6, 2, 3, 3}, torch::device(kCuda));
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, std::nullopt, 1, 0, 1, 1),
                              "weight.size(1) * groups");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, std::nullopt, 1, 0, 1, 0), "groups");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, std::nullopt, 0, 0, 1, 2), "stride");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, std::nullopt, 1, 0, 0, 2), "dilation");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, std::nullopt, 1, -1, 1, 2), "padding");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::conv2d(x, w, std::nullopt, 1, 0, {int64_t{1} << 40, 1}, 2), "dilat");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w, torch::randn({5}, torch::device(kCuda)),
                                                 1, 0, 1, 2),
                              "bias");
  EXPECT_C10_ERROR_MENTIONING(customconv::conv2d(x, w.to(at::kHalf), std::nullopt, 1, 0, 1, 2),
                              "dtype");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::conv2d(x.to(at::kInt), w.to(at::kInt), std::nullopt, 1, 0, 1, 2), "input");
  EXPECT_C10_ERROR_MENTIONING(
      customconv::col2im(torch::randn({2, 18, 15}, torch::device(kCuda)), {6, 6}, {3, 3}),
      "columns.size(2)");
  EXPECT_C10_ERROR_MENTIONING(customconv::im2col(x, {9, 3}), "output size");
}

TEST(CudaErrorTest, NextValidCallWorksAfterAnError) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  const ConvConfig c{3, 4, 10, 9, 6, 3, 3, {2, 1}, {1, 1}, {1, 2}, 2, true};
  const ConvTensors t = make_conv_tensors(c);
  const at::Tensor x = t.input.to(kCuda), w = t.weight.to(kCuda), b = t.bias.to(kCuda);
  const at::Tensor expected = reference_conv2d(c, t.input, t.weight, t.bias);
  auto valid_call = [&] {
    return customconv::conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
  };
  EXPECT_THROW(customconv::conv2d(x, w, b, 0, c.padding, c.dilation, c.groups), c10::Error);
  EXPECT_TRUE(all_close(valid_call(), expected, kF64Rtol, kF64Atol)) << "after stride 0";
  EXPECT_THROW(customconv::conv2d(x, w.cpu(), b, c.stride, c.padding, c.dilation, c.groups),
               c10::Error);
  EXPECT_TRUE(all_close(valid_call(), expected, kF64Rtol, kF64Atol)) << "after mixed devices";
  EXPECT_THROW(customconv::col2im(torch::randn({1, 9, 7}, torch::device(kCuda).dtype(at::kDouble)),
                                  {5, 5}, {3, 3}),
               c10::Error);
  EXPECT_THROW(customconv::conv2d(x, w, b, c.stride, c.padding, {int64_t{1} << 40, 1}, c.groups),
               c10::Error);
  torch::cuda::synchronize();
  EXPECT_TRUE(all_close(valid_call(), expected, kF64Rtol, kF64Atol)) << "after several errors";
  // Backward still works too.
  const at::Tensor xg = x.clone().requires_grad_();
  EXPECT_THROW(customconv::conv2d(xg, w, b, c.stride, c.padding, c.dilation, 5), c10::Error);
  const at::Tensor out = customconv::conv2d(xg, w, b, c.stride, c.padding, c.dilation, c.groups);
  const at::Tensor go = torch::randn(out.sizes(), torch::kDouble);
  const at::Tensor rx = t.input.clone().requires_grad_();
  EXPECT_TRUE(all_close(grad({out}, {xg}, {go.to(kCuda)})[0],
                        grad({reference_conv2d(c, rx, t.weight, t.bias)}, {rx}, {go})[0],
                        kF64Rtol, kF64Atol));
  torch::cuda::synchronize();
}

#ifdef CUSTOMCONV_TEST_CUDA_RUNTIME

// A CUDA graph captures only work launched on the capturing (current) stream;
// a kernel launched on the legacy default stream makes the capture fail.
TEST(Conv2dCudaTest, RunsOnTheCurrentStreamAndReplaysFromACudaGraph) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  const ConvConfig c{4, 4, 12, 10, 6, 3, 3, {1, 2}, {1, 1}, {2, 1}, 2, true};
  ConvTensors t = make_conv_tensors(c);
  const at::Tensor x = t.input.to(kCuda, at::kFloat), w = t.weight.to(kCuda, at::kFloat),
                   b = t.bias.to(kCuda, at::kFloat);
  const at::Tensor cols_in = torch::randn({2, 3, 9, 9}, torch::device(kCuda));
  auto run = [&] {
    return std::make_pair(
        customconv::conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups),
        customconv::col2im(customconv::im2col(cols_in, {3, 2}, {2, 1}, {1, 0}, {1, 2}), {9, 9},
                           {3, 2}, {2, 1}, {1, 0}, {1, 2}));
  };
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAGraph graph;
  std::pair<at::Tensor, at::Tensor> out;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    run();  // warm-up on the capturing stream (library handles, allocator)
    side.synchronize();
    graph.capture_begin();
    out = run();
    graph.capture_end();
  }
  // New values in the captured inputs, then replay.
  const at::Tensor x2 = torch::randn(x.sizes(), torch::kDouble);
  const at::Tensor img2 = torch::randn(cols_in.sizes(), torch::kDouble);
  x.copy_(x2);
  cols_in.copy_(img2);
  graph.replay();
  torch::cuda::synchronize();
  EXPECT_TRUE(all_close(out.first,
                        reference_conv2d(c, x2.to(at::kFloat).to(at::kDouble),
                                         w.cpu().to(at::kDouble), b.cpu().to(at::kDouble)),
                        1e-4, 1e-4));
  const at::Tensor img2f = img2.to(at::kFloat).to(at::kDouble);
  EXPECT_TRUE(all_close(out.second,
                        reference_fold(reference_unfold(img2f, {3, 2}, {2, 1}, {1, 0}, {1, 2}),
                                       {9, 9}, {3, 2}, {2, 1}, {1, 0}, {1, 2}),
                        1e-5, 1e-5));
}

TEST(Conv2dCudaTest, WorksOnASecondDeviceWhileAnotherIsCurrent) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const torch::Device second(torch::kCUDA, 1);
  const c10::cuda::CUDAGuard current(0);
  const ConvConfig c{3, 4, 10, 9, 6, 3, 3, {2, 1}, {1, 1}, {1, 2}, 2, true};
  const ConvTensors t = make_conv_tensors(c);
  const at::Tensor xg = t.input.to(second).requires_grad_();
  const at::Tensor out = customconv::conv2d(xg, t.weight.to(second), t.bias.to(second), c.stride,
                                            c.padding, c.dilation, c.groups);
  EXPECT_EQ(out.device(), second);
  EXPECT_TRUE(all_close(out, reference_conv2d(c, t.input, t.weight, t.bias), kF64Rtol, kF64Atol));
  const at::Tensor go = torch::randn(out.sizes(), torch::kDouble);
  const at::Tensor gx = grad({out}, {xg}, {go.to(second)})[0];
  EXPECT_EQ(gx.device(), second);
  const at::Tensor rx = t.input.clone().requires_grad_();
  EXPECT_TRUE(all_close(gx, grad({reference_conv2d(c, rx, t.weight, t.bias)}, {rx}, {go})[0],
                        kF64Rtol, kF64Atol));
  EXPECT_C10_ERROR_MENTIONING(
      customconv::conv2d(t.input.to(second), t.weight.to(kCuda), std::nullopt), "device");
}

// Sizes past 2^31 elements need 64-bit index arithmetic in the kernels.
TEST(Im2colCudaTest, HandlesTensorsOfMoreThan2Pow31Elements) {
  seed_for_current_test();
  SKIP_WITHOUT_CUDA();
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (free_bytes < (size_t{24} << 30)) GTEST_SKIP() << "needs 24 GiB of free GPU memory";
  // (1, 1, 46400, 46400) in float16: 2'152'960'000 elements, 4.3 GB.
  const int64_t side = 46400;
  ASSERT_GT(side * side, int64_t{1} << 31);
  const at::Tensor x =
      torch::randn({1, 1, side, side}, torch::device(kCuda).dtype(at::kHalf));
  // Non-overlapping windows (stride == kernel): every element lands in exactly
  // one column entry, so col2im(im2col(x)) == x exactly.
  const at::Tensor cols = customconv::im2col(x, {2, 1}, {2, 1});
  ASSERT_EQ(cols.numel(), x.numel());
  EXPECT_TRUE(at::equal(cols, at::im2col(x, {2, 1}, {1, 1}, {0, 0}, {2, 1})));
  // The last window position of the last row reads the last elements of x.
  EXPECT_TRUE(at::equal(cols.select(2, cols.size(2) - 1).flatten(),
                        x.select(3, side - 1).slice(2, side - 2, side).flatten()));
  const at::Tensor back = customconv::col2im(cols, {side, side}, {2, 1}, {2, 1});
  EXPECT_TRUE(at::equal(back, x));
}

#endif  // CUSTOMCONV_TEST_CUDA_RUNTIME

}  // namespace
