// The sweep's float32 (TF32) fprop candidates.
#include "bench/tune/tile_sweep_kernels.cuh"

namespace customconv::tile_sweep {

std::vector<Candidate> fprop_f32() {
  using E = float;
  return {FPROP_SPLIT(E, 128, 128, 32, 64, 64, 3), FPROP(E, 128, 128, 32, 64, 64, 4),
          FPROP(E, 128, 128, 16, 64, 64, 5),       FPROP_SPLIT(E, 128, 64, 32, 64, 32, 4),
          FPROP(E, 128, 64, 32, 64, 32, 3),        FPROP(E, 64, 128, 32, 32, 64, 4),
          FPROP_SPLIT(E, 64, 64, 32, 32, 32, 5),   FPROP(E, 256, 128, 32, 64, 64, 3),
          FPROP(E, 128, 256, 32, 64, 64, 3),       FPROP(E, 256, 64, 32, 64, 64, 4),
          FPROP(E, 64, 256, 32, 64, 64, 4),        FPROP(E, 256, 128, 16, 64, 64, 3)};
}

}  // namespace customconv::tile_sweep
