"""16-bit pointwise layers on cuBLAS (batched_gemm_cuda.cpp): products whose
reduction is no longer than their longer output side, the forward and the
input gradient of channels_last 1x1 layers, run without a cuBLAS workspace,
so no memset precedes their kernel, and they match float64 within 16-bit
rounding. The weight gradient, a long reduction over positions, keeps the
workspace and matches as well. PyTorch's own products after ours get their
workspace back: a float16 matmul with a long reduction launches the same
kernels before and after our calls."""

import pytest
import torch

from testlib import assert_matches, conv2d_gradients_and_bounds, make_tensor, ops, run_profiled_cuda

pytestmark = pytest.mark.cuda

CL = torch.channels_last
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}

# (images, input channels, output channels, plane): ResNet-50's layers at
# N=32, above 2^26 multiply-adds (the pointwise GEMM route's cuBLAS products),
# whose forward (the first two) or input gradient (the last two) cuBLAS runs
# after a memset when PyTorch's workspace is set; and one with channels not
# a multiple of 64.
CASES = [
    (32, 64, 256, (56, 56)),
    (32, 128, 512, (28, 28)),
    (32, 256, 64, (56, 56)),
    (32, 512, 128, (28, 28)),
    (8, 24, 144, (56, 56)),
]

ONE, ZERO = [1, 1], [0, 0]


def memsets(names):
    return [n for n in names if "memset" in n.lower()]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"n{c[0]}-{c[1]}to{c[2]}-{c[3][0]}x{c[3][1]}")
def test_pointwise_passes_match_float64_without_a_memset(case, dtype, gen):
    n, c, k, (h, w_) = case
    x = make_tensor((n, c, h, w_), dtype, "cuda", gen=gen).contiguous(memory_format=CL)
    w = make_tensor((k, c, 1, 1), dtype, "cuda", gen=gen).contiguous(memory_format=CL)
    go = make_tensor((n, k, h, w_), dtype, "cuda", gen=gen).contiguous(memory_format=CL)
    ctx = f"case={case} dtype={dtype}"

    out, names = run_profiled_cuda(lambda: ops.conv2d(x, w, None, ONE, ZERO, ONE, 1))
    assert out.is_contiguous(memory_format=CL), ctx
    assert not memsets(names), (ctx, names)
    want = torch.nn.functional.conv2d(x.double(), w.double())
    bound = torch.nn.functional.conv2d(x.double().abs(), w.double().abs())
    assert_matches(out, want.cpu(), bound.cpu(), dtype, c, "forward", ctx, device="cuda")

    (want_gi, want_gw), (bound_gi, bound_gw) = conv2d_gradients_and_bounds(go, x, w)
    gi, names = run_profiled_cuda(lambda: ops.conv2d_grad_input(go, x, w, ONE, ZERO, ONE, 1))
    assert gi.is_contiguous(memory_format=CL), ctx
    assert not memsets(names), (ctx, names)
    assert_matches(gi, want_gi.cpu(), bound_gi.cpu(), dtype, k, "grad_input", ctx, device="cuda")

    gw = ops.conv2d_grad_weight(go, x, w, ONE, ZERO, ONE, 1)
    assert_matches(gw, want_gw.cpu(), bound_gw.cpu(), dtype, n * h * w_, "grad_weight", ctx, device="cuda")


def test_pytorch_products_after_ours_keep_their_workspace(gen):
    # A float16 product with a long reduction, whose kernels may use cuBLAS's
    # workspace: the same kernels run before and after our workspace-free calls.
    a = make_tensor((128, 1 << 16), torch.float16, "cuda", gen=gen)
    b = make_tensor((1 << 16, 96), torch.float16, "cuda", gen=gen)
    x = make_tensor((8, 64, 56, 56), torch.float16, "cuda", gen=gen).contiguous(memory_format=CL)
    w = make_tensor((256, 64, 1, 1), torch.float16, "cuda", gen=gen).contiguous(memory_format=CL)
    _, before = run_profiled_cuda(lambda: torch.mm(a, b))
    ops.conv2d(x, w, None, ONE, ZERO, ONE, 1)
    got, after = run_profiled_cuda(lambda: torch.mm(a, b))
    assert before == after, (before, after)
    want, bound = a.double() @ b.double(), a.double().abs() @ b.double().abs()
    assert_matches(got, want.cpu(), bound.cpu(), torch.float16, a.shape[1], "mm", "after conv2d")
