"""The float32 input gradient of channels_last pointwise layers in TF32 on an
sm_90 device (ops/conv2d/tf32_gemm_sm90.h): grad_input's (N*H*W, C) rows =
grad_output's rows times the weight, one CUTLASS warpgroup-MMA GEMM where the
product has at least 4096 rows (positions), 128 columns (input channels) and
64 reduction steps (output channels), more than 2^26 multiply-adds (smaller
products take cuBLASLt) and TF32 is allowed for convolutions.
The layers it takes run its kernel and match float64 within TF32's rounding;
the ones it declines (too narrow or too few positions, TF32 off, a
misaligned weight) run cuBLAS and match as well (exactly with TF32 off)."""

import pytest
import torch

from testlib import TF32_ROUNDOFF, capture_and_replay, make_tensor, ops, run_profiled_cuda

pytestmark = pytest.mark.cuda

CL = torch.channels_last
ONE, ZERO = [1, 1], [0, 0]

# (images, input channels, output channels, plane, taken with TF32 on).
CASES = [
    (8, 256, 128, (28, 28), True),    # 6272 rows
    (32, 256, 1024, (14, 14), True),  # ResNet-50's 256 -> 1024 layer
    (4, 512, 64, (32, 32), True),     # the fewest rows and reduction steps it takes
    (6, 136, 72, (41, 37), True),     # columns off the 64-wide tiles, rows off the 256-wide ones
    (8, 64, 256, (28, 28), False),    # 64 columns: cuBLAS
    (32, 512, 2048, (7, 7), False),   # 1568 rows: cuBLAS
    (4, 256, 32, (32, 32), False),    # 32 reduction steps: cuBLAS
]


def sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def gemm_ran(names) -> bool:
    return any("GemmUniversal" in n for n in names)


def check(gi, go, w, tf32, ctx):
    go64, w64 = go.double(), w.double().flatten(1)
    want = torch.einsum("nkhw,kc->nchw", go64, w64)
    bound = torch.einsum("nkhw,kc->nchw", go64.abs(), w64.abs())
    err = (gi.double() - want).abs()
    rel = 4 * TF32_ROUNDOFF if tf32 else 4 * 2.0**-24 * go.shape[1]
    assert bool((err <= rel * bound + 1e-30).all()), f"{ctx}: max err/bound {(err / bound).max()}"


@pytest.mark.parametrize("tf32", [True, False], ids=["tf32", "exact"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"n{c[0]}-{c[1]}to{c[2]}-{c[3][0]}x{c[3][1]}")
def test_grad_input_matches_float64(case, tf32, gen):
    n, c, k, (h, w_), taken = case
    x = make_tensor((n, c, h, w_), torch.float32, "cuda", gen=gen).contiguous(memory_format=CL)
    w = make_tensor((k, c, 1, 1), torch.float32, "cuda", gen=gen).contiguous(memory_format=CL)
    go = make_tensor((n, k, h, w_), torch.float32, "cuda", gen=gen).contiguous(memory_format=CL)
    ctx = f"case={case} tf32={tf32}"
    gi, names = run_profiled_cuda(lambda: ops.conv2d_grad_input(go, x, w, ONE, ZERO, ONE, 1), tf32=tf32)
    assert gi.shape == x.shape and gi.is_contiguous(memory_format=CL), ctx
    if names:  # (none under compute-sanitizer)
        assert gemm_ran(names) == (taken and tf32 and sm90()), (ctx, names)
    check(gi, go, w, tf32, ctx)


@pytest.mark.parametrize("row", [257, 260], ids=["rows-off-16-bytes", "start-off-16-bytes"])
def test_misaligned_weight_declined(row, gen):
    # A weight whose rows, or whose start, lie off 16 bytes: TMA cannot read
    # it, cuBLAS does.
    n, c, k, h = 8, 256, 128, 28
    x = make_tensor((n, c, h, h), torch.float32, "cuda", gen=gen).contiguous(memory_format=CL)
    big = make_tensor((k, row), torch.float32, "cuda", gen=gen)
    w = big[:, 1:c + 1].view(k, c, 1, 1)
    go = make_tensor((n, k, h, h), torch.float32, "cuda", gen=gen).contiguous(memory_format=CL)
    gi, names = run_profiled_cuda(lambda: ops.conv2d_grad_input(go, x, w, ONE, ZERO, ONE, 1), tf32=True)
    if names:
        assert not gemm_ran(names), names
    check(gi, go, w, True, "misaligned weight")


def test_grad_input_in_a_cuda_graph(gen):
    n, c, k, h = 8, 256, 128, 28
    x = make_tensor((n, c, h, h), torch.float32, "cuda", gen=gen).contiguous(memory_format=CL)
    w = make_tensor((k, c, 1, 1), torch.float32, "cuda", gen=gen).contiguous(memory_format=CL)
    go = make_tensor((n, k, h, h), torch.float32, "cuda", gen=gen).contiguous(memory_format=CL)
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        before = ops.conv2d_grad_input(go, x, w, ONE, ZERO, ONE, 1)
        (got,), _graph = capture_and_replay(
            lambda: (ops.conv2d_grad_input(go, x, w, ONE, ZERO, ONE, 1),), [go], gen)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    check(got, go, w, True, "graph replay")
    assert not torch.equal(got, before)
