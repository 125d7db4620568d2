// The tiles of the Hopper forward of float32 groups of 32 channels that loads
// each tile's input once for all of its taps (implicit_gemm_wgmma_halo.cuh):
// host arithmetic only (no CUDA here), read by its launcher and by the route
// choice (implicit_gemm.h's hopper_grouped_forward_first).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ops/conv2d/implicit_gemm.h"

namespace customconv::implicit_gemm {

constexpr int kHaloRows = 128;      // output positions a tile (two consumer warpgroups)
constexpr int kHaloCols = 32;       // output channels a tile: one group's
constexpr int kHaloRowBytes = 128;  // one pixel's 32 float32 channels
constexpr int kHaloTaps = 9;        // 3x3 windows only
constexpr int kHaloTapBytes = kHaloCols * kHaloRowBytes;  // a tap's 32 x 32 weights
constexpr size_t kHaloSmemLimit = 227 * 1024;
constexpr size_t kHaloSmemFixed = 1024 + 64;  // alignment, barriers

// Plane (u, v) of stride (sh, sw) holds pixels (sh a + u - pad_h, sw b + v -
// pad_w); a tile's output rows are flattened with the planes' row pitch wp =
// q + 2 / sw, and it covers bh output rows of bn images: hh = bh + 2 / sh
// plane rows an image.
struct HaloShape {
  bool take = false;
  int wp = 0, hh = 0, bh = 0, bn = 0;
  int th = 0;           // tiles down the plane
  int tiles = 0;        // th x image tiles x groups
  int plane_bytes = 0;  // a plane's shared memory (whole 1024 bytes)
  int stage_bytes = 0;  // sh x sw planes and the group's 9 taps of weights
  int stages = 0;       // 2 or 3
  size_t smem = 0;      // dynamic shared memory a block
};

// Takes groups of 32 input and 32 output channels, dilation 1, strides of 1
// or 2, 3x3 windows, planes whose pitch fits a tile, tiles that are at least
// 75% outputs (a 7x7 plane at stride 1 is 49 of 128: not taken) and two
// stages that fit the shared memory; pr's c and groups are the merged
// groups' (block_diagonal_weight.h).
inline HaloShape halo_shape(const ConvProblem& pr) {
  HaloShape sh;
  if (pr.groups <= 1 || pr.c != pr.k || pr.c / pr.groups != kHaloCols || pr.c % pr.groups != 0 ||
      pr.dilation_h != 1 || pr.dilation_w != 1 || pr.stride_h < 1 || pr.stride_h > 2 ||
      pr.stride_w < 1 || pr.stride_w > 2 || pr.r != 3 || pr.s != 3 || pr.p <= 0 || pr.q <= 0 ||
      pr.n <= 0) {
    return sh;
  }
  const int eh = 2 / pr.stride_h, ew = 2 / pr.stride_w;
  sh.wp = pr.q + ew;
  if (sh.wp > kHaloRows || sh.wp * pr.stride_w > 256) return sh;
  if ((pr.p + eh) * sh.wp <= kHaloRows) {  // whole images, stacked
    sh.bh = pr.p, sh.hh = pr.p + eh;
    sh.bn = std::min(pr.n, 1 + (kHaloRows - pr.p * sh.wp) / (sh.hh * sh.wp));
  } else {
    sh.bh = std::min(pr.p, kHaloRows / sh.wp), sh.hh = sh.bh + eh, sh.bn = 1;
  }
  if (sh.hh * pr.stride_h > 256 || 4 * sh.bn * sh.bh * pr.q < 3 * kHaloRows) return sh;
  sh.th = (pr.p + sh.bh - 1) / sh.bh;
  const int64_t tiles = int64_t(sh.th) * ((pr.n + sh.bn - 1) / sh.bn) * pr.groups;
  if (tiles >= (int64_t(1) << 31)) return sh;
  sh.tiles = int(tiles);
  sh.plane_bytes = (sh.bn * sh.hh * sh.wp + 7) / 8 * 8 * kHaloRowBytes;
  sh.stage_bytes = pr.stride_h * pr.stride_w * sh.plane_bytes + kHaloTaps * kHaloTapBytes;
  sh.stages = int(std::min<size_t>(3, (kHaloSmemLimit - kHaloSmemFixed) / size_t(sh.stage_bytes)));
  if (sh.stages < 2) return sh;
  sh.smem = size_t(sh.stages) * sh.stage_bytes + kHaloSmemFixed;
  sh.take = true;
  return sh;
}

}  // namespace customconv::implicit_gemm
