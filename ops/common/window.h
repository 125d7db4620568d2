// Sliding-window geometry shared by every kernel family: argument checks and
// output-size arithmetic. Written once, templated on the integer type so the
// same code serves the CPU and CUDA kernels (int64_t) and the meta kernels
// used for fake tensors under torch.compile / torch.export (c10::SymInt).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <type_traits>

namespace customconv {

// The four int[2] arguments of a 2-D sliding window, validated.
struct Window2d {
  int64_t kh, kw;  // kernel size
  int64_t sh, sw;  // stride
  int64_t ph, pw;  // zero padding on each side
  int64_t dh, dw;  // dilation

  // Span of the dilated kernel: dilation * (k - 1) + 1 (checked not to overflow).
  int64_t extent_h() const { return dh * (kh - 1) + 1; }
  int64_t extent_w() const { return dw * (kw - 1) + 1; }
  // A 1x1 window with stride 1 and no padding: each output position reads its
  // own input position, so the convolution is a matrix product over positions.
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

// Validates kernel_size > 0, stride > 0, padding >= 0, dilation > 0, every list
// of length 2 (a single value is broadcast, as the schema's int[2] allows), and
// that the dilated extent and twice the padding fit in 64 bits.
// `kernel_size` may be empty for ops whose kernel size comes from a tensor;
// then `kh`/`kw` are taken from those arguments.
Window2d check_window(const char* op, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation);
Window2d check_window(const char* op, int64_t kh, int64_t kw, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation);

// Size of one tensor dimension as int64_t or c10::SymInt.
template <class I>
inline I dim_size(const at::Tensor& t, int64_t d) {
  if constexpr (std::is_same_v<I, int64_t>) {
    return t.size(d);
  } else {
    return t.sym_size(d);
  }
}

// Reads a dimension that must be static (a kernel size, a channel count) as a
// concrete integer; under symbolic shapes this specializes on its value.
template <class I>
inline int64_t concrete_size_of(const at::Tensor& t, int64_t d) {
  if constexpr (std::is_same_v<I, int64_t>) {
    return t.size(d);
  } else {
    return t.sym_size(d).guard_int(__FILE__, __LINE__);
  }
}

// Throws unless a * b (both non-negative) fits in int64_t; returns the product.
int64_t checked_mul(const char* op, const char* what, int64_t a, int64_t b);

// Output length of a sliding window along one axis:
//   (in + 2 * pad - extent) / stride + 1, refused when it would be <= 0.
template <class I>
I window_output_size(const char* op, const char* axis, const I& in, int64_t extent, int64_t stride,
                     int64_t pad) {
  const I padded = in + 2 * pad;
  TORCH_CHECK(padded >= extent, op, ": the kernel spans ", extent, " along ", axis,
              " (dilation * (kernel_size - 1) + 1), more than the padded input (", in, " + 2*", pad,
              " = ", padded, "); the output size would be <= 0");
  return (padded - extent) / stride + 1;
}

}  // namespace customconv
