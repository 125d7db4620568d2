// Passes over NCHW images in chunks, for the CUDA engines that change NCHW
// operands to channels_last (implicit_gemm.cpp, and the grouped tensor-core
// forward through engines_cuda.cpp): a chunk's channels_last copies stay
// within the workspace limit (ops/common/workspace.h), as the column
// route's buffers do. At N=32 in float32, ResNet-50's stem and strided 1x1
// layers and ResNeXt-50's 56x56 grouped layers changed 98-245 MiB of NCHW
// data in one piece. A chunk's images are views made without the
// dispatcher (strided_view.h's leading_view): they stay within the op.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "ops/common/conv_shapes.h"
#include "ops/common/epilogue.h"
#include "ops/common/relayout_cuda.h"
#include "ops/common/strided_view.h"
#include "ops/common/workspace.h"

namespace customconv {

// Images per chunk of a pass whose NCHW operands change layout (`nchw`: the
// input's or grad_output's layout changes; else the whole batch): the
// channels_last copies of a chunk's input and output sides, (C*H*W + K*P*Q)
// elements an image, stay within the workspace limit, or for a forward
// (`forward`) within relayout_forward_limit_bytes with twice the weight's
// bytes reserved (its channels_last copy, and its merged or rotated form).
// The chunks are as even as their number allows (32 images in two chunks of
// 16, not 30 and 2): a chunk of a few images fills the device poorly.
inline int64_t relayout_chunk(const at::Tensor& t, const Conv2dShape<int64_t>& s, bool nchw,
                              bool forward = false) {
  const int64_t n = std::max<int64_t>(s.in.n, 1);
  if (!nchw || !s.in.batched) return n;
  const int64_t es = t.element_size();
  const int64_t image = (s.in.c * s.in.h * s.in.w + s.k * s.oh * s.ow) * es;
  const c10::DeviceType device = t.device().type();
  const int64_t weight_bytes =
      s.k * (s.in.c / std::max<int64_t>(s.groups, 1)) * s.win.kh * s.win.kw * es;
  const int64_t fit =
      forward ? images_within(n, image, relayout_forward_limit_bytes(device, 2 * weight_bytes))
              : images_per_chunk(n, image, device);
  const int64_t chunks = (n + fit - 1) / fit;
  return (n + chunks - 1) / chunks;
}

inline Conv2dShape<int64_t> with_images(Conv2dShape<int64_t> s, int64_t n) {
  s.in.n = n;
  return s;
}

// The epilogue of images [n0, n0 + nc): its residual's images.
inline ConvEpilogue epilogue_images(const ConvEpilogue& e, int64_t n0, int64_t nc) {
  ConvEpilogue part;
  part.activation = e.activation;
  if (e.has_residual()) part.residual = leading_view(e.residual, n0, nc);
  return part;
}

// pass(n0, nc) -> std::optional<at::Tensor>: the result of images [n0, n0 +
// nc), in any layout, for chunks of `chunk` of `n` images; the results written
// into one tensor of `options` in `format` (by the transpose kernel where the
// layout changes, relayout_cuda.h), or nullopt where a chunk declines
// (another route then takes the batch).
template <class Pass>
std::optional<at::Tensor> by_image_chunks(int64_t n, int64_t chunk,
                                          const at::TensorOptions& options, at::MemoryFormat format,
                                          const Pass& pass) {
  at::Tensor all;
  for (int64_t n0 = 0; n0 < n; n0 += chunk) {
    const int64_t nc = std::min(chunk, n - n0);
    const std::optional<at::Tensor> part = pass(n0, nc);
    if (!part) return std::nullopt;
    if (!all.defined()) {
      std::vector<int64_t> sizes = part->sizes().vec();
      sizes[0] = n;
      all = at::empty(sizes, options.memory_format(format));
    }
    copy_in_memory_format(*part, leading_view(all, n0, nc), format);
  }
  return all;
}

// whole() -> std::optional<at::Tensor> (the whole batch's result, in any
// layout) where `chunk` covers the n images, else part(n0, nc) on each chunk
// (by_image_chunks); the result in `format`.
template <class Whole, class Part>
std::optional<at::Tensor> whole_or_by_image_chunks(int64_t n, int64_t chunk,
                                                   const at::TensorOptions& options,
                                                   at::MemoryFormat format, const Whole& whole,
                                                   const Part& part) {
  if (chunk >= n) {
    const std::optional<at::Tensor> out = whole();
    if (!out) return std::nullopt;
    return to_memory_format(*out, format);
  }
  return by_image_chunks(n, chunk, options, format, part);
}

// A forward whose NCHW input changes layout: pass(x, shape, epilogue) ->
// std::optional<at::Tensor>, the channels_last result of the images x, on the
// whole batch where its copies fit the limit (relayout_chunk), else on each
// chunk with its share of the epilogue's residual; the result in `format`.
template <class Pass>
std::optional<at::Tensor> forward_by_image_chunks(const at::Tensor& input,
                                                  const Conv2dShape<int64_t>& s,
                                                  const ConvEpilogue* epilogue,
                                                  at::MemoryFormat format, const Pass& pass) {
  const int64_t chunk =
      relayout_chunk(input, s, !input.is_contiguous(at::MemoryFormat::ChannelsLast),
                     /*forward=*/true);
  return whole_or_by_image_chunks(
      s.in.n, chunk, input.options(), format, [&] { return pass(input, s, epilogue); },
      [&](int64_t n0, int64_t nc) {
        const ConvEpilogue part =
            epilogue != nullptr ? epilogue_images(*epilogue, n0, nc) : ConvEpilogue{};
        return pass(leading_view(input, n0, nc), with_images(s, nc),
                    epilogue != nullptr ? &part : nullptr);
      });
}

// An input gradient whose NCHW grad_output changes layout: pass(go, x,
// shape) -> std::optional<at::Tensor>, the channels_last input gradient of
// the images x from their grad_output go, on the whole batch where the
// copies fit the limit (relayout_chunk), else on each chunk; the result in
// `format`.
template <class Pass>
std::optional<at::Tensor> grad_input_by_image_chunks(const at::Tensor& grad_output,
                                                     const at::Tensor& input,
                                                     const Conv2dShape<int64_t>& s,
                                                     at::MemoryFormat format, const Pass& pass) {
  const int64_t chunk =
      relayout_chunk(grad_output, s, !grad_output.is_contiguous(at::MemoryFormat::ChannelsLast));
  return whole_or_by_image_chunks(
      s.in.n, chunk, input.options(), format, [&] { return pass(grad_output, input, s); },
      [&](int64_t n0, int64_t nc) {
        return pass(leading_view(grad_output, n0, nc), leading_view(input, n0, nc), with_images(s, nc));
      });
}

// A weight gradient whose NCHW operands change layout: pass(go, x, shape,
// unrounded) -> std::optional<at::Tensor>, the weight gradient of the images
// x; on the whole batch (unrounded false: the weight's dtype and layout)
// where their copies fit the limit (relayout_chunk), else on each chunk
// (unrounded true: its sum in float32, or float64, not rounded), the chunks'
// parts added in order and rounded once into `weight`'s dtype, stored in
// `format`. The chunks depend on the shape and the limit only, so the
// result repeats bit for bit.
template <class Pass>
std::optional<at::Tensor> grad_weight_by_image_chunks(const at::Tensor& grad_output,
                                                      const at::Tensor& input,
                                                      const at::Tensor& weight,
                                                      const Conv2dShape<int64_t>& s,
                                                      at::MemoryFormat format, const Pass& pass) {
  constexpr auto kCl = at::MemoryFormat::ChannelsLast;
  const int64_t chunk =
      relayout_chunk(input, s, !input.is_contiguous(kCl) || !grad_output.is_contiguous(kCl));
  if (chunk >= s.in.n) return pass(grad_output, input, s, false);
  at::Tensor sum;
  for (int64_t n0 = 0; n0 < s.in.n; n0 += chunk) {
    const int64_t nc = std::min(chunk, s.in.n - n0);
    const std::optional<at::Tensor> part =
        pass(leading_view(grad_output, n0, nc), leading_view(input, n0, nc), with_images(s, nc), true);
    if (!part) return std::nullopt;
    if (sum.defined()) {
      sum.add_(*part);
    } else {
      sum = part->contiguous();
    }
  }
  return sum.to(weight.scalar_type()).contiguous(format);
}

}  // namespace customconv
