// The sweep's float16 Hopper wgrad candidates (sm_90a).
#include "bench/tune/tile_sweep_hopper_kernels.cuh"

namespace customconv::tile_sweep {

std::vector<Candidate> hopper_wgrad_f16() {
  return {HOPPER_WGRAD(128, 128, 64), HOPPER_WGRAD(64, 128, 64), HOPPER_WGRAD(128, 64, 64)};
}

}  // namespace customconv::tile_sweep
