"""depthwise_conv2d's channels_last kernels on CUDA
(ops/depthwise/depthwise_channels_last_cuda.cu, depthwise_channels_last_grad_cuda.cu
and, for float32 3x3 forwards at stride 2, depthwise_channels_last_rows_cuda.cu): square 3x3, 5x5 and 7x7 windows,
stride 1 and 2, any padding, channel counts on and off the kernels'
32-channel blocks, planes on and off their tiles, with and without bias,
every activation of conv2d_fused, float16, bfloat16 and float32, against
F.conv2d in float64; the output and the input gradient are channels_last,
written in place, with no layout change (no copy kernel runs). Calls they
decline (channels not a whole number of 16-byte vectors, dilation, other
windows, float64) keep the other kernels and the same results."""

import random

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from testlib import capture_and_replay, cuda, make_tensor, ops

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


def random_layer(dtype, rng, gen, seed):
    """A channels_last layer the kernels take or decline, drawn from rng:
    (x, weight, bias or None, stride, padding, description)."""
    k = rng.choice([3, 5, 7])
    stride = rng.choice([1, 2])
    pad = rng.randint(0, k - 1)
    c = rng.choice([8, 24, 32, 40, 96, 144])
    n = rng.choice([1, 2, 3])
    h, w = rng.randint(k, 40), rng.randint(k, 40)
    x = make_tensor((n, c, h, w), dtype, "cuda", "channels_last", gen)
    wt = make_tensor((c, 1, k, k), dtype, "cuda", rng.choice(["contiguous", "channels_last"]), gen)
    b = make_tensor((c,), dtype, "cuda", gen=gen) if rng.random() < 0.7 else None
    ctx = f"seed={seed} n={n} c={c} {h}x{w} k={k} s={stride} p={pad} bias={b is not None}"
    return x, wt, b, stride, pad, ctx


@pytest.mark.parametrize("idx", range(16))
@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_forward_matches_torch_on_random_geometries(dtype, idx, rng, gen, seed):
    x, wt, b, stride, pad, ctx = random_layer(dtype, rng, gen, seed)
    out = ops.depthwise_conv2d(x, wt, b, [stride, stride], [pad, pad], [1, 1])
    check(out, reference(x, wt, b, stride, pad, "identity"), dtype, ctx)


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


def model_layer(layer, dtype, gen):
    """(x, weight, bias) of a model's layer (channels, plane side, window, stride) at N=4."""
    c, h, k, _ = layer
    x = make_tensor((4, c, h, h), dtype, "cuda", "channels_last", gen)
    wt = make_tensor((c, 1, k, k), dtype, "cuda", "contiguous", gen)
    return x, wt, make_tensor((c,), dtype, "cuda", gen=gen)


