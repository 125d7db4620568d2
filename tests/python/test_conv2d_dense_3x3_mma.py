"""The weight gradient of ungrouped 3x3 layers on tensor cores
(ops/conv2d/dense_mma.h: dense_mma_conv2d_grad_weight) against F.conv2d's in
float64: 16-bit within the bound of float32 sums of exact products rounded
once, float32 (PyTorch's TF32 policy for convolutions on) within that of
products of operands rounded to TF32. Random strides, paddings, dilations,
plane sizes, batch sizes, channel counts and layouts; ResNet-50's 3x3
layers; the memory format; a result that repeats bit for bit; a CUDA graph;
and the layers left to the other routes (float32 with TF32 off among
them)."""

import pytest
import torch
import torch.nn.functional as F

from testlib import TF32_ROUNDOFF, capture_and_replay, cuda, make_tensor, ops

pytestmark = cuda

DTYPES = [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float32, id="f32-tf32")]
# The rounding of a result, relative to the sum of the products' magnitudes:
# 16-bit (float32 sums of exact products) half an ulp of the dtype, with room
# for the float32 sums; float32 two operands rounded to TF32 and the float32
# sums.
TOL = {torch.float16: 2.0**-9, torch.bfloat16: 2.0**-7, torch.float32: 4 * TF32_ROUNDOFF}


@pytest.fixture(autouse=True)
def tf32_for_float32(request):
    """float32 cases run with PyTorch's TF32 policy for convolutions on (the
    suite's default is off), as the kernel takes float32 only then."""
    params = getattr(request.node, "callspec", None)
    on = params is not None and params.params.get("dtype") == torch.float32
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = on or saved
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved
KERNEL = "dense_mma_grad_weight_kernel"
# Where CUTLASS 3's Hopper weight gradient takes a layer instead (an sm_90
# device, 16-bit, at most 6272 output positions, 128 or more output channels).
SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


# Output positions of a 14x14 plane at N=32: float32 layers take the kernel
# above this, and on sm_90 16-bit layers of 128 or more output channels
# take CUTLASS 3's Hopper kernel up to it.
SMALL_PLANE = 6272


def routed_here(positions, k, dtype):
    """Whether the layer's weight gradient must run on this kernel (where the
    Hopper kernel may take a 16-bit one, either is right)."""
    if dtype == torch.float32:
        return positions > SMALL_PLANE
    return not (SM90 and positions <= SMALL_PLANE and k >= 128)


def grad_weight_and_route(go, x, w, args):
    """conv2d_grad_weight and whether the tensor-core kernel ran (None where
    the profiler saw no kernel: under compute-sanitizer)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got = ops.conv2d_grad_weight(go, x, w, *args)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return got, (any(KERNEL in n for n in names) if names else None)


def check(got, go, x, w, args, dtype, ctx):
    """got against the float64 weight gradient, within TOL of the sum of the
    products' magnitudes (the same gradient of |x| against |go|)."""
    stride, padding, dilation, groups = args

    def grad(x, w, go):
        w = w.double().requires_grad_()
        out = F.conv2d(x.double(), w, None, stride, padding, dilation, groups)
        return torch.autograd.grad(out, w, go.double())[0]

    want = grad(x, w, go)
    bound = grad(x.abs(), w, go.abs())
    assert got.shape == want.shape, ctx
    err = (got.double() - want).abs() - TOL[dtype] * bound
    assert (err <= 1e-6).all(), f"{ctx} worst {float(err.max())}"


def out_size(size, padding, dilation, stride):
    return (size + 2 * padding - 2 * dilation - 1) // stride + 1


