#include "ops/conv2d/implicit_gemm.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <limits>

namespace customconv {
namespace {

constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0; }

bool fits_int(int64_t v) { return v <= std::numeric_limits<int>::max(); }

// Whether the engine takes the geometry and dtype (any pass): 16-bit, batched,
// groups 1, C and K multiples of 8 and not zero, every size an int.
bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  const auto dtype = input.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16) return false;
  if (!s.in.batched || s.groups != 1 || s.in.c == 0 || s.in.c % 8 != 0 || s.k == 0 ||
      s.k % 8 != 0) {
    return false;
  }
  const Window2d& win = s.win;
  for (int64_t v : {s.in.n * s.in.c * s.in.h * s.in.w, s.k * s.in.c * win.kh * win.kw,
                    s.in.n * s.k * s.oh * s.ow, win.ph, win.pw, win.sh, win.sw, win.dh, win.dw}) {
    if (!fits_int(v)) return false;
  }
  return true;
}

// A channels_last tensor the kernels can read in place: dense and aligned.
bool readable(const at::Tensor& t) { return t.is_contiguous(kChannelsLast) && aligned16(t); }

at::Tensor empty_channels_last(const at::Tensor& like, int64_t n, int64_t c, int64_t h, int64_t w,
                               at::ScalarType dtype) {
  return at::empty({n, c, h, w}, like.options().dtype(dtype).memory_format(kChannelsLast));
}

// The problem with the geometry of s and no tensors yet.
implicit_gemm::ConvProblem geometry(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  const Window2d& win = s.win;
  implicit_gemm::ConvProblem pr{};
  pr.n = int(s.in.n), pr.h = int(s.in.h), pr.w = int(s.in.w), pr.c = int(s.in.c);
  pr.k = int(s.k), pr.r = int(win.kh), pr.s = int(win.kw), pr.p = int(s.oh), pr.q = int(s.ow);
  pr.pad_h = int(win.ph), pr.pad_w = int(win.pw), pr.stride_h = int(win.sh);
  pr.stride_w = int(win.sw), pr.dilation_h = int(win.dh), pr.dilation_w = int(win.dw);
  pr.device = int(input.get_device());
  pr.stream = at::cuda::getCurrentCUDAStream().stream();
  return pr;
}

bool is_half(const at::Tensor& t) { return t.scalar_type() == at::kHalf; }

// Reduction slices for the weight gradient: enough blocks to fill the device
// twice over, each slice at least 1024 positions long, their float32 planes
// within 48 MiB.
int split_k_for(const Conv2dShape<int64_t>& s, int device) {
  const int64_t tiles = ((s.k + implicit_gemm::kWgradTileRows - 1) / implicit_gemm::kWgradTileRows) *
                        ((s.win.kh * s.win.kw * s.in.c + implicit_gemm::kWgradTileCols - 1) /
                         implicit_gemm::kWgradTileCols);
  const int64_t wanted = (2 * implicit_gemm::wgrad_resident_blocks(device) + tiles - 1) / tiles;
  const int64_t by_length = (s.in.n * s.oh * s.ow) / 1024;
  const int64_t plane_bytes = s.k * s.win.kh * s.win.kw * s.in.c * 4;
  const int64_t by_memory = (int64_t(48) << 20) / plane_bytes;
  return int(std::max<int64_t>(1, std::min({wanted, by_length, by_memory, int64_t(256)})));
}

}  // namespace

std::optional<at::Tensor> implicit_gemm_conv2d(const at::Tensor& input, const at::Tensor& weight,
                                               const std::optional<at::Tensor>& bias,
                                               const Conv2dShape<int64_t>& s) {
  // Channels_last input only: an NCHW input keeps the NCHW route (no hidden layout copy).
  if (!takes(input, s) || !readable(input)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor w = weight.contiguous(kChannelsLast);  // (K, kh, kw, C) in memory
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  if (!aligned16(w) || (has_bias && !aligned16(b))) return std::nullopt;
  at::Tensor out = empty_channels_last(input, s.in.n, s.k, s.oh, s.ow, input.scalar_type());
  if (out.numel() == 0) return out;
  implicit_gemm::ConvProblem pr = geometry(input, s);
  pr.input = const_cast<void*>(input.const_data_ptr());
  pr.weight = const_cast<void*>(w.const_data_ptr());
  pr.output = out.mutable_data_ptr();
  pr.bias = has_bias ? b.const_data_ptr() : nullptr;
  if (!(is_half(input) ? implicit_gemm::fprop_f16(pr) : implicit_gemm::fprop_bf16(pr))) {
    return std::nullopt;
  }
  return out;
}

std::optional<at::Tensor> implicit_gemm_conv2d_grad_input(const at::Tensor& grad_output,
                                                          const at::Tensor& input,
                                                          const at::Tensor& weight,
                                                          const Conv2dShape<int64_t>& s) {
  // Stride 1 is the forward kernel's (conv2d.cpp); dilation is not the
  // strided kernel's.
  const Window2d& win = s.win;
  if ((win.sh == 1 && win.sw == 1) || win.dh != 1 || win.dw != 1) return std::nullopt;
  if (!takes(input, s) || s.in.n * s.in.h * s.in.w == 0) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor go = grad_output.contiguous(kChannelsLast);  // as F.conv2d's backward reads it
  const at::Tensor w = weight.contiguous(kChannelsLast);
  if (!aligned16(go) || !aligned16(w)) return std::nullopt;
  at::Tensor gi = empty_channels_last(input, s.in.n, s.in.c, s.in.h, s.in.w, input.scalar_type());
  implicit_gemm::ConvProblem pr = geometry(input, s);
  pr.input = gi.mutable_data_ptr();
  pr.weight = const_cast<void*>(w.const_data_ptr());
  pr.output = const_cast<void*>(go.const_data_ptr());
  if (!(is_half(input) ? implicit_gemm::dgrad_f16(pr) : implicit_gemm::dgrad_bf16(pr))) {
    return std::nullopt;
  }
  return gi;
}

std::optional<at::Tensor> implicit_gemm_conv2d_grad_weight(const at::Tensor& grad_output,
                                                           const at::Tensor& input,
                                                           const at::Tensor& weight,
                                                           const Conv2dShape<int64_t>& s) {
  if (!takes(input, s) || !readable(input) || s.in.n * s.oh * s.ow == 0) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor go = grad_output.contiguous(kChannelsLast);
  if (!aligned16(go)) return std::nullopt;
  implicit_gemm::ConvProblem pr = geometry(input, s);
  pr.split_k = split_k_for(s, pr.device);
  if (implicit_gemm::wgrad_resident_blocks(pr.device) == 0) return std::nullopt;
  // The slices' float32 (K, kh, kw, C) planes, summed in order and rounded once.
  const at::Tensor planes = at::empty({pr.split_k, s.k, s.win.kh, s.win.kw, s.in.c},
                                      input.options().dtype(at::kFloat));
  pr.input = const_cast<void*>(input.const_data_ptr());
  pr.output = const_cast<void*>(go.const_data_ptr());
  pr.weight = planes.mutable_data_ptr();
  if (!(is_half(input) ? implicit_gemm::wgrad_f16(pr) : implicit_gemm::wgrad_bf16(pr))) {
    return std::nullopt;
  }
  // (K, kh, kw, C) in memory: the (K, C, kh, kw) gradient, channels_last.
  return at::sum(planes, {0}, false, input.scalar_type()).permute({0, 3, 1, 2});
}

}  // namespace customconv
