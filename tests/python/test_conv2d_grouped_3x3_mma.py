"""The grouped 3x3 layers with 8, 16 and 32 channels a group on tensor cores
(ops/conv2d/grouped_mma.h: grouped_mma_conv2d for the forward of groups of 8
and 16, grouped_mma_conv2d_grad_input, grouped_mma_conv2d_grad_weight) in
float16 and bfloat16: the forward (with
bias, and conv2d_fused's residual and activation) and both gradients against
F.conv2d in float64 within the bound of float32 sums of exact products
rounded once, on random strides, paddings, dilations, plane sizes, batch
sizes and layouts; ResNeXt's and RegNet's layers; the memory format; a
weight gradient that repeats bit for bit; a CUDA graph; and the layers left
to the other routes."""

import pytest
import torch
import torch.nn.functional as F

from testlib import capture_and_replay, cuda, make_tensor, ops

pytestmark = cuda

DTYPES = [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16")]
PASSES = ["grad_input", "grad_weight"]
ALL_PASSES = ["forward"] + PASSES
# The rounding of a result (float32 sums of exact products): half an ulp of
# the dtype, with room for the float32 sums, relative to the sum of the
# products' magnitudes.
TOL = {torch.float16: 2.0**-9, torch.bfloat16: 2.0**-7}
KERNELS = {"forward": ("grouped_mma_forward_kernel", "grouped_mma16_forward_kernel"),
           "grad_input": ("grouped_mma_grad_input_kernel",), "grad_weight": ("grouped_mma_grad_weight_kernel",)}
TINY_MACS = 1 << 20  # tiny_direct.h: smaller gradients go to the direct kernels first


def gradient_and_route(which, go, x, w, args):
    """The pass `which` (forward: conv2d without bias) and whether its
    tensor-core kernel ran (None where the profiler saw no kernel: under
    compute-sanitizer)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        if which == "forward":
            got = ops.conv2d(x, w, None, *args)
        else:
            got = getattr(ops, "conv2d_" + which)(go, x, w, *args)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return got, (ran_any(KERNELS[which], names) if names else None)


def ran_any(kernels, names):
    return any(k in n for n in names for k in kernels)


def kernel_takes(which, width, groups, stride):
    """Whether the layer's pass `which` goes to its tensor-core kernel (the
    gradients above the tiny bound): the forward takes groups of 8 and 16
    channels, any stride; the input gradient leaves groups of 8 that no pair
    merges (an odd count) under 32 groups to the other routes."""
    if which == "forward":
        return width <= 16
    return not (which == "grad_input" and width == 8 and groups % 2 == 1 and groups < 32)


def check(which, got, go, x, w, args, dtype, ctx):
    """got against the float64 gradient, within TOL of the sum of the
    products' magnitudes (the same gradient of |x| and |w| against |go|)."""
    stride, padding, dilation, groups = args

    def grad(x, w, go):
        x, w = x.double().requires_grad_(), w.double().requires_grad_()
        out = F.conv2d(x, w, None, stride, padding, dilation, groups)
        if which == "forward":
            return out.detach()
        return torch.autograd.grad(out, x if which == "grad_input" else w, go.double())[0]

    want = grad(x, w, go)
    bound = grad(x.abs(), w.abs(), go.abs())
    assert got.shape == want.shape, ctx
    err = (got.double() - want).abs() - TOL[dtype] * bound
    assert (err <= 1e-6).all(), f"{ctx} worst {float(err.max())}"


@pytest.mark.parametrize("idx", range(10))
@pytest.mark.parametrize("width", [8, 16, 32])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ALL_PASSES)
def test_random_grouped_3x3_layers_on_tensor_cores(which, dtype, width, idx, rng, gen, seed):
    groups = rng.choice([2, 3, 6, 13, 32] if width == 8 else [2, 3, 5, 32])
    stride = (rng.choice([1, 1, 2, 3]), rng.choice([1, 2]))
    dilation = (rng.choice([1, 1, 2]), rng.choice([1, 1, 3]))
    padding = tuple(rng.randint(0, 2 * d) for d in dilation)
    size = tuple(2 * d + 1 + rng.randint(0, 27) for d in dilation)
    batch = rng.choice([1, 2, 3, 5])
    c = width * groups
    layout = rng.choice(["channels_last", "channels_last", "contiguous"])
    w_layout = rng.choice(["channels_last", "contiguous"])
    x = make_tensor((batch, c, *size), dtype, "cuda", layout, gen)
    w = make_tensor((c, width, 3, 3), dtype, "cuda", w_layout, gen)
    oh = (size[0] + 2 * padding[0] - 2 * dilation[0] - 1) // stride[0] + 1
    ow = (size[1] + 2 * padding[1] - 2 * dilation[1] - 1) // stride[1] + 1
    go = make_tensor((batch, c, oh, ow), dtype, "cuda", rng.choice(["channels_last", "contiguous"]), gen)
    args = (list(stride), list(padding), list(dilation), groups)
    ctx = f"seed={seed} x={tuple(x.shape)} groups={groups} args={args} layouts={layout},{w_layout}"
    got, ran = gradient_and_route(which, go, x, w, args)
    if ran is not None:
        takes = kernel_takes(which, width, groups, stride)
        if which == "forward":  # (tiny NCHW forwards go to their own kernel first)
            assert ran == takes or (layout == "contiguous" and not ran), ctx
        else:
            assert ran == (batch * oh * ow * c * width * 9 > TINY_MACS and takes), ctx
    fmt = torch.channels_last if "channels_last" in (layout, w_layout) else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt), ctx
    check(which, got, go, x, w, args, dtype, ctx)


