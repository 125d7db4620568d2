#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/common/launch.h"
#include "ops/depthwise/depthwise.h"

namespace customconv {
namespace {

// Geometry of one call in plain integers.
struct Dims {
  int64_t n, c, h, w, mult, oh, ow;
  int64_t k() const { return c * mult; }
};

// The output columns x whose input column x*stride + offset lies in [0, w).
struct XRange {
  int64_t lo, hi;
};
XRange valid_x(int64_t offset, int64_t stride, int64_t w, int64_t ow) {
  const int64_t lo = offset >= 0 ? 0 : (-offset - 1) / stride + 1;  // no overflow for any stride
  const int64_t hi = w - 1 - offset >= 0 ? std::min(ow, (w - 1 - offset) / stride + 1) : 0;
  return {lo, std::max(lo, hi)};
}

// Whether the float32 paths below may copy a plane zero-padded: their copy
// of rows x pitch floats, rows = (oh - 1) * sh + (kh - 1) * dh + 1 and pitch =
// (ow rounded up to 16 - 1) * sw + (kw - 1) * dw + 9, stays within a small
// multiple of the planes it is made from and read into (`in_plane`, `oh` x
// `ow`). Geometries with far larger padding, dilation or stride (where most
// taps fall outside the input) take the direct loops, which never form it.
bool padded_copy_fits(const Window2d& k, int64_t oh, int64_t ow, int64_t in_plane) {
  const double rows = double(oh - 1) * double(k.sh) + double(k.kh - 1) * double(k.dh) + 1;
  const double pitch =
      double((ow + 15) / 16 * 16 - 1) * double(k.sw) + double(k.kw - 1) * double(k.dw) + 9;
  return rows * pitch <= 4.0 * double(in_plane + (ow + 15) / 16 * 16 * oh) + double(1 << 16);
}

// The hot float32 loops below are compiled twice on x86-64 (x86-64-v3: AVX2 and FMA; and the
// baseline), the loader picking one for the machine at run time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CUSTOMCONV_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CUSTOMCONV_CPU_CLONES
#endif

// The helpers below are always inlined into their callers, so the vector
// calling convention GCC warns about (-Wpsabi) never crosses a call.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

// 8 floats as one value (GCC/Clang vector extension: one AVX register, or
// two SSE registers in the baseline build), loaded and stored unaligned.
typedef float Float8 __attribute__((vector_size(32)));
__attribute__((always_inline)) inline Float8 load8(const float* p) {
  Float8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
__attribute__((always_inline)) inline Float8 load8_strided(const float* p, int64_t stride) {
  Float8 v;
  for (int l = 0; l < 8; ++l) v[l] = p[l * stride];
  return v;
}
// The even-indexed of 16 consecutive floats.
__attribute__((always_inline)) inline Float8 load8_even(const float* p) {
  typedef int Int8 __attribute__((vector_size(32)));
  return __builtin_shuffle(load8(p), load8(p + 8), Int8{0, 2, 4, 6, 8, 10, 12, 14});
}
__attribute__((always_inline)) inline void store8(float* p, Float8 v) {
  __builtin_memcpy(p, &v, sizeof v);
}

// Output row y of a correlation over a zero-padded plane P (row pitch pw_):
// 16 outputs per block, accumulated in two 8-wide vector registers. With K > 0
// (a K x K kernel, horizontal stride S of 1 or 2, dilation 1) every tap is
// unrolled; stride 2 reads 16 consecutive inputs and keeps the even ones.
template <int K, int S>
__attribute__((always_inline)) inline void padded_row_f32(const float* P, int64_t pitch,
                                                          const float* taps, const Window2d& k,
                                                          int64_t y, int64_t ow, float bias,
                                                          bool add, float* dst) {
  for (int64_t x = 0; x < ow; x += 16) {
    Float8 acc0 = bias - Float8{}, acc1 = acc0;
    if constexpr (K > 0) {
#pragma GCC unroll 8
      for (int i = 0; i < K; ++i) {
        const float* src = P + (y * k.sh + i * k.dh) * pitch + x * S;
#pragma GCC unroll 16
        for (int j = 0; j < K; ++j) {
          const float t = taps[i * K + j];
          if constexpr (S == 1) {
            acc0 += t * load8(src + j);
            acc1 += t * load8(src + j + 8);
          } else {
            acc0 += t * load8_even(src + j);
            acc1 += t * load8_even(src + j + 16);
          }
        }
      }
    } else {
      for (int64_t i = 0; i < k.kh; ++i) {
        const float* src = P + (y * k.sh + i * k.dh) * pitch + x * k.sw;
        for (int64_t j = 0; j < k.kw; ++j) {
          const float t = taps[i * k.kw + j];
          const float* s = src + j * k.dw;
          if (k.sw == 1) {
            acc0 += t * load8(s);
            acc1 += t * load8(s + 8);
          } else {
            acc0 += t * load8_strided(s, k.sw);
            acc1 += t * load8_strided(s + 8 * k.sw, k.sw);
          }
        }
      }
    }
    if (x + 16 <= ow) {
      if (add) {
        acc0 += load8(dst + x);
        acc1 += load8(dst + x + 8);
      }
      store8(dst + x, acc0);
      store8(dst + x + 8, acc1);
      continue;
    }
    float out[16];  // the last, partial block
    store8(out, acc0);
    store8(out + 8, acc1);
    for (int64_t e = 0; x + e < ow; ++e) dst[x + e] = add ? dst[x + e] + out[e] : out[e];
  }
}

// Output rows y and y + 1 at once for a fixed K x K kernel at stride S: four
// independent accumulators (two rows x two vectors) keep the FMA units busy
// where one row's two dependency chains would wait on FMA latency.
template <int K, int S>
__attribute__((always_inline)) inline void padded_rows2_f32(const float* P, int64_t pitch,
                                                            const float* taps, const Window2d& k,
                                                            int64_t y, int64_t ow, float bias,
                                                            bool add, float* dst) {
  for (int64_t x = 0; x < ow; x += 16) {
    Float8 a00 = bias - Float8{}, a01 = a00, a10 = a00, a11 = a00;
#pragma GCC unroll 16
    for (int i = 0; i < K; ++i) {
      const float* s0 = P + (y * k.sh + i * k.dh) * pitch + x * S;
      const float* s1 = s0 + k.sh * pitch;
#pragma GCC unroll 16
      for (int j = 0; j < K; ++j) {
        const float t = taps[i * K + j];
        if constexpr (S == 1) {
          a00 += t * load8(s0 + j);
          a01 += t * load8(s0 + j + 8);
          a10 += t * load8(s1 + j);
          a11 += t * load8(s1 + j + 8);
        } else {
          a00 += t * load8_even(s0 + j);
          a01 += t * load8_even(s0 + j + 16);
          a10 += t * load8_even(s1 + j);
          a11 += t * load8_even(s1 + j + 16);
        }
      }
    }
    float* d0 = dst + y * ow + x;
    float* d1 = d0 + ow;
    if (x + 16 <= ow) {
      if (add) {
        a00 += load8(d0), a01 += load8(d0 + 8), a10 += load8(d1), a11 += load8(d1 + 8);
      }
      store8(d0, a00), store8(d0 + 8, a01), store8(d1, a10), store8(d1 + 8, a11);
      continue;
    }
    float out[2][16];  // the last, partial block
    store8(out[0], a00), store8(out[0] + 8, a01), store8(out[1], a10), store8(out[1] + 8, a11);
    for (int64_t e = 0; x + e < ow; ++e) {
      d0[e] = add ? d0[e] + out[0][e] : out[0][e];
      d1[e] = add ? d1[e] + out[1][e] : out[1][e];
    }
  }
}

// All output rows of a plane: two per pass for a fixed kernel (K > 0), then
// the odd one; one at a time for the general loop.
template <int K, int S>
__attribute__((always_inline)) inline void plane_rows_f32(const float* P, int64_t pitch,
                                                          const float* taps, const Window2d& k,
                                                          int64_t oh, int64_t ow, float bias,
                                                          bool add, float* dst) {
  int64_t y = 0;
  if constexpr (K > 0) {
    for (; y + 2 <= oh; y += 2) padded_rows2_f32<K, S>(P, pitch, taps, k, y, ow, bias, add, dst);
  }
  for (; y < oh; ++y) padded_row_f32<K, S>(P, pitch, taps, k, y, ow, bias, add, dst + y * ow);
}

// A whole float32 output plane (oh x ow) of the correlation of `plane` (h x w,
// spread out by (spread_y, spread_x): zeros between its samples, as the input
// gradient of a strided correlation reads its grad output) with `taps` under
// window k. The plane is first copied, zero-padded, into `scratch` so that
// every output, the edges included, runs the same vector loop; `add` adds to
// dst instead of overwriting it.
CUSTOMCONV_CPU_CLONES
void correlate_plane_f32(const float* plane, int64_t h, int64_t w, int64_t spread_y,
                         int64_t spread_x, const float* taps, const Window2d& k, int64_t oh,
                         int64_t ow, float bias, bool add, float* dst,
                         std::vector<float>& scratch) {
  const int64_t ow16 = (ow + 15) / 16 * 16;
  const int64_t rows = (oh - 1) * k.sh + (k.kh - 1) * k.dh + 1;
  // One more vector of slack: stride-2 blocks read 16 inputs for 8 outputs.
  const int64_t pitch = (ow16 - 1) * k.sw + (k.kw - 1) * k.dw + 1 + 8;
  scratch.resize(static_cast<size_t>(rows * pitch));
  float* P = scratch.data();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t ty = r - k.ph, iy = ty >= 0 ? ty / spread_y : -1;
    float* prow = P + r * pitch;
    if (iy < 0 || iy >= h || iy * spread_y != ty) {
      std::fill(prow, prow + pitch, 0.f);
      continue;
    }
    if (spread_x > 1) {
      for (int64_t c = 0; c < pitch; ++c) {
        const int64_t tx = c - k.pw, ix = tx >= 0 ? tx / spread_x : -1;
        prow[c] = ix >= 0 && ix < w && ix * spread_x == tx ? plane[iy * w + ix] : 0.f;
      }
      continue;
    }
    const int64_t c0 = std::clamp<int64_t>(k.pw, 0, pitch);       // first column in the plane
    const int64_t c1 = std::clamp<int64_t>(k.pw + w, c0, pitch);  // one past its last
    std::fill(prow, prow + c0, 0.f);
    std::copy(plane + iy * w + (c0 - k.pw), plane + iy * w + (c1 - k.pw), prow + c0);
    std::fill(prow + c1, prow + pitch, 0.f);
  }
  // Square kernels of 3..13 taps at stride 1 and 3..7 at stride 2 (dilation 1
  // along x) run unrolled, two rows per pass; everything else the general loop.
  const int64_t kk = k.dw == 1 && k.kh == k.kw ? k.kw : 0;
  if (kk == 3 && k.sw == 1) return plane_rows_f32<3, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 5 && k.sw == 1) return plane_rows_f32<5, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 7 && k.sw == 1) return plane_rows_f32<7, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 9 && k.sw == 1) return plane_rows_f32<9, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 11 && k.sw == 1)
    return plane_rows_f32<11, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 13 && k.sw == 1)
    return plane_rows_f32<13, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 3 && k.sw == 2) return plane_rows_f32<3, 2>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 5 && k.sw == 2) return plane_rows_f32<5, 2>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 7 && k.sw == 2) return plane_rows_f32<7, 2>(P, pitch, taps, k, oh, ow, bias, add, dst);
  plane_rows_f32<0, 0>(P, pitch, taps, k, oh, ow, bias, add, dst);
}

