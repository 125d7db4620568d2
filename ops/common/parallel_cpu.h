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

}  // namespace customconv
