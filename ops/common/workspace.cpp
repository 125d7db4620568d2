#include "ops/common/workspace.h"

#include <algorithm>
#include <atomic>
#include <c10/util/Exception.h>
#include <cstdlib>
#include <string>

namespace customconv {
namespace {

int64_t initial_limit() {
  constexpr int64_t kDefaultMiB = 48;
  const char* env = std::getenv("CUSTOMCONV_WORKSPACE_MB");
  if (env == nullptr || *env == '\0') return kDefaultMiB << 20;
  char* end = nullptr;
  const long long mib = std::strtoll(env, &end, 10);
  TORCH_CHECK(end != env && *end == '\0' && mib > 0 && mib < (int64_t{1} << 40),
              "CUSTOMCONV_WORKSPACE_MB must be a positive integer number of MiB; got '", env, "'");
  return static_cast<int64_t>(mib) << 20;
}

std::atomic<int64_t>& limit() {
  static std::atomic<int64_t> value{initial_limit()};
  return value;
}

}  // namespace

int64_t workspace_limit_bytes() { return limit().load(std::memory_order_relaxed); }

void set_workspace_limit_bytes(int64_t bytes) {
  TORCH_CHECK(bytes > 0, "set_workspace_limit_bytes: bytes must be positive; got ", bytes);
  limit().store(bytes, std::memory_order_relaxed);
}

int64_t images_per_chunk(int64_t n, int64_t bytes_per_image) {
  if (n <= 1) return std::max<int64_t>(n, 1);
  const int64_t fit = workspace_limit_bytes() / std::max<int64_t>(bytes_per_image, 1);
  return std::clamp<int64_t>(fit, 1, n);
}

}  // namespace customconv
