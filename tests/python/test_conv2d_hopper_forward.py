"""conv2d's Hopper forward (ops/conv2d/implicit_gemm_wgmma.cuh: warpgroup MMA
fed by TMA on sm_90 devices): dense windows larger than 1x1 or strided, channels_last
128 or more input channels (64 or more where the output has 40 to 64, on
64-wide tiles): float32 under TF32, and float16 and bfloat16 (a multiple of
64) where the tiles are many (their output stored through shared memory), against F.conv2d in float64, the kernel seen
running in the profiler (implicit_gemm.h, wgmma_fprop_plan); boxes of output
positions that do and do not divide the plane, rows of consecutive positions
(TMA's im2col mode) across rows and images, the split-K sum with
conv2d_fused's epilogue, the last round's tiles in halves, 192-row tiles, 16-bit RGB stems read
through the strides of their packed view, a CUDA graph, and the problems the plan leaves to
the other kernels. Skipped on other devices, where the sm80-style kernels
(test_conv2d_implicit_gemm.py) run these cases."""

import re

import pytest
import torch
import torch.nn.functional as F

from testlib import capture_and_replay, cuda, make_tensor, ops, random_hopper_window, run_profiled_cuda

pytestmark = [cuda, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                       reason="the Hopper forward runs on sm_90 devices only")]


# The bound of a result's error: |got - want| <= TOL * (|x| conv |w| + |b| + |residual|),
# TF32's operands carrying 10 bits of mantissa each.
TOL = 2.0**-8

ACTIVATIONS = {"identity": lambda t: t, "relu": F.relu, "relu6": F.relu6, "silu": F.silu,
               "hardswish": F.hardswish, "gelu": F.gelu, "sigmoid": torch.sigmoid}


def step_channels(dtype) -> int:
    """Channels in one 128-byte reduction step."""
    return 128 // torch.empty((), dtype=dtype).element_size()


def run_with_tf32(fn, kernel=r"implicit_gemm::wgmma"):
    """fn's result and whether the Hopper kernel (a kernel whose name matches
    the pattern `kernel`) ran in it (None where the profiler saw no kernel:
    under compute-sanitizer), PyTorch's TF32 policy for convolutions on."""
    out, names = run_profiled_cuda(fn, tf32=True)
    return out, (any(re.search(kernel, n) for n in names) if names else None)


# The result's own rounding, relative: 16-bit outputs half an ulp; float32's
# as before (a few ulps of TF32's sums).
ROUND = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-10}
# 16-bit operands are exact: float32 accumulation only.
TOL16 = 2.0**-16


def check(got, x, w, b, stride, padding, dilation, dtype, ctx, residual=None, activation="identity", tol=TOL):
    """got against activation(conv + b + residual) in float64, within tol of the
    magnitudes and the output's rounding."""
    args = (stride, padding, dilation)
    pre = F.conv2d(x.double(), w.double(), None if b is None else b.double(), *args)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else b.double().abs(), *args)
    if residual is not None:
        pre, bound = pre + residual.double(), bound + residual.double().abs()
    want = ACTIVATIONS[activation](pre)
    assert got.shape == want.shape and got.dtype == dtype, ctx
    assert got.is_contiguous(memory_format=torch.channels_last), ctx
    # The activations change a value by at most 1.5x its input's change (hardswish).
    err = (got.double() - want).abs() - 1.5 * tol * bound - ROUND[dtype] * want.abs()
    assert (err <= 1e-5).all(), (ctx, float(err.max()))


def square_layer(n, c, k, size, kernel, stride, pad, activation, residual, bias, dtype, gen):
    """A square layer's channels_last operands (x, w, b or None, residual or None) and the call of
    conv2d (activation None) or conv2d_fused on them."""
    x = make_tensor((n, c, size, size), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c, kernel, kernel), dtype, "cuda", "channels_last", gen)
    b = make_tensor((k,), dtype, "cuda", gen=gen) if bias else None
    out = (size + 2 * pad - kernel) // stride + 1
    r = make_tensor((n, k, out, out), dtype, "cuda", "channels_last", gen) if residual else None
    if activation is None:
        call = lambda: ops.conv2d(x, w, b, [stride] * 2, [pad] * 2, [1, 1], 1)  # noqa: E731
    else:
        call = lambda: ops.conv2d_fused(x, w, b, [stride] * 2, [pad] * 2, [1, 1], 1, activation, r)  # noqa: E731
    return x, w, b, r, call


