// Views of a tensor's storage made without a dispatcher call, for the
// temporaries that a kernel's host code hands to its own launches and GEMMs.
//
// Every ATen view (as_strided, select, narrow, transpose, expand, view) is a
// dispatcher call that allocates a TensorImpl and sets up view and autograd
// bookkeeping: a microsecond or more of host time each. The column route of
// conv2d made 20 to 70 of them a call (per image, per group, per chunk),
// which small and many-chunked layers paid in full. These views carry none of
// that bookkeeping, so they are only for tensors that never leave the op:
// not returned, not saved for backward, not seen by autograd.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <utility>

namespace customconv {

// The (sizes, strides) view of `base`'s storage from element `offset` (in
// elements of `dtype`; base's own dtype by default). The caller keeps it
// within the storage.
inline at::Tensor strided_view(const at::Tensor& base, c10::IntArrayRef sizes,
                               c10::IntArrayRef strides, int64_t offset, caffe2::TypeMeta dtype) {
  at::Tensor v = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(), dtype);
  v.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return v;
}

inline at::Tensor strided_view(const at::Tensor& base, c10::IntArrayRef sizes,
                               c10::IntArrayRef strides, int64_t offset) {
  return strided_view(base, sizes, strides, offset, base.dtype());
}

// `base` with dimension `dim` fixed at `index` (base.select(dim, index)).
inline at::Tensor select_view(const at::Tensor& base, int64_t dim, int64_t index) {
  c10::SmallVector<int64_t, 6> sizes, strides;
  for (int64_t d = 0; d < base.dim(); ++d) {
    if (d == dim) continue;
    sizes.push_back(base.size(d));
    strides.push_back(base.stride(d));
  }
  return strided_view(base, sizes, strides, base.storage_offset() + index * base.stride(dim));
}

// Images [first, first + count) of `base` along its first dimension
// (base.narrow(0, first, count)).
inline at::Tensor leading_view(const at::Tensor& base, int64_t first, int64_t count) {
  c10::SmallVector<int64_t, 6> sizes(base.sizes().begin(), base.sizes().end());
  sizes[0] = count;
  return strided_view(base, sizes, base.strides(), base.storage_offset() + first * base.stride(0));
}

// `base` with dimensions a and b swapped (base.transpose(a, b)).
inline at::Tensor transposed_view(const at::Tensor& base, int64_t a, int64_t b) {
  c10::SmallVector<int64_t, 6> sizes(base.sizes().begin(), base.sizes().end());
  c10::SmallVector<int64_t, 6> strides(base.strides().begin(), base.strides().end());
  std::swap(sizes[a], sizes[b]);
  std::swap(strides[a], strides[b]);
  return strided_view(base, sizes, strides, base.storage_offset());
}

}  // namespace customconv
