// CUSTOMCONV_HOST_DEVICE: a function callable from host and device code when
// compiled by nvcc, a plain inline one otherwise. No ATen or CUDA headers.
#pragma once

#if defined(__CUDACC__)
#define CUSTOMCONV_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CUSTOMCONV_HOST_DEVICE inline
#endif
