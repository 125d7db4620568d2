// batched_gemm on CUDA: one strided-batched product on the operands' own
// strides, on the current stream, with the compute type PyTorch's
// convolutions would use. Products of at most 2^26 multiply-adds, whose
// device time is a few microseconds, take a cublasLtMatmul with the
// algorithm kept per problem (cublaslt.h): cublasGemmStridedBatchedEx runs
// cuBLAS's own selection on every call, 2-3 us more of the host's time a
// call on an H200, up to 13 us on some. Larger products (and every product
// where cuBLASLt is missing or has no algorithm) take
// cublasGemmStridedBatchedEx: there cuBLASLt's heuristic's first algorithm
// measured slower on the device: ResNet-50's 1x1 layers at N=32 in float32
// channels_last, forward+backward, took 9-52 us more a layer on an H200
// (0.091-0.208 ms against 0.075-0.169).
//
// The library does not link cuBLAS itself: it calls the cuBLAS that libtorch_cuda
// already loaded (process_symbol.h).
#include "ops/conv2d/batched_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>

#include "ops/common/process_symbol.h"
#include "ops/conv2d/cublaslt.h"
#ifdef CUSTOMCONV_WITH_SM90A
#include "ops/conv2d/tf32_gemm_sm90.h"
#endif

namespace customconv {
namespace {

cudaDataType_t cuda_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return CUDA_R_32F;
    case at::kDouble: return CUDA_R_64F;
    case at::kHalf: return CUDA_R_16F;
    case at::kBFloat16: return CUDA_R_16BF;
    default: TORCH_CHECK(false, "batched_gemm: unsupported dtype ", t);
  }
}

// One matrix of a batched view, as the cuBLAS (column-major) operand whose
// op() is the matrix's transpose. cuBLAS computes c^T = b^T · a^T, which is
// c = a · b in the row-major terms the tensors are in.
struct Operand {
  cublasOperation_t op;
  int64_t ld;
  int64_t batch_stride;
  bool ok;
};

// `t` is (B, rows, cols). A unit stride along cols: the memory, read column-
// major with ld = the row stride, is already the transpose (op N). A unit
// stride along rows: it is the matrix itself, so op T.
Operand transposed_operand(const at::Tensor& t) {
  const int64_t rows = t.size(1), cols = t.size(2);
  const int64_t sr = t.stride(1), sc = t.stride(2);
  const int64_t bs = t.size(0) == 1 ? 0 : t.stride(0);
  if (sc == 1 || cols == 1) {
    const int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : sr;
    return {CUBLAS_OP_N, ld, bs, ld >= std::max<int64_t>(cols, 1)};
  }
  if (sr == 1 || rows == 1) {
    const int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : sc;
    return {CUBLAS_OP_T, ld, bs, ld >= std::max<int64_t>(rows, 1)};
  }
  return {CUBLAS_OP_N, 0, 0, false};
}

// cuBLAS's function `name`, of type Fn, from the process (libtorch_cuda loads
// cuBLAS); an error where it is not there.
template <typename Fn>
Fn cublas_function(const char* name) {
  constexpr const char* kSoname = "libcublas.so." CUSTOMCONV_SYMBOL_STR(CUBLAS_VER_MAJOR);
  void* sym = process_symbol(name, kSoname);
  TORCH_CHECK(sym != nullptr, "customconv: cannot find ", name, " in the process (", kSoname,
              " is loaded by libtorch_cuda)");
  return reinterpret_cast<Fn>(sym);
}

using StridedBatchedGemmFn = decltype(&cublasGemmStridedBatchedEx_64);

StridedBatchedGemmFn strided_batched_gemm() {
  static const auto fn = cublas_function<StridedBatchedGemmFn>("cublasGemmStridedBatchedEx_64");
  return fn;
}

