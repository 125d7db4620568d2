// Float32 7x7 correlation at stride 1 on compute capability 9.0 and newer:
// persistent blocks in which one warp keeps the input windows of the next
// tiles in flight with the Tensor Memory Accelerator while eight warps compute
// from shared memory (see streamed_tile_correlation.cu).
// launch_blocked (blocked_correlation.cuh) tries it first for float32 with 7
// taps on the vector path.
#pragma once

#include <cuda_runtime.h>

namespace customconv {

struct BlockedCorrelation;

// Runs the kernel on `stream` (bias may be null) and returns true, or returns
// false, launching nothing, when it does not take the case: one weight row per
// plane (fan 1), "same" column padding (3), w and ow multiples of 4, 16-byte
// aligned input and output, output planes holding a whole 64 x 128 tile each
// way, at least three tiles per SM, and a device (and a build of this kernel
// for it) of compute capability 9.0 or newer.
bool launch_streamed_tile_correlation(const float* in, const float* weight, const float* bias,
                                      float* out, const BlockedCorrelation& g,
                                      cudaStream_t stream);

}  // namespace customconv