@pytest.mark.parametrize("idx", range(32))
def test_hopper_forward_matches_torch_on_random_configs(idx, rng, gen, seed):
    # Windows up to 7x7 (never 1x1), strides, paddings and dilations per
    # axis, output channels any multiple of 8 (partial column tiles), planes
    # whose sides rarely divide the box, split in two or not.
    kernel, stride, dilation, padding, size = random_hopper_window(rng, [1, 2, 3, 5, 7], [2, 3, 3, 5], 16)
    dtype = torch.float32
    k = 8 * rng.randint(1, 16)
    # From 128 input channels; from 64 where the output's are 40 to 64 (64-wide tiles).
    c = rng.choice(([64, 96] if 32 < k <= 64 else []) + [128, 160, 256, 288, 320])
    x = make_tensor((rng.randint(1, 3), c, *size), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c, *kernel), dtype, "cuda", rng.choice(["contiguous", "channels_last"]), gen)
    b = make_tensor((k,), dtype, "cuda", gen=gen) if rng.random() < 0.7 else None
    ctx = f"seed={seed} {dtype} x={tuple(x.shape)} w={tuple(w.shape)} s={stride} p={padding} d={dilation}"
    got, ran = run_with_tf32(lambda: ops.conv2d(x, w, b, list(stride), list(padding), list(dilation), 1))
    assert ran is not False, ctx
    check(got, x, w, b, stride, padding, dilation, dtype, ctx)


# Layers the plan takes: ResNet-50's 3x3 layers with 128, 256 and 512 channels
# (small planes split in two, at N=2; 14x14 at N=32 not), a plane wider
# than a box's 128 rows, a plane the box does not divide, 5x5 with dilation,
# a strided 1x1 layer (ResNet-50's downsampling shortcut), and layers of at
# most 64 output channels on 64-wide tiles (ResNet-50's 64-channel layer, a
# partial column tile).
PLAN_LAYERS = {
    "256-14x14": dict(n=32, c=256, k=256, size=14, kernel=3, stride=1, padding=1, dilation=1),
    "128-28x28": dict(n=32, c=128, k=128, size=28, kernel=3, stride=1, padding=1, dilation=1),
    "128-56-s2": dict(n=4, c=128, k=128, size=56, kernel=3, stride=2, padding=1, dilation=1),
    "256-150x9": dict(n=1, c=256, k=64, size=(9, 150), kernel=3, stride=1, padding=1, dilation=1),
    "512-7x7": dict(n=2, c=512, k=512, size=7, kernel=3, stride=1, padding=1, dilation=1),
    "512-14-s2": dict(n=2, c=512, k=512, size=14, kernel=3, stride=2, padding=1, dilation=1),
    "256-11x11": dict(n=3, c=256, k=200, size=11, kernel=3, stride=1, padding=1, dilation=1),
    "256-5x5-d2": dict(n=1, c=256, k=64, size=13, kernel=5, stride=1, padding=2, dilation=2),
    "256-1x1-s2": dict(n=8, c=256, k=512, size=28, kernel=1, stride=2, padding=0, dilation=1),
    # (float32 channels_last: taken here, not by the strided pointwise route, engines_cuda.cpp)
    "512-1x1-s2-k1024": dict(n=16, c=512, k=1024, size=28, kernel=1, stride=2, padding=0, dilation=1),
    "64-56x56": dict(n=4, c=64, k=64, size=56, kernel=3, stride=1, padding=1, dilation=1),
    "96-20x20-k40": dict(n=6, c=96, k=40, size=20, kernel=3, stride=1, padding=1, dilation=1),
}


def plan_layer(name, dtype, gen):
    L = PLAN_LAYERS[name]
    size = L["size"] if isinstance(L["size"], tuple) else (L["size"], L["size"])
    x = make_tensor((L["n"], L["c"], *size), dtype, "cuda", "channels_last", gen)
    w = make_tensor((L["k"], L["c"], L["kernel"], L["kernel"]), dtype, "cuda", "channels_last", gen)
    b = make_tensor((L["k"],), dtype, "cuda", gen=gen)
    return x, w, b, L["stride"], L["padding"], L["dilation"]


