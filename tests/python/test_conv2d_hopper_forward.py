"""conv2d's Hopper forward (ops/conv2d/implicit_gemm_wgmma.cuh and
implicit_gemm_wgmma_tma.cuh: warpgroup MMA on sm_90 devices): dense windows larger than 1x1 on channels_last float16,
bfloat16 and float32 (TF32) inputs whose channels fill whole 128-byte
reduction steps, against F.conv2d in float64, the kernel seen running in the
profiler; each kernel and block tile of the plan (implicit_gemm.h, wgmma_fprop_plan),
the split-K sum, conv2d_fused's epilogue in the kernel and in the split sum,
and a CUDA graph. Skipped on other devices, where the sm80-style kernels
(test_conv2d_implicit_gemm.py) run these cases."""

import pytest
import torch
import torch.nn.functional as F

from testlib import capture_and_replay, cuda, make_tensor, ops

pytestmark = [cuda, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                       reason="the Hopper forward runs on sm_90 devices only")]

DTYPES = [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float32, id="tf32")]

# The bound of a result's error: |got - want| <= tol * (|x| conv |w| + |b| + |residual|).
# TF32 here drops the low 13 bits of each operand (up to 2^-10 of it each).
TOL = {torch.float16: 2.0**-9, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-8}

ACTIVATIONS = {"identity": lambda t: t, "relu": F.relu, "relu6": F.relu6, "silu": F.silu,
               "hardswish": F.hardswish, "gelu": F.gelu, "sigmoid": torch.sigmoid}


def step_channels(dtype) -> int:
    """Channels in one 128-byte reduction step."""
    return 128 // torch.empty((), dtype=dtype).element_size()


