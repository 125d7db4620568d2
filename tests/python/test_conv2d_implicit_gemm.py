"""conv2d's implicit-GEMM engine on CUDA (ops/conv2d/implicit_gemm.h) and the
pointwise GEMMs (ops/conv2d/pointwise_gemm.h): channels_last float16,
bfloat16 and float32 (TF32) inputs with channel counts that are multiples of 8
and groups 1, forward and both gradients, against F.conv2d in float64 on
random geometries (kernel, stride, padding, dilation, bias); results are
channels_last, as F.conv2d gives, and the weight gradient is reproducible bit
for bit; NCHW inputs go through a layout change each way and give NCHW
results; with TF32 off, float32 takes the exact route; inputs the engine
declines (channels not a multiple of 8, groups, non-contiguous views) keep the
other routes and the same results."""

import contextlib
import random

import pytest
import torch
import torch.nn.functional as F

from testlib import (ConvConfig, capture_and_replay, check_conv_case, conv2d_call, cuda, kernels_launched, make_tensor,
                     ops)

pytestmark = cuda

DTYPES = [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float32, id="tf32")]  # float32: TF32 is PyTorch's default for convolutions


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


@pytest.mark.parametrize("idx", range(24))
@pytest.mark.parametrize("dtype", DTYPES)
def test_implicit_gemm_matches_torch_on_random_channels_last_configs(dtype, idx, rng, gen, seed):
    cfg = engine_config(rng)
    out = check_conv_case(conv2d_call(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {dtype} {cfg}")
    assert out.is_contiguous(memory_format=torch.channels_last), cfg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", [
    # ResNet-50 shapes at a small batch: 3x3 stride 1 and 2, 1x1 in and out of the bottleneck.
    dict(in_channels=64, out_channels=64, kernel=(3, 3), stride=(1, 1), padding=(1, 1), size=(56, 56)),
    dict(in_channels=128, out_channels=128, kernel=(3, 3), stride=(2, 2), padding=(1, 1), size=(56, 56)),
    dict(in_channels=256, out_channels=64, kernel=(1, 1), stride=(1, 1), padding=(0, 0), size=(56, 56)),
    dict(in_channels=512, out_channels=2048, kernel=(1, 1), stride=(1, 1), padding=(0, 0), size=(7, 7)),
    dict(in_channels=256, out_channels=256, kernel=(3, 3), stride=(1, 1), padding=(1, 1), size=(14, 14)),
    dict(in_channels=512, out_channels=512, kernel=(3, 3), stride=(1, 1), padding=(1, 1), size=(7, 7)),
    dict(in_channels=256, out_channels=512, kernel=(1, 1), stride=(2, 2), padding=(0, 0), size=(28, 28)),
    dict(in_channels=3, out_channels=64, kernel=(7, 7), stride=(2, 2), padding=(3, 3), size=(40, 40)),
], ids=["64-56-3x3", "128-56-3x3-s2", "256to64-1x1", "512to2048-7", "256-14-3x3", "512-7-3x3",
        "256to512-1x1-s2", "stem-3to64-7x7-s2"])
