// tf32_gemm_sm90.h's GEMM: CUTLASS 3's collective builders, a 64 x 256 x 32
// tile of the transposed problem, pingpong warpgroups.
//
// CUTLASS solves D^T (n x m, column-major: D's rows) = B^T (n x k, column-
// major: B's rows) * A^T (k x m, column-major: A's rows). Its A, B^T, is
// MN-major: the collective's producer warp loads its tiles by TMA and the
// consumer warpgroups read them from shared memory into registers (the
// register-sourced warpgroup MMA), while A^T, K-major, is read from shared
// memory by the MMA. Each block owns 64 of the n columns (C) by 256 of the
// m rows (positions) of D; the two consumer warpgroups take alternate tiles,
// one's epilogue (TMA stores of D) running beside the other's main loop.
#include <c10/cuda/CUDAException.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

#include <cstdint>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <limits>

#include "ops/common/kernel_fit.h"
#include "ops/conv2d/tf32_gemm_sm90.h"

namespace customconv {
namespace {

using Col = cutlass::layout::ColumnMajor;
using TileShape = cute::Shape<cute::_64, cute::_256, cute::_32>;
using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
using Epilogue = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, Col, 4, float, Col, 4,
    cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;
using Mainloop = cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::tfloat32_t, Col, 4,
    cutlass::tfloat32_t, Col, 4, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;
using Kernel =
    cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;
using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

}  // namespace

bool tf32_gemm_sm90_takes(int64_t m, int64_t n, int64_t k) {
  return m >= 4096 && n >= 128 && k >= 64;
}

bool tf32_gemm_sm90(const float* a, int64_t lda, const float* b, int64_t ldb, float* d, int64_t ldd,
                    int64_t m, int64_t n, int64_t k, int device, cudaStream_t stream) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (m > kMax || n > kMax || k > kMax) return false;
  // TMA reads and writes whole 16 bytes: aligned pointers and leading dimensions.
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                         reinterpret_cast<uintptr_t>(d) | uintptr_t(lda * 4) | uintptr_t(ldb * 4) |
                         uintptr_t(ldd * 4);
  if (bits % 16 != 0) return false;
  static CachedKernelFit fit(
      reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>),
      KernelNeeds{90, int(Kernel::MaxThreadsPerBlock), size_t(Kernel::SharedStorageSize)});
  const KernelFit& f = fit.on(device);
  if (!f) return false;
  typename Kernel::StrideA stride_a{};  // B^T: (n, k), unit stride along n
  typename Kernel::StrideB stride_b{};  // A^T: (m, k), unit stride along k
  typename Kernel::StrideD stride_d{};  // D^T: (n, m), unit stride along n
  cute::get<1>(stride_a) = ldb;
  cute::get<0>(stride_b) = lda;
  cute::get<1>(stride_d) = ldd;
  typename Device::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {int(n), int(m), int(k), 1},
                                  {reinterpret_cast<const cutlass::tfloat32_t*>(b), stride_a,
                                   reinterpret_cast<const cutlass::tfloat32_t*>(a), stride_b},
                                  {{1.0f, 0.0f}, nullptr, stride_d, d, stride_d}};
  args.hw_info.device_id = device;
  args.hw_info.sm_count = f.sms;  // (not queried again per call)
  if (Device::can_implement(args) != cutlass::Status::kSuccess ||
      Device::get_workspace_size(args) != 0) {
    return false;
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);
  const bool launched = Device::run(params, stream) == cutlass::Status::kSuccess;
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return launched;
}

}  // namespace customconv