def run_with_tf32(fn):
    """fn's result and whether the Hopper kernel ran in it (None where the
    profiler saw no kernel: under compute-sanitizer), PyTorch's TF32 policy
    for convolutions on."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = fn()
            torch.cuda.synchronize()
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return out, (any("implicit_gemm::wgmma" in n for n in names) if names else None)


def check(got, x, w, b, stride, padding, dilation, dtype, ctx, residual=None, activation="identity"):
    """got against activation(conv + b + residual) in float64, within TOL of the magnitudes."""
    args = (stride, padding, dilation)
    pre = F.conv2d(x.double(), w.double(), None if b is None else b.double(), *args)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else b.double().abs(), *args)
    if residual is not None:
        pre, bound = pre + residual.double(), bound + residual.double().abs()
    want = ACTIVATIONS[activation](pre)
    assert got.shape == want.shape and got.dtype == dtype, ctx
    assert got.is_contiguous(memory_format=torch.channels_last), ctx
    # The activations change a value by at most 1.5x its input's change (hardswish).
    err = (got.double() - want).abs() - 1.5 * TOL[dtype] * bound - 2.0**-10 * want.abs()
    assert (err <= 1e-5).all(), (ctx, float(err.max()))


@pytest.mark.parametrize("idx", range(12))
@pytest.mark.parametrize("dtype", DTYPES)
def test_hopper_forward_matches_torch_on_random_configs(dtype, idx, rng, gen, seed):
    # Windows up to 7x7 (never 1x1), strides, paddings and dilations per
    # axis, output channels any multiple of 8 (partial column tiles), positions
    # rarely a whole number of 128-row tiles.
    kernel = (rng.choice([1, 2, 3, 5, 7]), rng.choice([2, 3, 3, 5]))
    if rng.random() < 0.5:
        kernel = kernel[::-1]
    stride = tuple(rng.choice([1, 1, 2, 3]) for _ in range(2))
    dilation = tuple(rng.choice([1, 1, 2]) for _ in range(2))
    padding = tuple(rng.randint(0, (k - 1) * d // 2 + 1) for k, d in zip(kernel, dilation))
    size = tuple((k - 1) * d + 1 + rng.randint(0, 24) for k, d in zip(kernel, dilation))
    c = step_channels(dtype) * rng.randint(1, 6)  # from 4 steps a tap: the TMA kernel
    k = 8 * rng.randint(1, 40)
    x = make_tensor((rng.randint(1, 3), c, *size), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c, *kernel), dtype, "cuda", rng.choice(["contiguous", "channels_last"]), gen)
    b = make_tensor((k,), dtype, "cuda", gen=gen) if rng.random() < 0.7 else None
    ctx = f"seed={seed} {dtype} x={tuple(x.shape)} w={tuple(w.shape)} s={stride} p={padding} d={dilation}"
    got, ran = run_with_tf32(lambda: ops.conv2d(x, w, b, list(stride), list(padding), list(dilation), 1))
    assert ran is not False, ctx
    check(got, x, w, b, stride, padding, dilation, dtype, ctx)


# One layer per kernel and block tile of the plan on an H100 (132
# multiprocessors; the same on 114), named by its 16-bit route (float32's
# reductions are twice as many steps): the TMA kernel (4 or more steps a tap)
# with and without the split; the cp.async kernel's tiles: at most 64 output
# channels; 128 x 128 tiles filling at most half the device (split in two); at
# most all of it; more.
PLAN_LAYERS = {
    "tma-split": (2, 256, 512, 7),
    "tma": (32, 256, 256, 14),
    "128x64": (2, 64, 64, 20),
    "64x128-split": (2, 128, 256, 7),
    "128x128": (8, 128, 256, 28),
    "64x128x3": (8, 64, 128, 56),
}


@pytest.mark.parametrize("layer", list(PLAN_LAYERS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_hopper_forward_plan_tiles(dtype, layer, gen, seed):
    n, c, k, size = PLAN_LAYERS[layer]
    x = make_tensor((n, c, size, size), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c, 3, 3), dtype, "cuda", "channels_last", gen)
    b = make_tensor((k,), dtype, "cuda", gen=gen)
    got, ran = run_with_tf32(lambda: ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1))
    assert ran is not False, f"seed={seed} {layer}"
    check(got, x, w, b, 1, 1, 1, dtype, f"seed={seed} {dtype} {layer}")


@pytest.mark.parametrize("residual", [False, True], ids=["no-residual", "residual"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("layer", ["tma-split", "tma", "64x128-split", "128x128"])
@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="f16"), pytest.param(torch.float32, id="tf32")])
def test_hopper_forward_fused_epilogue(dtype, layer, activation, residual, gen, seed):
    # conv2d_fused: the residual and the activation in the kernel's epilogue
    # (one pass) or in the split-K sum, against the float64 composition.
    n, c, k, size = PLAN_LAYERS[layer]
    x = make_tensor((n, c, size, size), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c, 3, 3), dtype, "cuda", "channels_last", gen)
    b = make_tensor((k,), dtype, "cuda", gen=gen)
    r = make_tensor((n, k, size, size), dtype, "cuda", "channels_last", gen) if residual else None
    got, ran = run_with_tf32(lambda: ops.conv2d_fused(x, w, b, [1, 1], [1, 1], [1, 1], 1, activation, r))
    ctx = f"seed={seed} {dtype} {layer} {activation}"
    assert ran is not False, ctx
    check(got, x, w, b, 1, 1, 1, dtype, ctx, r, activation)


@pytest.mark.parametrize("layer", ["tma-split", "64x128-split", "64x128x3"])
def test_hopper_forward_in_a_cuda_graph(layer, gen):
    # Stream-ordered, nothing allocated outside the caching allocator: a
    # captured forward replays on new inputs.
    n, c, k, size = PLAN_LAYERS[layer]
    x = make_tensor((n, c, size, size), torch.float16, "cuda", "channels_last", gen)
    w = make_tensor((k, c, 3, 3), torch.float16, "cuda", "channels_last", gen)
    b = make_tensor((k,), torch.float16, "cuda", gen=gen)
    (out,), _graph = capture_and_replay(lambda: (ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1),), [x, w], gen)
    check(out, x, w, b, 1, 1, 1, torch.float16, layer)


def test_hopper_forward_declines_what_it_does_not_take(gen):
    # 1x1 windows, channels that are not whole reduction steps, groups and
    # exact float32 keep their routes (the results still right).
    cases = [((2, 64, 9, 9), (32, 64, 1, 1), 1, torch.float16, True),
             ((2, 40, 9, 9), (32, 40, 3, 3), 1, torch.float16, True),
             ((2, 128, 9, 9), (64, 64, 3, 3), 2, torch.float16, True),
             ((2, 64, 9, 9), (32, 64, 3, 3), 1, torch.float32, False)]
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
        tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-2, atol=5e-2)
        torch.testing.assert_close(got.double(), want, **tol)
