// The sweep's float16 dgrad candidates (unit-stride and strided kernels).
#include "bench/tune/tile_sweep_kernels.cuh"

namespace customconv::tile_sweep {

std::vector<Candidate> dgrad_f16() {
  using E = cutlass::half_t;
  return {DGRAD(E, 128, 128, 64, 64, 64, 3), DGRAD(E, 128, 128, 32, 64, 64, 4),
          DGRAD(E, 128, 64, 64, 64, 32, 4),  DGRAD(E, 64, 128, 64, 32, 64, 4),
          DGRAD(E, 64, 64, 64, 32, 32, 5),   DGRAD(E, 256, 128, 32, 64, 64, 3),
          DGRAD(E, 256, 64, 64, 64, 64, 4)};
}

}  // namespace customconv::tile_sweep