// Whether a product runs with no cuBLAS workspace: products (c = a b, c of
// m x n, a reduction of k) whose reduction is no longer than their longer
// output side (forwards and input gradients of pointwise layers, per-image
// products of NCHW routes), in 16-bit, and in float32 as TF32 where the output
// is at most 64 columns wide over 2^16 rows or more. Long reductions (weight
// gradients over positions) keep the workspace, which their split-K kernels
// need: without it 19 such 16-bit weight gradients took 2926 us instead of 259.
// 16-bit: with PyTorch's workspace set, cuBLAS picks kernels that need 4 bytes
// of it, zeroed by a memset before each launch; without it, the same tiles in a
// variant that needs none, as cuDNN runs them. H200, N=32, 1x1 layers of
// ResNet-50 and MobileNetV2, channels_last, device us, with the workspace /
// without (cuDNN), float16: 64 -> 256 at 56x56 forward 21.3 / 18.1 (18.4), 128
// -> 512 at 28x28 12.6 / 10.4 (10.7), 512 -> 128 input gradient 12.5 / 10.5
// (10.7); 19 layers' forwards 225.7 / 214.1 (217.1), input gradients 229.4 /
// 217.8 (235.5), none slower. Float32 (TF32): cuBLAS picks other kernels
// without the workspace, faster for narrow outputs over many positions (input
// gradients of 64 -> 256 at 56x56 45.5 / 36.7 (36.7), 16 -> 96 at 112x112 81.4
// / 60.4 (81.4), 24 -> 144 at 56x56 29.9 / 24.6 (25.0)) and slower for wide
// ones (the 19 forwards 467 / 561 (477); 512 -> 2048 at 7x7 input gradient
// 17.4 / 29.8). PyTorch sets its workspace again each time it hands out the
// handle (getCurrentCUDABlasHandle), so the next caller has it back.
bool without_workspace(cudaDataType_t type, cublasComputeType_t compute, int64_t m, int64_t n,
                       int64_t k) {
  if (k > std::max(m, n)) return false;
  if (type == CUDA_R_16F || type == CUDA_R_16BF) return true;
  return compute == CUBLAS_COMPUTE_32F_FAST_TF32 && n <= 64 && m >= (int64_t(1) << 16);
}

using SetWorkspaceFn = decltype(&cublasSetWorkspace_v2);

SetWorkspaceFn set_workspace() {
  static const auto fn = cublas_function<SetWorkspaceFn>("cublasSetWorkspace_v2");
  return fn;
}

