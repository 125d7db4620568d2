"""conv2d's 16-bit Hopper forward (CUTLASS 3's implicit GEMM for sm_90
devices, ops/conv2d/implicit_gemm_sm90.cuh): dense layers without a bias
whose sm80-style forward would split its reduction (few output tiles, 256 or
more input channels), in float16 and bfloat16, against F.conv2d in float64,
the kernel seen running in the profiler (implicit_gemm.cpp,
fprop_sm90_16bit); random windows, strides, paddings and dilations,
ResNet-50's layers it takes, a CUDA graph, gradients through it, and
the problems left to the other kernels (a bias, conv2d_fused, many tiles).
Skipped on other devices."""

import pytest
import torch
import torch.nn.functional as F

from testlib import capture_and_replay, cuda, make_tensor, ops, random_hopper_window

pytestmark = [cuda, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                       reason="the Hopper forward runs on sm_90 devices only")]

DTYPES = [torch.float16, torch.bfloat16]

# The result's rounding (half an ulp of the element type) and float32
# accumulation: |got - want| <= EPS * |want| + 2^-16 * (|x| conv |w|).
EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def run_profiled(fn):
    """fn's result and whether CUTLASS 3's convolution kernel ran in it (None
    where the profiler saw no kernel: under compute-sanitizer)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return out, (any("ConvUniversal" in n for n in names) if names else None)


def check(got, x, w, b, stride, padding, dilation, ctx):
    args = (stride, padding, dilation)
    want = F.conv2d(x.double(), w.double(), None if b is None else b.double(), *args)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else b.double().abs(), *args)
    assert got.shape == want.shape and got.dtype == x.dtype, ctx
    assert got.is_contiguous(memory_format=torch.channels_last), ctx
    err = (got.double() - want).abs() - EPS[x.dtype] * want.abs() - 2.0**-16 * bound
    assert (err <= 1e-6).all(), (ctx, float(err.max()))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("idx", range(16))
def test_16bit_hopper_forward_matches_torch_on_random_configs(idx, dtype, rng, gen, seed):
    # Windows up to 7x5, strides, paddings and dilations per axis; input
    # channels a multiple of 128 (whole reduction slices), output channels a
    # multiple of 8 above 64 (partial column tiles); planes whose sides rarely
    # divide a tile; a few images, so few tiles that the sm80-style forward
    # would split its reduction; channels_last input (NCHW inputs of planes
    # this small take the column route, conv2d.h).
    kernel, stride, dilation, padding, size = random_hopper_window(rng, [1, 3, 3, 5, 7], [1, 2, 3, 5], 14)
    c = 128 * rng.randint(2, 5)
    k = 8 * rng.randint(9, 32)
    x = make_tensor((rng.randint(1, 4), c, *size), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c, *kernel), dtype, "cuda", rng.choice(["contiguous", "channels_last"]), gen)
    ctx = f"seed={seed} {dtype} x={tuple(x.shape)} w={tuple(w.shape)} s={stride} p={padding} d={dilation}"
    got, ran = run_profiled(lambda: ops.conv2d(x, w, None, list(stride), list(padding), list(dilation), 1))
    assert ran is not False, ctx
    check(got, x, w, None, stride, padding, dilation, ctx)


# ResNet-50's 512-channel 3x3 layers at N=32 (the layers it is routed for),
# and a 256-channel 3x3 layer on a 7x7 plane at N=8.
LAYERS = {
    "512-7x7": dict(n=32, c=512, k=512, size=7, stride=1),
    "512-14-s2": dict(n=32, c=512, k=512, size=14, stride=2),
    "256-7x7": dict(n=8, c=256, k=256, size=7, stride=1),
}


def layer(name, dtype, gen, requires_grad=False):
    L = LAYERS[name]
    x = make_tensor((L["n"], L["c"], L["size"], L["size"]), dtype, "cuda", "channels_last", gen,
                    requires_grad=requires_grad)
    w = make_tensor((L["k"], L["c"], 3, 3), dtype, "cuda", "channels_last", gen, requires_grad=requires_grad)
    return x, w, L["stride"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_16bit_hopper_forward_on_layers_it_takes(name, dtype, gen, seed):
    x, w, st = layer(name, dtype, gen)
    got, ran = run_profiled(lambda: ops.conv2d(x, w, None, [st, st], [1, 1], [1, 1], 1))
    assert ran is not False, f"seed={seed} {name}"
    check(got, x, w, None, st, 1, 1, f"seed={seed} {dtype} {name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_16bit_hopper_forward_gradients(dtype, gen, seed):
    # The backward of a forward it ran: the gradients against float64's.
    x, w, st = layer("256-7x7", dtype, gen, requires_grad=True)
    out = ops.conv2d(x, w, None, [st, st], [1, 1], [1, 1], 1)
    go = make_tensor(out.shape, dtype, "cuda", "channels_last", gen)
    gx, gw = torch.autograd.grad(out, (x, w), go)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want_x, want_w = torch.autograd.grad(F.conv2d(xd, wd, None, st, 1), (xd, wd), go.double())
    tol = dict(rtol=2e-2, atol=2e-1) if dtype == torch.bfloat16 else dict(rtol=4e-3, atol=4e-2)
    torch.testing.assert_close(gx.double(), want_x, **tol, msg=f"seed={seed} grad_input")
    torch.testing.assert_close(gw.double(), want_w, **tol, msg=f"seed={seed} grad_weight")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_16bit_hopper_forward_in_a_cuda_graph(dtype, gen):
    # Stream-ordered, no workspace: a captured forward replays on new inputs.
    x, w, st = layer("512-7x7", dtype, gen)
    (out,), _graph = capture_and_replay(lambda: (ops.conv2d(x, w, None, [st, st], [1, 1], [1, 1], 1),),
                                        [x, w], gen)
    check(out, x, w, None, st, 1, 1, f"graph {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_16bit_hopper_forward_declines_what_it_does_not_take(dtype, gen):
    # A bias, conv2d_fused's activation, many output tiles (ResNet-50's 256-channel
    # 3x3 layer at N=32, 98 tiles: our Hopper kernel), 64 output channels and groups
    # keep other kernels, their results right.
    x, w, st = layer("512-7x7", dtype, gen)
    b = make_tensor((w.shape[0],), dtype, "cuda", gen=gen)
    wide = make_tensor((32, 256, 14, 14), dtype, "cuda", "channels_last", gen)
    w256 = make_tensor((256, 256, 3, 3), dtype, "cuda", "channels_last", gen)
    w64 = make_tensor((64, 512, 3, 3), dtype, "cuda", "channels_last", gen)
    wg = make_tensor((512, 256, 3, 3), dtype, "cuda", "channels_last", gen)
    cases = {
        "bias": (lambda: ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1), x, w, b, 1),
        "fused": (lambda: ops.conv2d_fused(x, w, None, [1, 1], [1, 1], [1, 1], 1, "relu", None), x, w, None, 1),
        "many tiles": (lambda: ops.conv2d(wide, w256, None, [1, 1], [1, 1], [1, 1], 1), wide, w256, None, 1),
        "64 channels": (lambda: ops.conv2d(x, w64, None, [1, 1], [1, 1], [1, 1], 1), x, w64, None, 1),
        "groups": (lambda: ops.conv2d(x, wg, None, [1, 1], [1, 1], [1, 1], 2), x, wg, None, 2),
    }
    for name, (call, xi, wi, bi, groups) in cases.items():
        got, ran = run_profiled(call)
        assert ran is not True, name
        want = F.conv2d(xi.double(), wi.double(), None if bi is None else bi.double(), 1, 1, 1, groups)
        if name == "fused":
            want = want.relu()
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-1, msg=name)
