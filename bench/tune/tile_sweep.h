// The implicit-GEMM tile sweep (bench/tune): candidate kernels per pass and
// element type, each a tile configuration of implicit_gemm_kernels.cuh, timed
// against cuDNN on ResNet-50's layers by tile_sweep.cpp.
#pragma once

#include <vector>

#include "ops/conv2d/implicit_gemm.h"

namespace customconv::tile_sweep {

using Launch = bool (*)(const implicit_gemm::ConvProblem&);

struct Candidate {
  const char* name;  // "MxNxK sS": block tile and pipeline stages
  int tile_m, tile_n, tile_k;
  Launch plain;      // one pass (fprop, dgrad unit stride, wgrad with pr.split_k planes)
  Launch split;      // fprop with pr.split_k float32 slices and their sum; dgrad: the strided kernel
};

// Element types: f16 (bf16 shares its tiles) and f32 (TF32).
std::vector<Candidate> fprop_f16();
std::vector<Candidate> fprop_f32();
std::vector<Candidate> dgrad_f16();
std::vector<Candidate> dgrad_f32();
std::vector<Candidate> wgrad_f16();
std::vector<Candidate> wgrad_f32();
// Hopper (sm_90a) float16 candidates; empty where the sweep is built without them.
std::vector<Candidate> hopper_fprop_f16();
std::vector<Candidate> hopper_wgrad_f16();

}  // namespace customconv::tile_sweep
