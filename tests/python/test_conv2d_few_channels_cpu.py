"""conv2d's direct CPU forward over few input channels
(ops/conv2d/few_channels_direct_cpu.h): float32 layers with 1 to 15 input
channels and groups 1, any window, read in place in any input layout, against
F.conv2d in float64 on random geometries (odd sizes, padding wider than the
window, stride, dilation, bias or none, output channels that fill no whole
vector) and on the ResNet stem's shape; F.conv2d's memory format; the same
result with one thread and with two; layers it declines keep the other
routes. The backward passes are the other routes' (checked here too)."""

import random

import pytest
import torch
import torch.nn.functional as F

from testlib import (ConvConfig, check_conv_case, check_cpu_float32_case, conv2d_call, make_tensor, ops,
                     random_direct_cpu_config)


def few_channels_config(rng: random.Random, **fixed) -> ConvConfig:
    kernel = (rng.randint(1, 7), rng.randint(1, 7))
    stride = (rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2, 3]))
    dilation = (rng.choice([1, 1, 2]), rng.choice([1, 1, 2]))
    padding = tuple(rng.randint(0, (k - 1) * d + 2) for k, d in zip(kernel, dilation))
    size = tuple(max(1, (k - 1) * d + 1 - 2 * p) + rng.randint(0, 13)
                 for k, d, p in zip(kernel, dilation, padding))
    window = dict(kernel=kernel, stride=stride, dilation=dilation, padding=padding, size=size,
                  in_channels=rng.randint(1, 15), out_channels=rng.choice([1, 5, 8, 16, 17, 24, 40, 64, 70, 130]))
    return random_direct_cpu_config(rng, window, **fixed)


@pytest.mark.parametrize("idx", range(40))
def test_few_channels_cpu_matches_torch_on_random_configs(idx, rng, gen, seed):
    cfg = few_channels_config(rng)
    check_cpu_float32_case(cfg, gen, f"seed={seed} {cfg}")


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("batch", [1, 3])
def test_few_channels_cpu_matches_torch_on_the_resnet_stem(layout, bias, batch, gen, seed):
    # ResNet's 7x7 stride-2 stem on a smaller, odd-sized image.
    cfg = ConvConfig(batch=batch, in_channels=3, out_channels=64, groups=1, kernel=(7, 7),
                     stride=(2, 2), padding=(3, 3), dilation=(1, 1), size=(45, 38), bias=bias,
                     input_layout=layout, weight_layout=layout, grad_layout=layout)
    out = check_conv_case(conv2d_call(cfg), cfg, "cpu", torch.float32, gen, f"seed={seed} {cfg}")
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    assert out.is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("case", ["nchw-in-channels-last-weight", "channels-last-in-nchw-weight"])
def test_few_channels_cpu_follows_torch_memory_format(case, gen):
    x_layout, w_layout = {"nchw-in-channels-last-weight": ("contiguous", "channels_last"),
                          "channels-last-in-nchw-weight": ("channels_last", "contiguous")}[case]
    x = make_tensor((2, 3, 33, 35), torch.float32, "cpu", x_layout, gen)
    w = make_tensor((24, 3, 3, 3), torch.float32, "cpu", w_layout, gen)
    b = make_tensor((24,), torch.float32, "cpu", "contiguous", gen)
    got = ops.conv2d(x, w, b, [2, 1], [1, 1], [1, 1], 1)
    want = F.conv2d(x.double(), w.double(), b.double(), (2, 1), 1)
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_few_channels_cpu_forward_does_not_depend_on_the_thread_count(batch, layout, gen):
    x = make_tensor((batch, 3, 61, 59), torch.float32, "cpu", layout, gen)
    w = make_tensor((40, 3, 7, 7), torch.float32, "cpu", layout, gen)
    b = make_tensor((40,), torch.float32, "cpu", "contiguous", gen)
    saved = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(ops.conv2d(x, w, b, [2, 2], [3, 3], [1, 1], 1))
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(outs[0], outs[1])
    want = F.conv2d(x.double(), w.double(), b.double(), 2, 3)
    torch.testing.assert_close(outs[0].double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_few_channels_cpu_positions_whose_windows_lie_in_the_padding_get_the_bias(gen):
    # Padding wider than the window: the outer output rows and columns see no input.
    x = make_tensor((2, 2, 5, 4), torch.float32, "cpu", "channels_last", gen)
    w = make_tensor((20, 2, 2, 3), torch.float32, "cpu", "contiguous", gen)
    b = make_tensor((20,), torch.float32, "cpu", "contiguous", gen)
    got = ops.conv2d(x, w, b, [1, 1], [4, 5], [1, 1], 1)
    want = F.conv2d(x.double(), w.double(), b.double(), 1, (4, 5))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    torch.testing.assert_close(got[:, :, 0, 0].double(), b.double().expand(2, 20), rtol=0, atol=0)


@pytest.mark.parametrize("case", ["16-channels", "float64", "bfloat16", "grouped", "unbatched"])
def test_few_channels_cpu_cases_it_declines_keep_the_other_routes(case, rng, gen, seed):
    fixed = {"16-channels": dict(in_channels=16), "float64": {}, "bfloat16": {},
             "grouped": dict(in_channels=6, out_channels=8, groups=2),
             "unbatched": dict(batch=None)}[case]
    cfg = few_channels_config(rng, **fixed)
    dtype = {"float64": torch.float64, "bfloat16": torch.bfloat16}.get(case, torch.float32)
    check_conv_case(conv2d_call(cfg), cfg, "cpu", dtype, gen, f"seed={seed} {case} {cfg}")


def test_few_channels_cpu_empty_batch(rng, gen, seed):
    cfg = few_channels_config(rng, batch=0)
    out = check_conv_case(conv2d_call(cfg), cfg, "cpu", torch.float32, gen, f"seed={seed} {cfg}")
    assert out.shape == cfg.output_shape
