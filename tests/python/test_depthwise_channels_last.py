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
