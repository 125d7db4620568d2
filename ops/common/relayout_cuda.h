// Layout changes of 4-D CUDA tensors between NCHW (contiguous) and
// channels_last, by one tiled-transpose kernel: a (N, C, H, W) tensor is, per
// image, a (C, H*W) matrix in NCHW and its transpose (H*W, C) in
// channels_last, so either change is a batch of matrix transposes.
//
// This is how the implicit-GEMM engine (channels_last only) takes NCHW data,
// and how it gives NCHW results back. The kernel reads and writes whole
// tiles (64 x 64) through shared memory, so both sides of the copy are
// coalesced (at::Tensor::contiguous's element-wise copy reads one of them
// with a stride), each thread moving two neighbouring elements in one access
// where the sizes allow and the data is aligned; it costs one allocation and
// one launch on the host.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace customconv {

// `t` in memory format `format` (Contiguous or ChannelsLast): `t` itself where
// it already is; the transpose kernel's copy where `t` is a 4-D CUDA tensor
// of 2- or 4-byte elements dense in the other format; otherwise
// t.contiguous(format).
at::Tensor to_memory_format(const at::Tensor& t, at::MemoryFormat format);

// dst = src, where dst has src's sizes and dtype and is dense in `format`
// (Contiguous or ChannelsLast): by the transpose kernel where it changes src
// into that format, else by dst.copy_(src).
void copy_in_memory_format(const at::Tensor& src, const at::Tensor& dst, at::MemoryFormat format);

// (to_memory_format(a, ChannelsLast), to_memory_format(b, ChannelsLast)),
// with one allocation and one launch where both need the kernel's copy.
std::pair<at::Tensor, at::Tensor> to_channels_last_together(const at::Tensor& a, const at::Tensor& b);

// Rows of `inner` elements moved to strided places: src is contiguous
// (a, b, inner), and its row (r, j) goes to element offset
// r * dst_stride_a + j * dst_stride_b of dst's data (one dtype, one CUDA
// device; the places must not overlap). With dst_stride_a = inner and
// dst_stride_b = a * inner it swaps the two outer dimensions (the column
// route's GEMM result regrouped into images); with (C * L, L)-strided
// columns it is a 1x1 window's im2col. One launch, 16-byte accesses where
// the sizes, strides and both pointers allow.
void copy_rows_cuda(const at::Tensor& src, const at::Tensor& dst, int64_t a, int64_t b,
                    int64_t inner, int64_t dst_stride_a, int64_t dst_stride_b);

}  // namespace customconv