// Adds one image's contribution to the weight gradient of one float32 channel:
// for every tap, 16 lane sums (lanes[tap * 16 + l]) of grad_output times the
// input it met. The input plane is copied zero-padded (and zero past the last
// column or row any output reads, so the grad output's zero padding never
// meets a stray Inf) and the grad output to rows of a multiple of 16; then
// each tap is 16-wide vector products over whole rows.
CUSTOMCONV_CPU_CLONES
void weight_grad_plane_f32(const float* go, const float* plane, int64_t h, int64_t w,
                           const Window2d& k, int64_t oh, int64_t ow, float* lanes,
                           std::vector<float>& pad_in, std::vector<float>& pad_go) {
  const int64_t ow16 = (ow + 15) / 16 * 16;
  const int64_t rows = (oh - 1) * k.sh + (k.kh - 1) * k.dh + 1;
  const int64_t cols = (ow - 1) * k.sw + (k.kw - 1) * k.dw + 1;  // columns any output reads
  const int64_t pitch = (ow16 - 1) * k.sw + (k.kw - 1) * k.dw + 1 + 8;
  pad_in.assign(static_cast<size_t>(rows * pitch), 0.f);
  pad_go.assign(static_cast<size_t>(oh * ow16), 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t iy = r - k.ph;
    if (iy < 0 || iy >= h) continue;
    const int64_t c0 = std::clamp<int64_t>(k.pw, 0, cols),
                  c1 = std::clamp<int64_t>(k.pw + w, c0, cols);
    std::copy(plane + iy * w + (c0 - k.pw), plane + iy * w + (c1 - k.pw),
              pad_in.data() + r * pitch + c0);
  }
  for (int64_t y = 0; y < oh; ++y)
    std::copy(go + y * ow, go + (y + 1) * ow, pad_go.data() + y * ow16);
  const float* P = pad_in.data();
  for (int64_t i = 0; i < k.kh; ++i) {
    for (int64_t j = 0; j < k.kw; ++j) {
      Float8 a0 = load8(lanes + (i * k.kw + j) * 16), a1 = load8(lanes + (i * k.kw + j) * 16 + 8);
      for (int64_t y = 0; y < oh; ++y) {
        const float* g = pad_go.data() + y * ow16;
        const float* p = P + (y * k.sh + i * k.dh) * pitch + j * k.dw;
        for (int64_t x = 0; x < ow16; x += 16) {
          if (k.sw == 1) {
            a0 += load8(g + x) * load8(p + x);
            a1 += load8(g + x + 8) * load8(p + x + 8);
          } else if (k.sw == 2) {
            a0 += load8(g + x) * load8_even(p + 2 * x);
            a1 += load8(g + x + 8) * load8_even(p + 2 * x + 16);
          } else {
            a0 += load8(g + x) * load8_strided(p + x * k.sw, k.sw);
            a1 += load8(g + x + 8) * load8_strided(p + (x + 8) * k.sw, k.sw);
          }
        }
      }
      store8(lanes + (i * k.kw + j) * 16, a0);
      store8(lanes + (i * k.kw + j) * 16 + 8, a1);
    }
  }
}