@pytest.mark.parametrize("layer", list(PLAN_LAYERS))
def test_hopper_forward_on_layers_it_takes(layer, gen, seed):
    dtype = torch.float32
    x, w, b, st, pd, dl = plan_layer(layer, dtype, gen)
    args = ([st] * 2, [pd] * 2, [dl] * 2, 1)
    got, ran = run_with_tf32(lambda: ops.conv2d(x, w, b, *args))
    assert ran is not False, f"seed={seed} {layer}"
    check(got, x, w, b, st, pd, dl, dtype, f"seed={seed} {dtype} {layer}")


@pytest.mark.parametrize("residual", [False, True], ids=["no-residual", "residual"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("layer", ["512-7x7", "256-14x14"])
def test_hopper_forward_fused_epilogue(layer, activation, residual, gen, seed):
    # conv2d_fused: the residual and the activation applied in the split-K
    # sum after the kernel (7x7) or in the kernel's epilogue (14x14 at N=32),
    # against the float64 composition.
    dtype = torch.float32
    x, w, b, st, pd, dl = plan_layer(layer, dtype, gen)
    shape = (x.shape[0], w.shape[0], *x.shape[2:])
    r = make_tensor(shape, dtype, "cuda", "channels_last", gen) if residual else None
    got, ran = run_with_tf32(lambda: ops.conv2d_fused(x, w, b, [1, 1], [1, 1], [1, 1], 1, activation, r))
    ctx = f"seed={seed} {layer} {activation}"
    assert ran is not False, ctx
    check(got, x, w, b, 1, 1, 1, dtype, ctx, r, activation)


@pytest.mark.parametrize("layer", ["512-7x7", "256-11x11"])
def test_hopper_forward_in_a_cuda_graph(layer, gen):
    # Stream-ordered, its workspace from the caching allocator: a captured
    # forward replays on new inputs.
    x, w, b, st, pd, dl = plan_layer(layer, torch.float32, gen)
    args = ([st] * 2, [pd] * 2, [dl] * 2, 1)
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        (out,), _graph = capture_and_replay(lambda: (ops.conv2d(x, w, b, *args),), [x, w], gen)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    check(out, x, w, b, st, pd, dl, torch.float32, layer)


# Layers whose tiles are rows of 128 consecutive output positions (TMA's
# im2col mode; wgmma_fprop_plan takes it where it saves a round of tiles over
# the H100's and H200's 132 multiprocessors, by its tile counts box / rows of
# positions): 5 images of 30x30 with 1000 output channels (400 / 288 tiles),
# stride 2 with uneven padding and dilation (396 / 207), a 67x67 plane (402 /
# 213), a 5x3 window with uneven padding and dilation (180 / 99). Tiles
# cross images, the last one partly outside the output.
IM2COL_LAYERS = {
    "30x30-k1000": dict(n=5, c=256, k=1000, size=(30, 30), kernel=(3, 3), stride=(1, 1), padding=(1, 1),
                        dilation=(1, 1)),
    "131-s2-d12": dict(n=2, c=288, k=384, size=(131, 131), kernel=(3, 3), stride=(2, 2), padding=(1, 2),
                       dilation=(1, 2)),
    "67x67": dict(n=2, c=256, k=384, size=(67, 67), kernel=(3, 3), stride=(1, 1), padding=(1, 1),
                  dilation=(1, 1)),
    "5x3-d12": dict(n=3, c=320, k=264, size=(40, 33), kernel=(5, 3), stride=(1, 1), padding=(2, 3),
                    dilation=(1, 2)),
}


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("layer", list(IM2COL_LAYERS))
def test_hopper_forward_rows_of_positions(layer, fused, gen, seed):
    L = IM2COL_LAYERS[layer]
    dtype = torch.float32
    x = make_tensor((L["n"], L["c"], *L["size"]), dtype, "cuda", "channels_last", gen)
    w = make_tensor((L["k"], L["c"], *L["kernel"]), dtype, "cuda", "channels_last", gen)
    b = make_tensor((L["k"],), dtype, "cuda", gen=gen)
    args = (list(L["stride"]), list(L["padding"]), list(L["dilation"]), 1)
    ctx = f"seed={seed} {layer} fused={fused}"
    if fused:
        out_size = F.conv2d(x[:1, :1], w[:1, :1], None, *args[:3]).shape[2:]
        r = make_tensor((L["n"], L["k"], *out_size), dtype, "cuda", "channels_last", gen)
        got, ran = run_with_tf32(lambda: ops.conv2d_fused(x, w, b, *args, "silu", r))
        check(got, x, w, b, L["stride"], L["padding"], L["dilation"], dtype, ctx, r, "silu")
    else:
        got, ran = run_with_tf32(lambda: ops.conv2d(x, w, b, *args))
        check(got, x, w, b, L["stride"], L["padding"], L["dilation"], dtype, ctx)
    assert ran is not False, ctx


def test_hopper_forward_declines_what_it_does_not_take(gen):
    # 16-bit layers of few tiles, 1x1 windows, fewer input channels than a
    # tile's columns, groups and exact float32 keep their routes (the
    # results still right).
    cases = [((2, 256, 7, 7), (64, 256, 3, 3), 1, torch.float16, True),
             ((2, 256, 7, 7), (64, 256, 3, 3), 1, torch.bfloat16, True),
             ((2, 256, 7, 7), (32, 256, 1, 1), 1, torch.float32, True),
             ((2, 64, 7, 7), (128, 64, 3, 3), 1, torch.float32, True),
             ((2, 64, 7, 7), (32, 64, 3, 3), 1, torch.float32, True),
             ((2, 512, 7, 7), (256, 256, 3, 3), 2, torch.float16, True),
             ((2, 256, 7, 7), (64, 256, 3, 3), 1, torch.float32, False)]
    for xs, ws, groups, dtype, tf32 in cases:
        x = make_tensor(xs, dtype, "cuda", "channels_last", gen)
        w = make_tensor(ws, dtype, "cuda", "channels_last", gen)
        call = lambda: ops.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], groups)  # noqa: E731
        if tf32:
            got, ran = run_with_tf32(call)
        else:
            got = call()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            ran = any("implicit_gemm::wgmma" in e.name for e in prof.events())
        assert ran is not True, (xs, ws, groups, dtype)
        want = F.conv2d(x.double(), w.double(), None, 1, 0, 1, groups)
        tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 and not tf32 else dict(rtol=2e-2, atol=1e-1)
        torch.testing.assert_close(got.double(), want, **tol)


