#include "ops/common/window.h"

#include <c10/util/safe_numerics.h>

namespace customconv {
namespace {

// Reads one int[2] argument; a single value stands for both axes.
void read_pair(const char* op, const char* name, c10::IntArrayRef v, int64_t& a, int64_t& b) {
  TORCH_CHECK(v.size() == 2 || v.size() == 1, op, ": ", name,
              " must be a list of 2 integers (or 1, used for both axes); got ", v.size(),
              " values ", v);
  a = v[0];
  b = v.size() == 2 ? v[1] : v[0];
}

}  // namespace

int64_t checked_mul(const char* op, const char* what, int64_t a, int64_t b) {
  uint64_t out = 0;
  TORCH_CHECK(a >= 0 && b >= 0 &&
                  !c10::mul_overflows(static_cast<uint64_t>(a), static_cast<uint64_t>(b), &out) &&
                  out <= static_cast<uint64_t>(INT64_MAX),
              op, ": ", what, " overflows 64-bit integers (", a, " * ", b, ")");
  return static_cast<int64_t>(out);
}

Window2d check_window(const char* op, int64_t kh, int64_t kw, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  Window2d w{};
  w.kh = kh;
  w.kw = kw;
  read_pair(op, "stride", stride, w.sh, w.sw);
  read_pair(op, "padding", padding, w.ph, w.pw);
  read_pair(op, "dilation", dilation, w.dh, w.dw);
  TORCH_CHECK(w.kh > 0 && w.kw > 0, op, ": kernel_size must be positive; got (", w.kh, ", ", w.kw,
              ")");
  TORCH_CHECK(w.sh > 0 && w.sw > 0, op, ": stride must be positive; got (", w.sh, ", ", w.sw, ")");
  TORCH_CHECK(w.ph >= 0 && w.pw >= 0, op, ": padding must be non-negative; got (", w.ph, ", ", w.pw,
              ")");
  TORCH_CHECK(w.dh > 0 && w.dw > 0, op, ": dilation must be positive; got (", w.dh, ", ", w.dw,
              ")");
  // extent = dilation * (k - 1) + 1 and in + 2 * padding must stay well inside int64.
  constexpr int64_t kLimit = int64_t{1} << 62;
  TORCH_CHECK(checked_mul(op, "dilation * (kernel_size - 1)", w.dh, w.kh - 1) < kLimit &&
                  checked_mul(op, "dilation * (kernel_size - 1)", w.dw, w.kw - 1) < kLimit,
              op, ": dilation * (kernel_size - 1) is too large (dilation (", w.dh, ", ", w.dw,
              "), kernel_size (", w.kh, ", ", w.kw, "))");
  TORCH_CHECK(w.ph < kLimit / 4 && w.pw < kLimit / 4, op, ": padding (", w.ph, ", ", w.pw,
              ") is too large");
  return w;
}

Window2d check_window(const char* op, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  int64_t kh = 0, kw = 0;
  read_pair(op, "kernel_size", kernel_size, kh, kw);
  return check_window(op, kh, kw, stride, padding, dilation);
}

}  // namespace customconv
