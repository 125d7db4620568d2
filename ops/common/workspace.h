// The bound on the temporary memory that conv2d's routes allocate.
//
// conv2d and its backward ops process images in chunks: a chunk's column
// buffer plus its GEMM result take at most `workspace_limit_bytes(device)`,
// except that a chunk always holds at least one image. So the extra memory of
// one call is at most max(limit, bytes for one image), where one image needs
// (C*kh*kw + K) * H_out * W_out elements. The CUDA engines' layout changes of
// NCHW operands (image_chunks.h) go in chunks under the same limit, a
// forward's under relayout_forward_limit_bytes (below). The
// default is 256 MiB on the CPU and 48 MiB on CUDA, where it keeps a call's
// extra memory within 64 MiB with the smaller buffers that come with a chunk
// (on the CPU, converted ResNet-50 inference at N=16 ran 3-11% slower with
// 48); the environment variable CUSTOMCONV_WORKSPACE_MB (read once) or
// set_workspace_limit_bytes() sets one limit for every device.
#pragma once

#include <cstdint>

#include "customconv/customconv.h"  // workspace_limit_bytes(), set_workspace_limit_bytes()

namespace customconv {

// How many of `n` images fit in the workspace of `device` when each needs
// `bytes_per_image` (at least 1, at most n).
int64_t images_per_chunk(int64_t n, int64_t bytes_per_image, c10::DeviceType device);

// How many of `n` images fit in `limit` bytes when each needs
// `bytes_per_image` (at least 1, at most n).
int64_t images_within(int64_t n, int64_t bytes_per_image, int64_t limit);

// The bound on the channels_last copies of a forward's chunk of NCHW images
// (image_chunks.h) on `device`. Such a forward allocates nothing else of
// their size, so on CUDA they may take the 64 MiB that a call may use beyond
// its inputs and outputs, less `reserved` bytes for its weight-sized
// buffers, where the column route's chunks leave 16 MiB of it to their
// smaller buffers; never less than the workspace limit. A limit set by
// CUSTOMCONV_WORKSPACE_MB or set_workspace_limit_bytes() bounds both.
int64_t relayout_forward_limit_bytes(c10::DeviceType device, int64_t reserved);

// The bound on the float32 (or float64) partial sums that a weight gradient
// keeps for a chunk of images (image_chunks.h's grad_weight_by_image_chunks):
// a third of the workspace limit of `device`, the chunk's layout changes
// taking the rest.
inline int64_t chunk_partials_limit_bytes(c10::DeviceType device) {
  return workspace_limit_bytes(device) / 3;
}

}  // namespace customconv
