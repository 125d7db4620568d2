"""conv2d's Hopper forward of float32 groups that merge into groups of 32
channels, each tile's input loaded once for its 9 taps
(ops/conv2d/implicit_gemm_wgmma_halo.cuh, halo_plan.h): 3x3 windows at
stride 1 and 2, groups of 4, 8, 16 and 32 channels (merged 8, 4, 2 and 1
at a time), planes split into tiles of rows and small planes stacked whole,
sides that fill no whole tile, channels_last and NCHW inputs, bias or none,
conv2d_fused's activations, the input gradient (whose stride-1 form runs
as this forward), a CUDA graph, and the layers the plan leaves to the other
kernels; against F.conv2d in float64, the kernel seen running in the
profiler. Skipped on devices other than sm_90."""

import math

import pytest
import torch
import torch.nn.functional as F

from testlib import capture_and_replay, cuda, make_tensor, ops, run_profiled_cuda

pytestmark = [cuda, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                       reason="the Hopper forward runs on sm_90 devices only")]

# TF32 operands (10 bits of mantissa each), float32 sums: |got - want| <= TOL
# * (|x| conv |w| + |b|) plus the output's rounding.
TOL = 2.0**-9

ACTIVATIONS = {"identity": lambda t: t, "relu": F.relu, "silu": F.silu, "hardswish": F.hardswish,
               "gelu": F.gelu}

HALO = "fprop_halo_kernel"


def run(fn):
    """fn's result (TF32 on for convolutions) and whether the kernel ran
    (None where the profiler saw no kernel: under compute-sanitizer)."""
    out, names = run_profiled_cuda(fn, tf32=True)
    return out, (any(HALO in n for n in names) if names else None)


def layer(n, c, groups, h, w, stride, layout, bias, gen):
    x = make_tensor((n, c, h, w), torch.float32, "cuda", layout, gen)
    wt = make_tensor((c, c // groups, 3, 3), torch.float32, "cuda", layout, gen) / math.sqrt(9 * c / groups)
    b = make_tensor((c,), torch.float32, "cuda", gen=gen) if bias else None
    return x, wt, b


def check(got, x, w, b, stride, groups, activation, ctx):
    args = (stride, 1, 1, groups)
    pre = F.conv2d(x.double(), w.double(), None if b is None else b.double(), *args)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else b.double().abs(), *args)
    want = ACTIVATIONS[activation](pre)
    assert got.shape == want.shape and got.dtype == torch.float32, ctx
    err = (got.double() - want).abs() - 1.5 * TOL * bound - 2.0**-20 * want.abs()
    assert (err <= 1e-6).all(), (ctx, float(err.max()))


# (n, channels, groups, h, w, stride): ResNeXt-50's grouped layers at N=2 and
# 3, and sides that fill no whole tile; 14x14 at stride 2 stacks two whole
# images in a tile (with three or five images, the last tile's second is
# outside). Every case has more than 2^20 multiply-adds: smaller NCHW ones
# take the one-launch route for tiny problems (tiny_direct.h).
SHAPES = [
    (2, 128, 32, 56, 56, 1), (2, 256, 32, 56, 56, 2), (3, 256, 32, 28, 28, 1), (2, 512, 32, 28, 28, 2),
    (3, 512, 32, 14, 14, 1), (3, 1024, 32, 14, 14, 2), (5, 64, 8, 13, 13, 1), (2, 96, 12, 17, 23, 2),
    (3, 64, 8, 10, 10, 1), (4, 128, 16, 30, 31, 2), (3, 64, 2, 8, 12, 1), (5, 128, 16, 14, 14, 2),
    (2, 128, 32, 11, 40, 1), (3, 96, 3, 30, 14, 2),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "n{}-c{}-g{}-{}x{}-s{}".format(*s))
@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
def test_grouped_halo_forward_matches_float64(shape, layout, gen):
    n, c, groups, h, w, stride = shape
    x, wt, b = layer(n, c, groups, h, w, stride, layout, True, gen)
    got, ran = run(lambda: ops.conv2d(x, wt, b, [stride] * 2, [1, 1], [1, 1], groups))
    assert ran is not False, shape
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt), shape
    check(got, x, wt, b, stride, groups, "identity", shape)