@pytest.mark.parametrize("idx", range(16))
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_3x3_layers(dtype, idx, rng, gen, seed):
    c, k = rng.choice([64, 128, 192]), rng.choice([64, 128, 256])
    stride = (rng.choice([1, 1, 2, 3]), rng.choice([1, 2]))
    dilation = (rng.choice([1, 1, 2]), rng.choice([1, 1, 3]))
    padding = tuple(rng.randint(0, 2 * d) for d in dilation)
    size = tuple(2 * d + 1 + rng.randint(0, 40) for d in dilation)
    batch = rng.choice([1, 2, 3, 5, 9, 16])
    oh, ow = (out_size(size[i], padding[i], dilation[i], stride[i]) for i in range(2))
    if dtype == torch.float32:  # enough positions for the kernel to take it
        batch = max(batch, SMALL_PLANE // (oh * ow) + 1)
    layout = rng.choice(["channels_last", "channels_last", "contiguous"])
    w_layout = rng.choice(["channels_last", "contiguous"])
    x = make_tensor((batch, c, *size), dtype, "cuda", layout, gen)
    w = make_tensor((k, c, 3, 3), dtype, "cuda", w_layout, gen)
    go = make_tensor((batch, k, oh, ow), dtype, "cuda", rng.choice(["channels_last", "contiguous"]), gen)
    args = (list(stride), list(padding), list(dilation), 1)
    ctx = f"seed={seed} x={tuple(x.shape)} k={k} args={args} layouts={layout},{w_layout}"
    got, ran = grad_weight_and_route(go, x, w, args)
    assert ran is not False or not routed_here(batch * oh * ow, k, dtype), ctx
    fmt = torch.channels_last if "channels_last" in (layout, w_layout) else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt), ctx
    check(got, go, x, w, args, dtype, ctx)


# (C, K, stride, input size): ResNet-50's 3x3 layers, at N=16.
LAYERS = {"64@56": (64, 64, 1, 56), "128@56-s2": (128, 128, 2, 56), "128@28": (128, 128, 1, 28),
          "256@28-s2": (256, 256, 2, 28), "256@14": (256, 256, 1, 14), "512@14-s2": (512, 512, 2, 14),
          "512@7": (512, 512, 1, 7)}


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_resnet50_layers(dtype, layer, gen, seed):
    c, k, s, h = LAYERS[layer]
    x = make_tensor((16, c, h, h), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c, 3, 3), dtype, "cuda", "channels_last", gen)
    o = (h - 1) // s + 1
    go = make_tensor((16, k, o, o), dtype, "cuda", "channels_last", gen)
    args = ([s, s], [1, 1], [1, 1], 1)
    got, ran = grad_weight_and_route(go, x, w, args)
    assert ran is not False or not routed_here(16 * o * o, k, dtype), f"seed={seed}"
    assert got.is_contiguous(memory_format=torch.channels_last)
    check(got, go, x, w, args, dtype, f"seed={seed} {layer}")


# (plane side, stride, dilation): planes wider than a chunk of positions
# (112), of odd and prime widths (57, 61), several rows a chunk (14, 7 from
# 14 at stride 2), larger strides and dilations, and an odd batch whose
# positions leave the last chunk part empty.
PLANES = [(112, 1, 1), (57, 1, 1), (61, 1, 1), (14, 1, 1), (14, 2, 1), (40, 3, 3), (23, 1, 2)]