WIDE = {"f16": torch.float16, "bf16": torch.bfloat16}


@pytest.mark.parametrize("dtype", list(WIDE.values()), ids=list(WIDE))
@pytest.mark.parametrize("idx", range(12))
def test_16bit_hopper_forward_matches_torch_on_random_configs(idx, dtype, rng, gen, seed):
    # 16-bit: input channels a multiple of 64 from 128 (from 64 with 40 to 64
    # output channels, 64-wide tiles), images enough for more
    # output tiles than half the multiprocessors (the plan splits none);
    # windows, strides, paddings and dilations per axis; output channels any
    # multiple of 8 (partial column tiles, runs of 8 in the staged store); a
    # bias or not; conv2d_fused with a residual and an activation a third of
    # the time.
    kernel, stride, dilation, padding, size = random_hopper_window(rng, [1, 2, 3, 5], [2, 3, 3], 8)
    ext = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
    size = tuple(max(sz, e - 2 * p + 7 * st + 1) for sz, e, p, st in zip(size, ext, padding, stride))
    out = [(sz + 2 * p - e) // st + 1 for sz, e, p, st in zip(size, ext, padding, stride)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = -(-(sms // 2 + 2) * 128 // (out[0] * out[1]))
    k = 8 * rng.randint(1, 24)
    c = 64 * rng.randint(1 if 32 < k <= 64 else 2, 6)  # 64 only for 64-wide tiles
    x = make_tensor((n, c, *size), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c, *kernel), dtype, "cuda", rng.choice(["contiguous", "channels_last"]), gen)
    b = make_tensor((k,), dtype, "cuda", gen=gen) if rng.random() < 0.7 else None
    args = (list(stride), list(padding), list(dilation), 1)
    ctx = f"seed={seed} {dtype} x={tuple(x.shape)} w={tuple(w.shape)} s={stride} p={padding} d={dilation}"
    if rng.random() < 1 / 3:
        act = rng.choice(list(ACTIVATIONS))
        r = make_tensor((n, k, *out), dtype, "cuda", "channels_last", gen)
        got, ran = run_with_tf32(lambda: ops.conv2d_fused(x, w, b, *args, act, r))
        check(got, x, w, b, stride, padding, dilation, dtype, ctx, r, act, tol=TOL16)
    else:
        got, ran = run_with_tf32(lambda: ops.conv2d(x, w, b, *args))
        check(got, x, w, b, stride, padding, dilation, dtype, ctx, tol=TOL16)
    assert ran is not False, ctx


