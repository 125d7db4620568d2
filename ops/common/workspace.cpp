#include "ops/common/workspace.h"

#include <algorithm>
#include <atomic>
#include <c10/util/Exception.h>
#include <cstdlib>
#include <string>

namespace customconv {
namespace {

constexpr int64_t kCpuDefaultMiB = 256;
constexpr int64_t kCudaDefaultMiB = 48;
constexpr int64_t kCudaCallBoundMiB = 64;  // a call's extra memory on CUDA

// CUSTOMCONV_WORKSPACE_MB in bytes, or 0 where it is not set.
int64_t environment_limit() {
  const char* env = std::getenv("CUSTOMCONV_WORKSPACE_MB");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const long long mib = std::strtoll(env, &end, 10);
  TORCH_CHECK(end != env && *end == '\0' && mib > 0 && mib < (int64_t{1} << 40),
              "CUSTOMCONV_WORKSPACE_MB must be a positive integer number of MiB; got '", env, "'");
  return static_cast<int64_t>(mib) << 20;
}

// The limit set_workspace_limit_bytes() set, else the environment's (0: neither).
std::atomic<int64_t>& set_limit() {
  static std::atomic<int64_t> value{environment_limit()};
  return value;
}

}  // namespace

int64_t workspace_limit_bytes(c10::DeviceType device) {
  const int64_t set = set_limit().load(std::memory_order_relaxed);
  if (set > 0) return set;
  return (device == c10::DeviceType::CUDA ? kCudaDefaultMiB : kCpuDefaultMiB) << 20;
}

void set_workspace_limit_bytes(int64_t bytes) {
  TORCH_CHECK(bytes >= 0,
              "set_workspace_limit_bytes: bytes must be positive, or 0 for the defaults; got ",
              bytes);
  set_limit().store(bytes > 0 ? bytes : environment_limit(), std::memory_order_relaxed);
}

int64_t images_per_chunk(int64_t n, int64_t bytes_per_image, c10::DeviceType device) {
  return images_within(n, bytes_per_image, workspace_limit_bytes(device));
}

int64_t images_within(int64_t n, int64_t bytes_per_image, int64_t limit) {
  if (n <= 1) return std::max<int64_t>(n, 1);
  const int64_t fit = limit / std::max<int64_t>(bytes_per_image, 1);
  return std::clamp<int64_t>(fit, 1, n);
}

int64_t relayout_forward_limit_bytes(c10::DeviceType device, int64_t reserved) {
  const int64_t limit = workspace_limit_bytes(device);
  if (device != c10::DeviceType::CUDA || set_limit().load(std::memory_order_relaxed) > 0) {
    return limit;
  }
  return std::max<int64_t>((kCudaCallBoundMiB << 20) - std::max<int64_t>(reserved, 0), limit);
}

}  // namespace customconv
