// Space-to-depth: a strided convolution of an image with few channels (an RGB
// stem) rewritten as a stride-1 convolution with whole reduction steps of
// channels, which the implicit-GEMM kernels take.
//
// With stride (sh, sw), tap i of the window reads input row sh*p - ph + i for
// output row p. Writing i = sh*t + u (u < sh) makes that row sh*(p + t) + u - ph:
// tap t of a window of ceil(kh / sh) taps, on the rows of phase u; the same
// along the width. Packing the sh*sw phases of cv channels (zeros past the
// input's C) as channels, and `fold` neighbouring packed columns on top of
// them,
//
//   packed[n, a, b, ((j*sh + u)*sw + v)*cv + c]
//       = input[n, c, sh*a + u - ph, sw*(bstep*b + j) + v - pw]     (j < fold)
//
// with bstep 1 (zero outside the input), turns the convolution into one with
// stride 1, no padding, fold*sh*sw*cv input channels, the window
// (ceil(kh/sh), ceil(kw/(sw*fold))) and dilation (1, fold); its weight is the
// weight packed the same way with bstep = fold and no padding (taps past kh
// and kw are zeros).
#pragma once

#include <ATen/core/Tensor.h>

namespace customconv {

struct SpaceToDepth {
  int64_t sh, sw;  // the convolution's stride: the phases
  int64_t ph, pw;  // its padding (0 for the weight)
  int64_t cv;      // channels per phase (at least the input's)
  int64_t fold;    // packed columns folded into the channels
  int64_t bstep;   // input columns per packed column, in units of sw: 1, or fold for the weight
};

// `t` (N, C, H, W), any strides, C <= p.cv, packed as above into a new
// (N, fold*sh*sw*cv, oh, ow) tensor stored channels_last.
at::Tensor space_to_depth_cuda(const at::Tensor& t, const SpaceToDepth& p, int64_t oh, int64_t ow);

}  // namespace customconv
