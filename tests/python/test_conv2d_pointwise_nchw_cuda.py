"""conv2d's NCHW pointwise forwards on CUDA (engines_cuda.cpp): float32
layers on planes of 7x7 positions and more whose weight has at most 2^19
elements run as per-image GEMMs in place; other layers of several images on
planes under 128 positions go through channels_last (a layout change each way around the channels_last
GEMM), and so do those layers' gradients. Each runs its route and matches
float64: float32 exactly or within TF32's rounding with TF32 on, 16-bit
within its rounding; results are NCHW."""

import pytest
import torch
import torch.nn.functional as F

from testlib import (TF32_ROUNDOFF, assert_float32_conv2d_matches, assert_matches,
                     conv2d_gradients_and_bounds, make_tensor, ops, run_profiled_cuda)

pytestmark = pytest.mark.cuda

PER_IMAGE_MAX_WEIGHT = 1 << 19


def run(x, w, b):
    """The op's result and whether it changed layout each way (the transpose
    kernel ran; None where the profiler saw no kernel: under
    compute-sanitizer). Neither route runs the column route's im2col or row
    copy."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = ops.conv2d(x, w, b, [1, 1], [0, 0], [1, 1], 1)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not names:
        return out, None
    assert not any("im2col" in n or "copy_rows" in n for n in names), names
    return out, any("batched_transpose" in n for n in names)


# (images, input channels, output channels, plane): MobileNetV2's and
# EfficientNet-B0's 7x7 layers scaled down, odd planes, and a weight above
# the bound (ResNet-50's 512 -> 2048 at 7x7 is 2^20).
CASES = [
    (6, 96, 160, (7, 7)),
    (5, 160, 96, (8, 9)),
    (4, 320, 128, (7, 11)),
    (6, 64, 48, (14, 14)),
    (4, 1024, 768, (7, 7)),
]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("tf32", [False, True], ids=["exact", "tf32"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"n{c[0]}-{c[1]}to{c[2]}-{c[3][0]}x{c[3][1]}")
def test_float32_nchw_pointwise_forward_matches_float64(case, tf32, bias, gen):
    n, c, k, (h, w_) = case
    x = make_tensor((n, c, h, w_), torch.float32, "cuda", gen=gen)
    w = make_tensor((k, c, 1, 1), torch.float32, "cuda", gen=gen)
    b = make_tensor((k,), torch.float32, "cuda", gen=gen) if bias else None
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        got, relaid = run(x, w, b)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    ctx = f"case={case} tf32={tf32} bias={bias}"
    assert got.shape == (n, k, h, w_) and got.is_contiguous(), ctx
    per_image = c * k <= PER_IMAGE_MAX_WEIGHT
    assert relaid in (not per_image and h * w_ < 128, None), ctx
    assert_float32_conv2d_matches(got, x, w, b, tf32, ctx)


# (images, input channels, output channels, plane): 16-bit layers, through
# channels_last on planes under 128 positions, else per-image GEMMs in place.
CASES_16BIT = [
    (8, 128, 96, (7, 7)),
    (4, 64, 72, (9, 13)),
    (4, 256, 320, (14, 14)),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("case", CASES_16BIT, ids=lambda c: f"n{c[0]}-{c[1]}to{c[2]}-{c[3][0]}x{c[3][1]}")
def test_16bit_nchw_pointwise_forward_matches_float64(case, bias, dtype, gen):
    n, c, k, (h, w_) = case
    x = make_tensor((n, c, h, w_), dtype, "cuda", gen=gen)
    w = make_tensor((k, c, 1, 1), dtype, "cuda", gen=gen)
    b = make_tensor((k,), dtype, "cuda", gen=gen) if bias else None
    got, relaid = run(x, w, b)
    ctx = f"case={case} bias={bias} {dtype}"
    assert got.shape == (n, k, h, w_) and got.is_contiguous() and got.dtype == dtype, ctx
    assert relaid in (h * w_ < 128, None), ctx
    bd = None if b is None else b.double()
    want = F.conv2d(x.double(), w.double(), bd)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else bd.abs())
    assert_matches(got, want.cpu(), bound.cpu(), dtype, c, "output", ctx, device="cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("groups", [1, 2])
def test_one_image_nchw_pointwise_gradients_match_float64(dtype, groups, gen):
    # One image on a plane under 128 positions: the NCHW column route's
    # per-image GEMMs in place, the weight gradient's product written
    # straight into the result (conv2d.cpp).
    x = make_tensor((1, 48, 9, 7), dtype, "cuda", gen=gen)
    w = make_tensor((32, 48 // groups, 1, 1), dtype, "cuda", gen=gen)
    go = make_tensor((1, 32, 9, 7), dtype, "cuda", gen=gen)
    args = ([1, 1], [0, 0], [1, 1], groups)
    gi = ops.conv2d_grad_input(go, x, w, *args)
    gw = ops.conv2d_grad_weight(go, x, w, *args)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    want_gi, want_gw = torch.autograd.grad(F.conv2d(x64, w64, None, 1, 0, 1, groups), (x64, w64),
                                           go.double())
    assert gi.is_contiguous() and gw.is_contiguous()
    tol = 1e-2 if dtype == torch.float16 else 4 * TF32_ROUNDOFF  # (TF32 as PyTorch's default allows)
    for got, want in ((gi, want_gi), (gw, want_gw)):
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * float(want.abs().max()))


def assert_gradients_match(gi, gw, go, x, w, dtype, tf32, ctx, stride=1):
    (want_gi, want_gw), (bound_gi, bound_gw) = conv2d_gradients_and_bounds(go, x, w, stride)
    k, c = w.shape[:2]
    positions = go.shape[0] * go.shape[2] * go.shape[3]
    for got, want, bound, reduction, what in ((gi, want_gi, bound_gi, k, "grad_input"),
                                              (gw, want_gw, bound_gw, positions, "grad_weight")):
        if dtype == torch.float32 and tf32:
            err = (got.double() - want).abs()
            assert bool((err <= 4 * TF32_ROUNDOFF * bound + 1e-30).all()), f"{ctx} {what}: {err.max()}"
        else:
            assert_matches(got, want.cpu(), bound.cpu(), dtype, reduction, what, ctx, device="cuda")


# (images, input channels, output channels, plane): NCHW layers of several
# images on planes under 128 positions, whose gradients go through
# channels_last like their forward: grad_output (with the input, for the
# weight's) changes layout, the channels_last GEMM runs, the input gradient
# changes back. ResNet-50's 7x7 layers scaled down, and odd planes.
GRAD_CASES = [
    (4, 256, 64, (7, 7)),
    (3, 64, 256, (7, 7)),
    (5, 40, 24, (9, 11)),
]


@pytest.mark.parametrize("dtype,tf32", [(torch.float32, False), (torch.float32, True),
                                        (torch.float16, None), (torch.bfloat16, None)],
                         ids=["f32", "tf32", "f16", "bf16"])
@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: f"n{c[0]}-{c[1]}to{c[2]}-{c[3][0]}x{c[3][1]}")
def test_nchw_pointwise_gradients_go_through_channels_last(case, dtype, tf32, gen):
    n, c, k, (h, w_) = case
    x = make_tensor((n, c, h, w_), dtype, "cuda", gen=gen)
    w = make_tensor((k, c, 1, 1), dtype, "cuda", gen=gen)
    go = make_tensor((n, k, h, w_), dtype, "cuda", gen=gen)
    args = ([1, 1], [0, 0], [1, 1], 1)
    (gi, gw), names = run_profiled_cuda(
        lambda: (ops.conv2d_grad_input(go, x, w, *args), ops.conv2d_grad_weight(go, x, w, *args)), tf32)
    ctx = f"case={case} {dtype} tf32={tf32}"
    assert gi.shape == x.shape and gi.is_contiguous() and gw.shape == w.shape and gw.is_contiguous(), ctx
    if names:  # none under compute-sanitizer
        text = " ".join(names)
        assert "batched_transpose" in text and "ImplicitGemmConvolution" not in text, (ctx, names)
        assert "im2col" not in text and "copy_rows" not in text, (ctx, names)
    assert_gradients_match(gi, gw, go, x, w, dtype, tf32, ctx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_nchw_pointwise_gradients_through_channels_last_take_any_grad_output(dtype, gen):
    # grad_output as autograd hands it over from a sum (one value expanded
    # over every element) and as a channels_last tensor: the route changes
    # its layout like any other (results NCHW, as the input's).
    x = make_tensor((4, 96, 7, 7), dtype, "cuda", gen=gen)
    w = make_tensor((64, 96, 1, 1), dtype, "cuda", gen=gen)
    args = ([1, 1], [0, 0], [1, 1], 1)
    for go in (make_tensor((1, 1, 1, 1), dtype, "cuda", gen=gen).expand(4, 64, 7, 7),
               make_tensor((4, 64, 7, 7), dtype, "cuda", "channels_last", gen)):
        gi = ops.conv2d_grad_input(go, x, w, *args)
        gw = ops.conv2d_grad_weight(go, x, w, *args)
        ctx = f"{dtype} grad_output strides {go.stride()}"
        assert gi.is_contiguous() and gw.is_contiguous(), ctx
        assert_gradients_match(gi, gw, go, x, w, dtype, False, ctx)
