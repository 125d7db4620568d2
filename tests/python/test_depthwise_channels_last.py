"""depthwise_conv2d on batched channels_last inputs with channel multiplier
1: on the CPU in float32 its channels_last kernels
(ops/depthwise/depthwise_channels_last_cpu.cpp), on CUDA in every dtype the
NCHW kernels with the layout changed in and out. Forward and the three
gradients against F.conv2d in float64 on random geometries (kernels up to
7x7, stride, dilation, padding, channel counts on and off the vectors) and
on model layers (13x13 windows and planes narrower than the window among
them); the results stay channels_last; the weight gradient is the
same bit for bit over repeated calls and, on the CPU, with one thread and
with two."""

import random

import pytest
import torch
import torch.nn.functional as F

from testlib import check_conv_case, cuda, make_tensor, ops, random_depthwise_config

CASES = [pytest.param("cpu", torch.float32, id="cpu-f32")] + [
    pytest.param("cuda", dt, id=f"cuda-{name}", marks=cuda)
    for dt, name in ((torch.float32, "f32"), (torch.float16, "f16"), (torch.bfloat16, "bf16"),
                     (torch.float64, "f64"))]


def cl_config(rng: random.Random, **fixed):
    values = dict(channels=rng.choice([1, 3, 16, 24, 40, 96]), multiplier=1,
                  kernel=(rng.choice([1, 3, 5, 7]), rng.choice([1, 3, 5, 7])),
                  batch=rng.choice([1, 2, 3]), input_layout="channels_last",
                  weight_layout=rng.choice(["contiguous", "channels_last"]),
                  grad_layout="channels_last")
    values.update(fixed)
    return random_depthwise_config(rng, **values)


def depthwise_of(cfg):
    stride, padding, dilation, _ = cfg.args()
    return lambda input, weight, bias: ops.depthwise_conv2d(input, weight, bias, stride, padding,
                                                            dilation)


@pytest.mark.parametrize("idx", range(20))
@pytest.mark.parametrize("device,dtype", CASES)
def test_channels_last_kernels_match_torch_on_random_configs(device, dtype, idx, rng, gen, seed):
    cfg = cl_config(rng)
    out = check_conv_case(depthwise_of(cfg), cfg, device, dtype, gen, f"seed={seed} {cfg}")
    if out.dim() == 4 and out.numel() > 0:
        assert out.is_contiguous(memory_format=torch.channels_last), cfg


@pytest.mark.parametrize("layer", [(96, 56, 3, 1), (144, 28, 3, 2), (240, 14, 5, 1), (96, 28, 7, 1),
                                   (48, 14, 7, 1), (32, 30, 13, 1), (40, 9, 13, 1)],
                         ids=["mobilenet-k3", "mobilenet-k3-s2", "efficientnet-k5", "convnext-k7",
                              "convnext-k7-small-plane", "replknet-k13", "k13-plane-narrower-than-window"])
