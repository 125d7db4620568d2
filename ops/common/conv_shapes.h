// Argument checks and output shapes of conv2d, im2col and col2im. Templated on
// the integer type: int64_t for the CPU/CUDA kernels, c10::SymInt for the meta
// kernels that serve fake tensors, so both see exactly the same rules.
#pragma once

#include <c10/util/safe_numerics.h>

#include <optional>

#include "ops/common/tensor_checks.h"
#include "ops/common/window.h"

namespace customconv {

// Input (N, C, H, W) or unbatched (C, H, W), seen as a batch.
template <class I>
struct ImageShape {
  bool batched;
  I n, c, h, w;
};

template <class I>
ImageShape<I> read_image(const at::Tensor& t) {
  const bool batched = t.dim() == 4;
  const int64_t o = batched ? 1 : 0;
  return {batched, batched ? dim_size<I>(t, 0) : I(1), dim_size<I>(t, o), dim_size<I>(t, o + 1),
          dim_size<I>(t, o + 2)};
}

// The value of a size, where it is known (always for int64_t).
inline std::optional<int64_t> as_int(int64_t v) { return v; }
inline std::optional<int64_t> as_int(const c10::SymInt& v) { return v.maybe_as_int(); }

// Rejects sizes whose element count would not fit in 64 bits (kernels index with int64).
inline void check_numel(const char* op, const char* what, std::initializer_list<int64_t> sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n = checked_mul(op, what, n, s);
}

// The memory format of conv2d's output, F.conv2d's rule: channels_last when the
// input is batched (4 dims) and it or the weight is laid out channels_last,
// else contiguous (NCHW). The CPU, CUDA and meta kernels all follow it.
inline at::MemoryFormat conv2d_output_format(const at::Tensor& input, const at::Tensor& weight) {
  const bool channels_last = input.dim() == 4 && weight.dim() == 4 &&
                             (input.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
                              weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast);
  return channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

template <class I>
struct Conv2dShape {
  ImageShape<I> in;
  I k;       // output channels
  I oh, ow;  // output height and width
  int64_t groups;
  Window2d win;
};

template <class I>
Conv2dShape<I> check_conv2d(const char* op, const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                            c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  check_dims(op, "input", input, {3, 4});
  check_dims(op, "weight", weight, {4});
  check_floating(op, "input", input);
  check_same_dtype_device(op, "weight", weight, "input", input);
  TORCH_CHECK(groups > 0, op, ": groups must be positive; got ", groups);

  Conv2dShape<I> s{};
  s.in = read_image<I>(input);
  s.groups = groups;
  s.k = dim_size<I>(weight, 0);
  const I wc = dim_size<I>(weight, 1);
  TORCH_CHECK(s.in.c % groups == 0, op, ": groups (", groups, ") must divide the input channels (",
              s.in.c, ")");
  TORCH_CHECK(s.k % groups == 0, op, ": groups (", groups,
              ") must divide the output channels weight.size(0) (", s.k, ")");
  TORCH_CHECK(wc * groups == s.in.c, op, ": input has ", s.in.c,
              " channels but weight.size(1) * groups = ", wc, " * ", groups,
              "; weight must be (out_channels, in_channels / groups, kh, kw)");
  if (bias.has_value() && bias->defined()) {
    check_dims(op, "bias", *bias, {1});
    check_same_dtype_device(op, "bias", *bias, "input", input);
    TORCH_CHECK(dim_size<I>(*bias, 0) == s.k, op, ": bias has ", dim_size<I>(*bias, 0),
                " elements but there are ", s.k, " output channels");
  }
  s.win = check_window(op, concrete_size_of<I>(weight, 2), concrete_size_of<I>(weight, 3), stride,
                       padding, dilation);
  s.oh = window_output_size<I>(op, "height", s.in.h, s.win.extent_h(), s.win.sh, s.win.ph);
  s.ow = window_output_size<I>(op, "width", s.in.w, s.win.extent_w(), s.win.sw, s.win.pw);
  if constexpr (std::is_same_v<I, int64_t>) {
    check_numel(op, "the output size", {s.in.n, s.k, s.oh, s.ow});
    check_numel(op, "the column buffer of one image", {s.in.c, s.win.kh, s.win.kw, s.oh, s.ow});
  }
  return s;
}

// depthwise_conv2d: conv2d with groups == C and weight (C*m, 1, kh, kw), m >= 1.
template <class I>
Conv2dShape<I> check_depthwise_conv2d(const char* op, const at::Tensor& input,
                                      const at::Tensor& weight,
                                      const std::optional<at::Tensor>& bias,
                                      c10::IntArrayRef stride, c10::IntArrayRef padding,
                                      c10::IntArrayRef dilation) {
  check_dims(op, "input", input, {3, 4});
  check_dims(op, "weight", weight, {4});
  const int64_t c = concrete_size_of<I>(input, input.dim() - 3);
  TORCH_CHECK(c > 0, op, ": input must have at least one channel; got shape ", input.sym_sizes());
  TORCH_CHECK(dim_size<I>(weight, 1) == 1, op, ": weight must be (C*m, 1, kh, kw); got shape ",
              weight.sym_sizes());
  TORCH_CHECK(dim_size<I>(weight, 0) > 0 && dim_size<I>(weight, 0) % c == 0, op,
              ": weight.size(0) (", dim_size<I>(weight, 0),
              ") must be a positive multiple of the input channels (", c,
              "): weight is (C*m, 1, kh, kw) for a channel multiplier m >= 1");
  return check_conv2d<I>(op, input, weight, bias, stride, padding, dilation, c);
}

// grad_output of conv2d's backward ops: the forward output's shape, dtype and device.
template <class I>
void check_conv2d_grad_output(const char* op, const at::Tensor& grad_output,
                              const at::Tensor& input, const Conv2dShape<I>& s) {
  check_dims(op, "grad_output", grad_output, {input.dim()});
  check_same_dtype_device(op, "grad_output", grad_output, "input", input);
  const int64_t o = s.in.batched ? 1 : 0;
  TORCH_CHECK((!s.in.batched || dim_size<I>(grad_output, 0) == s.in.n) &&
                  dim_size<I>(grad_output, o) == s.k && dim_size<I>(grad_output, o + 1) == s.oh &&
                  dim_size<I>(grad_output, o + 2) == s.ow,
              op, ": grad_output has shape ", grad_output.sym_sizes(),
              " but the convolution's output is (", s.in.n, ", ", s.k, ", ", s.oh, ", ", s.ow, ")");
}

// The arguments of conv2d's backward ops: the forward's, and its grad_output.
template <class I>
Conv2dShape<I> check_conv2d_backward(const char* op, const at::Tensor& grad_output,
                                     const at::Tensor& input, const at::Tensor& weight,
                                     c10::IntArrayRef stride, c10::IntArrayRef padding,
                                     c10::IntArrayRef dilation, int64_t groups) {
  auto s = check_conv2d<I>(op, input, weight, std::nullopt, stride, padding, dilation, groups);
  check_conv2d_grad_output(op, grad_output, input, s);
  return s;
}

// The arguments of depthwise_conv2d's backward ops.
template <class I>
Conv2dShape<I> check_depthwise_conv2d_backward(const char* op, const at::Tensor& grad_output,
                                               const at::Tensor& input, const at::Tensor& weight,
                                               c10::IntArrayRef stride, c10::IntArrayRef padding,
                                               c10::IntArrayRef dilation) {
  auto s = check_depthwise_conv2d<I>(op, input, weight, std::nullopt, stride, padding, dilation);
  check_conv2d_grad_output(op, grad_output, input, s);
  return s;
}

// im2col: input (N, C, H, W) or (C, H, W) -> (N, C*kh*kw, L) or (C*kh*kw, L).
template <class I>
struct Im2colShape {
  ImageShape<I> in;
  I oh, ow;
  Window2d win;
};

template <class I>
Im2colShape<I> check_im2col(const char* op, const at::Tensor& input, c10::IntArrayRef kernel_size,
                            c10::IntArrayRef stride, c10::IntArrayRef padding,
                            c10::IntArrayRef dilation) {
  check_dims(op, "input", input, {3, 4});
  check_floating(op, "input", input);
  Im2colShape<I> s{};
  s.in = read_image<I>(input);
  s.win = check_window(op, kernel_size, stride, padding, dilation);
  s.oh = window_output_size<I>(op, "height", s.in.h, s.win.extent_h(), s.win.sh, s.win.ph);
  s.ow = window_output_size<I>(op, "width", s.in.w, s.win.extent_w(), s.win.sw, s.win.pw);
  if constexpr (std::is_same_v<I, int64_t>) {
    check_numel(op, "the output size", {s.in.n, s.in.c, s.win.kh, s.win.kw, s.oh, s.ow});
  }
  return s;
}

// col2im: columns (N, C*kh*kw, L) or (C*kh*kw, L) -> (N, C, H, W) or (C, H, W),
// where L must equal the number of window positions on an H x W image.
template <class I>
Im2colShape<I> check_col2im(const char* op, const at::Tensor& columns, c10::IntArrayRef output_size,
                            c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                            c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  check_dims(op, "columns", columns, {2, 3});
  check_floating(op, "columns", columns);
  TORCH_CHECK(output_size.size() == 2 || output_size.size() == 1, op,
              ": output_size must be a list of 2 integers; got ", output_size);
  const int64_t h = output_size[0];
  const int64_t w = output_size.size() == 2 ? output_size[1] : output_size[0];
  TORCH_CHECK(h > 0 && w > 0, op, ": output_size must be positive; got (", h, ", ", w, ")");

  Im2colShape<I> s{};
  s.win = check_window(op, kernel_size, stride, padding, dilation);
  const bool batched = columns.dim() == 3;
  const int64_t o = batched ? 1 : 0;
  const I rows = dim_size<I>(columns, o);
  const I length = dim_size<I>(columns, o + 1);
  const int64_t taps = checked_mul(op, "kernel_size", s.win.kh, s.win.kw);
  TORCH_CHECK(rows % taps == 0, op, ": columns.size(", o, ") (", rows,
              ") must be a multiple of kh * kw = ", taps);
  s.in = {batched, batched ? dim_size<I>(columns, 0) : I(1), rows / taps, I(h), I(w)};
  s.oh = window_output_size<I>(op, "height", s.in.h, s.win.extent_h(), s.win.sh, s.win.ph);
  s.ow = window_output_size<I>(op, "width", s.in.w, s.win.extent_w(), s.win.sw, s.win.pw);
  // oh * ow may pass 2^63 (then no tensor dim can match it).
  const std::optional<int64_t> oh = as_int(s.oh), ow = as_int(s.ow);
  int64_t positions = 0;
  TORCH_CHECK(!oh || !ow || !c10::mul_overflows(*oh, *ow, &positions), op, ": columns.size(", o + 1,
              ") is ", length, " but output_size (", h, ", ", w,
              ") with this kernel_size, stride, padding and dilation has ", s.oh, " x ", s.ow,
              " window positions, more than 2^63");
  TORCH_CHECK(length == s.oh * s.ow, op, ": columns.size(", o + 1, ") is ", length,
              " but output_size (", h, ", ", w,
              ") with this kernel_size, stride, padding and "
              "dilation has ",
              s.oh, " x ", s.ow, " = ", s.oh * s.ow, " window positions");
  if constexpr (std::is_same_v<I, int64_t>) {
    check_numel(op, "the output size", {s.in.n, s.in.c, h, w});
  }
  return s;
}

}  // namespace customconv