@pytest.mark.parametrize("plane", PLANES, ids=lambda p: "x".join(map(str, p)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_plane_widths_and_chunk_rows(dtype, plane, gen, seed):
    size, stride, dilation = plane
    oh = out_size(size, dilation, dilation, stride)
    batch = 3 if dtype != torch.float32 else max(3, SMALL_PLANE // (oh * oh) + 1) | 1
    x = make_tensor((batch, 64, size, size), dtype, "cuda", "channels_last", gen)
    w = make_tensor((64, 64, 3, 3), dtype, "cuda", "channels_last", gen)
    go = make_tensor((batch, 64, oh, oh), dtype, "cuda", "channels_last", gen)
    args = ([stride, stride], [dilation, dilation], [dilation, dilation], 1)
    got, ran = grad_weight_and_route(go, x, w, args)
    assert ran is not False, f"seed={seed}"
    check(got, go, x, w, args, dtype, f"seed={seed} {plane} batch={batch}")


@pytest.mark.parametrize("c, h", [(64, 56), (128, 28)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_weight_gradient_repeats_bit_for_bit(dtype, c, h, gen):
    # Many slices (a long reduction): their planes are added in a fixed order.
    x = make_tensor((16, c, h, h), dtype, "cuda", "channels_last", gen)
    w = make_tensor((c, c, 3, 3), dtype, "cuda", "channels_last", gen)
    go = make_tensor((16, c, h, h), dtype, "cuda", "channels_last", gen)
    args = ([1, 1], [1, 1], [1, 1], 1)
    first, ran = grad_weight_and_route(go, x, w, args)
    assert ran is not False
    for _ in range(3):
        assert torch.equal(ops.conv2d_grad_weight(go, x, w, *args), first)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_backward_in_a_cuda_graph_on_a_side_stream(dtype, gen):
    x = make_tensor((4, 64, 20, 20), dtype, "cuda", "channels_last", gen).requires_grad_()
    w = make_tensor((64, 64, 3, 3), dtype, "cuda", "channels_last", gen).requires_grad_()
    go = make_tensor((4, 64, 10, 10), dtype, "cuda", "channels_last", gen)
    args = ([2, 2], [1, 1], [1, 1], 1)

    def step():
        out = ops.conv2d(x, w, None, *args)
        return (torch.autograd.grad(out, w, go)[0],)

    (got,), _graph = capture_and_replay(step, [x.detach()], gen)
    assert torch.equal(got, step()[0])
    check(got, go, x.detach(), w.detach(), args, dtype, "graph")


@pytest.mark.parametrize("case", ["48-channels", "96-outputs", "groups", "5x5", "float32", "misaligned"])
def test_layers_left_to_the_other_routes(case, gen):
    # Outside its conditions the weight gradient keeps the other routes and
    # is right: channel counts not multiples of 64, groups, other windows,
    # float32 with TF32 off (this suite's default), a view not 16-byte
    # aligned.
    dtype = torch.float32 if case == "float32" else torch.float16
    c = 48 if case == "48-channels" else 128
    k = 96 if case == "96-outputs" else 128
    groups = 2 if case == "groups" else 1
    ks = 5 if case == "5x5" else 3
    x = make_tensor((4, c, 24, 24), dtype, "cuda", "channels_last", gen)
    go = make_tensor((4, k, 12, 12), dtype, "cuda", "channels_last", gen)
    if case == "misaligned":
        views = []
        for t in (x, go):
            base = torch.empty(t.numel() + 1, dtype=dtype, device="cuda")
            shifted = base[1:].view(t.permute(0, 2, 3, 1).shape).permute(0, 3, 1, 2)
            shifted.copy_(t)
            views.append(shifted)
        x, go = views
    w = make_tensor((k, c // groups, ks, ks), dtype, "cuda", "channels_last", gen)
    args = ([2, 2], [ks // 2, ks // 2], [1, 1], groups)
    got, ran = grad_weight_and_route(go, x, w, args)
    assert ran is not True
    w64 = w.double().requires_grad_()
    out = F.conv2d(x.double(), w64, None, 2, ks // 2, 1, groups)
    want = torch.autograd.grad(out, w64, go.double())[0]
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * float(want.abs().max()))


def test_empty_batch(gen):
    x = make_tensor((0, 64, 9, 9), torch.float16, "cuda", "channels_last", gen)
    w = make_tensor((64, 64, 3, 3), torch.float16, "cuda", "channels_last", gen)
    go = make_tensor((0, 64, 9, 9), torch.float16, "cuda", "channels_last", gen)
    got = ops.conv2d_grad_weight(go, x, w, [1, 1], [1, 1], [1, 1], 1)
    assert got.shape == w.shape
    assert not got.any()
