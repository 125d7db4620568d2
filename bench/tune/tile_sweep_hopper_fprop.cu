// The sweep's float16 Hopper fprop candidates (sm_90a).
#include "bench/tune/tile_sweep_hopper_kernels.cuh"

namespace customconv::tile_sweep {

std::vector<Candidate> hopper_fprop_f16() {
  return {HOPPER_FPROP(128, 128, 64), HOPPER_FPROP(64, 128, 64), HOPPER_FPROP(128, 64, 64),
          HOPPER_FPROP(64, 64, 64)};
}

}  // namespace customconv::tile_sweep
