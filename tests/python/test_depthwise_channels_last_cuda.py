"""depthwise_conv2d's channels_last forward kernel on CUDA
(ops/depthwise/depthwise_channels_last_cuda.cu): square 3x3, 5x5 and 7x7
windows, stride 1 and 2, any padding, channel counts on and off the kernel's
32-channel blocks, planes on and off its output tiles, with
and without bias, every activation of conv2d_fused, float16, bfloat16 and
float32, against F.conv2d in float64; the output is channels_last, written in
place. Calls it declines (channels not a whole number of 16-byte vectors,
dilation, other windows, float64)
keep the other kernels and the same results."""

import random

import pytest
import torch
import torch.nn.functional as F

from testlib import cuda, make_tensor, ops

pytestmark = cuda

DTYPES = [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float32, id="f32")]
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5, torch.float64: 1e-12}
ACTIVATIONS = {
    "identity": lambda t: t, "relu": F.relu, "relu6": F.relu6, "silu": F.silu,
    "hardswish": lambda t: t * (t + 3).clamp(0, 6) / 6, "gelu": F.gelu, "sigmoid": torch.sigmoid}


def reference(x, w, b, stride, padding, activation):
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride, padding, 1, x.shape[1])
    return ACTIVATIONS[activation](y)


def check(got, want, dtype, ctx):
    assert got.is_contiguous(memory_format=torch.channels_last), ctx
    scale = want.abs().max().item()
    torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype] * max(scale, 1.0),
                               msg=lambda m: f"{ctx}\n{m}")


@pytest.mark.parametrize("idx", range(16))
@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_forward_matches_torch_on_random_geometries(dtype, idx, rng, gen, seed):
    k = rng.choice([3, 5, 7])
    stride = rng.choice([1, 2])
    pad = rng.randint(0, k - 1)
    c = rng.choice([8, 24, 32, 40, 96, 144])
    n = rng.choice([1, 2, 3])
    h, w = rng.randint(k, 40), rng.randint(k, 40)
    x = make_tensor((n, c, h, w), dtype, "cuda", "channels_last", gen)
    wt = make_tensor((c, 1, k, k), dtype, "cuda", rng.choice(["contiguous", "channels_last"]), gen)
    b = make_tensor((c,), dtype, "cuda", gen=gen) if rng.random() < 0.7 else None
    out = ops.depthwise_conv2d(x, wt, b, [stride, stride], [pad, pad], [1, 1])
    check(out, reference(x, wt, b, stride, pad, "identity"), dtype,
          f"seed={seed} n={n} c={c} {h}x{w} k={k} s={stride} p={pad} bias={b is not None}")


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_forward_applies_the_fused_activation(dtype, activation, gen):
    # conv2d_fused on a depthwise layer: the activation in the kernel's store.
    c, k = 48, 3
    x = make_tensor((2, c, 23, 37), dtype, "cuda", "channels_last", gen)
    wt = make_tensor((c, 1, k, k), dtype, "cuda", "contiguous", gen)
    b = make_tensor((c,), dtype, "cuda", gen=gen)
    out = ops.conv2d_fused(x, wt, b, [1, 1], [1, 1], [1, 1], c, activation, None)
    check(out, reference(x, wt, b, 1, 1, activation), dtype, activation)


@pytest.mark.parametrize("layer", [(96, 56, 7, 1), (384, 14, 7, 1), (144, 56, 3, 2), (32, 112, 3, 1),
                                   (240, 28, 5, 2), (1152, 7, 5, 1)],
                         ids=["convnext-56", "convnext-14", "mobilenet-s2", "mobilenet-112",
                              "efficientnet-k5-s2", "efficientnet-7"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_forward_on_model_layers(dtype, layer, gen):
    c, h, k, s = layer
    x = make_tensor((4, c, h, h), dtype, "cuda", "channels_last", gen)
    wt = make_tensor((c, 1, k, k), dtype, "cuda", "contiguous", gen)
    b = make_tensor((c,), dtype, "cuda", gen=gen)
    out = ops.depthwise_conv2d(x, wt, b, [s, s], [k // 2, k // 2], [1, 1])
    check(out, reference(x, wt, b, s, k // 2, "identity"), dtype, str(layer))


@pytest.mark.parametrize("case", ["odd-channels", "channels-6", "dilation", "window-1x3", "float64",
                                  "stride-3"])
def test_declined_calls_keep_the_other_kernels(case, gen):
    dtype = torch.float64 if case == "float64" else torch.float16
    c = {"odd-channels": 31, "channels-6": 6}.get(case, 32)
    kh, kw = (1, 3) if case == "window-1x3" else (3, 3)
    dil = 2 if case == "dilation" else 1
    stride = 3 if case == "stride-3" else 1
    x = make_tensor((2, c, 20, 20), dtype, "cuda", "channels_last", gen)
    wt = make_tensor((c, 1, kh, kw), dtype, "cuda", "contiguous", gen)
    out = ops.depthwise_conv2d(x, wt, None, [stride, stride], [1, 1], [dil, dil])
    want = F.conv2d(x.double(), wt.double(), None, stride, 1, dil, c)
    check(out, want, dtype, case)


def test_channels_last_forward_runs_in_a_cuda_graph(gen):
    x = make_tensor((2, 64, 30, 30), torch.float16, "cuda", "channels_last", gen)
    wt = make_tensor((64, 1, 7, 7), torch.float16, "cuda", "contiguous", gen)
    ops.depthwise_conv2d(x, wt, None, [1, 1], [3, 3], [1, 1])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.depthwise_conv2d(x, wt, None, [1, 1], [3, 3], [1, 1])
    x.copy_(make_tensor(x.shape, torch.float16, "cuda", "channels_last", gen))
    graph.replay()
    torch.cuda.synchronize()
    check(out, reference(x, wt, None, 1, 3, "identity"), torch.float16, "graph")