@pytest.mark.parametrize("dtype", list(WIDE.values()), ids=list(WIDE))
@pytest.mark.parametrize("activation", ["identity", "relu", "silu", "gelu"])
@pytest.mark.parametrize("layer", ["256-14x14", "128-28x28", "64-56x56"])
def test_16bit_hopper_forward_on_resnet_layer(layer, activation, dtype, gen, seed):
    # ResNet-50's 256-channel 3x3 layer at N=32 (98 tiles), its 128-channel
    # one at 28x28 (N=32: 196 tiles) and its 64-channel one at 56x56 (N=4:
    # 98 tiles 64 channels wide): plain, and conv2d_fused with its residual
    # and activation in the epilogue.
    x, w, b, st, pd, dl = plan_layer(layer, dtype, gen)
    ctx = f"seed={seed} {dtype} {layer} {activation}"
    if activation == "identity":
        got, ran = run_with_tf32(lambda: ops.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1))
        check(got, x, w, None, 1, 1, 1, dtype, ctx, tol=TOL16)
    else:
        r = make_tensor((x.shape[0], w.shape[0], *x.shape[2:]), dtype, "cuda", "channels_last", gen)
        got, ran = run_with_tf32(lambda: ops.conv2d_fused(x, w, b, [1, 1], [1, 1], [1, 1], 1, activation, r))
        check(got, x, w, b, 1, 1, 1, dtype, ctx, r, activation, tol=TOL16)
    assert ran is not False, ctx


@pytest.mark.parametrize("dtype", list(WIDE.values()), ids=list(WIDE))
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
def test_16bit_hopper_forward_on_strided_1x1_layer(fused, dtype, gen, seed):
    # ResNet-50's 512 -> 1024 shortcut from 28x28 at N=32 (196 x 8 tiles):
    # every other pixel read by the tensor map; plain, and conv2d_fused with
    # a residual and relu.
    x = make_tensor((32, 512, 28, 28), dtype, "cuda", "channels_last", gen)
    w = make_tensor((1024, 512, 1, 1), dtype, "cuda", "channels_last", gen)
    b = make_tensor((1024,), dtype, "cuda", gen=gen)
    ctx = f"seed={seed} {dtype} fused={fused}"
    if fused:
        r = make_tensor((32, 1024, 14, 14), dtype, "cuda", "channels_last", gen)
        got, ran = run_with_tf32(lambda: ops.conv2d_fused(x, w, b, [2, 2], [0, 0], [1, 1], 1, "relu", r))
        check(got, x, w, b, 2, 0, 1, dtype, ctx, r, "relu", tol=TOL16)
    else:
        got, ran = run_with_tf32(lambda: ops.conv2d(x, w, b, [2, 2], [0, 0], [1, 1], 1))
        check(got, x, w, b, 2, 0, 1, dtype, ctx, tol=TOL16)
    assert ran is not False, ctx


@pytest.mark.parametrize("dtype", list(WIDE.values()), ids=list(WIDE))
@pytest.mark.parametrize("layer", ["30x30-k1000", "67x67", "5x3-d12"])
def test_16bit_hopper_forward_rows_of_positions(layer, dtype, gen, seed):
    L = IM2COL_LAYERS[layer]
    x = make_tensor((L["n"], L["c"], *L["size"]), dtype, "cuda", "channels_last", gen)
    w = make_tensor((L["k"], L["c"], *L["kernel"]), dtype, "cuda", "channels_last", gen)
    b = make_tensor((L["k"],), dtype, "cuda", gen=gen)
    args = (list(L["stride"]), list(L["padding"]), list(L["dilation"]), 1)
    got, ran = run_with_tf32(lambda: ops.conv2d(x, w, b, *args))
    ctx = f"seed={seed} {dtype} {layer}"
    check(got, x, w, b, L["stride"], L["padding"], L["dilation"], dtype, ctx, tol=TOL16)
    assert ran is not False, ctx


