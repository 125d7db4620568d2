"""conv2d_fused's pointwise layers on CUDA as one cuBLASLt product
(ops/conv2d/pointwise_fused_lt.h): 1x1 windows, stride 1, channels_last, the
residual as the product's C operand and the bias and relu in its epilogue,
in float16, bfloat16 and float32 (TF32 on and off), against the float64
composition; cuBLASLt's kernel seen running and none of the implicit GEMMs;
a CUDA graph; gradients through it; and the cases it declines (other
activations, NCHW data, a residual in another layout, rows not a whole 16
bytes, a misaligned input), whose results stay right on the other routes."""

import re

import pytest
import torch
import torch.nn.functional as F

from testlib import capture_and_replay, cuda, make_tensor, ops, run_profiled_cuda

pytestmark = [cuda]

# The error bound: |got - want| <= TOL * (|x| conv |w| + |b| + |residual|) + ROUND * |want|:
# TF32's operands carry 10 bits of mantissa; 16-bit operands are exact and
# accumulate in float32; the result's own rounding on top.
TOL = {torch.float16: 2.0**-16, torch.bfloat16: 2.0**-16, torch.float32: 2.0**-8}
TOL_EXACT = 2.0**-20  # float32 with TF32 off
ROUND = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-20}

DTYPES = {"f16": (torch.float16, True), "bf16": (torch.bfloat16, True), "f32-tf32": (torch.float32, True),
          "f32-exact": (torch.float32, False)}


def ran_lt(names):
    """Whether the call ran cuBLAS's kernels alone (its matrix products, and
    the epilogue pass cuBLASLt adds to some of them): no implicit GEMM and no
    ATen epilogue pass (None where the profiler saw no kernel: under
    compute-sanitizer). The profiler shortens long names in the middle."""
    if not names:
        return None
    return all(re.search(r"nvjet|gemm|xmma|splitK|Memset|cutlass_80|cublasLt", n, re.IGNORECASE) and "ImplicitGemm" not in n
               and "customconv" not in n for n in names)


def check(got, x, w, b, r, activation, dtype, tol, ctx):
    pre = F.conv2d(x.double(), w.double(), None if b is None else b.double())
    bound = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else b.double().abs())
    if r is not None:
        pre, bound = pre + r.double(), bound + r.double().abs()
    want = pre.relu() if activation == "relu" else pre
    assert got.shape == want.shape and got.dtype == dtype, ctx
    assert got.is_contiguous(memory_format=torch.channels_last), ctx
    err = (got.double() - want).abs() - tol * bound - ROUND[dtype] * want.abs()
    assert (err <= 1e-6).all(), (ctx, float(err.max()))


def operands(n, c, k, size, dtype, bias, residual, gen):
    x = make_tensor((n, c, size, size), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c, 1, 1), dtype, "cuda", "channels_last", gen)
    b = make_tensor((k,), dtype, "cuda", gen=gen) if bias else None
    r = make_tensor((n, k, size, size), dtype, "cuda", "channels_last", gen) if residual else None
    return x, w, b, r


# ResNet-50's expansion (64 -> 256, with its residual and relu), a reduction
# with relu, and positions that fill no whole tile (3 x 9 x 9).
SHAPES = {"64-to-256-28x28": (2, 64, 256, 28), "512-to-128-14x14": (4, 512, 128, 14),
          "128-to-72-9x9": (3, 128, 72, 9)}


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("residual", [False, True], ids=["no-residual", "residual"])
@pytest.mark.parametrize("activation", ["identity", "relu"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dt", list(DTYPES))
def test_pointwise_fused_on_cublaslt(dt, shape, activation, residual, bias, gen, seed):
    dtype, tf32 = DTYPES[dt]
    x, w, b, r = operands(*SHAPES[shape], dtype, bias, residual, gen)
    got, names = run_profiled_cuda(lambda: ops.conv2d_fused(x, w, b, [1, 1], [0, 0], [1, 1], 1, activation, r), tf32)
    ctx = f"seed={seed} {dt} {shape} {activation} residual={residual} bias={bias}"
    assert ran_lt(names) is not False, (ctx, names)
    check(got, x, w, b, r, activation, dtype, TOL[dtype] if tf32 else TOL_EXACT, ctx)


@pytest.mark.parametrize("dt", ["f16", "f32-tf32"])
def test_pointwise_fused_on_cublaslt_in_a_cuda_graph(dt, gen):
    # Stream-ordered on PyTorch's cuBLASLt workspace: a captured call replays
    # on new inputs.
    dtype, tf32 = DTYPES[dt]
    x, w, b, r = operands(2, 64, 256, 28, dtype, True, True, gen)
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        (out,), _graph = capture_and_replay(
            lambda: (ops.conv2d_fused(x, w, b, [1, 1], [0, 0], [1, 1], 1, "relu", r),), [x, w, b, r], gen)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    check(out, x, w, b, r, "relu", dtype, TOL[dtype], f"graph {dt}")


def test_pointwise_fused_gradients_through_cublaslt(gen, seed):
    # Training runs the fused op with no activation (the residual in the
    # product), then relu in ATen: the gradients against float64's.
    dtype = torch.float32
    x, w, b, r = operands(2, 64, 128, 14, dtype, True, True, gen)
    for t in (x, w, b, r):
        t.requires_grad_()
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        out = ops.conv2d_fused(x, w, b, [1, 1], [0, 0], [1, 1], 1, "relu", r)
        go = make_tensor(out.shape, dtype, "cuda", "channels_last", gen)
        got = torch.autograd.grad(out, (x, w, b, r), go)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b, r)]
    ref = (F.conv2d(leaves[0], leaves[1], leaves[2]) + leaves[3]).relu()
    want = torch.autograd.grad(ref, leaves, go.double())
    for name, g, e in zip(["input", "weight", "bias", "residual"], got, want):
        torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4, msg=f"seed={seed} {name}")


def test_pointwise_fused_declines_what_cublaslt_does_not_take(gen):
    # Other activations, NCHW data, an NCHW residual, 16-bit rows of 36
    # channels (72 bytes), and an input 2 bytes off 16: the other routes
    # compute them, right.
    dtype = torch.float16
    x, w, b, r = operands(2, 64, 128, 14, dtype, True, True, gen)
    w36 = make_tensor((36, 64, 1, 1), dtype, "cuda", "channels_last", gen)
    r36 = make_tensor((2, 36, 14, 14), dtype, "cuda", "channels_last", gen)
    flat = make_tensor((x.numel() + 1,), dtype, "cuda", gen=gen)
    shifted = flat.as_strided(x.shape, x.stride(), 1)  # channels_last strides, one element in
    call = lambda xi, wi, ri, act: ops.conv2d_fused(xi, wi, b if wi.shape[0] == 128 else None,  # noqa: E731
                                                    [1, 1], [0, 0], [1, 1], 1, act, ri)
    cases = {
        "silu": (x, w, r, "silu"),
        "nchw input": (x.contiguous(), w.contiguous(), r.contiguous(), "relu"),
        "nchw residual": (x, w, r.contiguous(), "relu"),
        "36 channels": (x, w36, r36, "relu"),
        "misaligned input": (shifted, w, r, "relu"),
    }
    for name, (xi, wi, ri, act) in cases.items():
        got, names = run_profiled_cuda(lambda: call(xi, wi, ri, act), True)
        assert ran_lt(names) is not True, name
        bi = b if wi.shape[0] == 128 else None
        pre = F.conv2d(xi.double(), wi.double(), None if bi is None else bi.double()) + ri.double()
        want = F.silu(pre) if act == "silu" else pre.relu()
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=5e-2, msg=name)