@pytest.mark.parametrize("activation", ["relu", "silu", "hardswish", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_grouped_halo_fused_activation(activation, bias, gen):
    n, c, groups, h, w, stride = 3, 256, 32, 19, 21, 2
    x, wt, b = layer(n, c, groups, h, w, stride, "channels_last", bias, gen)
    got, ran = run(lambda: ops.conv2d_fused(x, wt, b, [stride] * 2, [1, 1], [1, 1], groups, activation, None))
    assert ran is not False
    check(got, x, wt, b, stride, groups, activation, (activation, bias))


@pytest.mark.parametrize("stride", [1, 2])
def test_grouped_halo_gradients(stride, gen):
    # The input gradient of a stride-1 grouped layer runs as the forward of
    # grad_output with the rotated weight: on this kernel too.
    n, c, groups, h, w = 2, 128, 16, 14, 15
    x, wt, b = layer(n, c, groups, h, w, stride, "channels_last", True, gen)
    x.requires_grad_(True), wt.requires_grad_(True)
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        out = ops.conv2d(x, wt, b, [stride] * 2, [1, 1], [1, 1], groups)
        go = make_tensor(out.shape, torch.float32, "cuda", "channels_last", gen)
        gx, gw = torch.autograd.grad(out, (x, wt), go)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    xd, wd = x.detach().double().requires_grad_(True), wt.detach().double().requires_grad_(True)
    want = F.conv2d(xd, wd, b.double(), stride, 1, 1, groups)
    wgx, wgw = torch.autograd.grad(want, (xd, wd), go.double())
    for got, ref in ((gx, wgx), (gw, wgw)):
        assert float((got.double() - ref).norm() / ref.norm()) < 2.0**-9


def test_grouped_halo_in_cuda_graph(gen):
    n, c, groups, h, w, stride = 2, 256, 32, 28, 28, 1
    x, wt, b = layer(n, c, groups, h, w, stride, "channels_last", True, gen)
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        (got,), graph = capture_and_replay(lambda: (ops.conv2d(x, wt, b, [1, 1], [1, 1], [1, 1], groups),), [x], gen)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    check(got, x, wt, b, stride, groups, "identity", "graph")
    del graph


@pytest.mark.parametrize("case", ["7x7-stride-1", "dilation-2", "5x5", "tf32-off", "groups-of-64", "regnet-13-groups"])
def test_grouped_halo_declines(case, gen):
    # Outside the plan the other kernels run, and the result is right: a
    # 7x7 plane at stride 1 fills 49 of a tile's 128 rows; dilation and
    # 5x5 windows; float32 without TF32 (exact routes); groups of 64
    # channels; 13 groups of 8, which no merge into 32 channels divides.
    n, c, groups, h, w, stride, k, dil, tf32 = 3, 256, 32, 7, 7, 1, 3, 1, True
    if case == "dilation-2":
        h, w, dil = 15, 15, 2
    if case == "5x5":
        h, w, k = 15, 15, 5
    if case == "tf32-off":
        h = w = 12
        tf32 = False
    if case == "groups-of-64":
        groups, h, w = 4, 12, 12
    if case == "regnet-13-groups":
        c, groups, h, w = 104, 13, 12, 12
    x = make_tensor((n, c, h, w), torch.float32, "cuda", "channels_last", gen)
    wt = make_tensor((c, c // groups, k, k), torch.float32, "cuda", "channels_last", gen) / math.sqrt(k * k * c / groups)
    b = make_tensor((c,), torch.float32, "cuda", gen=gen)
    pad = dil * (k - 1) // 2
    out, names = run_profiled_cuda(lambda: ops.conv2d(x, wt, b, [stride] * 2, [pad] * 2, [dil] * 2, groups), tf32=tf32)
    if names:
        assert not any(HALO in n for n in names), case
    want = F.conv2d(x.double(), wt.double(), b.double(), stride, pad, dil, groups)
    bound = F.conv2d(x.double().abs(), wt.double().abs(), b.double().abs(), stride, pad, dil, groups)
    tol = TOL if tf32 else 2.0**-20
    assert ((out.double() - want).abs() - 1.5 * tol * bound <= 1e-6).all(), case
