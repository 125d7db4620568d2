// The sweep's float16 wgrad candidates.
#include "bench/tune/tile_sweep_kernels.cuh"

namespace customconv::tile_sweep {

std::vector<Candidate> wgrad_f16() {
  using E = cutlass::half_t;
  return {WGRAD(E, 128, 128, 32, 64, 64, 4), WGRAD(E, 128, 128, 64, 64, 64, 3),
          WGRAD(E, 128, 128, 64, 64, 64, 4), WGRAD(E, 128, 64, 64, 64, 32, 4),
          WGRAD(E, 64, 128, 64, 32, 64, 4),  WGRAD(E, 64, 64, 64, 32, 32, 5),
          WGRAD(E, 256, 128, 32, 64, 64, 3), WGRAD(E, 128, 256, 32, 64, 64, 3)};
}

}  // namespace customconv::tile_sweep
