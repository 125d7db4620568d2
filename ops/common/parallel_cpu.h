// Splitting a range of work over ATen's intra-op threads from code built
// without OpenMP.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/empty.h>

#include <cstdint>

namespace customconv {

// Runs f(b, e) over subranges [b, e) covering [0, n), spread over ATen's
// intra-op threads like ATen's own CPU ops. at::parallel_for cannot do this
// here: with PyTorch's OpenMP backend its threading lives in a header and
// only takes effect in code compiled with -fopenmp (without it, it calls
// f(0, n) on the calling thread). TensorIterator::for_each is compiled into
// ATen, so it is used to split the range: it iterates over n bytes (never
// read or written) and hands each thread a contiguous run of them; a byte's
// offset is its index. Ranges below 2 * grain, one thread, or a call from
// inside a parallel region run inline.
template <class F>
void parallel_range(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  if (n < 2 * grain || at::get_num_threads() < 2 || at::in_parallel_region()) return f(0, n);
  const at::Tensor marks = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  at::TensorIterator iter = at::TensorIteratorConfig()
                                .add_output(marks)
                                .resize_outputs(false)
                                .check_all_same_dtype(false)
                                .build();
  const char* base = static_cast<const char*>(marks.const_data_ptr());
  iter.for_each(
      [&](char** data, const int64_t* strides, int64_t size0, int64_t size1) {
        for (int64_t o = 0; o < size1; ++o) {
          const int64_t b = data[0] + o * strides[1] - base;
          f(b, b + size0);
        }
      },
      grain);
}

// Total work (grain_for's units, about a multiply-add each) below which
// parallel_range_sized runs a range on the calling thread. Entering a parallel
// region costs 1-3 us a call on a 2-core machine (far more while another
// process keeps a core busy), more than splitting saves on work this small:
// the few-channel 3x3 forward with 8 -> 8 channels (its units: positions x
// taps x input channels x 16 padded output channels), one thread against two,
// at 8x8 7.4 against 8.7 us, at 12x12 11.5 against 13.3 (medians), level at
// 16x16 (295K units), two threads ahead from 24x24 (664K units: 19.3 against
// 23.2).
constexpr int64_t kInlineWork = int64_t(1) << 18;

// parallel_range, run on the calling thread where total_work (the range's
// work in grain_for's units) is below kInlineWork.
template <class F>
void parallel_range_sized(int64_t n, int64_t grain, int64_t total_work, const F& f) {
  if (n <= 0) return;
  if (total_work < kInlineWork) return f(0, n);
  parallel_range(n, grain, f);
}

}  // namespace customconv