// Work split: one task per output plane (image, output channel); each output
// row is accumulated in opmath precision tap by tap, the inner loop running
// along the row (unit stride in the output, vectorizable).
template <typename T>
void forward_planes(const T* in, const T* wt, const T* bias, T* out, const Dims& d,
                    const Window2d& k) {
  using acc_t = at::opmath_type<T>;
  const bool padded = padded_copy_fits(k, d.oh, d.ow, d.h * d.w);
  at::parallel_for(0, d.n * d.k(), grain_for(k.kh * k.kw * d.oh * d.ow), [&](int64_t b, int64_t e) {
    std::vector<acc_t> acc(static_cast<size_t>(d.ow));
    std::vector<float> scratch;
    for (int64_t p = b; p < e; ++p) {
      const int64_t oc = p % d.k(), n = p / d.k();
      const T* plane = in + (n * d.c + oc / d.mult) * d.h * d.w;
      const T* taps = wt + oc * k.kh * k.kw;
      const acc_t b0 = bias ? static_cast<acc_t>(bias[oc]) : acc_t(0);
      if constexpr (std::is_same_v<T, float>) {
        if (padded) {
          correlate_plane_f32(plane, d.h, d.w, 1, 1, taps, k, d.oh, d.ow, b0, false,
                              out + p * d.oh * d.ow, scratch);
          continue;
        }
      }
      for (int64_t y = 0; y < d.oh; ++y) {
        std::fill(acc.begin(), acc.end(), b0);
        for (int64_t i = 0; i < k.kh; ++i) {
          const int64_t iy = y * k.sh - k.ph + i * k.dh;
          if (iy < 0 || iy >= d.h) continue;
          const T* row = plane + iy * d.w;
          for (int64_t j = 0; j < k.kw; ++j) {
            const acc_t tap = static_cast<acc_t>(taps[i * k.kw + j]);
            const int64_t off = j * k.dw - k.pw;
            const XRange r = valid_x(off, k.sw, d.w, d.ow);
            if (k.sw == 1) {
              for (int64_t x = r.lo; x < r.hi; ++x)
                acc[x] += tap * static_cast<acc_t>(row[x + off]);
            } else {
              for (int64_t x = r.lo; x < r.hi; ++x) {
                acc[x] += tap * static_cast<acc_t>(row[x * k.sw + off]);
              }
            }
          }
        }
        T* dst = out + (p * d.oh + y) * d.ow;
        for (int64_t x = 0; x < d.ow; ++x) dst[x] = static_cast<T>(acc[x]);
      }
    }
  });
}