@pytest.mark.parametrize("dtype", list(WIDE.values()), ids=list(WIDE))
def test_16bit_hopper_forward_in_a_cuda_graph(dtype, gen):
    x, w, b, st, pd, dl = plan_layer("256-14x14", dtype, gen)
    (out,), _graph = capture_and_replay(lambda: (ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1),), [x, w], gen)
    check(out, x, w, b, 1, 1, 1, dtype, f"graph {dtype}", tol=TOL16)


# Small layers that reach each epilogue of the Hopper forward in every type,
# with enough tiles that the plan takes them in 16-bit too (more than half the
# multiprocessors of an H100 or H200): a partial 128-wide column tile with a
# residual and gelu, 64-wide tiles (two blocks a multiprocessor) with a
# residual and relu and partly empty, and a strided 1x1 layer. Small enough
# for compute-sanitizer's racecheck: `pytest -k epilogues_small`.
SMALL_LAYERS = {
    # name: (n, c, k, size, kernel, stride, activation, residual)
    "136-partial-gelu-residual": (24, 128, 136, 14, 3, 1, "gelu", True),
    "64-wide-relu-residual": (4, 64, 64, 56, 3, 1, "relu", True),
    "64-wide-k40": (4, 128, 40, 56, 3, 1, "identity", False),
    "1x1-s2-relu": (12, 256, 512, 28, 1, 2, "relu", False),
}


@pytest.mark.parametrize("dtype", [torch.float32, *WIDE.values()], ids=["f32", *WIDE])
@pytest.mark.parametrize("layer", list(SMALL_LAYERS))
def test_hopper_forward_epilogues_small(layer, dtype, gen, seed):
    n, c, k, size, kernel, stride, activation, residual = SMALL_LAYERS[layer]
    pad = kernel // 2
    x, w, b, r, call = square_layer(n, c, k, size, kernel, stride, pad, activation, residual, True, dtype, gen)
    got, ran = run_with_tf32(call)
    ctx = f"seed={seed} {dtype} {layer}"
    check(got, x, w, b, stride, pad, 1, dtype, ctx, r, activation, tol=TOL if dtype == torch.float32 else TOL16)
    assert ran is not False, ctx


# Layers with more tiles than an H100's or H200's 132 multiprocessors, which
# the plan gives to the pingpong kernel (implicit_gemm.h, WgmmaPlan::pingpong:
# each consumer warpgroup owns whole tiles, turn by turn; in 16-bit, which
# stores its tiles by TMA, only reductions of up to 8 steps of 64 channels
# without a residual): every epilogue, a partial column tile, rows of
# positions and boxes, odd tile counts a block (the two warpgroups' shares
# differ), a plain conv2d without bias; in float32, and in 16-bit where the
# channels are a multiple of 64 (the other layers there on the cooperative
# kernel). The smallest is small enough for compute-sanitizer's racecheck:
# `pytest -k "pingpong and 1x1"`.
PINGPONG_LAYERS = {
    # name: (n, c, k, size, kernel, stride, activation, residual, bias)  tiles
    "1x1-s2-k392-silu-residual": (6, 128, 392, 64, 1, 2, "silu", True, True),  # 192
    "1x1-s2-k392-silu": (6, 128, 392, 64, 1, 2, "silu", False, True),  # 192
    "1x1-s2-512ch-k200-plain": (48, 512, 200, 28, 1, 2, None, False, False),  # 148 or more
    "3x3-96x96-gelu-residual": (2, 128, 128, 96, 3, 1, "gelu", True, True),  # 144
    "3x3-160ch-28x28-plain": (32, 160, 128, 28, 3, 1, None, False, False),  # 196
    "3x3-192ch-28x28-plain": (32, 192, 136, 28, 3, 1, None, False, False),  # 392
    "5x5-s2-k200-relu6": (24, 128, 200, 40, 5, 2, "relu6", False, True),  # 150
    "3x3-s2-hardswish-residual": (11, 256, 256, 56, 3, 2, "hardswish", True, True),  # 136
    "3x3-s2-sigmoid": (11, 256, 256, 56, 3, 2, "sigmoid", False, True),  # 136
}


