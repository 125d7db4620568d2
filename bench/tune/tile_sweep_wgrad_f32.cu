// The sweep's float32 (TF32) wgrad candidates.
#include "bench/tune/tile_sweep_kernels.cuh"

namespace customconv::tile_sweep {

std::vector<Candidate> wgrad_f32() {
  using E = float;
  return {WGRAD(E, 128, 128, 32, 64, 64, 3), WGRAD(E, 128, 128, 16, 64, 64, 4),
          WGRAD(E, 128, 128, 32, 64, 64, 4), WGRAD(E, 128, 64, 32, 64, 32, 4),
          WGRAD(E, 64, 128, 32, 32, 64, 4),  WGRAD(E, 64, 64, 32, 32, 32, 5),
          WGRAD(E, 256, 128, 16, 64, 64, 3), WGRAD(E, 128, 256, 16, 64, 64, 3)};
}

}  // namespace customconv::tile_sweep