// Work split: one task per input plane (image, input channel); the task
// scatters the gradients of its m output channels into a private opmath
// accumulator plane, then writes the plane once (fixed order: deterministic).
template <typename T>
void grad_input_planes(const T* go, const T* wt, T* gi, const Dims& d, const Window2d& k) {
  using acc_t = at::opmath_type<T>;
  const int64_t work = d.mult * k.kh * k.kw * d.oh * d.ow;
  // The gradient is the grad output, spread out by the stride, correlated
  // with the rotated taps and padded by dilation*(k-1) - padding; the m
  // output channels add in order.
  const Window2d adj{k.kh, k.kw, 1, 1, (k.kh - 1) * k.dh - k.ph, (k.kw - 1) * k.dw - k.pw,
                     k.dh, k.dw};
  if constexpr (std::is_same_v<T, float>) {
    if (padded_copy_fits(adj, d.h, d.w, d.oh * d.ow)) {
      const int64_t taps = k.kh * k.kw;
      std::vector<float> rotated(static_cast<size_t>(d.k() * taps));
      for (int64_t oc = 0; oc < d.k(); ++oc)
        for (int64_t t = 0; t < taps; ++t) rotated[oc * taps + t] = wt[oc * taps + taps - 1 - t];
      at::parallel_for(0, d.n * d.c, grain_for(work), [&](int64_t b, int64_t e) {
        std::vector<float> scratch;
        for (int64_t p = b; p < e; ++p) {
          const int64_t c = p % d.c, n = p / d.c;
          for (int64_t m = 0; m < d.mult; ++m) {
            const int64_t oc = c * d.mult + m;
            const float* gplane = go + (n * d.k() + oc) * d.oh * d.ow;
            correlate_plane_f32(gplane, d.oh, d.ow, k.sh, k.sw, rotated.data() + oc * taps, adj,
                                d.h, d.w, 0.f, m > 0, gi + p * d.h * d.w, scratch);
          }
        }
      });
      return;
    }
  }
  at::parallel_for(0, d.n * d.c, grain_for(work), [&](int64_t b, int64_t e) {
    std::vector<acc_t> acc(static_cast<size_t>(d.h * d.w));
    for (int64_t p = b; p < e; ++p) {
      const int64_t c = p % d.c, n = p / d.c;
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t m = 0; m < d.mult; ++m) {
        const int64_t oc = c * d.mult + m;
        const T* gplane = go + (n * d.k() + oc) * d.oh * d.ow;
        const T* taps = wt + oc * k.kh * k.kw;
        for (int64_t y = 0; y < d.oh; ++y) {
          const T* grow = gplane + y * d.ow;
          for (int64_t i = 0; i < k.kh; ++i) {
            const int64_t iy = y * k.sh - k.ph + i * k.dh;
            if (iy < 0 || iy >= d.h) continue;
            acc_t* arow = acc.data() + iy * d.w;
            for (int64_t j = 0; j < k.kw; ++j) {
              const acc_t tap = static_cast<acc_t>(taps[i * k.kw + j]);
              const int64_t off = j * k.dw - k.pw;
              const XRange r = valid_x(off, k.sw, d.w, d.ow);
              for (int64_t x = r.lo; x < r.hi; ++x) {
                arow[x * k.sw + off] += tap * static_cast<acc_t>(grow[x]);
              }
            }
          }
        }
      }
      T* dst = gi + p * d.h * d.w;
      for (int64_t q = 0; q < d.h * d.w; ++q) dst[q] = static_cast<T>(acc[q]);
    }
  });
}

