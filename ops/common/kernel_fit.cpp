#include "ops/common/kernel_fit.h"

#include <cuda_runtime_api.h>

namespace customconv {

namespace {

constexpr size_t kDefaultSharedLimit = 48 * 1024;

KernelFit query(const void* kernel, int device, const KernelNeeds& needs) {
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) return {};
  // The function attributes and occupancy below are those of the current device.
  if (previous != device && cudaSetDevice(device) != cudaSuccess) return {};
  KernelFit fit{};
  int major = 0, minor = 0, optin = 0, sms = 0;
  cudaFuncAttributes attr{};
  bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
            cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
                cudaSuccess &&
            cudaFuncGetAttributes(&attr, kernel) == cudaSuccess;
  ok = ok && 10 * major + minor >= needs.min_arch && attr.binaryVersion >= needs.min_arch &&
       attr.ptxVersion >= needs.min_arch;
  ok = ok && needs.shared_bytes + attr.sharedSizeBytes <= size_t(optin) &&
       needs.threads <= attr.maxThreadsPerBlock;
  if (ok && needs.shared_bytes > kDefaultSharedLimit) {
    ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(needs.shared_bytes)) == cudaSuccess;
  }
  int per_sm = 0;
  ok = ok && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, needs.threads,
                                                           needs.shared_bytes) == cudaSuccess;
  if (ok && per_sm > 0) fit = KernelFit{sms, per_sm};
  if (previous != device) cudaSetDevice(previous);
  return fit;
}

}  // namespace

KernelFit query_kernel_fit(const void* kernel, int device, const KernelNeeds& needs) {
  const KernelFit fit = query(kernel, device, needs);
  (void)cudaGetLastError();  // a failed query leaves no error for the next launch check
  return fit;
}

}  // namespace customconv