# (C, groups, stride, input size): ResNeXt-50 32x4d's grouped layers with 8,
# 16 and 32 channels a group and RegNetY-400MF's (8 a group), at N=4.
LAYERS = {
    "resnext-8pg-s2": (256, 32, 2, 56),
    "resnext-8pg": (256, 32, 1, 28),
    "resnext-16pg-s2": (512, 32, 2, 28),
    "resnext-16pg": (512, 32, 1, 14),
    "resnext-32pg-s2": (1024, 32, 2, 14),
    "resnext-32pg": (1024, 32, 1, 7),
    "regnet-6g-s2": (48, 6, 2, 112),
    "regnet-13g": (104, 13, 1, 28),
    "regnet-55g-s2": (440, 55, 2, 14),
}


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ALL_PASSES)
def test_resnext_and_regnet_layers(which, dtype, layer, gen, seed):
    c, groups, s, h = LAYERS[layer]
    x = make_tensor((4, c, h, h), dtype, "cuda", "channels_last", gen)
    w = make_tensor((c, c // groups, 3, 3), dtype, "cuda", "channels_last", gen)
    o = (h - 1) // s + 1
    go = make_tensor((4, c, o, o), dtype, "cuda", "channels_last", gen)
    args = ([s, s], [1, 1], [1, 1], groups)
    got, ran = gradient_and_route(which, go, x, w, args)
    assert ran is not (not kernel_takes(which, c // groups, groups, (s, s))), f"seed={seed}"
    assert got.is_contiguous(memory_format=torch.channels_last)
    check(which, got, go, x, w, args, dtype, f"seed={seed} {layer}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_weight_gradient_repeats_bit_for_bit(dtype, gen):
    # Many slices (a long reduction): their planes are added in a fixed order.
    x = make_tensor((16, 512, 28, 28), dtype, "cuda", "channels_last", gen)
    w = make_tensor((512, 16, 3, 3), dtype, "cuda", "channels_last", gen)
    go = make_tensor((16, 512, 28, 28), dtype, "cuda", "channels_last", gen)
    args = ([1, 1], [1, 1], [1, 1], 32)
    first, ran = gradient_and_route("grad_weight", go, x, w, args)
    assert ran is not False
    for _ in range(3):
        assert torch.equal(ops.conv2d_grad_weight(go, x, w, *args), first)


def test_backward_in_a_cuda_graph_on_a_side_stream(gen):
    x = make_tensor((4, 128, 20, 20), torch.float16, "cuda", "channels_last", gen).requires_grad_()
    w = make_tensor((128, 16, 3, 3), torch.float16, "cuda", "channels_last", gen).requires_grad_()
    go = make_tensor((4, 128, 10, 10), torch.float16, "cuda", "channels_last", gen)
    args = ([2, 2], [1, 1], [1, 1], 8)

    def step():
        out = ops.conv2d(x, w, None, *args)
        return torch.autograd.grad(out, (x, w), go)

    got, _graph = capture_and_replay(step, [x.detach(), w.detach()], gen)
    for g, want, which in zip(got, step(), PASSES):
        assert torch.equal(g, want)
        check(which, g, go, x.detach(), w.detach(), args, torch.float16, "graph")


@pytest.mark.parametrize("case", ["groups-of-4", "groups-of-64", "5x5", "float32", "misaligned", "more-outputs"])
@pytest.mark.parametrize("which", ALL_PASSES)
def test_layers_left_to_the_other_routes(which, case, gen):
    # Outside its conditions each pass keeps the other routes and is right:
    # 4 or 64 channels a group, other windows, float32, a view not 16-byte
    # aligned, more output than input channels. (Groups of 4 run on the
    # forward's kernel, two groups a tile.)
    dtype = torch.float32 if case == "float32" else torch.float16
    cg = {"groups-of-4": 4, "groups-of-64": 64}.get(case, 16)
    groups = 32 if case == "groups-of-4" else 4
    ks = 5 if case == "5x5" else 3
    k = 2 * cg * groups if case == "more-outputs" else cg * groups
    x = make_tensor((4, cg * groups, 24, 24), dtype, "cuda", "channels_last", gen)
    go = make_tensor((4, k, 12, 12), dtype, "cuda", "channels_last", gen)
    if case == "misaligned":
        views = []
        for t in (x, go):
            base = torch.empty(t.numel() + 1, dtype=dtype, device="cuda")
            shifted = base[1:].view(t.permute(0, 2, 3, 1).shape).permute(0, 3, 1, 2)
            shifted.copy_(t)
            views.append(shifted)
        x, go = views
    w = make_tensor((k, cg, ks, ks), dtype, "cuda", "channels_last", gen)
    args = ([2, 2], [ks // 2, ks // 2], [1, 1], groups)
    got, ran = gradient_and_route(which, go, x, w, args)
    assert ran is not (which != "forward" or case != "groups-of-4")
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    out = F.conv2d(x64, w64, None, 2, ks // 2, 1, groups)
    if which == "forward":
        want = out.detach()
    else:
        want = torch.autograd.grad(out, x64 if which == "grad_input" else w64, go.double())[0]
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * float(want.abs().max()))


@pytest.mark.parametrize("which", PASSES)
def test_empty_batch(which, gen):
    x = make_tensor((0, 64, 9, 9), torch.float16, "cuda", "channels_last", gen)
    w = make_tensor((64, 8, 3, 3), torch.float16, "cuda", "channels_last", gen)
    go = make_tensor((0, 64, 9, 9), torch.float16, "cuda", "channels_last", gen)
    got = getattr(ops, "conv2d_" + which)(go, x, w, [1, 1], [1, 1], [1, 1], 8)
    assert got.shape == (x if which == "grad_input" else w).shape
    assert not got.any()


ACTIVATIONS = {"identity": lambda t: t, "relu": F.relu, "relu6": F.relu6, "silu": F.silu,
               "hardswish": F.hardswish, "gelu": F.gelu, "sigmoid": torch.sigmoid}


@pytest.mark.parametrize("residual", [False, True], ids=["no-residual", "residual"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_bias_residual_and_activation_in_the_forward(dtype, activation, residual, rng, gen, seed):
    # conv2d_fused on the forward's kernel (groups of 8 and 16; the other
    # routes otherwise): bias, residual and activation applied as
    # the results are stored, against act(conv + bias + residual) in float64.
    width, groups = rng.choice([(8, 32), (8, 13), (16, 6), (32, 4)])
    c = width * groups
    stride = rng.choice([1, 2])
    x = make_tensor((2, c, 15, 13), dtype, "cuda", "channels_last", gen)
    w = make_tensor((c, width, 3, 3), dtype, "cuda", "channels_last", gen)
    b = make_tensor((c,), dtype, "cuda", gen=gen)
    o = (15 - 1) // stride + 1, (13 - 1) // stride + 1
    r = make_tensor((2, c, *o), dtype, "cuda", "channels_last", gen) if residual else None
    args = ([stride, stride], [1, 1], [1, 1], groups)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got = ops.conv2d_fused(x, w, b, *args, activation, r)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert not names or ran_any(KERNELS["forward"], names) == kernel_takes("forward", width, groups, (stride, stride)), \
        f"seed={seed}"
    pre = F.conv2d(x.double(), w.double(), b.double(), stride, 1, 1, groups)
    bound = F.conv2d(x.double().abs(), w.double().abs(), b.double().abs(), stride, 1, 1, groups)
    if r is not None:
        pre, bound = pre + r.double(), bound + r.double().abs()
    want = ACTIVATIONS[activation](pre)
    assert got.is_contiguous(memory_format=torch.channels_last)
    # The activations here change a value by at most 1.5x its input's change (hardswish).
    err = (got.double() - want).abs() - 1.5 * TOL[dtype] * bound - 2.0**-10 * want.abs()
    assert (err <= 1e-6).all(), f"seed={seed} worst {float(err.max())}"


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
def test_forward_with_bias_keeps_the_memory_format(layout, gen):
    x = make_tensor((3, 96, 20, 17), torch.float16, "cuda", layout, gen)
    w = make_tensor((96, 16, 3, 3), torch.float16, "cuda", layout, gen)
    b = make_tensor((96,), torch.float16, "cuda", gen=gen)
    got = ops.conv2d(x, w, b, [1, 2], [1, 1], [2, 1], 6)
    want = F.conv2d(x.double(), w.double(), b.double(), [1, 2], [1, 1], [2, 1], 6)
    bound = F.conv2d(x.double().abs(), w.double().abs(), b.double().abs(), [1, 2], [1, 1], [2, 1], 6)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt)
    assert ((got.double() - want).abs() <= TOL[torch.float16] * bound + 1e-6).all()
