// Whether a CUDA kernel can run on a device, and how many of its blocks are
// resident there at once: the one place the launchers ask. It checks the
// device's compute capability and that of the binary the device would run
// (a kernel compiled empty for older architectures must not be launched),
// the per-block shared-memory opt-in limit (raising the kernel's limit when it
// needs more than the default 48 KiB), and the occupancy at the block size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace customconv {

// Devices a cached answer is kept for; a device beyond them gets "cannot run".
constexpr int kMaxFitDevices = 64;

struct KernelNeeds {
  int min_arch = 0;         // compute capability x 10 the device and the binary need (0: any)
  int threads = 1;          // threads per block
  size_t shared_bytes = 0;  // dynamic shared memory per block
};

struct KernelFit {
  int sms = 0;            // multiprocessors of the device
  int blocks_per_sm = 0;  // resident blocks per multiprocessor; 0: the kernel cannot run there
  explicit operator bool() const { return blocks_per_sm > 0; }
  int64_t resident_blocks() const { return int64_t(sms) * blocks_per_sm; }
};

// Asks the runtime (several calls: meant to be cached, see CachedKernelFit).
// Never throws: a CUDA error met on the way means "cannot run" and is cleared.
KernelFit query_kernel_fit(const void* kernel, int device, const KernelNeeds& needs);

// query_kernel_fit's answer for one kernel and one set of needs, found once
// per device and then read without a runtime call. A launcher keeps one as a
// function-local static next to the kernel it launches.
class CachedKernelFit {
 public:
  CachedKernelFit(const void* kernel, KernelNeeds needs) : kernel_(kernel), needs_(needs) {}
  CachedKernelFit(const CachedKernelFit&) = delete;
  CachedKernelFit& operator=(const CachedKernelFit&) = delete;

  const KernelFit& on(int device) {
    static const KernelFit kNone{};
    if (device < 0 || device >= kMaxFitDevices) return kNone;
    std::call_once(once_[device],
                   [&] { fit_[device] = query_kernel_fit(kernel_, device, needs_); });
    return fit_[device];
  }

 private:
  const void* kernel_;
  KernelNeeds needs_;
  std::once_flag once_[kMaxFitDevices];
  KernelFit fit_[kMaxFitDevices];
};

}  // namespace customconv
