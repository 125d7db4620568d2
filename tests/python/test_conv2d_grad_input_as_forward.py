"""conv2d_grad_input of ungrouped stride-1 layers as the Hopper forward of
grad_output with the rotated weight (implicit_gemm.cpp,
grad_input_as_hopper_forward; rotated_weight.h): float32 under TF32 with 128
or more output channels (the TF32 Hopper forward's input channels), and
16-bit layers whose sm80-style forward would split (small planes) or with 256
or more output channels and many tiles (our Hopper forward's 16-bit plan), against
the float64 input gradient; random windows, paddings, dilations and weight
layouts, the rotation kernel seen running in the profiler, the memory format
of the result, and a CUDA graph. Skipped on devices other than sm_90, where
the sm80-style input gradient runs these cases (test_conv2d_implicit_gemm.py)."""

import pytest
import torch
import torch.nn.functional as F

from testlib import capture_and_replay, cuda, make_tensor, ops

pytestmark = [cuda, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                       reason="the Hopper forwards run on sm_90 devices only")]

# The bound of an error against the products' magnitudes: TF32's and the
# 16-bit types' operands rounded, float32 sums, the result rounded once.
TOL = {torch.float32: 2.0**-8, torch.float16: 2.0**-8, torch.bfloat16: 2.0**-6}
KERNEL = "transposed_taps_kernel"


def grad_input_and_route(go, x, w, padding, dilation):
    """conv2d_grad_input under TF32 and whether the rotation ran (None where
    the profiler saw no kernel: under compute-sanitizer)."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            got = ops.conv2d_grad_input(go, x, w, [1, 1], list(padding), list(dilation), 1)
            torch.cuda.synchronize()
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return got, (any(KERNEL in n for n in names) if names else None)


def check(got, go, x, w, padding, dilation, dtype, ctx):
    def grad(x, w, go):
        x = x.double().requires_grad_()
        out = F.conv2d(x, w.double(), None, 1, padding, dilation)
        return torch.autograd.grad(out, x, go.double())[0]

    want = grad(x, w, go)
    bound = grad(x, w.abs(), go.abs())
    assert got.shape == want.shape and got.dtype == dtype, ctx
    err = (got.double() - want).abs() - TOL[dtype] * bound
    assert (err <= 1e-5).all(), (ctx, float(err.max()))


def random_layer(rng, gen, dtype, c, k, batch, size_slack):
    kernel = (rng.choice([1, 2, 3, 5]), rng.choice([2, 3]))
    dilation = (rng.choice([1, 1, 2]), rng.choice([1, 1, 2]))
    # The rotated padding d (k - 1) - p must not be negative.
    padding = tuple(rng.randint(0, (kk - 1) * d) for kk, d in zip(kernel, dilation))
    size = tuple((kk - 1) * d + 1 + rng.randint(0, size_slack) for kk, d in zip(kernel, dilation))
    layout = rng.choice(["channels_last", "channels_last", "contiguous"])
    x = make_tensor((batch, c, *size), dtype, "cuda", layout, gen)
    w = make_tensor((k, c, *kernel), dtype, "cuda", rng.choice(["contiguous", "channels_last"]), gen)
    oh, ow = (size[a] + 2 * padding[a] - (kernel[a] - 1) * dilation[a] for a in (0, 1))
    go = make_tensor((batch, k, oh, ow), dtype, "cuda", layout, gen)
    return go, x, w, padding, dilation, layout


@pytest.mark.parametrize("idx", range(16))
def test_float32_with_128_or_more_output_channels(idx, rng, gen, seed):
    c = 8 * rng.randint(1, 40)
    k = rng.choice([128, 160, 256, 288, 320])
    go, x, w, padding, dilation, layout = random_layer(rng, gen, torch.float32, c, k, rng.randint(1, 3), 12)
    ctx = f"seed={seed} x={tuple(x.shape)} w={tuple(w.shape)} p={padding} d={dilation} {layout}"
    got, ran = grad_input_and_route(go, x, w, padding, dilation)
    assert ran is not False, ctx
    fmt = torch.channels_last if layout == "channels_last" or w.is_contiguous(memory_format=torch.channels_last) \
        else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt), ctx
    check(got, go, x, w, padding, dilation, torch.float32, ctx)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("idx", range(8))
def test_16bit_small_planes(dtype, idx, rng, gen, seed):
    # Few output tiles (a small plane, many channels): the sm80-style forward
    # of the transposed problem would split its reduction.
    c = 64 * rng.randint(2, 8)
    k = 128 * rng.randint(2, 4)
    go, x, w, padding, dilation, layout = random_layer(rng, gen, dtype, c, k, rng.randint(1, 2), 6)
    ctx = f"seed={seed} x={tuple(x.shape)} w={tuple(w.shape)} p={padding} d={dilation} {layout}"
    got, ran = grad_input_and_route(go, x, w, padding, dilation)
    assert ran is not False, ctx
    check(got, go, x, w, padding, dilation, dtype, ctx)


# ResNet-50's 3x3 layers: the 512-channel 7x7 one at N=8, and the 256-channel
# 14x14 one at N=32 (98 tiles: our Hopper forward's 16-bit plan takes the
# transposed problem).
RESNET_LAYERS = [(8, 512, 7, torch.float32), (8, 512, 7, torch.float16),
                 (32, 256, 14, torch.float16), (32, 256, 14, torch.bfloat16)]


@pytest.mark.parametrize("n,c,size,dtype", RESNET_LAYERS, ids=["512-f32", "512-f16", "256-f16", "256-bf16"])
def test_resnet50_3x3_layers(n, c, size, dtype, gen):
    x = make_tensor((n, c, size, size), dtype, "cuda", "channels_last", gen)
    w = make_tensor((c, c, 3, 3), dtype, "cuda", "channels_last", gen)
    go = make_tensor((n, c, size, size), dtype, "cuda", "channels_last", gen)
    got, ran = grad_input_and_route(go, x, w, (1, 1), (1, 1))
    assert ran is not False
    assert got.is_contiguous(memory_format=torch.channels_last)
    check(got, go, x, w, (1, 1), (1, 1), dtype, f"resnet50 {c} {size}x{size}")


def test_float32_without_tf32_keeps_the_exact_routes(gen):
    x = make_tensor((2, 64, 9, 9), torch.float32, "cuda", "channels_last", gen)
    w = make_tensor((256, 64, 3, 3), torch.float32, "cuda", "channels_last", gen)
    go = make_tensor((2, 256, 9, 9), torch.float32, "cuda", "channels_last", gen)
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            got = ops.conv2d_grad_input(go, x, w, [1, 1], [1, 1], [1, 1], 1)
            torch.cuda.synchronize()
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    assert not any(KERNEL in e.name for e in prof.events())
    x64 = x.double().requires_grad_()
    want = torch.autograd.grad(F.conv2d(x64, w.double(), None, 1, 1), x64, go.double())[0]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_backward_in_a_cuda_graph(gen):
    x = make_tensor((4, 128, 7, 7), torch.float16, "cuda", "channels_last", gen).requires_grad_()
    w = make_tensor((512, 128, 3, 3), torch.float16, "cuda", "channels_last", gen).requires_grad_()
    go = make_tensor((4, 512, 7, 7), torch.float16, "cuda", "channels_last", gen)

    def step():
        return (torch.autograd.grad(ops.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1), x, go)[0],)

    (got,), _graph = capture_and_replay(step, [w.detach()], gen)
    assert torch.equal(got, step()[0])
    check(got, go, x.detach(), w.detach(), (1, 1), (1, 1), torch.float16, "graph")
