#include "ops/filter2d/adjoint.h"

#include "ops/common/launch.h"
#include "ops/filter2d/border.h"
#include "ops/filter2d/filter2d.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <vector>

namespace customconv {
namespace {

// For each padded coordinate t in [0, n + 2*pad): the plane index it reads, or -1.
std::vector<int64_t> border_map(int64_t n, int64_t pad, Border mode) {
  std::vector<int64_t> map(static_cast<size_t>(n + 2 * pad));
  for (int64_t t = 0; t < n + 2 * pad; ++t) map[t] = border_index(t - pad, n, mode);
  return map;
}

// Work split: one task per output row of any plane. The row is accumulated in
// opmath precision tap by tap; for each tap the columns that read inside the
// plane run as a plain unit-stride loop (vectorizable), the border columns go
// through the border map.
template <typename T>
void forward_rows(const T* in, const T* kern, T* out, int64_t planes, int64_t h, int64_t w,
                  const Filter2dShape& s) {
  using acc_t = at::opmath_type<T>;
  const auto rows = border_map(h, s.ph, s.border);
  const auto cols = border_map(w, s.pw, s.border);
  at::parallel_for(0, planes * h, grain_for(s.kh * s.kw * w), [&](int64_t b, int64_t e) {
    std::vector<acc_t> acc(static_cast<size_t>(w));
    for (int64_t r = b; r < e; ++r) {
      const int64_t p = r / h, y = r % h;
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t i = 0; i < s.kh; ++i) {
        const int64_t sy = rows[y + i];
        if (sy < 0) continue;
        const T* src = in + (p * h + sy) * w;
        for (int64_t j = 0; j < s.kw; ++j) {
          const acc_t tap = static_cast<acc_t>(kern[i * s.kw + j]);
          const int64_t off = j - s.pw;  // column x reads x + off
          const int64_t lo = std::clamp<int64_t>(-off, 0, w),
                        hi = std::clamp<int64_t>(w - off, lo, w);
          for (int64_t x = 0; x < lo; ++x) {
            const int64_t c = cols[x + j];
            if (c >= 0) acc[x] += tap * static_cast<acc_t>(src[c]);
          }
          for (int64_t x = lo; x < hi; ++x) acc[x] += tap * static_cast<acc_t>(src[x + off]);
          for (int64_t x = hi; x < w; ++x) {
            const int64_t c = cols[x + j];
            if (c >= 0) acc[x] += tap * static_cast<acc_t>(src[c]);
          }
        }
      }
      T* dst = out + r * w;
      for (int64_t x = 0; x < w; ++x) dst[x] = static_cast<T>(acc[x]);
    }
  });
}

// Work split: one task per input row of any plane; each sample's gradient is
// gathered by filter2d_input_gradient (fixed order: deterministic).
template <typename T>
void grad_input_rows(const T* go, const T* kern, T* gi, int64_t planes, int64_t h, int64_t w,
                     const Filter2dShape& s) {
  using acc_t = at::opmath_type<T>;
  at::parallel_for(0, planes * h, grain_for(s.kh * s.kw * w), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t p = r / h, qy = r % h;
      for (int64_t qx = 0; qx < w; ++qx) {
        gi[r * w + qx] = static_cast<T>(
            filter2d_input_gradient<T, acc_t>(go + p * h * w, kern, qy, qx, h, w, s));
      }
    }
  });
}

// Work split: the rows of all planes are cut into a fixed number of chunks;
// each chunk sums grad_out * padded input for every tap into its own partial,
// and the partials are added in chunk order (deterministic whatever the
// thread count).
template <typename T>
void grad_kernel_chunks(const T* go, const T* in, T* gk, int64_t planes, int64_t h, int64_t w,
                        const Filter2dShape& s) {
  using acc_t = at::opmath_type<T>;
  const int64_t total_rows = planes * h, taps = s.kh * s.kw;
  const int64_t chunks = std::min<int64_t>(total_rows, 64);
  const auto rows = border_map(h, s.ph, s.border);
  const auto cols = border_map(w, s.pw, s.border);
  std::vector<acc_t> partial(static_cast<size_t>(chunks * taps), acc_t(0));
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t chunk = b; chunk < e; ++chunk) {
      acc_t* part = partial.data() + chunk * taps;
      const int64_t r0 = total_rows * chunk / chunks, r1 = total_rows * (chunk + 1) / chunks;
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t p = r / h, y = r % h;
        const T* grow = go + r * w;
        for (int64_t i = 0; i < s.kh; ++i) {
          const int64_t sy = rows[y + i];
          if (sy < 0) continue;
          const T* src = in + (p * h + sy) * w;
          for (int64_t j = 0; j < s.kw; ++j) {
            acc_t sum = 0;
            for (int64_t x = 0; x < w; ++x) {
              const int64_t c = cols[x + j];
              if (c >= 0) sum += static_cast<acc_t>(grow[x]) * static_cast<acc_t>(src[c]);
            }
            part[i * s.kw + j] += sum;
          }
        }
      }
    }
  });
  for (int64_t t = 0; t < taps; ++t) {
    acc_t sum = 0;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) sum += partial[chunk * taps + t];
    gk[t] = static_cast<T>(sum);
  }
}

void forward_cpu(const at::Tensor& planes, const at::Tensor& kernel, const at::Tensor& out,
                 const Filter2dShape& s) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, planes.scalar_type(), "filter2d_cpu", [&] {
        forward_rows<scalar_t>(planes.const_data_ptr<scalar_t>(), kernel.const_data_ptr<scalar_t>(),
                               out.data_ptr<scalar_t>(), planes.size(0), planes.size(1),
                               planes.size(2), s);
      });
}

void grad_input_cpu(const at::Tensor& grad_out, const at::Tensor& kernel, const at::Tensor& grad_in,
                    const Filter2dShape& s) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_out.scalar_type(), "filter2d_grad_input_cpu", [&] {
        grad_input_rows<scalar_t>(grad_out.const_data_ptr<scalar_t>(),
                                  kernel.const_data_ptr<scalar_t>(), grad_in.data_ptr<scalar_t>(),
                                  grad_out.size(0), grad_out.size(1), grad_out.size(2), s);
      });
}

void grad_kernel_cpu(const at::Tensor& grad_out, const at::Tensor& planes,
                     const at::Tensor& grad_kernel, const Filter2dShape& s) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, planes.scalar_type(), "filter2d_grad_kernel_cpu", [&] {
        grad_kernel_chunks<scalar_t>(
            grad_out.const_data_ptr<scalar_t>(), planes.const_data_ptr<scalar_t>(),
            grad_kernel.data_ptr<scalar_t>(), planes.size(0), planes.size(1), planes.size(2), s);
      });
}

}  // namespace

Filter2dKernels cpu_filter2d_kernels() { return {&forward_cpu, &grad_input_cpu, &grad_kernel_cpu}; }

}  // namespace customconv