PINGPONG_CASES = [(layer, dtype) for layer, (_, c, *_rest) in PINGPONG_LAYERS.items()
                  for dtype in (torch.float32, torch.float16, torch.bfloat16)
                  if dtype == torch.float32 or c % 64 == 0]
KERNEL_NAME = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}


@pytest.mark.parametrize("layer,dtype", PINGPONG_CASES,
                         ids=[f"{layer}-{str(dtype)[6:]}" for layer, dtype in PINGPONG_CASES])
def test_hopper_forward_pingpong(layer, dtype, gen, seed):
    n, c, k, size, kernel, stride, activation, residual, bias = PINGPONG_LAYERS[layer]
    pad = kernel // 2
    x, w, b, r, call = square_layer(n, c, k, size, kernel, stride, pad, activation, residual, bias, dtype, gen)
    pingpong = dtype == torch.float32 or (not residual and kernel * kernel * c <= 8 * 64)
    # 16-bit layers left to the cooperative kernel may take 192-row tiles.
    rows = "128" if pingpong else "(?:128|192)"
    kernel_name = rf"fprop_tma_kernel<{KERNEL_NAME[dtype]}, {rows}, 128, \d+, {str(pingpong).lower()}>"
    got, ran = run_with_tf32(call, kernel=kernel_name)
    ctx = f"seed={seed} {layer} {dtype}"
    check(got, x, w, b, stride, pad, 1, dtype, ctx, r, activation or "identity",
          tol=TOL if dtype == torch.float32 else TOL16)
    assert ran is not False, ctx


# The tail (wgmma_plan.h's tail_tiles): where the tiles leave a last round
# over the resident blocks that fills at most half of them, and a tile's
# reduction has 32 steps or more, those tiles run as two halves of their
# reduction on two blocks at once, and the second to finish adds the
# first's float32 sums to its own. Tile counts on the H100's and H200's 132
# multiprocessors: 256 channels 3x3 at 14x14 with N=48 (192 boxes, 60 of
# them split: the cooperative kernel in 16-bit, the pingpong one in
# float32), 256 -> 64 channels on 64-wide tiles two blocks a multiprocessor
# (336 boxes over 264 blocks), ResNet-50's 128-channel 3x3 layer (196 rows
# of positions; 36 steps in float32 only, so 16-bit runs it whole), with and
# without the fused epilogue. The sum is the same whichever half arrives
# first: two calls agree bit for bit, and a CUDA graph's replays reuse the
# halves' flags.
TAIL_LAYERS = {
    # name: (n, c, k, size, kernel, stride, activation, residual)
    "3x3-256ch-14x14": (48, 256, 256, 14, 3, 1, None, False),
    "3x3-256ch-14x14-relu-residual": (48, 256, 256, 14, 3, 1, "relu", True),
    "3x3-256-to-64ch-28x28": (48, 256, 64, 28, 3, 1, None, False),
    "3x3-256-to-64ch-silu-residual": (48, 256, 64, 28, 3, 1, "silu", True),
    "3x3-128ch-28x28": (32, 128, 128, 28, 3, 1, None, False),
    "3x3-128ch-28x28-gelu-residual": (32, 128, 128, 28, 3, 1, "gelu", True),
}


@pytest.mark.parametrize("dtype", [torch.float32, *WIDE.values()], ids=["f32", *WIDE])
@pytest.mark.parametrize("layer", list(TAIL_LAYERS))
def test_hopper_forward_tail_tiles_in_halves(layer, dtype, gen, seed):
    n, c, k, size, kernel, stride, activation, residual = TAIL_LAYERS[layer]
    pad = kernel // 2
    x, w, b, r, call = square_layer(n, c, k, size, kernel, stride, pad, activation, residual, True, dtype, gen)
    got, ran = run_with_tf32(call)
    ctx = f"seed={seed} {layer} {dtype}"
    assert ran is not False, ctx
    tol = TOL if dtype == torch.float32 else TOL16
    check(got, x, w, b, stride, pad, 1, dtype, ctx, r, activation or "identity", tol=tol)
    again, _ = run_with_tf32(call)
    assert torch.equal(got, again), ctx
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        inputs = [x, w] if r is None else [x, w, r]
        (replayed,), graph = capture_and_replay(lambda: (call(),), inputs, gen)
        check(replayed, x, w, b, stride, pad, 1, dtype, ctx + " graph", r, activation or "identity", tol=tol)
        x.copy_(make_tensor(x.shape, dtype, "cuda", gen=gen))  # new sums for the halves to meet on
        graph.replay()
        torch.cuda.synchronize()
        check(replayed, x, w, b, stride, pad, 1, dtype, ctx + " graph again", r, activation or "identity",
              tol=tol)
    finally:
        torch.backends.cudnn.allow_tf32 = saved