def test_implicit_gemm_matches_torch_on_resnet_layers(dtype, layer, gen, seed):
    # Forward and both gradients: the fprop tiles (narrow, large, split-K on
    # small planes), the strided dgrad, the split-K wgrad, the pointwise GEMMs
    # and the RGB stem (packed by space-to-depth).
    cfg = ConvConfig(batch=2, groups=1, dilation=(1, 1), bias=True, input_layout="channels_last",
                     weight_layout="channels_last", grad_layout="channels_last", **layer)
    out = check_conv_case(conv2d_call(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {dtype} {cfg}")
    assert out.is_contiguous(memory_format=torch.channels_last), cfg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", [
    # Planes larger than the small-plane kernels take (more than 6272 output
    # positions), so that every weight-gradient kernel runs: 128 x 128, 64 x 64
    # (at most 64 output channels) and 128 x 64 (1x1) in 16-bit, 128 x 128,
    # 256 x 128 and 64 x 64 (at most 64 output channels) in float32; and the
    # input gradient's 128 x 128 tiles (enough tiles to fill the
    # multiprocessors) next to its 128 x 64 ones.
    dict(batch=4, in_channels=64, out_channels=96, kernel=(3, 3), stride=(1, 1), padding=(1, 1), size=(48, 48)),
    dict(batch=4, in_channels=256, out_channels=128, kernel=(3, 3), stride=(1, 1), padding=(1, 1),
         size=(64, 64)),
    dict(batch=4, in_channels=128, out_channels=256, kernel=(1, 1), stride=(2, 2), padding=(0, 0),
         size=(96, 96)),
    dict(batch=8, in_channels=64, out_channels=64, kernel=(3, 3), stride=(1, 1), padding=(1, 1), size=(32, 32)),
    dict(batch=4, in_channels=128, out_channels=40, kernel=(1, 1), stride=(2, 2), padding=(0, 0),
         size=(96, 96)),
], ids=["64to96-48-3x3", "256to128-64-3x3", "128to256-96-1x1-s2", "64-32-3x3", "128to40-96-1x1-s2"])
def test_implicit_gemm_kernel_choices_on_larger_planes(dtype, layer, gen, seed):
    cfg = ConvConfig(groups=1, dilation=(1, 1), bias=True, input_layout="channels_last",
                     weight_layout="channels_last", grad_layout="channels_last", **layer)
    out = check_conv_case(conv2d_call(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {dtype} {cfg}")
    assert out.is_contiguous(memory_format=torch.channels_last), cfg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", [1, 3], ids=["1x1", "3x3"])
@pytest.mark.parametrize("stride", [1, 2], ids=["s1", "s2"])
@pytest.mark.parametrize("out_channels", [96, 128], ids=["K96", "K128"])
def test_implicit_gemm_gradients_are_channels_last_and_the_weight_gradient_reproducible(
        dtype, kernel, stride, out_channels, gen):
    # A reduction long enough to be split into slices (8 images of 40x40), or,
    # in 16-bit with 128 output channels and stride 2, the small-plane kernel
    # of sm_90 devices (one pass): the same inputs give bitwise the same weight
    # gradient; both gradients are channels_last, as F.conv2d's are, and match
    # float64.
    x = make_tensor((8, 64, 40, 40), dtype, "cuda", "channels_last", gen)
    w = make_tensor((out_channels, 64, kernel, kernel), dtype, "cuda", "channels_last", gen)
    args = ([stride, stride], [kernel // 2, kernel // 2], [1, 1], 1)
    y = F.conv2d(x.double(), w.double(), None, stride, kernel // 2)
    go = make_tensor(y.shape, dtype, "cuda", "channels_last", gen)
    gw = [ops.conv2d_grad_weight(go, x, w, *args) for _ in range(3)]
    assert all(torch.equal(gw[0], g) for g in gw[1:])
    gx = ops.conv2d_grad_input(go, x, w, *args)
    for got in (gx, gw[0]):
        assert got.is_contiguous(memory_format=torch.channels_last)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    want_gx, want_gw = torch.autograd.grad(F.conv2d(x64, w64, None, stride, kernel // 2), (x64, w64),
                                           go.double())
    scale = go.double().abs().mean() * x.double().abs().mean()
    torch.testing.assert_close(gx.double(), want_gx, rtol=2e-2, atol=float(scale) * 0.5)
    torch.testing.assert_close(gw[0].double(), want_gw, rtol=2e-2,
                               atol=float(scale) * 8 * 40 * 40 / stride ** 2 * 1e-2)


@pytest.mark.parametrize("idx", range(12))
@pytest.mark.parametrize("dtype", DTYPES)
def test_implicit_gemm_takes_nchw_data_through_a_layout_change(dtype, idx, rng, gen, seed):
    # NCHW input and grad_output (sometimes one of them channels_last), with
    # odd plane sizes: the gradients (and the forward where that moves less
    # data than the column route) changed to channels_last by the transpose
    # kernel, the results changed back. F.conv2d's rule for the output's
    # format: channels_last when the input or the weight is.
    layouts = ["contiguous", "contiguous", "channels_last"]
    cfg = engine_config(rng, input_layout=rng.choice(layouts), grad_layout=rng.choice(layouts))
    out = check_conv_case(conv2d_call(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {dtype} {cfg}")
    either_cl = "channels_last" in (cfg.input_layout, cfg.weight_layout)
    want = torch.channels_last if either_cl else torch.contiguous_format
    assert out.is_contiguous(memory_format=want), cfg


@contextlib.contextmanager
def tf32_allowed():
    """PyTorch's default TF32 policy for convolutions (the tests run with it off)."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved


def assert_close_in_norm(got: torch.Tensor, want: torch.Tensor, rel: float, ctx) -> None:
    """|got - want| / |want| <= rel in the 2-norm over the whole tensor."""
    err = float((got.double() - want).norm() / want.norm())
    assert err <= rel, (ctx, err)


def packed_reduction_ratio(kernel, stride, channels, dtype) -> float:
    """The packed stem's reduction over the layer's (implicit_gemm.cpp,
    packed_stem): 4 channels a phase, neighbouring columns folded in until a
    tap is one 128-byte reduction step. Forwards with an NCHW result pack only
    up to 2 times the layer's reduction."""
    phases = 4 * stride[0] * stride[1]
    fold = max(1, (128 // torch.empty((), dtype=dtype).element_size()) // phases)
    th = -(-kernel[0] // stride[0])
    tw = -(-kernel[1] // (stride[1] * fold))
    return th * tw * phases * fold / (kernel[0] * kernel[1] * channels)


@pytest.mark.parametrize("idx", range(12))
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_stems_run_packed_by_space_to_depth(dtype, idx, rng, gen, seed):
    # Few input channels with a stride (RGB stems: ResNet's 7x7 stride 2, a
    # 4x4 stride-4 patch embedding, MobileNet's 3x3 stride 2, and others
    # whose packed reduction stays within 5 times the layer's): the forward
    # (with an NCHW result: within 2 times) and the weight gradient run as
    # the packed stride-1 convolution (float32 with TF32 allowed, PyTorch's
    # default), in either input layout, with windows that are and are not
    # multiples of the stride, odd planes and paddings; the input gradient
    # takes the other routes. Channels from the fewest the rule packs up to
    # 4 (3 in float32, where 4 channels are a whole vector).
    kernel, stride, fewest = rng.choice([((7, 7), (2, 2), 3), ((7, 7), (2, 2), 3), ((4, 4), (4, 4), 2),
                                         ((8, 8), (4, 4), 2), ((5, 5), (2, 2), 4), ((7, 7), (2, 1), 3),
                                         ((6, 6), (2, 4), 3), ((3, 3), (2, 2), 3)])
    most = 3 if dtype == torch.float32 else 4
    if fewest > most:
        kernel, stride, fewest = (7, 7), (2, 2), 3
    channels = rng.randint(fewest, most)
    padding = tuple(rng.randint(0, k // 2 + 1) for k in kernel)
    size = tuple(k + rng.randint(0, 30) for k in kernel)
    cfg = ConvConfig(batch=rng.choice([1, 2, 3]), in_channels=channels,
                     out_channels=8 * rng.randint(1, 9), groups=1, kernel=kernel, stride=stride,
                     padding=padding, dilation=(1, 1), size=size, bias=rng.random() < 0.7,
                     input_layout=rng.choice(["contiguous", "channels_last"]),
                     weight_layout=rng.choice(["contiguous", "channels_last"]),
                     grad_layout=rng.choice(["contiguous", "channels_last"]))
    ctx = f"seed={seed} {dtype} {cfg}"
    if dtype != torch.float32:  # (float32 runs the engine with TF32 only: checked below)
        check_conv_case(conv2d_call(cfg), cfg, "cuda", dtype, gen, ctx)
    x = make_tensor(cfg.input_shape, dtype, "cuda", cfg.input_layout, gen, True)
    w = make_tensor(cfg.weight_shape, dtype, "cuda", cfg.weight_layout, gen, True)
    b = make_tensor((cfg.out_channels,), dtype, "cuda", gen=gen) if cfg.bias else None
    args = (list(stride), list(padding), [1, 1], 1)
    with tf32_allowed():
        out = ops.conv2d(x, w, b, *args)
        go = make_tensor(out.shape, dtype, "cuda", cfg.grad_layout, gen)
        gw = ops.conv2d_grad_weight(go, x, w, *args)
        either_cl = "channels_last" in (cfg.input_layout, cfg.weight_layout)
        packed = [lambda: ops.conv2d_grad_weight(go, x, w, *args)]
        # 3x3 forwards of up to 64 output channels run on CUDA cores instead
        # (stem_direct.h; test_conv2d_stem_direct_cuda.py).
        direct_stem = kernel == (3, 3) and cfg.out_channels <= 64
        packs = either_cl or packed_reduction_ratio(kernel, stride, channels, dtype) <= 2
        if packs and not direct_stem:
            packed.append(lambda: ops.conv2d(x, w, b, *args))
        for fn in packed:
            names = kernels_launched(fn)
            # (The packed forward runs on the Hopper kernel on sm_90 devices; a
            # tiny NCHW forward on the one-launch route, tiny_direct.h.)
            conv_kernel = "ImplicitGemmConvolution" in names or "implicit_gemm::wgmma" in names
            assert ("space_to_depth" in names and conv_kernel) or "tiny_forward_kernel" in names, (ctx, names[:300])
        if direct_stem:
            names = kernels_launched(lambda: ops.conv2d(x, w, b, *args))
            assert "stem_forward_kernel" in names or "tiny_forward_kernel" in names, \
                (ctx, names[:300])
    assert out.is_contiguous(memory_format=torch.channels_last if either_cl else torch.contiguous_format)
    assert gw.is_contiguous(memory_format=torch.channels_last if either_cl else torch.contiguous_format)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = F.conv2d(x64, w64, None if b is None else b.double(), stride, padding)
    want_gw, = torch.autograd.grad(want, w64, go.double())
    rel = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 2e-3}[dtype]
    assert_close_in_norm(out, want, rel, ctx)
    assert_close_in_norm(gw, want_gw, rel, ctx)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["channels-12", "groups-2", "empty-batch", "view"])
def test_cases_the_engine_declines_keep_the_other_route(dtype, case, rng, gen, seed):
    fixed = {"channels-12": dict(in_channels=12),
             "groups-2": dict(groups=2, in_channels=16, out_channels=16),
             "empty-batch": dict(batch=0),
             "view": dict(input_layout=rng.choice(["sliced", "transposed", "offset"]))}[case]
    cfg = engine_config(rng, **fixed)
    check_conv_case(conv2d_call(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {case} {cfg}")


def test_implicit_gemm_runs_on_the_current_stream_and_in_a_cuda_graph(gen):
    x = make_tensor((2, 32, 20, 20), torch.float16, "cuda", "channels_last", gen)
    w = make_tensor((40, 32, 3, 3), torch.float16, "cuda", "channels_last", gen)
    b = make_tensor((40,), torch.float16, "cuda", gen=gen)
    want = ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1)
    (out,), _graph = capture_and_replay(lambda: (ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1),), [x], gen)
    torch.testing.assert_close(out, ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1), rtol=0, atol=0)
    assert not torch.equal(out, want)


@pytest.mark.parametrize("kernel", [1, 3], ids=["1x1", "3x3"])
def test_float32_without_tf32_takes_the_exact_route(kernel, gen):
    # torch.backends.cudnn.allow_tf32 = False: no TF32 anywhere, so float32
    # matches float64 to float32's own rounding; with TF32 allowed it does not.
    x = make_tensor((4, 64, 24, 24), torch.float32, "cuda", "channels_last", gen)
    w = make_tensor((64, 64, kernel, kernel), torch.float32, "cuda", "channels_last", gen)
    want = F.conv2d(x.double(), w.double(), None, 1, kernel // 2)
    args = ([1, 1], [kernel // 2, kernel // 2], [1, 1], 1)
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False
        exact = ops.conv2d(x, w, None, *args)
        torch.backends.cudnn.allow_tf32 = True
        tf32 = ops.conv2d(x, w, None, *args)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    assert exact.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(exact.double(), want, rtol=1e-5, atol=1e-4)
    assert (tf32.double() - want).abs().max() > (exact.double() - want).abs().max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", [
    # (batch, C, K, plane): 2^26 multiply-adds or fewer go to the engine, one
    # launch with the bias in its epilogue; larger ones to the pointwise GEMM.
    pytest.param((2, 64, 96, 12, True), id="small-engine"),
    pytest.param((1, 256, 512, 7, True), id="one-image-7x7-engine"),
    pytest.param((2, 256, 1024, 16, False), id="large-gemm"),
])
def test_pointwise_channels_last_forward_route_follows_the_problem_size(dtype, layer, gen, seed):
    n, c, k, hw, engine = layer
    x = make_tensor((n, c, hw, hw), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c, 1, 1), dtype, "cuda", "channels_last", gen)
    b = make_tensor((k,), dtype, "cuda", "contiguous", gen)
    args = ([1, 1], [0, 0], [1, 1], 1)
    with tf32_allowed():
        names = kernels_launched(lambda: ops.conv2d(x, w, b, *args))
        out = ops.conv2d(x, w, b, *args)
    assert ("ImplicitGemmConvolution" in names) == engine, (layer, names)
    assert out.is_contiguous(memory_format=torch.channels_last)
    want = F.conv2d(x.double(), w.double(), b.double())
    # TF32 or 16-bit operands, float32 accumulation.
    assert_close_in_norm(out, want, 2e-3 if dtype == torch.float32 else 5e-3, f"seed={seed} {layer}")
