"""conv2d's grouped direct kernels on the CPU (ops/conv2d/grouped_direct_cpu.h):
float32 grouped layers whose output channels per group are 1, 2, 4 or a
multiple of 8, in both layouts, forward and both gradients against F.conv2d
in float64 on random geometries and on ResNeXt's and RegNet's layer shapes;
F.conv2d's memory format; the same forward and weight gradient with one
thread and with two; layers they decline keep the other routes."""

import random

import pytest
import torch
import torch.nn.functional as F

from testlib import ConvConfig, check_conv_case, conv2d_call, make_tensor, ops, per_thread_count


def grouped_config(rng: random.Random, **fixed) -> ConvConfig:
    groups = rng.choice([2, 4, 8, 16])
    kg = rng.choice([1, 2, 4, 8, 16, 24])
    groups = groups if (groups * kg) % 8 == 0 else 8
    cg = rng.choice([2, 3, 4, 8, 16, 20])
    kernel = tuple(rng.choice([1, 3, 3, 5]) for _ in range(2))
    stride = tuple(rng.choice([1, 1, 2]) for _ in range(2))
    dilation = tuple(rng.choice([1, 1, 2]) for _ in range(2))
    padding = tuple(rng.randint(0, (k - 1) * d // 2 + 1) for k, d in zip(kernel, dilation))
    size = tuple((k - 1) * d + 1 + rng.randint(0, 11) for k, d in zip(kernel, dilation))
    values = dict(batch=rng.choice([1, 2, 3]), in_channels=cg * groups, out_channels=kg * groups,
                  groups=groups, kernel=kernel, stride=stride, padding=padding, dilation=dilation,
                  size=size, bias=rng.random() < 0.7,
                  input_layout=rng.choice(["channels_last", "channels_last", "contiguous"]),
                  weight_layout=rng.choice(["contiguous", "channels_last"]),
                  grad_layout="channels_last")
    values.update(fixed)
    return ConvConfig(**values)


@pytest.mark.parametrize("idx", range(24))
def test_grouped_cpu_matches_torch_on_random_configs(idx, rng, gen, seed):
    cfg = grouped_config(rng)
    out = check_conv_case(conv2d_call(cfg), cfg, "cpu", torch.float32, gen, f"seed={seed} {cfg}")
    cl = "channels_last" in (cfg.input_layout, cfg.weight_layout)
    assert out.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)


@pytest.mark.parametrize("idx", range(10))
def test_groups_of_8_input_channels_match_torch(idx, rng, gen, seed):
    # 8 input channels per group (8, 16 or 24 output channels): the kernels
    # with the input channels as the lanes: the forward, the stride-1 input
    # gradient (the forward of grad_output with the rotated weight, whose
    # groups have 8 input channels where the layer has 8 output channels) and,
    # with 8 output channels and 3-wide windows, the weight gradient, which
    # is the same with one thread and with two.
    kg = rng.choice([8, 8, 16, 24])
    kernel = rng.choice([(3, 3), (3, 3), (1, 3), (5, 3), (3, 5)])
    cfg = grouped_config(rng, in_channels=8 * 4, out_channels=kg * 4, groups=4, kernel=kernel,
                         dilation=(1, 1), padding=tuple(rng.randint(0, k // 2 + 1) for k in kernel),
                         size=tuple(k + rng.randint(0, 11) for k in kernel))
    out = check_conv_case(conv2d_call(cfg), cfg, "cpu", torch.float32, gen, f"seed={seed} {cfg}")
    cl = "channels_last" in (cfg.input_layout, cfg.weight_layout)
    assert out.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
    x = make_tensor(cfg.input_shape, torch.float32, "cpu", cfg.input_layout, gen)
    w = make_tensor(cfg.weight_shape, torch.float32, "cpu", cfg.weight_layout, gen)
    go = make_tensor(out.shape, torch.float32, "cpu", "channels_last", gen)
    stride, padding, dilation, groups = cfg.args()
    saved = torch.get_num_threads()
    try:
        grads = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            grads.append(ops.conv2d_grad_weight(go, x, w, stride, padding, dilation, groups))
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(grads[0], grads[1]), cfg


@pytest.mark.parametrize("layer", [(128, 128, 32, 1, 12), (256, 256, 32, 2, 12), (256, 256, 32, 1, 10),
                                   (512, 512, 32, 1, 7), (512, 512, 16, 2, 9), (48, 48, 6, 2, 14),
                                   (104, 104, 13, 1, 9)],
                         ids=["resnext-4pg", "resnext-8pg-s2", "resnext-8pg", "resnext-16pg",
                              "resnext-32pg-s2", "regnet-6g-s2", "regnet-13g"])
def test_grouped_cpu_matches_torch_on_model_layers(layer, gen, seed):
    c, k, groups, s, h = layer
    cfg = ConvConfig(batch=2, in_channels=c, out_channels=k, groups=groups, kernel=(3, 3),
                     stride=(s, s), padding=(1, 1), dilation=(1, 1), size=(h, h), bias=True,
                     input_layout="channels_last", weight_layout="channels_last",
                     grad_layout="channels_last")
    check_conv_case(conv2d_call(cfg), cfg, "cpu", torch.float32, gen, f"seed={seed} {cfg}")


# (channels, groups): 4 output channels a group; 16 and 32, which the AVX-512
# build runs 16 channels a vector.
@pytest.mark.parametrize("layer", [(128, 32), (256, 16), (256, 8)], ids=["4pg", "16pg", "32pg"])
def test_grouped_cpu_forward_and_weight_gradient_do_not_depend_on_the_thread_count(layer, gen):
    c, groups = layer
    x = make_tensor((3, c, 13, 11), torch.float32, "cpu", "channels_last", gen)
    w = make_tensor((c, c // groups, 3, 3), torch.float32, "cpu", "channels_last", gen)
    go = make_tensor((3, c, 13, 11), torch.float32, "cpu", "channels_last", gen)
    args = ([1, 1], [1, 1], [1, 1], groups)
    outs = per_thread_count(lambda: ops.conv2d(x, w, None, *args))
    grads = per_thread_count(lambda: ops.conv2d_grad_weight(go, x, w, *args))
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])
    want = F.conv2d(x.double(), w.double(), None, 1, 1, 1, groups)
    torch.testing.assert_close(outs[0].double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    want_gw = torch.ops.aten.convolution_backward(go.double(), x.double(), w.double(), None, [1, 1], [1, 1],
                                                  [1, 1], False, [0, 0], groups, [False, True, False])[1]
    torch.testing.assert_close(grads[0].double(), want_gw, rtol=1e-5, atol=1e-5 * want_gw.abs().max().item())


@pytest.mark.parametrize("case", ["kg-3", "float64", "k-not-multiple-of-8"])
def test_grouped_cpu_cases_it_declines_keep_the_other_routes(case, rng, gen, seed):
    fixed = {"kg-3": dict(groups=8, out_channels=24, in_channels=16),
             "float64": {},
             "k-not-multiple-of-8": dict(groups=3, out_channels=6, in_channels=9)}[case]
    cfg = grouped_config(rng, **fixed)
    dtype = torch.float64 if case == "float64" else torch.float32
    check_conv_case(conv2d_call(cfg), cfg, "cpu", dtype, gen, f"seed={seed} {case} {cfg}")


def test_grouped_cpu_weight_gradient_does_not_depend_on_the_thread_count(gen):
    x = make_tensor((3, 256, 14, 14), torch.float32, "cpu", "channels_last", gen)
    w = make_tensor((256, 8, 3, 3), torch.float32, "cpu", "channels_last", gen)
    go = make_tensor((3, 256, 7, 7), torch.float32, "cpu", "channels_last", gen)
    args = ([2, 2], [1, 1], [1, 1], 32)
    grads = per_thread_count(lambda: ops.conv2d_grad_weight(go, x, w, *args))
    assert torch.equal(grads[0], grads[1])
    assert grads[0].is_contiguous(memory_format=torch.channels_last)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    want = torch.autograd.grad(F.conv2d(x64, w64, None, 2, 1, 1, 32), w64, go.double())[0]
    torch.testing.assert_close(grads[0].double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
