// The bound on the temporary memory that conv2d's routes allocate.
//
// conv2d and its backward ops process images in chunks: a chunk's column
// buffer plus its GEMM result take at most `workspace_limit_bytes(device)`,
// except that a chunk always holds at least one image. So the extra memory of
// one call is at most max(limit, bytes for one image), where one image needs
// (C*kh*kw + K) * H_out * W_out elements. The CUDA engines' layout changes of
// NCHW operands (image_chunks.h) go in chunks under the same limit. The
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

}  // namespace customconv