// Work split: one task per output channel; for each tap it sums
// grad_output * input over batch and space in a fixed order (deterministic).
template <typename T>
void grad_weight_channels(const T* go, const T* in, T* gw, const Dims& d, const Window2d& k) {
  using acc_t = at::opmath_type<T>;
  const int64_t work = d.n * k.kh * k.kw * d.oh * d.ow;
  if constexpr (std::is_same_v<T, float>) {
    if (padded_copy_fits(k, d.oh, d.ow, d.h * d.w)) {
      // Per channel: every image adds into 16 lanes per tap, which are then
      // summed in a fixed order (deterministic).
      const int64_t taps = k.kh * k.kw;
      at::parallel_for(0, d.k(), grain_for(work), [&](int64_t b, int64_t e) {
        std::vector<float> lanes(static_cast<size_t>(taps * 16)), pad_in, pad_go;
        for (int64_t oc = b; oc < e; ++oc) {
          const int64_t c = oc / d.mult;
          std::fill(lanes.begin(), lanes.end(), 0.f);
          for (int64_t n = 0; n < d.n; ++n) {
            weight_grad_plane_f32(go + (n * d.k() + oc) * d.oh * d.ow,
                                  in + (n * d.c + c) * d.h * d.w, d.h, d.w, k, d.oh, d.ow,
                                  lanes.data(), pad_in, pad_go);
          }
          for (int64_t t = 0; t < taps; ++t) {
            double sum = 0;
            for (int l = 0; l < 16; ++l) sum += lanes[t * 16 + l];
            gw[oc * taps + t] = static_cast<float>(sum);
          }
        }
      });
      return;
    }
  }
  at::parallel_for(0, d.k(), grain_for(work), [&](int64_t b, int64_t e) {
    for (int64_t oc = b; oc < e; ++oc) {
      const int64_t c = oc / d.mult;
      for (int64_t i = 0; i < k.kh; ++i) {
        for (int64_t j = 0; j < k.kw; ++j) {
          const int64_t off = j * k.dw - k.pw;
          const XRange r = valid_x(off, k.sw, d.w, d.ow);
          acc_t sum = 0;
          for (int64_t n = 0; n < d.n; ++n) {
            const T* gplane = go + (n * d.k() + oc) * d.oh * d.ow;
            const T* plane = in + (n * d.c + c) * d.h * d.w;
            for (int64_t y = 0; y < d.oh; ++y) {
              const int64_t iy = y * k.sh - k.ph + i * k.dh;
              if (iy < 0 || iy >= d.h) continue;
              const T* grow = gplane + y * d.ow;
              const T* row = plane + iy * d.w;
              for (int64_t x = r.lo; x < r.hi; ++x) {
                sum += static_cast<acc_t>(grow[x]) * static_cast<acc_t>(row[x * k.sw + off]);
              }
            }
          }
          gw[(oc * k.kh + i) * k.kw + j] = static_cast<T>(sum);
        }
      }
    }
  });
}