@pytest.mark.parametrize("device,dtype", CASES)
def test_channels_last_kernels_match_torch_on_model_layers(device, dtype, layer, gen):
    c, h, k, s = layer
    x = make_tensor((2, c, h, h), dtype, device, "channels_last", gen, True)
    w = make_tensor((c, 1, k, k), dtype, device, "channels_last", gen, True)
    b = make_tensor((c,), dtype, device, gen=gen, requires_grad=True)
    out = ops.depthwise_conv2d(x, w, b, [s, s], [k // 2, k // 2], [1, 1])
    go = make_tensor(out.shape, dtype, device, "channels_last", gen)
    grads = torch.autograd.grad(out, (x, w, b), go)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    want = F.conv2d(x64, w64, b64, s, k // 2, 1, c)
    want_grads = torch.autograd.grad(want, (x64, w64, b64), go.double())
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert grads[0].is_contiguous(memory_format=torch.channels_last)
    tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-4}.get(dtype, 1e-10)
    for got, ref in zip((out,) + grads, (want,) + want_grads):
        scale = ref.abs().max().item()
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("device,dtype", CASES)
def test_channels_last_weight_gradient_is_reproducible(device, dtype, gen):
    x = make_tensor((4, 40, 30, 30), dtype, device, "channels_last", gen)
    w = make_tensor((40, 1, 3, 3), dtype, device, "channels_last", gen)
    go = make_tensor((4, 40, 30, 30), dtype, device, "channels_last", gen)
    saved = torch.get_num_threads()
    try:
        results = []
        for threads in ((1, 2, 1) if device == "cpu" else (saved, saved, saved)):
            torch.set_num_threads(threads)
            results.append(ops.depthwise_conv2d_grad_weight(go, x, w, [1, 1], [1, 1], [1, 1]))
    finally:
        torch.set_num_threads(saved)
    assert all(torch.equal(results[0], r) for r in results[1:])


# (C, H, W, kernel, stride, padding): windows wider than the unrolled ones at
# horizontal stride 1 on the CPU, and windows at column stride 2. Planes narrower than about twice the window
# (31x31 over 28x28) run whole padded rows; wider ones run the positions
# inside the row in chunks of taps and the edges with column checks. Channel
# counts on and off the 16-channel vectors, a vertical stride, padding other
# than half the window.
WIDE = {
    "k31-padded-rows": (32, 28, 28, (31, 31), (1, 1), (15, 15)),
    "k9x31-padded-rows-tail": (40, 20, 24, (9, 31), (1, 1), (4, 15)),
    "k9-chunks-tail": (24, 40, 40, (9, 9), (1, 1), (4, 4)),
    "k15-chunks-stride-2-rows": (48, 30, 30, (15, 15), (2, 1), (7, 7)),
    "k5x21-chunks-odd-padding": (16, 19, 44, (5, 21), (1, 1), (2, 3)),
    "k11-no-padding": (35, 12, 26, (11, 11), (1, 1), (0, 0)),
    # Column stride 2 with 3- and 5-wide windows: blocks of 8 positions that
    # load each window row's 2 * 7 + kw inputs once.
    "k3-column-stride-2-tail": (40, 21, 45, (3, 3), (2, 2), (1, 1)),
    "k5-column-stride-2": (32, 20, 47, (5, 5), (1, 2), (2, 2)),
    "k3x5-column-stride-2-odd-padding": (16, 9, 40, (3, 5), (2, 2), (0, 1)),
}


@pytest.mark.parametrize("activation", ["identity", "silu"])
@pytest.mark.parametrize("layer", list(WIDE))
def test_wide_windows_on_the_cpu_match_torch(layer, activation, gen):
    c, h, w, kernel, stride, padding = WIDE[layer]
    x = make_tensor((2, c, h, w), torch.float32, "cpu", "channels_last", gen, True)
    wt = make_tensor((c, 1) + kernel, torch.float32, "cpu", "channels_last", gen, True)
    b = make_tensor((c,), torch.float32, "cpu", gen=gen, requires_grad=True)
    if activation == "identity":
        out = ops.depthwise_conv2d(x, wt, b, list(stride), list(padding), [1, 1])
    else:
        out = ops.conv2d_fused(x, wt, b, list(stride), list(padding), [1, 1], c, activation)
    go = make_tensor(out.shape, torch.float32, "cpu", "channels_last", gen)
    grads = torch.autograd.grad(out, (x, wt, b), go)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, wt, b))
    want = F.conv2d(x64, w64, b64, stride, padding, 1, c)
    if activation == "silu":
        want = F.silu(want)
    want_grads = torch.autograd.grad(want, (x64, w64, b64), go.double())
    assert out.is_contiguous(memory_format=torch.channels_last)
    for got, ref in zip((out,) + grads, (want,) + want_grads):
        scale = ref.abs().max().item()
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4 * scale)
