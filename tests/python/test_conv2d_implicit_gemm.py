"""conv2d's implicit-GEMM forward on CUDA (ops/conv2d/implicit_gemm.h):
channels_last float16 and bfloat16 inputs with channel counts that are
multiples of 8 and groups 1, against F.conv2d in float64 on random
geometries (kernel, stride, padding, dilation, bias), with the gradients of
the backward ops alongside; the output is channels_last, as F.conv2d gives;
inputs the engine declines (NCHW, channels not a multiple of 8, groups) keep
the other route and the same results."""

import random

import pytest
import torch

from testlib import ConvConfig, check_conv_case, cuda, make_tensor, ops

pytestmark = cuda

DTYPES = [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16")]


def engine_config(rng: random.Random, **fixed) -> ConvConfig:
    """A random configuration the engine takes: channels_last input, C and K
    multiples of 8 (8 to 96), groups 1; windows 1x1 to 7x7 with stride,
    padding and dilation per axis."""
    kernel = tuple(rng.choice([1, 3, 3, 5, 7]) for _ in range(2))
    if rng.random() < 0.5:
        kernel = (kernel[0], kernel[0])
    stride = tuple(rng.choice([1, 1, 2, 3]) for _ in range(2))
    dilation = tuple(rng.choice([1, 1, 2]) for _ in range(2))
    padding = tuple(rng.randint(0, (k - 1) * d // 2 + 1) for k, d in zip(kernel, dilation))
    size = tuple((k - 1) * d + 1 + rng.randint(0, 20) for k, d in zip(kernel, dilation))
    values = dict(batch=rng.choice([1, 2, 3]), in_channels=8 * rng.randint(1, 12),
                  out_channels=8 * rng.randint(1, 12), groups=1, kernel=kernel, stride=stride,
                  padding=padding, dilation=dilation, size=size, bias=rng.random() < 0.7,
                  input_layout="channels_last", weight_layout=rng.choice(["contiguous", "channels_last"]),
                  grad_layout="channels_last")
    values.update(fixed)
    return ConvConfig(**values)


def conv2d_of(cfg):
    stride, padding, dilation, groups = cfg.args()
    return lambda input, weight, bias: ops.conv2d(input, weight, bias, stride, padding, dilation,
                                                  groups)


@pytest.mark.parametrize("idx", range(24))
@pytest.mark.parametrize("dtype", DTYPES)
def test_implicit_gemm_matches_torch_on_random_channels_last_configs(dtype, idx, rng, gen, seed):
    cfg = engine_config(rng)
    out = check_conv_case(conv2d_of(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {dtype} {cfg}")
    assert out.is_contiguous(memory_format=torch.channels_last), cfg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", [
    # ResNet-50 shapes at a small batch: 3x3 stride 1 and 2, 1x1 in and out of the bottleneck.
    dict(in_channels=64, out_channels=64, kernel=(3, 3), stride=(1, 1), padding=(1, 1), size=(56, 56)),
    dict(in_channels=128, out_channels=128, kernel=(3, 3), stride=(2, 2), padding=(1, 1), size=(56, 56)),
    dict(in_channels=256, out_channels=64, kernel=(1, 1), stride=(1, 1), padding=(0, 0), size=(56, 56)),
    dict(in_channels=512, out_channels=2048, kernel=(1, 1), stride=(1, 1), padding=(0, 0), size=(7, 7)),
    dict(in_channels=256, out_channels=256, kernel=(3, 3), stride=(1, 1), padding=(1, 1), size=(14, 14)),
], ids=["64-56-3x3", "128-56-3x3-s2", "256to64-1x1", "512to2048-7", "256-14-3x3"])
def test_implicit_gemm_matches_torch_on_resnet_layers(dtype, layer, gen, seed):
    cfg = ConvConfig(batch=2, groups=1, dilation=(1, 1), bias=True, input_layout="channels_last",
                     weight_layout="channels_last", grad_layout="channels_last", **layer)
    out = check_conv_case(conv2d_of(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {dtype} {cfg}",
                          need=())
    assert out.is_contiguous(memory_format=torch.channels_last), cfg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["nchw", "channels-12", "groups-2", "empty-batch"])
def test_cases_the_engine_declines_keep_the_other_route(dtype, case, rng, gen, seed):
    fixed = {"nchw": dict(input_layout="contiguous"),
             "channels-12": dict(in_channels=12),
             "groups-2": dict(groups=2, in_channels=16, out_channels=16),
             "empty-batch": dict(batch=0)}[case]
    cfg = engine_config(rng, **fixed)
    out = check_conv_case(conv2d_of(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {case} {cfg}")
    if case == "nchw":
        assert out.is_contiguous(), cfg


def test_implicit_gemm_runs_on_the_current_stream_and_in_a_cuda_graph(gen):
    x = make_tensor((2, 32, 20, 20), torch.float16, "cuda", "channels_last", gen)
    w = make_tensor((40, 32, 3, 3), torch.float16, "cuda", "channels_last", gen)
    b = make_tensor((40,), torch.float16, "cuda", gen=gen)
    want = ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1)
    torch.cuda.current_stream().wait_stream(stream)
    x.copy_(make_tensor(x.shape, torch.float16, "cuda", "channels_last", gen))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1), rtol=0, atol=0)
    assert not torch.equal(out, want)
