"""conv2d's strided pointwise route on CUDA (ops/conv2d/strided_pointwise.h;
engines_cuda.cpp says where it goes): 1x1 windows with a stride above 1 and
no padding, as GEMMs on the gathered positions. Forward and both gradients
against F.conv2d in float64, every dtype (float32 exact: the suite runs with
TF32 off; the GEMM under TF32 is checked through the pointwise forward in
test_conv2d_implicit_gemm.py), the input in every layout (odd planes, a different stride
per axis, views), the results in F.conv2d's memory format; the input gradient
is zero where the window never reads; the weight gradient is reproducible bit
for bit; the CUTLASS strided kernels are not launched where the route takes
the pass, and small or padded layers keep the other routes with the same
results. NCHW forwards take the positions gathered into an NCHW tensor and
per-image GEMMs in place, or in float32 on small results through
channels_last, or else the column route, each where engines_cuda.cpp says."""

import pytest
import torch
import torch.nn.functional as F

from testlib import (ConvConfig, assert_matches, check_conv_case, conv2d_call, conv2d_gradients_and_bounds,
                     cuda, kernels_launched, make_tensor, ops)

pytestmark = cuda

DTYPES = [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float32, id="f32"), pytest.param(torch.float64, id="f64")]

# (batch, C, K, H, W, stride): each above 2^26 multiply-adds. In 16-bit and
# float64 the gradients take the route, and the forward with C >= 1024; in
# float32 the gradients with K >= 1024, and the forward with C >= 512 as well
# (the last two layers keep CUTLASS there; under TF32 on an sm_90 device,
# channels_last float32 forwards go to the Hopper forward instead:
# test_conv2d_hopper_forward.py).
LAYERS = [
    pytest.param((4, 512, 1024, 14, 14, (2, 2)), id="512to1024-14-s2"),
    pytest.param((2, 1024, 1024, 15, 13, (2, 2)), id="1024to1024-15x13-s2"),
    pytest.param((6, 256, 768, 20, 21, (3, 2)), id="256to768-20x21-s3x2"),
    pytest.param((1, 256, 512, 56, 56, (2, 2)), id="256to512-56-s2"),
]


def layer_config(layer, dtype, input_layout, weight_layout, bias=True) -> ConvConfig:
    n, c, k, h, w, stride = layer
    return ConvConfig(batch=n, in_channels=c, out_channels=k, groups=1, kernel=(1, 1),
                      stride=stride, padding=(0, 0), dilation=(1, 1), size=(h, w), bias=bias,
                      input_layout=input_layout, weight_layout=weight_layout,
                      grad_layout=input_layout if input_layout == "channels_last" else "contiguous")


