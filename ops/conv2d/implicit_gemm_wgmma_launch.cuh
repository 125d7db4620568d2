// The launcher of the Hopper forward kernel (implicit_gemm_wgmma.cuh) for
// implicit_gemm.h's fprop_sm90_f32: the plan's box, the tensor maps, the
// kernel's fit on the device (cached), the launch on the problem's stream,
// and the split-K sum. Included by translation units compiled for sm_90a only.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "ops/common/kernel_fit.h"
#include "ops/conv2d/implicit_gemm.h"
#include "ops/conv2d/implicit_gemm_wgmma.cuh"
#include "ops/conv2d/split_k_sum.cuh"

namespace customconv::implicit_gemm {

// Sets `a`'s phases' tile extents and ranges (its box and phases set) for
// tiles kN channels wide, and a.tiles, with the divisions the kernel's index
// arithmetic makes (FastDivide); returns a.tiles.
template <int kN>
int set_tiles(wgmma_fprop::Args& a) {
  const int n_tiles = (a.k + kN - 1) / kN;
  int tiles = 0;
  for (int i = 0; i < a.phases; ++i) {
    Phase& f = a.ph[i];
    if (a.im2col) {
      f.tw = int((int64_t(a.n) * f.p * f.q + a.bw - 1) / a.bw), f.th = f.tn = 1;
    } else {
      f.tw = (f.q + a.bw - 1) / a.bw, f.th = (f.p + a.bh - 1) / a.bh,
      f.tn = (a.n + a.bn - 1) / a.bn;
    }
    f.tiles_begin = tiles;
    tiles += f.tw * f.th * f.tn * n_tiles;
    f.div_tw = FastDivide::of(f.tw), f.div_th = FastDivide::of(f.th);
    f.div_s = FastDivide::of(f.s), f.div_q = FastDivide::of(f.q);
    f.div_plane = FastDivide::of(f.p * f.q);
  }
  a.tiles = tiles;
  a.div_tiles = FastDivide::of(tiles), a.div_n_tiles = FastDivide::of(n_tiles);
  a.div_c = FastDivide::of(a.c), a.div_bw = FastDivide::of(a.bw), a.div_bh = FastDivide::of(a.bh);
  return tiles;
}

// A tag for a launch's tail flags (Args::tag): never 0, which marks a free
// slot, and a different one each launch.
inline unsigned long long next_join_tag() {
  static std::atomic<unsigned long long> count{0};
  return 0x9e3779b97f4a7c15ull ^ (count.fetch_add(1, std::memory_order_relaxed) << 1);
}

// Launches the kernel, tiles of 128 positions x kN output channels (128, or
// 64 for layers of 40 to 64, or a group's 32 or 64), on `a` (its box and phases set) over the
// input x (n, h, w, c NHWC) and the weight w ((k, taps * c)); false (nothing
// launched) where the device cannot run it or the driver refuses the tensor
// maps. As many blocks run on a multiprocessor as fit (the grid is the
// resident blocks' count): two of the 64-wide ones, whose pipeline is 3
// stages deep in 16-bit so that two fit, and one block's epilogue overlaps
// the other's main loop (with 4 stages, one block: 64 channels at 56x56 in
// float16 37.7 us, against 33.2; 128 -> 64 channels at 28x28 22.0 against
// 19.9).
// With a.tail (the plan's tail, a.join sized for it) the tail is taken
// again for the blocks that fit, and dropped where it would differ.
// The pingpong kernel (kPingpong) runs one block a multiprocessor, 6 stages
// deep in float32 and 5 in 16-bit (whose warpgroups' TMA-stored tiles take
// 64 KB): its consumer warpgroups take turns on the main loop, so the loads
// run further ahead of it.
template <typename T, int kN = 128, bool kPingpong = false, int kM = 128>
bool launch_wgmma(wgmma_fprop::Args& a, const void* x, const void* w, int h, int wd, int taps,
                  int device, void* stream) {
  constexpr int kStages = kPingpong                        ? (sizeof(T) == 2 ? 5 : 6)
                          : kM == 192                      ? 3
                          : sizeof(T) == 2 && kN == 64 ? 3
                                                           : 4;
  using Cfg = wgmma_fprop::Tile<T, kM, kN, kStages, kPingpong>;
  const auto kernel = &wgmma_fprop::fprop_tma_kernel<T, kM, kN, kStages, kPingpong>;
  static CachedKernelFit fit(reinterpret_cast<const void*>(kernel),
                             KernelNeeds{90, Cfg::kThreads, size_t(Cfg::kSmemBytes)});
  if (!fit.on(device)) return false;
  const int tiles = set_tiles<kN>(a);
  CUtensorMap xmap, wmap, ymap{};
  if (!wgmma_fprop::make_maps<T, kN>(&xmap, &wmap, x, w, a.n, h, wd, a.c, a.k, taps, a))
    return false;
  if constexpr (Cfg::kTmaStore) {
    // The 16-bit pingpong kernel's stores (one phase, a packed output,
    // no residual, no split: wgmma_fprop_plan).
    const Phase& f = a.ph[0];
    const bool packed = a.phases == 1 && f.y0 == 0 && f.sw == a.k && f.sh == f.q * a.k &&
                        f.sn == f.p * f.sh && reinterpret_cast<uintptr_t>(a.y) % 16 == 0;
    if (!packed || a.residual != nullptr || a.split != 1 ||
        !wgmma_fprop::make_output_map<T, kM>(&ymap, a.y, a))
      return false;
  }
  const int64_t resident = fit.on(device).resident_blocks();
  if (a.tail > 0) {
    const Phase& f = a.ph[0];
    const int64_t tail = tail_tiles(tiles, resident, int64_t(f.r) * f.s * a.c / Cfg::kStep);
    a.tail = a.split == 1 && a.phases == 1 && tail <= a.tail ? int(tail) : 0;
    a.tag = next_join_tag();
  }
  const int64_t all = int64_t(tiles) * a.split + a.tail;
  const unsigned blocks = unsigned(std::min<int64_t>(all, resident));
  kernel<<<blocks, Cfg::kThreads, Cfg::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(xmap, wmap,
                                                                                        ymap, a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

// T: float (TF32), __half or __nv_bfloat16. False (nothing launched) where
// the plan declines the problem, the device cannot run the kernel or the
// driver refuses the tensor maps.
template <typename T>
bool fprop_wgmma(const ConvProblem& pr) {
  const WgmmaPlan plan = wgmma_fprop_plan(pr, int(sizeof(T)));
  if (!plan.take || pr.split_k != plan.split || (pr.split_k > 1 && pr.workspace == nullptr))
    return false;
  wgmma_fprop::Args a{};
  a.y = pr.output, a.bias = pr.bias, a.residual = pr.residual, a.activation = pr.activation;
  a.partial = static_cast<float*>(pr.workspace), a.split = pr.split_k;
  if (pr.split_k == 1 && pr.workspace != nullptr) a.tail = plan.tail, a.join = pr.workspace;
  a.n = pr.n, a.k = pr.k, a.groups = pr.groups, a.c = pr.c / pr.groups;
  for (int i = 0; i < 3; ++i) a.xs[i] = pr.input_strides[i];
  a.stride_h = pr.stride_h, a.stride_w = pr.stride_w;
  a.dilation_h = pr.dilation_h, a.dilation_w = pr.dilation_w;
  a.bw = plan.box.bw, a.bh = plan.box.bh, a.bn = plan.box.bn;
  a.im2col = plan.im2col;
  if (a.im2col) a.bw = plan.rows, a.bh = a.bn = 1;
  a.phases = 1;
  Phase& f = a.ph[0];
  f.p = pr.p, f.q = pr.q, f.r = pr.r, f.s = pr.s, f.pad_h = pr.pad_h, f.pad_w = pr.pad_w;
  f.sw = pr.k, f.sh = pr.q * pr.k, f.sn = pr.p * pr.q * pr.k;
  const int taps = pr.r * pr.s;
  bool launched;
  if (plan.cols == 32) {  // (float32 groups of 32 channels only: wgmma_fprop_plan)
    if constexpr (sizeof(T) == 4) {
      launched = launch_wgmma<T, 32>(a, pr.input, pr.weight, pr.h, pr.w, taps, pr.device, pr.stream);
    } else {
      launched = false;
    }
  } else if (plan.cols == 64) {
    launched = launch_wgmma<T, 64>(a, pr.input, pr.weight, pr.h, pr.w, taps, pr.device, pr.stream);
  } else if (plan.rows == 192) {  // (16-bit only: wgmma_fprop_plan)
    if constexpr (sizeof(T) == 2) {
      launched = launch_wgmma<T, 128, false, 192>(a, pr.input, pr.weight, pr.h, pr.w, taps,
                                                   pr.device, pr.stream);
    } else {
      launched = false;
    }
  } else {
    launched = plan.pingpong && launch_wgmma<T, 128, true>(a, pr.input, pr.weight, pr.h, pr.w,
                                                           taps, pr.device, pr.stream);
    if (!launched)
      launched = launch_wgmma<T>(a, pr.input, pr.weight, pr.h, pr.w, taps, pr.device, pr.stream);
  }
  if (!launched) return false;
  if (pr.split_k > 1) launch_sum_slices<T>(pr);
  return true;
}

// The strided input gradient by stride phases (implicit_gemm.h's
// dgrad_phases_sm90_*): pr as for dgrad, its weight the phases' weight. One
// launch for all phases, no split. T: float (TF32), __half or __nv_bfloat16.
template <typename T>
bool dgrad_phases_wgmma(const ConvProblem& pr) {
  if (!wgmma_dgrad_phases_take(pr) || pr.k % (128 / int(sizeof(T))) != 0) return false;
  const StridePhases sp =
      stride_phases(pr.h, pr.w, pr.c, pr.r, pr.s, pr.pad_h, pr.pad_w, pr.stride_h, pr.stride_w);
  wgmma_fprop::Args a{};
  a.y = pr.input, a.activation = Activation::kIdentity, a.split = 1;
  a.n = pr.n, a.k = pr.c, a.c = pr.k, a.groups = 1;  // the forward of grad_output: K in, C out
  a.stride_h = a.stride_w = a.dilation_h = a.dilation_w = 1;
  // One box for all phases: the first rows' phase has the most.
  const Box box = choose_box(pr.n, (pr.h + pr.stride_h - 1) / pr.stride_h,
                             (pr.w + pr.stride_w - 1) / pr.stride_w, 1, 1, 128);
  a.bw = box.bw, a.bh = box.bh, a.bn = box.bn;
  a.phases = int(sp.phases.size());
  for (int i = 0; i < a.phases; ++i) a.ph[i] = sp.phases[i];
  // float32: the pingpong kernel where the tiles outnumber the multiprocessors, as in the forward.
  if constexpr (sizeof(T) == 4) {
    if (set_tiles<128>(a) > pr.multiprocessors) {
      return launch_wgmma<T, 128, true>(a, pr.output, pr.weight, pr.p, pr.q, pr.r * pr.s, pr.device,
                                        pr.stream);
    }
  }
  return launch_wgmma<T>(a, pr.output, pr.weight, pr.p, pr.q, pr.r * pr.s, pr.device, pr.stream);
}

}  // namespace customconv::implicit_gemm