Dims dims_of(const at::Tensor& input, const at::Tensor& out_like, int64_t mult) {
  return {input.size(0), input.size(1),    input.size(2),   input.size(3),
          mult,          out_like.size(2), out_like.size(3)};
}

void forward_cpu(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                 const at::Tensor& output, const Window2d& win, int64_t mult) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_cpu", [&] {
        forward_planes<scalar_t>(input.const_data_ptr<scalar_t>(),
                                 weight.const_data_ptr<scalar_t>(),
                                 bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr,
                                 output.data_ptr<scalar_t>(), dims_of(input, output, mult), win);
      });
}

void grad_input_cpu(const at::Tensor& grad_output, const at::Tensor& weight,
                    const at::Tensor& grad_input, const Window2d& win, int64_t mult) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_conv2d_grad_input_cpu", [&] {
        grad_input_planes<scalar_t>(
            grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
            grad_input.data_ptr<scalar_t>(), dims_of(grad_input, grad_output, mult), win);
      });
}

void grad_weight_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                     const at::Tensor& grad_weight, const Window2d& win, int64_t mult) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_grad_weight_cpu", [&] {
        grad_weight_channels<scalar_t>(
            grad_output.const_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
            grad_weight.data_ptr<scalar_t>(), dims_of(input, grad_output, mult), win);
      });
}

}  // namespace

DepthwiseKernels cpu_depthwise_kernels() {
  return {&forward_cpu, &grad_input_cpu, &grad_weight_cpu};
}

}  // namespace customconv
