// Autocast kernels (torch.autocast on CUDA and CPU): each op casts its floating
// point tensor arguments as its closest ATen relative does under autocast, then
// runs below autocast through the dispatcher (so autograd sees the casts):
//   conv2d, conv2d_fused,
//   depthwise_conv2d, filter2d           like aten::conv2d: the autocast dtype
//                                        (float16 / bfloat16), "lower_precision_fp"
//   trilinear_interpolation              like aten::grid_sampler (trilinear sampling
//                                        of a grid): on CUDA the widest dtype of its
//                                        arguments ("promote"), on CPU float32 ("fp32")
// float64 arguments are never cast, as in ATen. im2col and col2im, like
// aten::im2col and aten::col2im, have no autocast kernel: they run in the dtype
// they are given.
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "customconv/customconv.h"

namespace customconv {
namespace {

using at::autocast::cached_cast;

template <c10::DeviceType device>
c10::DispatchKey autocast_key() {
  return at::autocast::get_autocast_dispatch_key_from_device_type(device);
}

template <c10::DeviceType device>
at::ScalarType lower_precision() {
  return at::autocast::get_lower_precision_fp_from_device_type(device);
}

template <c10::DeviceType device>
at::Tensor conv2d_autocast(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<device>());
  const auto to = lower_precision<device>();
  return customconv::conv2d(cached_cast(to, input, device), cached_cast(to, weight, device),
                            cached_cast(to, bias, device), stride, padding, dilation, groups);
}

template <c10::DeviceType device>
at::Tensor conv2d_fused_autocast(const at::Tensor& input, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                 c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                 int64_t groups, c10::string_view activation,
                                 const std::optional<at::Tensor>& residual) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<device>());
  const auto to = lower_precision<device>();
  return customconv::conv2d_fused(cached_cast(to, input, device), cached_cast(to, weight, device),
                                  cached_cast(to, bias, device), stride, padding, dilation, groups,
                                  activation, cached_cast(to, residual, device));
}

template <c10::DeviceType device>
at::Tensor depthwise_conv2d_autocast(const at::Tensor& input, const at::Tensor& weight,
                                     const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                     c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<device>());
  const auto to = lower_precision<device>();
  return customconv::depthwise_conv2d(cached_cast(to, input, device),
                                      cached_cast(to, weight, device),
                                      cached_cast(to, bias, device), stride, padding, dilation);
}

template <c10::DeviceType device>
at::Tensor filter2d_autocast(const at::Tensor& input, const at::Tensor& kernel,
                             c10::string_view border) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<device>());
  const auto to = lower_precision<device>();
  return customconv::filter2d(cached_cast(to, input, device), cached_cast(to, kernel, device),
                              border);
}

template <c10::DeviceType device>
at::Tensor trilinear_interpolation_autocast(const at::Tensor& feats, const at::Tensor& points) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<device>());
  const auto to = device == c10::DeviceType::CUDA
                      ? at::autocast::promote_type(lower_precision<device>(), device, feats, points)
                      : at::kFloat;
  return customconv::trilinear_interpolation(cached_cast(to, feats, device),
                                             cached_cast(to, points, device));
}

template <c10::DeviceType device>
void register_autocast_kernels(torch::Library& m) {
  m.impl("conv2d", TORCH_FN(conv2d_autocast<device>));
  m.impl("conv2d_fused", TORCH_FN(conv2d_fused_autocast<device>));
  m.impl("depthwise_conv2d", TORCH_FN(depthwise_conv2d_autocast<device>));
  m.impl("filter2d", TORCH_FN(filter2d_autocast<device>));
  m.impl("trilinear_interpolation", TORCH_FN(trilinear_interpolation_autocast<device>));
}

}  // namespace

TORCH_LIBRARY_IMPL(customconv, AutocastCUDA, m) {
  register_autocast_kernels<c10::DeviceType::CUDA>(m);
}

TORCH_LIBRARY_IMPL(customconv, AutocastCPU, m) {
  register_autocast_kernels<c10::DeviceType::CPU>(m);
}

}  // namespace customconv
