// Checks on tensor arguments shared by every op: dims, dtype, device.
// Each error names the op and the argument.
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>

namespace customconv {

// The tensor's number of dims is one of `allowed`.
void check_dims(const char* op, const char* name, const at::Tensor& t,
                std::initializer_list<int64_t> allowed);

// A supported floating dtype: float32, float64, float16 or bfloat16.
void check_floating(const char* op, const char* name, const at::Tensor& t);

// `t` has the dtype and the device of `ref`.
void check_same_dtype_device(const char* op, const char* name, const at::Tensor& t,
                             const char* ref_name, const at::Tensor& ref);

}  // namespace customconv
