// Column-streaming CUDA kernel for plane correlations with tall kernels (an
// odd number of tap rows from 9 to 31) at stride 1, dilation 1 and a zero
// border: RepLKNet-style depthwise layers, large filter2d kernels, and their
// stride-1 input gradients. launch_plane_correlation (plane_correlation.cuh)
// tries it first for those geometries.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace customconv {

struct PlaneCorrelation;

// Whether the kernel takes kh x kw taps at stride (sh, sw) and dilation
// (dh, dw) for data of `element_size` bytes (float32 and 16-bit data).
bool large_kernel_takes(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                        int64_t element_size);

// Runs the kernel on `stream` (bias may be null), reading outside the planes
// as zeros; returns false, launching nothing, when it does not take the
// geometry (see large_kernel_takes; a staged tile must fit in 48 KiB of shared
// memory). T: float, at::Half, at::BFloat16.
template <typename T>
bool launch_large_kernel_correlation(const T* in, const T* weight, const T* bias, T* out,
                                     const PlaneCorrelation& g, cudaStream_t stream);

}  // namespace customconv
