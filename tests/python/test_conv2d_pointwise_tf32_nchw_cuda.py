"""conv2d's float32 NCHW pointwise forwards in TF32 on CUDA
(ops/conv2d/pointwise_tf32_nchw.h): one CUTLASS strided-batched GEMM takes
the expanding and square layers and the reducing ones with 64 or 128 output
channels, where PyTorch's TF32 policy for convolutions allows TF32 and the
channels and planes are multiples of 4. The layers it takes run its kernel
and match float64 within TF32's rounding; the layers and settings it declines
(other reducing layers, planes or channels not a multiple of 4, TF32 off,
channels_last data) keep the other routes and match as well. Results are
NCHW."""

import pytest
import torch
import torch.nn.functional as F

from testlib import assert_float32_conv2d_matches, make_tensor, ops, run_profiled_cuda

pytestmark = pytest.mark.cuda

# (images, input channels, output channels, plane, taken with TF32 on). Each
# is above the tiny direct kernel's 2^20 multiply-adds, so that a declined
# layer takes a GEMM route too.
CASES = [
    (4, 24, 144, (12, 12), True),    # expanding (MobileNetV2's 24 -> 144), 64-row tiles
    (3, 64, 64, (16, 16), True),     # square
    (2, 128, 512, (10, 10), True),   # expanding, 128-row tiles
    (4, 256, 64, (8, 8), True),      # reducing to 64 channels
    (2, 512, 128, (10, 10), True),   # reducing to 128 channels
    (4, 256, 96, (8, 8), False),     # reducing to 96: cuBLAS
    (8, 64, 256, (7, 7), False),     # 49 positions a plane
    (8, 6, 128, (32, 32), False),    # 6 input channels
]


def gemm_ran(names) -> bool:
    return any("GemmUniversal" in n for n in names)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("tf32", [True, False], ids=["tf32", "exact"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"n{c[0]}-{c[1]}to{c[2]}-{c[3][0]}x{c[3][1]}")
def test_float32_nchw_pointwise_forward_takes_the_gemm_where_it_should_and_matches_float64(
        case, tf32, bias, gen):
    n, c, k, (h, w_), taken = case
    x = make_tensor((n, c, h, w_), torch.float32, "cuda", gen=gen)
    w = make_tensor((k, c, 1, 1), torch.float32, "cuda", gen=gen)
    b = make_tensor((k,), torch.float32, "cuda", gen=gen) if bias else None
    got, names = run_profiled_cuda(lambda: ops.conv2d(x, w, b, [1, 1], [0, 0], [1, 1], 1), tf32=tf32)
    ctx = f"case={case} tf32={tf32} bias={bias}"
    assert got.shape == (n, k, h, w_) and got.is_contiguous(), ctx
    if names:  # (none under compute-sanitizer)
        assert gemm_ran(names) == (taken and tf32), (ctx, names)
    assert_float32_conv2d_matches(got, x, w, b, tf32, ctx)


def test_views_and_channels_last_data_match_float64(gen):
    # A strided NCHW input (rows 18 apart), a weight whose rows start 8 bytes
    # into a larger tensor (not 16-byte aligned: the GEMM declines it), and
    # channels_last data (the channels_last routes take it): each result
    # matches float64 within TF32's rounding, in F.conv2d's memory format.
    base = make_tensor((4, 64, 16, 18), torch.float32, "cuda", gen=gen)
    w_big = make_tensor((256, 68, 1, 1), torch.float32, "cuda", gen=gen)
    x_cl = make_tensor((4, 64, 16, 16), torch.float32, "cuda", gen=gen).contiguous(
        memory_format=torch.channels_last)
    cases = [(base[:, :, :, 1:17], w_big[:, :64], None, "strided input"),
             (x_cl.contiguous(), w_big[:, 2:66], False, "misaligned weight"),
             (x_cl, w_big[:, :64], False, "channels_last input")]
    for x, w, taken, what in cases:
        got, names = run_profiled_cuda(lambda: ops.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1),
                                       tf32=True)
        if names and taken is not None:
            assert gemm_ran(names) == taken, (what, names)
        assert_float32_conv2d_matches(got, x, w, None, True, what)
        cl = torch.channels_last
        assert got.is_contiguous(memory_format=cl) == F.conv2d(x, w).is_contiguous(memory_format=cl), what


def test_planes_of_more_tiles_than_the_grid_holds_decline_and_match(gen):
    # 2100x2100 positions in 64-wide tiles: 68,907 tiles of positions, over
    # CUDA's 65,535 blocks in the grid's y: the GEMM declines, cuBLAS's
    # per-image route takes the layer.
    x = make_tensor((1, 4, 2100, 2100), torch.float32, "cuda", gen=gen)
    w = make_tensor((4, 4, 1, 1), torch.float32, "cuda", gen=gen)
    got, names = run_profiled_cuda(lambda: ops.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1), tf32=True)
    if names:
        assert not gemm_ran(names), names
    assert_float32_conv2d_matches(got, x, w, None, True, "2100x2100 plane")
