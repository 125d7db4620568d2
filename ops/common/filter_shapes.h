// Argument checks of filter2d, shared by the CPU, CUDA and meta kernels.
#pragma once

#include <c10/util/string_view.h>

#include <string>

#include "ops/common/tensor_checks.h"
#include "ops/common/window.h"

namespace customconv {

// How a plane is extended beyond its edges: exactly F.pad's modes.
enum class Border : int { Zeros = 0, Reflect = 1, Replicate = 2, Circular = 3 };

// Parses "zeros", "reflect", "replicate" or "circular"; anything else is an
// error listing the valid names.
Border parse_border(const char* op, c10::string_view name);

struct Filter2dShape {
  Border border;
  int64_t kh, kw;  // odd kernel sizes
  int64_t ph, pw;  // kh / 2, kw / 2
};

// input (..., H, W) with at least 2 dims; kernel (kh, kw), both odd; same dtype
// and device; reflect padding below the plane size and circular padding at most
// the plane size, as F.pad requires. `input_name` names the planes' tensor in
// errors (the backward ops check their grad_output here).
template <class I>
Filter2dShape check_filter2d(const char* op, const at::Tensor& input, const at::Tensor& kernel,
                             c10::string_view border, const char* input_name = "input") {
  TORCH_CHECK(input.defined() && input.dim() >= 2, op, ": ", input_name,
              " must have at least 2 dims (..., H, W); got ", input.defined() ? input.dim() : 0,
              " dims");
  check_dims(op, "kernel", kernel, {2});
  check_floating(op, input_name, input);
  check_same_dtype_device(op, "kernel", kernel, input_name, input);
  Filter2dShape s{};
  s.border = parse_border(op, border);
  s.kh = concrete_size_of<I>(kernel, 0);
  s.kw = concrete_size_of<I>(kernel, 1);
  TORCH_CHECK(s.kh > 0 && s.kw > 0 && s.kh % 2 == 1 && s.kw % 2 == 1, op,
              ": kernel sizes must be odd; got (", s.kh, ", ", s.kw, ")");
  s.ph = s.kh / 2;
  s.pw = s.kw / 2;
  const I h = dim_size<I>(input, input.dim() - 2);
  const I w = dim_size<I>(input, input.dim() - 1);
  if (s.border == Border::Reflect) {
    TORCH_CHECK((s.ph == 0 || s.ph < h) && (s.pw == 0 || s.pw < w), op,
                ": border 'reflect' needs the padding (", s.ph, ", ", s.pw,
                ") = kernel size // 2 to be smaller than the plane (", h, ", ", w, ") of ",
                input_name);
  } else if (s.border == Border::Circular) {
    TORCH_CHECK(s.ph <= h && s.pw <= w, op, ": border 'circular' needs the padding (", s.ph, ", ",
                s.pw, ") = kernel size // 2 to be at most the plane size (", h, ", ", w, ") of ",
                input_name);
  }
  return s;
}

// Taps the kernel gradient takes at most (kh * kw), on every device: the CUDA
// kernels give each tap a grid row, and grids have at most 65535 rows.
constexpr int64_t kMaxGradKernelTaps = 65535;

// The arguments of filter2d_grad_kernel: filter2d's, a grad_output of the
// input's shape, dtype and device, and at most kMaxGradKernelTaps taps.
template <class I>
Filter2dShape check_filter2d_grad_kernel(const char* op, const at::Tensor& grad_output,
                                         const at::Tensor& input, const at::Tensor& kernel,
                                         c10::string_view border) {
  const Filter2dShape s = check_filter2d<I>(op, input, kernel, border);
  check_same_dtype_device(op, "grad_output", grad_output, "input", input);
  TORCH_CHECK(grad_output.sym_sizes() == input.sym_sizes(), op, ": grad_output has shape ",
              grad_output.sym_sizes(), " but input has shape ", input.sym_sizes());
  TORCH_CHECK(s.kh * s.kw <= kMaxGradKernelTaps, op, ": kernel of ", s.kh, " x ", s.kw, " = ",
              s.kh * s.kw, " taps; the kernel gradient supports at most ", kMaxGradKernelTaps,
              " taps");
  return s;
}

}  // namespace customconv
