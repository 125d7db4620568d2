"""conv2d_grad_input of strided layers as one stride-1 forward per stride
phase of the input (conv2d.cpp, grad_input_by_phases; on the CPU for
float32 channels_last 3x3 stride-2 layers of 64 or more channels with at
least 9 C output positions, engines_cpu.cpp): against the float64 input
gradient on random paddings, plane sizes (odd and even, so that phases get
different numbers of rows), channel counts and layouts of the weight and
grad_output; the route seen in the profiler (the sub-weights' index_select);
and the layers left to the other routes."""

import pytest
import torch
import torch.nn.functional as F

from testlib import make_tensor, ops


def grad_input_and_route(go, x, w, stride, padding):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = ops.conv2d_grad_input(go, x, w, list(stride), list(padding), [1, 1], 1)
    return got, any(e.name == "aten::index_select" for e in prof.events())


def check(got, go, x, w, stride, padding, ctx):
    x64 = x.double().requires_grad_()
    want = torch.autograd.grad(F.conv2d(x64, w.double(), None, stride, padding), x64, go.double())[0]
    bound = torch.autograd.grad(F.conv2d(x64, w.double().abs(), None, stride, padding), x64, go.double().abs())[0]
    assert got.shape == want.shape and got.dtype == x.dtype, ctx
    err = (got.double() - want).abs() - 2.0**-20 * bound
    assert (err <= 1e-9).all(), (ctx, float(err.max()))


@pytest.mark.parametrize("idx", range(12))
def test_random_strided_3x3_layers_by_phases(idx, rng, gen, seed):
    c, k = rng.choice([64, 72, 128]), rng.choice([64, 96, 128])
    padding = (rng.randint(0, 2), rng.randint(0, 2))
    size = (rng.randint(24, 41), rng.randint(24, 41))
    n = rng.randint(4, 6)
    x = make_tensor((n, c, *size), torch.float32, "cpu", "channels_last", gen)
    w = make_tensor((k, c, 3, 3), torch.float32, "cpu", rng.choice(["contiguous", "channels_last"]), gen)
    oh, ow = ((size[a] + 2 * padding[a] - 3) // 2 + 1 for a in (0, 1))
    go = make_tensor((n, k, oh, ow), torch.float32, "cpu", rng.choice(["contiguous", "channels_last"]), gen)
    ctx = f"seed={seed} x={tuple(x.shape)} k={k} padding={padding}"
    got, by_phases = grad_input_and_route(go, x, w, (2, 2), padding)
    assert by_phases == (n * oh * ow >= 9 * c), ctx
    assert got.is_contiguous(memory_format=torch.channels_last), ctx
    check(got, go, x, w, (2, 2), padding, ctx)


@pytest.mark.parametrize("case", ["nchw", "float64", "few-positions", "stride-3", "5x5", "32-channels"])
def test_layers_left_to_the_other_routes(case, gen):
    dtype = torch.float64 if case == "float64" else torch.float32
    c = 32 if case == "32-channels" else 64
    n, size = (1, 12) if case == "few-positions" else (4, 30)
    ks = 5 if case == "5x5" else 3
    stride = 3 if case == "stride-3" else 2
    x = make_tensor((n, c, size, size), dtype, "cpu", "contiguous" if case == "nchw" else "channels_last", gen)
    w = make_tensor((64, c, ks, ks), dtype, "cpu", gen=gen)
    o = (size + 2 - ks) // stride + 1
    go = make_tensor((n, 64, o, o), dtype, "cpu", gen=gen)
    got, by_phases = grad_input_and_route(go, x, w, (stride, stride), (1, 1))
    assert not by_phases, case
    x64 = x.double().requires_grad_()
    want = torch.autograd.grad(F.conv2d(x64, w.double(), None, stride, 1), x64, go.double())[0]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_resnet50_strided_layer_by_phases(gen):
    # ResNet-50's 128-channel 3x3 stride-2 layer at N=2 (3136 rows of 56x56 / 2 per image).
    x = make_tensor((2, 128, 56, 56), torch.float32, "cpu", "channels_last", gen)
    w = make_tensor((128, 128, 3, 3), torch.float32, "cpu", "channels_last", gen)
    go = make_tensor((2, 128, 28, 28), torch.float32, "cpu", "channels_last", gen)
    got, by_phases = grad_input_and_route(go, x, w, (2, 2), (1, 1))
    assert by_phases
    check(got, go, x, w, (2, 2), (1, 1), "resnet50 128 s2")