cublasComputeType_t compute_type(at::ScalarType t) {
  if (t == at::kDouble) return CUBLAS_COMPUTE_64F;
  if (t == at::kFloat && at::globalContext().allowTF32CuDNN(at::Float32Op::CONV)) {
    return CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  return CUBLAS_COMPUTE_32F;
}

// The largest power of two, at most 16, dividing the byte address of every
// matrix of a batched operand: its pointer, leading dimension and batch
// stride (in elements of `element_size` bytes).
uint32_t alignment_of(const void* ptr, int64_t ld, int64_t batch_stride, int64_t element_size) {
  uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | uint64_t(ld * element_size) |
                  uint64_t(batch_stride * element_size) | 16;
  return uint32_t(bits & (~bits + 1));  // the lowest set bit
}

// A column-major matrix layout of `rows` x `cols` (leading dimension ld),
// batched with the given count and stride.
void batched_layout(const LtApi& api, cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                    int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t batch_stride) {
  TORCH_CUDABLAS_CHECK(api.layout_create(layout, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    TORCH_CUDABLAS_CHECK(
        api.layout_set(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    TORCH_CUDABLAS_CHECK(api.layout_set(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                        &batch_stride, sizeof(batch_stride)));
  }
}

// cuBLAS's product (M, N, K) = (n, m, k), A = b with ob, B = a with oa (see
// batched_gemm_cuda), by cuBLASLt with its algorithm kept per problem; false
// where cuBLASLt is missing, has no algorithm, or turns the call down.
bool lt_batched_gemm(const at::Tensor& a, const Operand& oa, const at::Tensor& b, const Operand& ob,
                     const at::Tensor& c, int64_t ldc, int64_t c_batch_stride, int64_t batch,
                     int64_t m, int64_t n, int64_t k, cublasComputeType_t compute,
                     const void* alpha, const void* beta) {
  const LtApi& api = lt_api();
  if (!api.ok || batch > std::numeric_limits<int32_t>::max()) return false;
  const cudaDataType_t in_type = cuda_type(a.scalar_type()), out_type = cuda_type(c.scalar_type());
  const cudaDataType_t scale_type = compute == CUBLAS_COMPUTE_64F ? CUDA_R_64F : CUDA_R_32F;
  LtProduct p(api);
  TORCH_CUDABLAS_CHECK(api.desc_create(&p.op, compute, scale_type));
  TORCH_CUDABLAS_CHECK(api.desc_set(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ob.op, sizeof(ob.op)));
  TORCH_CUDABLAS_CHECK(api.desc_set(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &oa.op, sizeof(oa.op)));
  const bool a_n = ob.op == CUBLAS_OP_N, b_n = oa.op == CUBLAS_OP_N;
  batched_layout(api, &p.a, in_type, a_n ? n : k, a_n ? k : n, ob.ld, batch, ob.batch_stride);
  batched_layout(api, &p.b, in_type, b_n ? k : m, b_n ? m : k, oa.ld, batch, oa.batch_stride);
  batched_layout(api, &p.d, out_type, n, m, ldc, batch, c_batch_stride);
  const int64_t es = a.element_size();
  const uint32_t alignment =
      std::min({alignment_of(b.const_data_ptr(), ob.ld, ob.batch_stride, es),
                alignment_of(a.const_data_ptr(), oa.ld, oa.batch_stride, es),
                alignment_of(c.const_data_ptr(), ldc, c_batch_stride, c.element_size())});
  const LtProblemKey key{
      int64_t(c.get_device()), int64_t(in_type), int64_t(out_type), int64_t(compute),
      int64_t(ob.op), int64_t(oa.op), m, n, k, ob.ld, oa.ld, ldc, batch, ob.batch_stride,
      oa.batch_stride, c_batch_stride, int64_t(alignment)};
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  const std::optional<cublasLtMatmulAlgo_t> algo = lt_algorithm(key, handle, p, alignment);
  if (!algo) return false;
  const cublasStatus_t status = api.matmul(
      handle, p.op, alpha, b.const_data_ptr(), p.a, a.const_data_ptr(), p.b, beta,
      c.const_data_ptr(), p.d, c.data_ptr(), p.d, &*algo, at::cuda::getCUDABlasLtWorkspace(),
      at::cuda::getCUDABlasLtWorkspaceSize(), at::cuda::getCurrentCUDAStream());
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  TORCH_CUDABLAS_CHECK(status);
  return true;
}

}  // namespace

int64_t gemm_parallelism_cuda() {
  return 2 * int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
}

void batched_gemm_cuda(const at::Tensor& a_arg, const at::Tensor& b_arg, const at::Tensor& c,
                       bool accumulate) {
  TORCH_INTERNAL_ASSERT(a_arg.dim() == 3 && b_arg.dim() == 3 && c.dim() == 3);
  const int64_t batch = c.size(0), m = c.size(1), n = c.size(2), k = a_arg.size(2);
  TORCH_INTERNAL_ASSERT(a_arg.size(0) == batch && b_arg.size(0) == batch && a_arg.size(1) == m &&
                        b_arg.size(1) == k && b_arg.size(2) == n);
  TORCH_INTERNAL_ASSERT(c.stride(2) == 1 || n == 1);
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) c.zero_();
    return;
  }
  const c10::cuda::CUDAGuard guard(c.device());
  at::Tensor a = a_arg, b = b_arg;
  Operand oa = transposed_operand(a), ob = transposed_operand(b);
  if (!oa.ok) a = a.contiguous(), oa = transposed_operand(a);
  if (!ob.ok) b = b.contiguous(), ob = transposed_operand(b);
  const int64_t ldc = m == 1 ? n : c.stride(1);
  const int64_t c_batch_stride = batch == 1 ? 0 : c.stride(0);

  const at::ScalarType in_type = a.scalar_type();
  const cublasComputeType_t compute = compute_type(in_type);
  const double alpha_d = 1.0, beta_d = accumulate ? 1.0 : 0.0;
  const float alpha_f = 1.0f, beta_f = accumulate ? 1.0f : 0.0f;
  const bool is_double = compute == CUBLAS_COMPUTE_64F;
  const void* alpha = is_double ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = is_double ? static_cast<const void*>(&beta_d) : &beta_f;

  constexpr int64_t kLtMaxMacs = int64_t(1) << 26;
  const bool small = batch * m <= kLtMaxMacs / n / k;  // batch * m * n * k <= 2^26
  if (small &&
      lt_batched_gemm(a, oa, b, ob, c, ldc, c_batch_stride, batch, m, n, k, compute, alpha, beta))
    return;
#ifdef CUSTOMCONV_WITH_SM90A
  // Large row-major TF32 products on Hopper's warpgroup MMA (tf32_gemm_sm90.h).
  if (batch == 1 && !accumulate && compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a.stride(2) == 1 &&
      b.stride(2) == 1 && c.stride(2) == 1 && tf32_gemm_sm90_takes(m, n, k) &&
      tf32_gemm_sm90(a.const_data_ptr<float>(), a.stride(1), b.const_data_ptr<float>(), b.stride(1),
                     c.mutable_data_ptr<float>(), c.stride(1), m, n, k, c.get_device(),
                     at::cuda::getCurrentCUDAStream())) {
    return;
  }
#endif
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();  // bound to the current stream
  if (without_workspace(cuda_type(in_type), compute, m, n, k))
    TORCH_CUDABLAS_CHECK(set_workspace()(handle, nullptr, 0));
  // cuBLAS's (M, N, K) = (n, m, k); its A is b, its B is a.
  TORCH_CUDABLAS_CHECK(strided_batched_gemm()(
      handle, ob.op, oa.op, n, m, k, alpha, b.const_data_ptr(), cuda_type(in_type), ob.ld,
      ob.batch_stride, a.const_data_ptr(), cuda_type(in_type), oa.ld, oa.batch_stride, beta,
      c.data_ptr(), cuda_type(c.scalar_type()), ldc, c_batch_stride, batch, compute,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace customconv
