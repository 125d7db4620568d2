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
results."""

import pytest
import torch

from testlib import (ConvConfig, check_conv_case, conv2d_call, cuda, kernels_launched, make_tensor,
                     ops)

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