@pytest.mark.parametrize("layout", ["channels_last", "contiguous", "sliced"])
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_pointwise_matches_torch(dtype, layer, layout, gen, seed):
    # A sliced (NCHW-strided) input with a channels_last weight: a channels_last
    # result, so the route takes it, reading the input through its strides.
    weight_layout = "channels_last" if layout == "sliced" else "contiguous"
    cfg = layer_config(layer, dtype, layout, weight_layout)
    out = check_conv_case(conv2d_call(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {dtype} {cfg}")
    cl = "channels_last" in (layout, weight_layout)
    want = torch.channels_last if cl else torch.contiguous_format
    assert out.is_contiguous(memory_format=want), cfg


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_pointwise_gradients_zero_off_the_stride_and_reproducible(dtype, gen):
    n, c, k, h, w = 2, 1024, 1024, 15, 13
    x = make_tensor((n, c, h, w), dtype, "cuda", "channels_last", gen, requires_grad=True)
    wt = make_tensor((k, c, 1, 1), dtype, "cuda", gen=gen, requires_grad=True)
    out = ops.conv2d(x, wt, None, [2, 2], [0, 0], [1, 1], 1)
    g = make_tensor(out.shape, dtype, "cuda", "channels_last", gen)
    gx, gw = torch.autograd.grad(out, (x, wt), g)
    mask = torch.ones(h, w, dtype=torch.bool, device="cuda")
    mask[::2, ::2] = False
    assert gx[:, :, mask].abs().max().item() == 0.0
    assert gx[:, :, ::2, ::2].abs().max().item() > 0.0
    gx2, gw2 = torch.autograd.grad(ops.conv2d(x, wt, None, [2, 2], [0, 0], [1, 1], 1), (x, wt), g)
    assert torch.equal(gw, gw2) and torch.equal(gx, gx2)


@pytest.mark.parametrize("dtype", DTYPES[:3])
def test_strided_pointwise_route_skips_the_cutlass_strided_kernels(dtype, gen):
    x = make_tensor((4, 1024, 14, 14), dtype, "cuda", "channels_last", gen, requires_grad=True)
    w = make_tensor((1024, 1024, 1, 1), dtype, "cuda", gen=gen, requires_grad=True)

    def step():
        out = ops.conv2d(x, w, None, [2, 2], [0, 0], [1, 1], 1)
        torch.autograd.grad(out, (x, w), torch.ones_like(out))

    names = kernels_launched(step)
    assert "StridedDgrad" not in names, names
    assert "ImplicitGemmConvolution" not in names, names


@pytest.mark.parametrize("dtype", DTYPES[:3])
@pytest.mark.parametrize("case", [
    pytest.param(dict(batch=1, in_channels=64, out_channels=128, size=(16, 16), padding=(0, 0)),
                 id="small"),
    pytest.param(dict(batch=4, in_channels=512, out_channels=1024, size=(14, 14), padding=(1, 1)),
                 id="padded"),
])
def test_layers_the_route_declines_match_torch(dtype, case, gen, seed):
    cfg = ConvConfig(groups=1, kernel=(1, 1), stride=(2, 2), dilation=(1, 1), bias=True,
                     input_layout="channels_last", weight_layout="contiguous",
                     grad_layout="channels_last", **case)
    check_conv_case(conv2d_call(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {dtype} {cfg}")


# (images, input channels, output channels, plane, stride): NCHW layers whose
# results have at least 28x28 positions (per-image GEMMs in place on the
# gathered positions, every dtype), 14x14 and 15x15 results (in place in
# float32, the column route in the other dtypes), and results of 7x7 and 5x5
# positions (through channels_last in float32, the column route in the other
# dtypes). Each is above the tiny direct kernel's 2^20 multiply-adds.
NCHW_CASES = [
    ((2, 32, 48, (56, 56), (2, 2)), "in place"),
    ((2, 24, 40, (60, 59), (2, 2)), "in place"),
    ((3, 64, 96, (28, 28), (2, 2)), "in place in float32"),
    ((4, 96, 64, (45, 30), (3, 2)), "in place in float32"),
    ((6, 128, 96, (14, 14), (2, 2)), "through channels_last in float32"),
    ((8, 160, 96, (15, 13), (3, 3)), "through channels_last in float32"),
]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("case", NCHW_CASES, ids=lambda c: "n{}-{}to{}-{}x{}-s{}x{}".format(
    c[0][0], c[0][1], c[0][2], *c[0][3], *c[0][4]))
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_pointwise_nchw_forward_takes_its_route_and_matches_float64(dtype, case, bias, gen):
    (n, c, k, (h, w_), stride), route = case
    x = make_tensor((n, c, h, w_), dtype, "cuda", gen=gen)
    w = make_tensor((k, c, 1, 1), dtype, "cuda", gen=gen)
    b = make_tensor((k,), dtype, "cuda", gen=gen) if bias else None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got = ops.conv2d(x, w, b, list(stride), [0, 0], [1, 1], 1)
        torch.cuda.synchronize()
    names = " ".join(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    ctx = f"{dtype} {case} bias={bias}"
    want = F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride)
    assert got.shape == want.shape and got.is_contiguous() and got.dtype == dtype, ctx
    f32 = dtype == torch.float32
    per_image = route == "in place" or (route == "in place in float32" and f32)
    relaid = route == "through channels_last in float32" and f32
    if names:  # none under compute-sanitizer
        column_route = "im2col" in names or "copy_rows" in names
        assert column_route == (not per_image and not relaid), (ctx, names)
        assert ("batched_transpose" in names) == relaid, (ctx, names)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else b.double().abs(), stride)
    assert_matches(got, want.cpu(), bound.cpu(), dtype, c, "output", ctx, device="cuda")


@pytest.mark.parametrize("layer", [pytest.param((4, 512, 1024, 14, 14, (2, 2)), id="512to1024-14-s2"),
                                   pytest.param((6, 512, 1024, 15, 13, (3, 2)), id="512to1024-15x13-s3x2")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_pointwise_nchw_gradients_go_through_channels_last(dtype, layer, gen):
    # NCHW gradients of the layers the route takes: grad_output changes
    # layout (by the transpose kernel, which moves 2- and 4-byte elements),
    # the channels_last route runs, the input gradient changes back; neither
    # CUTLASS kernel runs. Against float64, zero off the stride.
    n, c, k, h, w_, stride = layer
    x = make_tensor((n, c, h, w_), dtype, "cuda", gen=gen)
    w = make_tensor((k, c, 1, 1), dtype, "cuda", gen=gen)
    oh, ow = (h - 1) // stride[0] + 1, (w_ - 1) // stride[1] + 1
    go = make_tensor((n, k, oh, ow), dtype, "cuda", gen=gen)
    args = (list(stride), [0, 0], [1, 1], 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        gi = ops.conv2d_grad_input(go, x, w, *args)
        gw = ops.conv2d_grad_weight(go, x, w, *args)
        torch.cuda.synchronize()
    names = " ".join(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    ctx = f"{dtype} {layer}"
    assert gi.shape == x.shape and gi.is_contiguous() and gw.shape == w.shape and gw.is_contiguous(), ctx
    if names:  # none under compute-sanitizer
        assert ("batched_transpose" in names) == (dtype != torch.float64), (ctx, names)
        assert "StridedDgrad" not in names and "ImplicitGemmConvolution" not in names, (ctx, names)
    want, bound = conv2d_gradients_and_bounds(go, x, w, stride)
    for got, want_, bound_, reduction, what in ((gi, want[0], bound[0], k, "grad_input"),
                                                (gw, want[1], bound[1], n * oh * ow, "grad_weight")):
        assert_matches(got, want_.cpu(), bound_.cpu(), dtype, reduction, what, ctx, device="cuda")
    mask = torch.ones(h, w_, dtype=torch.bool, device="cuda")
    mask[::stride[0], ::stride[1]] = False
    assert gi[:, :, mask].abs().max().item() == 0.0, ctx
