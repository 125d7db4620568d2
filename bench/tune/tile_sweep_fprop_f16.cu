// The sweep's float16 fprop candidates.
#include "bench/tune/tile_sweep_kernels.cuh"

namespace customconv::tile_sweep {

std::vector<Candidate> fprop_f16() {
  using E = cutlass::half_t;
  return {FPROP_SPLIT(E, 128, 128, 64, 64, 64, 3), FPROP(E, 128, 128, 64, 64, 64, 4),
          FPROP(E, 128, 128, 32, 64, 64, 5),       FPROP_SPLIT(E, 128, 64, 64, 64, 32, 4),
          FPROP(E, 128, 64, 64, 64, 32, 3),        FPROP(E, 64, 128, 64, 32, 64, 4),
          FPROP_SPLIT(E, 64, 64, 64, 32, 32, 5),   FPROP(E, 256, 128, 64, 64, 64, 3),
          FPROP(E, 128, 256, 64, 64, 64, 3),       FPROP(E, 256, 64, 64, 64, 64, 4),
          FPROP(E, 64, 256, 64, 64, 64, 4),        FPROP(E, 256, 128, 32, 64, 64, 3)};
}

}  // namespace customconv::tile_sweep
