// Column-streaming CUDA kernel for plane correlations with tall kernels (an
// odd number of tap rows from 9 to 31) at stride 1, dilation 1 and a zero
// border: RepLKNet-style depthwise layers, large filter2d kernels, and their
// stride-1 input gradients. launch_plane_correlation (plane_correlation.cuh)
// tries it first for those geometries.
#pragma once

#include <cuda_runtime.h>

namespace customconv {

struct PlaneCorrelation;

// Runs the kernel on `stream` (bias may be null), reading outside the planes
// as zeros; returns false, launching nothing, when it does not take the
// geometry: kh odd from 9 to 31, stride 1, dilation 1, non-negative padding,
// at least 21 output rows with three quarters of the rows it computes used,
// and a staged tile within 100 KB of shared memory. T: float, at::Half,
// at::BFloat16.
template <typename T>
bool launch_large_kernel_correlation(const T* in, const T* weight, const T* bias, T* out,
                                     const PlaneCorrelation& g, cudaStream_t stream);

}  // namespace customconv
