#include "ops/common/tensor_checks.h"

#include <c10/util/Exception.h>
#include <sstream>

namespace customconv {

void check_dims(const char* op, const char* name, const at::Tensor& t,
                std::initializer_list<int64_t> allowed) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
  for (int64_t d : allowed) {
    if (t.dim() == d) return;
  }
  std::ostringstream want;
  const char* sep = "";
  for (int64_t d : allowed) {
    want << sep << d;
    sep = " or ";
  }
  TORCH_CHECK(false, op, ": ", name, " must have ", want.str(), " dims; got ", t.dim(),
              " dims with shape ", t.sym_sizes());
}

void check_floating(const char* op, const char* name, const at::Tensor& t) {
  const auto s = t.scalar_type();
  TORCH_CHECK(s == at::kFloat || s == at::kDouble || s == at::kHalf || s == at::kBFloat16, op, ": ",
              name, " must be float32, float64, float16 or bfloat16; got ", s);
}

void check_same_dtype_device(const char* op, const char* name, const at::Tensor& t,
                             const char* ref_name, const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " is on ", t.device(), " but ", ref_name,
              " is on ", ref.device(), "; all tensors must be on one device");
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " has dtype ", t.scalar_type(),
              " but ", ref_name, " has dtype ", ref.scalar_type(),
              "; all tensors must have one dtype");
}

}  // namespace customconv
