#include "ops/conv2d/batched_gemm.h"

#include <ATen/ATen.h>

namespace customconv {

// The CPU BLAS through ATen's bmm, which takes strided operands as they are.
void batched_gemm_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                      bool accumulate) {
  if (c.scalar_type() != a.scalar_type()) {  // a float32 accumulator for 16-bit operands
    const at::Tensor product = at::bmm(a.to(c.scalar_type()), b.to(c.scalar_type()));
    accumulate ? c.add_(product) : c.copy_(product);
    return;
  }
  if (accumulate) {
    c.baddbmm_(a, b);
  } else {
    at::Tensor out = c;
    at::bmm_out(out, a, b);
  }
}

}  // namespace customconv