@pytest.mark.parametrize("layer", [(96, 56, 7, 1), (384, 14, 7, 1), (144, 56, 3, 2), (32, 112, 3, 1),
                                   (240, 28, 5, 2), (1152, 7, 5, 1)],
                         ids=["convnext-56", "convnext-14", "mobilenet-s2", "mobilenet-112",
                              "efficientnet-k5-s2", "efficientnet-7"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_forward_on_model_layers(dtype, layer, gen):
    x, wt, b = model_layer(layer, dtype, gen)
    k, s = layer[2], layer[3]
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
    (out,), _graph = capture_and_replay(
        lambda: (ops.depthwise_conv2d(x, wt, None, [1, 1], [3, 3], [1, 1]),), [x], gen)
    check(out, reference(x, wt, None, 1, 3, "identity"), torch.float16, "graph")


def gradients(x, wt, b, stride, pad, go, fn):
    """(grad_input, grad_weight, grad_bias or None) of fn(x, wt, b) under go."""
    x, wt = x.detach().requires_grad_(), wt.detach().requires_grad_()
    b = None if b is None else b.detach().requires_grad_()
    out = fn(x, wt, b, stride, pad)
    return torch.autograd.grad(out, [t for t in (x, wt, b) if t is not None], go)


def ours(x, wt, b, stride, pad):
    return ops.depthwise_conv2d(x, wt, b, [stride, stride], [pad, pad], [1, 1])


def theirs64(x, wt, b, stride, pad):
    return F.conv2d(x.double(), wt.double(), None if b is None else b.double(), stride, pad, 1,
                    x.shape[1])


def check_gradients(x, wt, b, stride, pad, dtype, gen, ctx):
    oh = (x.shape[2] + 2 * pad - wt.shape[2]) // stride + 1
    ow = (x.shape[3] + 2 * pad - wt.shape[3]) // stride + 1
    go = make_tensor((x.shape[0], wt.shape[0], oh, ow), dtype, "cuda", "channels_last", gen)
    got = gradients(x, wt, b, stride, pad, go, ours)
    want = gradients(x.double(), wt.double(), None if b is None else b.double(), stride, pad,
                     go.double(), theirs64)
    check(got[0], want[0], dtype, f"{ctx} grad_input")
    for name, g, w in zip(("grad_weight", "grad_bias"), got[1:], want[1:]):
        scale = w.abs().max().item()
        torch.testing.assert_close(g.double(), w, rtol=TOL[dtype], atol=TOL[dtype] * max(scale, 1.0),
                                   msg=lambda m, name=name: f"{ctx} {name}\n{m}")


@pytest.mark.parametrize("idx", range(16))
@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_gradients_match_torch_on_random_geometries(dtype, idx, rng, gen, seed):
    x, wt, b, stride, pad, ctx = random_layer(dtype, rng, gen, seed)
    check_gradients(x, wt, b, stride, pad, dtype, gen, ctx)


# Output widths that take each of the forward's tile shapes (rows of 1, 2 and
# 4 runs of 7), widths off them, and the weight gradient's 8-wide segments
# full, partial and single.
@pytest.mark.parametrize("width", [1, 7, 8, 9, 14, 15, 28, 33, 56])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("k", [3, 7])
@pytest.mark.parametrize("dtype", [DTYPES[0], DTYPES[2]])
def test_channels_last_forward_and_gradients_on_every_tile_width(dtype, k, stride, width, gen):
    pad = k // 2
    w_in = (width - 1) * stride + k - 2 * pad
    if w_in < 1:
        pytest.skip("no input this narrow gives that width")
    x = make_tensor((2, 40, 9, w_in), dtype, "cuda", "channels_last", gen)
    wt = make_tensor((40, 1, k, k), dtype, "cuda", gen=gen)
    b = make_tensor((40,), dtype, "cuda", gen=gen)
    ctx = f"k={k} s={stride} out width={width}"
    out = ops.depthwise_conv2d(x, wt, b, [stride, stride], [pad, pad], [1, 1])
    assert out.shape[3] == width, ctx
    check(out, reference(x, wt, b, stride, pad, "identity"), dtype, ctx)
    check_gradients(x, wt, b, stride, pad, dtype, gen, ctx)


@pytest.mark.parametrize("layer", [(32, 112, 3, 1), (96, 112, 3, 2), (144, 56, 3, 2), (960, 7, 3, 1),
                                   (240, 28, 5, 2), (1152, 7, 5, 1), (96, 56, 7, 1)],
                         ids=["mobilenet-112", "mobilenet-s2-112", "mobilenet-s2", "mobilenet-7",
                              "efficientnet-k5-s2", "efficientnet-7", "convnext-56"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_gradients_on_model_layers(dtype, layer, gen):
    x, wt, b = model_layer(layer, dtype, gen)
    k, s = layer[2], layer[3]
    check_gradients(x, wt, b, s, k // 2, dtype, gen, str(layer))


def kernels_run(fn):
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in p.key_averages() if e.device_time_total > 0]


@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_backward_changes_no_layout(dtype, stride, k, gen):
    # The backward of a channels_last layer runs the channels_last kernels
    # alone: no copy to NCHW and back.
    x = make_tensor((2, 64, 20, 20), dtype, "cuda", "channels_last", gen, requires_grad=True)
    wt = make_tensor((64, 1, k, k), dtype, "cuda", "contiguous", gen, requires_grad=True)
    b = make_tensor((64,), dtype, "cuda", gen=gen, requires_grad=True)
    out = ops.depthwise_conv2d(x, wt, b, [stride, stride], [k // 2, k // 2], [1, 1])
    go = make_tensor(out.shape, dtype, "cuda", "channels_last", gen)
    names = kernels_run(lambda: out.backward(go))
    assert x.grad.is_contiguous(memory_format=torch.channels_last)
    assert not any("copy" in n.lower() for n in names), names
    want = "depthwise_channels_last_kernel" if stride == 1 else "grad_input_stride2_kernel"
    assert any(want in n for n in names), names
    assert any("grad_weight_partial_kernel" in n for n in names), names


@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_weight_gradient_is_bitwise_reproducible(dtype, gen):
    x = make_tensor((8, 96, 56, 56), dtype, "cuda", "channels_last", gen)
    wt = make_tensor((96, 1, 3, 3), dtype, "cuda", "contiguous", gen)
    go = make_tensor((8, 96, 28, 28), dtype, "cuda", "channels_last", gen)
    first = ops.depthwise_conv2d_grad_weight_bias(go, x, wt, [2, 2], [1, 1], [1, 1])
    for _ in range(3):
        again = ops.depthwise_conv2d_grad_weight_bias(go, x, wt, [2, 2], [1, 1], [1, 1])
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_channels_last_backward_runs_in_a_cuda_graph(gen):
    dtype = torch.float16
    x = make_tensor((2, 64, 30, 30), dtype, "cuda", "channels_last", gen)
    wt = make_tensor((64, 1, 3, 3), dtype, "cuda", "contiguous", gen)
    go = make_tensor((2, 64, 15, 15), dtype, "cuda", "channels_last", gen)
    args = ([2, 2], [1, 1], [1, 1])
    (gi, (gw, gb)), _graph = capture_and_replay(
        lambda: (ops.depthwise_conv2d_grad_input(go, x, wt, *args),
                 ops.depthwise_conv2d_grad_weight_bias(go, x, wt, *args)), [go, x], gen)
    want = gradients(x.double(), wt.double(), torch.zeros(64, device="cuda", dtype=torch.float64), 2,
                     1, go.double(), theirs64)
    check(gi, want[0], dtype, "graph grad_input")
    torch.testing.assert_close(gw.double(), want[1], rtol=4e-3, atol=4e-3 * want[1].abs().max().item())
    torch.testing.assert_close(gb.double(), want[2], rtol=4e-3, atol=4e-3 * want[2].abs().max().item())


# The float32 3x3 stride-2 forward's kernel by output rows
# (depthwise_channels_last_rows_cuda.cu): 8, 4 or 2 rows a thread by the
# call's size (on a 132-multiprocessor GPU: 8 for 96 channels at 112x112 and
# N=32, 4 for 144 at 56x56, 2 for the rest), strips cut short by the plane's
# last rows, every padding.
ROWS_KERNEL = "depthwise_rows_kernel"


@pytest.mark.parametrize("shape", [(1, 4, 1, 1), (2, 8, 2, 3), (3, 12, 17, 9), (2, 44, 40, 3),
                                   (1, 64, 33, 70), (32, 96, 112, 112), (32, 144, 56, 56),
                                   (2, 1152, 14, 14), (5, 24, 31, 31)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("pad", [0, 1, 2])
def test_float32_stride2_3x3_forward_runs_by_rows_and_matches(shape, pad, gen):
    n, c, h, w = shape
    if h + 2 * pad < 3 or w + 2 * pad < 3:
        pytest.skip("no output")
    x = make_tensor(shape, torch.float32, "cuda", "channels_last", gen)
    wt = make_tensor((c, 1, 3, 3), torch.float32, "cuda", "contiguous", gen)
    b = make_tensor((c,), torch.float32, "cuda", gen=gen)
    names = kernels_run(lambda: ops.depthwise_conv2d(x, wt, b, [2, 2], [pad, pad], [1, 1]))
    assert any(ROWS_KERNEL in n for n in names), names
    out = ops.depthwise_conv2d(x, wt, b, [2, 2], [pad, pad], [1, 1])
    check(out, reference(x, wt, b, 2, pad, "identity"), torch.float32, f"{shape} p={pad}")


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_float32_stride2_3x3_forward_by_rows_applies_the_fused_activation(activation, gen):
    c = 40
    x = make_tensor((3, c, 29, 21), torch.float32, "cuda", "channels_last", gen)
    wt = make_tensor((c, 1, 3, 3), torch.float32, "cuda", "contiguous", gen)
    b = make_tensor((c,), torch.float32, "cuda", gen=gen)
    run = lambda: ops.conv2d_fused(x, wt, b, [2, 2], [1, 1], [1, 1], c, activation, None)
    assert any(ROWS_KERNEL in n for n in kernels_run(run))
    check(run(), reference(x, wt, b, 2, 1, activation), torch.float32, activation)


@pytest.mark.parametrize("case", ["weight-offset", "bias-offset", "float16", "stride-1", "window-5"])
def test_float32_stride2_3x3_forward_by_rows_declines_to_the_tiled_kernel(case, gen):
    # A weight or bias off 16 bytes, other dtypes, strides and windows: the
    # tiled kernel, the same results.
    dtype = torch.float16 if case == "float16" else torch.float32
    c, k = 32, 5 if case == "window-5" else 3
    stride = 1 if case == "stride-1" else 2
    x = make_tensor((2, c, 20, 20), dtype, "cuda", "channels_last", gen)
    wt = make_tensor((c * k * k + 1,), dtype, "cuda", gen=gen)
    wt = wt[1:] if case == "weight-offset" else wt[:-1]
    wt = wt.view(c, 1, k, k)
    b = make_tensor((c + 1,), dtype, "cuda", gen=gen)
    b = b[1:] if case == "bias-offset" else b[:-1]
    run = lambda: ops.depthwise_conv2d(x, wt, b, [stride, stride], [1, 1], [1, 1])
    names = kernels_run(run)
    assert not any(ROWS_KERNEL in n for n in names), names
    assert any("depthwise_channels_last_kernel" in n for n in names), names
    check(run(), reference(x, wt, b, stride, 1, "identity"), dtype, case)


def test_float32_stride2_3x3_forward_by_rows_runs_in_a_cuda_graph(gen):
    x = make_tensor((4, 96, 56, 56), torch.float32, "cuda", "channels_last", gen)
    wt = make_tensor((96, 1, 3, 3), torch.float32, "cuda", "contiguous", gen)
    (out,), _graph = capture_and_replay(
        lambda: (ops.depthwise_conv2d(x, wt, None, [2, 2], [1, 1], [1, 1]),), [x], gen)
    check(out, reference(x, wt, None, 2, 1, "identity"), torch.float32, "graph")
