"""conv2d's column route on CUDA (conv2d.cpp): NCHW layers that the engines
leave to im2col + GEMM. Where several images share one GEMM, its result is
regrouped into images by the row copy kernel (relayout_cuda.h), and grad_output
is regrouped the other way for the gradients; the weight gradient's partial
products (per image, or per slice of a long reduction) are summed and
rounded by the plane-sum kernel (weight_planes_sum.cuh). Each case matches
float64 F.conv2d in every pass, runs the kernel it is meant to exercise, and
gives the same weight gradient, bit for bit, on a second run. NCHW 3x3
weight gradients of 512 channels on small planes come here before the
engines."""

import pytest
import torch

from testlib import (TF32_ROUNDOFF, ConvConfig, check_conv_case, conv2d_gradients_and_bounds, dtype_name,
                     kernels_launched, make_tensor, ops)

pytestmark = pytest.mark.cuda

SWAP, SUM = "copy_rows_kernel", "sum_planes_kernel"

# (batch, in channels, out channels, kernel, padding, plane, dtypes, kernels
# the forward and backward launch). Planes of 49 positions move one element
# a thread; 64 and 144, 16-byte vectors. Every case is above the tiny direct
# kernel's 2^20 multiply-adds (tiny_direct.h).
CASES = [
    (4, 32, 32, 3, 1, (7, 7), [torch.float64], [SWAP]),
    (8, 16, 24, 3, 1, (12, 12), [torch.float64], [SWAP, SUM]),
    (4, 64, 64, 3, 1, (7, 7), [torch.float32, torch.float16, torch.bfloat16], [SWAP]),
    (2, 96, 96, 3, 1, (8, 8), [torch.float32, torch.float16, torch.bfloat16], [SWAP]),
    (3, 48, 40, 1, 0, (14, 14), [torch.float64, torch.float32, torch.float16, torch.bfloat16], [SUM]),
]

PARAMS = [
    pytest.param(case, dtype, id=f"{case[0]}x{case[1]}-{case[2]}-k{case[3]}-{case[5][0]}x{case[5][1]}-"
                                 f"{dtype_name(dtype)}")
    for case in CASES
    for dtype in case[6]
]


def config(case) -> ConvConfig:
    n, c, k, ks, pad, plane = case[:6]
    return ConvConfig(n, c, k, 1, (ks, ks), (1, 1), (pad, pad), (1, 1), plane, True)


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_column_route_matches_float64(case, dtype, gen, seed):
    cfg = config(case)
    check_conv_case(lambda input, weight, bias: ops.conv2d(input, weight, bias, *cfg.args()), cfg,
                    "cuda", dtype, gen, f"seed={seed} {dtype} {cfg}")


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_column_route_runs_its_kernels_and_repeats_bitwise(case, dtype, gen):
    cfg = config(case)
    x = make_tensor(cfg.input_shape, dtype, "cuda", gen=gen, requires_grad=True)
    w = make_tensor(cfg.weight_shape, dtype, "cuda", gen=gen, requires_grad=True)
    b = make_tensor((cfg.out_channels,), dtype, "cuda", gen=gen, requires_grad=True)
    g = make_tensor(cfg.output_shape, dtype, "cuda", gen=gen)

    def step():
        ops.conv2d(x, w, b, *cfg.args()).backward(g)

    names = kernels_launched(step)
    if names:  # (none under compute-sanitizer)
        for kernel in case[7]:
            assert kernel in names, f"{kernel} not launched; ran: {names}"
    first = ops.conv2d_grad_weight(g, x.detach(), w.detach(), *cfg.args())
    again = ops.conv2d_grad_weight(g, x.detach(), w.detach(), *cfg.args())
    assert torch.equal(first, again)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_name)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_nchw_weight_gradients_of_512_channels_on_small_planes(dtype, layout, gen, seed):
    # NCHW 3x3 layers of 512 input channels over few positions take the
    # column route's weight gradient (im2col + cuBLAS, engines_cuda.cpp),
    # float32 with TF32 allowed too; channels_last ones keep the engines.
    x = make_tensor((4, 512, 9, 9), dtype, "cuda", layout, gen)
    w = make_tensor((512, 512, 3, 3), dtype, "cuda", layout, gen)
    go = make_tensor((4, 512, 7, 7), dtype, "cuda", layout, gen)
    args = ([1, 1], [0, 0], [1, 1], 1)
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        names = kernels_launched(lambda: ops.conv2d_grad_weight(go, x, w, *args))
        got = ops.conv2d_grad_weight(go, x, w, *args)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    if names:  # (none under compute-sanitizer)
        assert ("im2col" in names) == (layout == "contiguous"), names
    (_, want), (_, bound) = conv2d_gradients_and_bounds(go, x, w)
    # TF32 products (two operands rounded) or float32 sums of exact 16-bit
    # products rounded to float16 once, relative to the sum of |terms|.
    tol = 4 * TF32_ROUNDOFF if dtype == torch.float32 else 2.0**-9
    err = (got.double() - want).abs() - tol * bound
    assert bool((err <= 1e-6).all()), f"seed={seed} {layout}: worst {float(err.max())}"
