// The tile configurations the sweep tries, and the candidate launchers built
// from implicit_gemm_kernels.cuh's templates (each instantiation compiles on
// its own, so the translation units split them by pass and element type).
#pragma once

#include "bench/tune/tile_sweep.h"
#include "ops/conv2d/implicit_gemm_kernels.cuh"

namespace customconv::tile_sweep {

using implicit_gemm::ConvProblem;
using implicit_gemm::TileConfig;
using cutlass::gemm::GemmShape;
using cutlass::conv::StrideSupport;

// MxNxK block tile, its warp tile, S stages.
template <int M, int N, int K, int WM, int WN, int S>
using T = TileConfig<GemmShape<M, N, K>, GemmShape<WM, WN, K>, S>;

template <typename Element, typename Tile>
bool fprop_plain(const ConvProblem& pr) {
  return implicit_gemm::launch_fprop<typename implicit_gemm::FpropKernel<Element, Tile>::Kernel>(pr);
}
template <typename Element, typename Tile>
bool fprop_split(const ConvProblem& pr) {
  return implicit_gemm::fprop_split<Element, Tile>(pr);
}
template <typename Element, typename Tile, StrideSupport kStride>
bool dgrad_one(const ConvProblem& pr) {
  return implicit_gemm::launch_dgrad<typename implicit_gemm::DgradKernel<Element, Tile, kStride>::Kernel>(pr);
}
template <typename Element, typename Tile>
bool wgrad_one(const ConvProblem& pr) {
  return implicit_gemm::wgrad_with<Element, Tile>(pr);
}

template <typename Tile>
constexpr int tm = Tile::kTile::kM;
template <typename Tile>
constexpr int tn = Tile::kTile::kN;
template <typename Tile>
constexpr int tk = Tile::kTile::kK;

#define SWEEP_NAME(M, N, K, S) #M "x" #N "x" #K " s" #S

// fprop candidate with and without split-K.
#define FPROP_SPLIT(E, M, N, K, WM, WN, S)                                                      \
  Candidate {                                                                                    \
    SWEEP_NAME(M, N, K, S), M, N, K, &fprop_plain<E, T<M, N, K, WM, WN, S>>,                     \
        &fprop_split<E, T<M, N, K, WM, WN, S>>                                                   \
  }
#define FPROP(E, M, N, K, WM, WN, S) \
  Candidate { SWEEP_NAME(M, N, K, S), M, N, K, &fprop_plain<E, T<M, N, K, WM, WN, S>>, nullptr }
#define DGRAD(E, M, N, K, WM, WN, S)                                                           \
  Candidate {                                                                                  \
    SWEEP_NAME(M, N, K, S), M, N, K, &dgrad_one<E, T<M, N, K, WM, WN, S>, StrideSupport::kUnity>, \
        &dgrad_one<E, T<M, N, K, WM, WN, S>, StrideSupport::kStrided>                          \
  }
#define WGRAD(E, M, N, K, WM, WN, S) \
  Candidate { SWEEP_NAME(M, N, K, S), M, N, K, &wgrad_one<E, T<M, N, K, WM, WN, S>>, nullptr }

}  // namespace customconv::tile_sweep
