#include "ops/filter2d/filter2d.h"

#include <ATen/ATen.h>

namespace customconv {
namespace {

// The input as contiguous planes (P, H, W).
at::Tensor as_planes(const at::Tensor& t) {
  return t.reshape({-1, t.size(-2), t.size(-1)}).contiguous();
}

}  // namespace

at::Tensor filter2d_impl(const Filter2dKernels& kernels, const at::Tensor& input,
                         const at::Tensor& kernel, c10::string_view border) {
  const auto s = check_filter2d<int64_t>("filter2d", input, kernel, border);
  at::Tensor out =
      at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  kernels.forward(as_planes(input), kernel.contiguous(),
                  out.view({-1, input.size(-2), input.size(-1)}), s);
  return out;
}

at::Tensor filter2d_grad_input_impl(const Filter2dKernels& kernels, const at::Tensor& grad_output,
                                    const at::Tensor& kernel, c10::string_view border) {
  const auto s =
      check_filter2d<int64_t>("filter2d_grad_input", grad_output, kernel, border, "grad_output");
  at::Tensor gi = at::empty(grad_output.sizes(),
                            grad_output.options().memory_format(at::MemoryFormat::Contiguous));
  if (gi.numel() == 0) return gi;
  kernels.grad_input(as_planes(grad_output), kernel.contiguous(),
                     gi.view({-1, gi.size(-2), gi.size(-1)}), s);
  return gi;
}

at::Tensor filter2d_grad_kernel_impl(const Filter2dKernels& kernels, const at::Tensor& grad_output,
                                     const at::Tensor& input, const at::Tensor& kernel,
                                     c10::string_view border) {
  const char* op = "filter2d_grad_kernel";
  const auto s = check_filter2d_grad_kernel<int64_t>(op, grad_output, input, kernel, border);
  at::Tensor gk = at::empty(kernel.sizes(), kernel.options());
  if (input.numel() == 0) return gk.zero_();
  kernels.grad_kernel(as_planes(grad_output), as_planes(input), gk, s);
  return gk;
}

}  // namespace customconv
