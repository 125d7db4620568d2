"""conv2d's float32 channels_last pointwise forwards in TF32 on CUDA
(ops/conv2d/pointwise_tf32_channels_last.h): one CUTLASS GEMM over the
positions takes the layers above 2^26 multiply-adds with at most 10240
multiply-adds a position (C * K), where PyTorch's TF32 policy for
convolutions allows TF32 and the channels are multiples of 4, the bias in its
epilogue. The layers it takes run its kernel and match float64 within TF32's
rounding; the layers and settings it declines (wider products, smaller
layers, channels not a multiple of 4, TF32 off, misaligned or strided data)
keep the other routes and match as well. Results are channels_last."""

import pytest
import torch

from testlib import assert_float32_conv2d_matches, make_tensor, ops, run_profiled_cuda

pytestmark = pytest.mark.cuda

CL = torch.channels_last

# (images, input channels, output channels, plane, taken with TF32 on).
CASES = [
    (32, 24, 144, (56, 56), True),   # MobileNetV2's 24 -> 144, 128-wide tiles
    (16, 96, 24, (56, 56), True),    # its 96 -> 24, 64-wide tiles
    (16, 64, 64, (56, 56), True),    # ResNet-50's 64 -> 64
    (4, 40, 240, (56, 56), True),    # C * K = 9600
    (32, 16, 36, (64, 64), True),    # output channels off the tiles
    (4, 64, 256, (56, 56), False),   # C * K = 16384: cuBLAS
    (2, 24, 144, (28, 28), False),   # 2^22.4 multiply-adds: the engine
    (64, 6, 96, (56, 56), False),    # 6 input channels
    (64, 16, 30, (64, 64), False),   # 30 output channels
]


def gemm_ran(names) -> bool:
    return any("GemmUniversal" in n for n in names)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("tf32", [True, False], ids=["tf32", "exact"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"n{c[0]}-{c[1]}to{c[2]}-{c[3][0]}x{c[3][1]}")
def test_float32_channels_last_pointwise_forward_takes_the_gemm_where_it_should_and_matches_float64(
        case, tf32, bias, gen):
    n, c, k, (h, w_), taken = case
    x = make_tensor((n, c, h, w_), torch.float32, "cuda", "channels_last", gen)
    w = make_tensor((k, c, 1, 1), torch.float32, "cuda", gen=gen)
    b = make_tensor((k,), torch.float32, "cuda", gen=gen) if bias else None
    got, names = run_profiled_cuda(lambda: ops.conv2d(x, w, b, [1, 1], [0, 0], [1, 1], 1), tf32=tf32)
    ctx = f"case={case} tf32={tf32} bias={bias}"
    assert got.shape == (n, k, h, w_) and got.is_contiguous(memory_format=CL), ctx
    if names:  # (none under compute-sanitizer)
        assert gemm_ran(names) == (taken and tf32), (ctx, names)
    assert_float32_conv2d_matches(got, x, w, b, tf32, ctx)


def test_views_decline_and_match_float64(gen):
    # A weight whose rows start 8 bytes into a larger tensor, a bias 4 bytes
    # into one (neither 16-byte aligned), a channels_last weight, and an input
    # that is a channel slice of a larger channels_last tensor (not
    # channels_last-contiguous): the GEMM declines the misaligned and sliced
    # ones, takes the channels_last weight, and every result matches float64
    # within TF32's rounding, channels_last.
    x = make_tensor((16, 64, 56, 56), torch.float32, "cuda", "channels_last", gen)
    w_big = make_tensor((64, 68, 1, 1), torch.float32, "cuda", gen=gen)
    b_big = make_tensor((65,), torch.float32, "cuda", gen=gen)
    x_big = make_tensor((16, 72, 56, 56), torch.float32, "cuda", "channels_last", gen)
    w = w_big[:, :64].contiguous()
    cases = [(x, w_big[:, 2:66], None, False, "misaligned weight"),
             (x, w, b_big[1:], False, "misaligned bias"),
             (x, w.contiguous(memory_format=CL), b_big[:64], True, "channels_last weight"),
             (x_big[:, :64], w, None, False, "sliced input")]
    for xi, wi, bi, taken, what in cases:
        got, names = run_profiled_cuda(lambda: ops.conv2d(xi, wi, bi, [1, 1], [0, 0], [1, 1], 1),
                                       tf32=True)
        if names:
            assert gemm_ran(names) == taken, (what, names)
        assert got.is_contiguous(memory_format=CL), what
        assert_float32_conv2d_matches(got, xi, wi, bi, True, what)