# 192-row tiles (three consumer warpgroups, rows of positions) for 16-bit
# layers where their rounds take less time (implicit_gemm.h, WgmmaPlan::rows):
# ResNet-50's 128-channel 3x3 layers at N=32, 131 tiles against 196 of 128
# rows, plain, fused, and at stride 2; the last tile partly outside; a
# 36-step layer whose last round runs in halves.
ROWS192_LAYERS = {
    # name: (n, c, k, size, kernel, stride, activation, residual)
    "3x3-128ch-28x28": (32, 128, 128, 28, 3, 1, None, False),
    "3x3-128ch-28x28-relu-residual": (32, 128, 128, 28, 3, 1, "relu", True),
    "3x3-128ch-56x56-s2-silu": (32, 128, 128, 56, 3, 2, "silu", False),
    # 36 steps a tile: 196 tiles, the last round's 64 in halves (three parts a half)
    "3x3-256ch-28x28-to-128-tail-relu-residual": (48, 256, 128, 28, 3, 1, "relu", True),
}


@pytest.mark.parametrize("dtype", list(WIDE.values()), ids=list(WIDE))
@pytest.mark.parametrize("layer", list(ROWS192_LAYERS))
def test_16bit_hopper_forward_192_row_tiles(layer, dtype, gen, seed):
    n, c, k, size, kernel, stride, activation, residual = ROWS192_LAYERS[layer]
    pad = kernel // 2
    x, w, b, r, call = square_layer(n, c, k, size, kernel, stride, pad, activation, residual, True, dtype, gen)
    got, ran = run_with_tf32(call, kernel=rf"fprop_tma_kernel<{KERNEL_NAME[dtype]}, 192, 128, 3, false>")
    ctx = f"seed={seed} {layer} {dtype}"
    assert ran is not False, ctx
    check(got, x, w, b, stride, pad, 1, dtype, ctx, r, activation or "identity", tol=TOL16)
    again, _ = run_with_tf32(call)
    assert torch.equal(got, again), ctx


# RGB stems in 16-bit as the engine packs them (implicit_gemm.cpp,
# packed_stem: ResNet's 7x7 stride 2 becomes 4x1 taps of 64 channels over an
# overlapping view of the packed phases): the Hopper forward's 64-wide tiles
# read that view through its strides (Args::xs); plain, fused, an odd plane
# and 40 output channels (a partial column tile). Enough positions for more
# tiles than half the multiprocessors (fewer are left to the other kernels).
STEM_LAYERS = {
    # name: (n, k, size, activation, residual, bias)
    "resnet-stem": (1, 64, 224, None, False, True),
    "resnet-stem-relu-residual": (3, 64, 128, "relu", True, True),
    "stem-40ch-odd-silu": (2, 40, 161, "silu", False, False),
}


@pytest.mark.parametrize("dtype", list(WIDE.values()), ids=list(WIDE))
@pytest.mark.parametrize("layer", list(STEM_LAYERS))
def test_16bit_packed_stems_on_hopper_forward(layer, dtype, gen, seed):
    n, k, size, activation, residual, bias = STEM_LAYERS[layer]
    x, w, b, r, call = square_layer(n, 3, k, size, 7, 2, 3, activation, residual, bias, dtype, gen)
    got, ran = run_with_tf32(call, kernel=rf"fprop_tma_kernel<{KERNEL_NAME[dtype]}, 128, 64, \d+, false>")
    ctx = f"seed={seed} {layer} {dtype}"
    assert ran is not False, ctx
    check(got, x, w, b, 2, 3, 1, dtype, ctx, r, activation or "identity", tol=TOL16)
    again, _ = run_with_tf32(call)
    assert torch.equal(got, again), ctx
