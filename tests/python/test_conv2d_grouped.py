"""conv2d's grouped direct kernels on CUDA (ops/conv2d/grouped_direct.h):
grouped layers (1 < groups < C, up to 64 channels per group) in every
floating dtype and both layouts, forward and both gradients, against
F.conv2d in float64 on random geometries (kernel, stride, padding, dilation,
bias, channel counts that do and do not allow vector loads, misaligned
views); ResNeXt's and RegNet's layer shapes; the memory format F.conv2d
gives; a bitwise reproducible weight gradient; a CUDA graph; wider groups
keep the other routes."""

import random

import pytest
import torch
import torch.nn.functional as F

from testlib import (ConvConfig, capture_and_replay, check_conv_case, conv2d_call, cuda, kernels_launched,
                     make_tensor, ops)

pytestmark = cuda

DTYPES = [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float32, id="f32"), pytest.param(torch.float64, id="f64")]


def grouped_config(rng: random.Random, **fixed) -> ConvConfig:
    """A random grouped configuration: 2 to 13 groups of 1 to 40 input and
    output channels (often a multiple of 4 or 8), windows 1x1 to 5x5 with
    stride, padding and dilation per axis, either layout."""
    groups = rng.choice([2, 3, 4, 8, 13])
    per_group = lambda: rng.choice([1, 2, 3, 4, 4, 8, 8, 16, 24, 40])
    cg, kg = per_group(), per_group()
    if cg == 1:
        cg = 2  # groups == C is the depthwise route
    kernel = tuple(rng.choice([1, 3, 3, 5]) for _ in range(2))
    stride = tuple(rng.choice([1, 1, 2, 3]) for _ in range(2))
    dilation = tuple(rng.choice([1, 1, 2]) for _ in range(2))
    padding = tuple(rng.randint(0, (k - 1) * d // 2 + 1) for k, d in zip(kernel, dilation))
    size = tuple((k - 1) * d + 1 + rng.randint(0, 13) for k, d in zip(kernel, dilation))
    values = dict(batch=rng.choice([1, 2, 3]), in_channels=cg * groups, out_channels=kg * groups,
                  groups=groups, kernel=kernel, stride=stride, padding=padding, dilation=dilation,
                  size=size, bias=rng.random() < 0.7,
                  input_layout=rng.choice(["channels_last", "channels_last", "contiguous"]),
                  weight_layout=rng.choice(["contiguous", "channels_last"]),
                  grad_layout=rng.choice(["channels_last", "contiguous"]))
    values.update(fixed)
    return ConvConfig(**values)


def expected_format(cfg):
    """F.conv2d's rule: channels_last when the input or the weight is."""
    cl = "channels_last" in (cfg.input_layout, cfg.weight_layout)
    return torch.channels_last if cl else torch.contiguous_format


@pytest.mark.parametrize("idx", range(16))
@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_matches_torch_on_random_configs(dtype, idx, rng, gen, seed):
    cfg = grouped_config(rng)
    out = check_conv_case(conv2d_call(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {dtype} {cfg}")
    assert out.is_contiguous(memory_format=expected_format(cfg)), cfg


# (C, K, groups, kernel, stride, input size): ResNeXt-50 32x4d's grouped 3x3
# layers (4, 8, 16 and 32 channels per group) and RegNetY-400MF's (8 per
# group, 6 to 55 groups), at a smaller plane.
LAYERS = {
    "resnext-4pg": (128, 128, 32, 3, 1, 20),
    "resnext-8pg-s2": (256, 256, 32, 3, 2, 20),
    "resnext-16pg": (512, 512, 32, 3, 1, 9),
    "resnext-16pg-s2": (512, 512, 32, 3, 2, 12),
    "resnext-32pg-s2": (1024, 1024, 32, 3, 2, 14),
    "regnet-6g-s2": (48, 48, 6, 3, 2, 24),
    "regnet-55g": (440, 440, 55, 3, 1, 7),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_grouped_matches_torch_on_resnext_and_regnet_layers(dtype, layout, layer, gen, seed):
    c, k, groups, ks, s, h = LAYERS[layer]
    cfg = ConvConfig(batch=2, in_channels=c, out_channels=k, groups=groups, kernel=(ks, ks),
                     stride=(s, s), padding=(ks // 2, ks // 2), dilation=(1, 1), size=(h, h),
                     bias=True, input_layout=layout, weight_layout=layout, grad_layout=layout)
    out = check_conv_case(conv2d_call(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {dtype} {cfg}")
    assert out.is_contiguous(memory_format=expected_format(cfg)), cfg


@pytest.mark.parametrize("dtype", DTYPES[:3])
@pytest.mark.parametrize("case", ["misaligned", "wide-groups", "empty-batch", "unbatched"])
def test_cases_the_direct_kernels_narrow_or_decline(dtype, case, rng, gen, seed):
    # A view one element into its storage (no vector loads), groups wider
    # than 64 channels (the other routes), an empty batch and an unbatched
    # input (declined): the same results as F.conv2d either way.
    fixed = {"misaligned": dict(in_channels=64, out_channels=64, groups=8),
             "wide-groups": dict(in_channels=144, out_channels=16, groups=2),
             "empty-batch": dict(batch=0),
             "unbatched": dict(batch=None, input_layout="contiguous", weight_layout="contiguous",
                              grad_layout="contiguous")}[case]
    cfg = grouped_config(rng, **fixed)
    if case == "misaligned":
        stride, padding, dilation, groups = cfg.args()
        x = make_tensor(cfg.input_shape, dtype, "cuda", cfg.input_layout, gen)
        base = torch.empty(x.numel() + 1, dtype=dtype, device="cuda")
        shifted = base[1:].view(x.permute(0, 2, 3, 1).shape).permute(0, 3, 1, 2)
        shifted.copy_(x)
        w = make_tensor(cfg.weight_shape, dtype, "cuda", "channels_last", gen)
        got = ops.conv2d(shifted, w, None, stride, padding, dilation, groups)
        want = F.conv2d(x.double(), w.double(), None, stride, padding, dilation, groups)
        tol = {torch.float16: 2e-2, torch.bfloat16: 6e-2}.get(dtype, 1e-4)
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())
        return
    check_conv_case(conv2d_call(cfg), cfg, "cuda", dtype, gen, f"seed={seed} {case} {cfg}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_weight_gradient_is_reproducible_bit_for_bit(dtype, gen):
    # A reduction long enough to be split into many slices.
    x = make_tensor((8, 128, 32, 32), dtype, "cuda", "channels_last", gen)
    w = make_tensor((128, 4, 3, 3), dtype, "cuda", "channels_last", gen)
    go = make_tensor((8, 128, 32, 32), dtype, "cuda", "channels_last", gen)
    args = ([1, 1], [1, 1], [1, 1], 32)
    gw = [ops.conv2d_grad_weight(go, x, w, *args) for _ in range(3)]
    assert all(torch.equal(gw[0], g) for g in gw[1:])
    assert gw[0].is_contiguous(memory_format=torch.channels_last)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    want = torch.autograd.grad(F.conv2d(x64, w64, None, 1, 1, 1, 32), w64, go.double())[0]
    scale = float(want.abs().max())
    tol = {torch.float16: 1e-2, torch.bfloat16: 4e-2, torch.float32: 1e-5}.get(dtype, 1e-12)
    torch.testing.assert_close(gw[0].double(), want, rtol=tol, atol=tol * scale)


def test_grouped_runs_on_the_current_stream_and_in_a_cuda_graph(gen):
    x = make_tensor((2, 64, 18, 18), torch.float16, "cuda", "channels_last", gen).requires_grad_()
    w = make_tensor((64, 8, 3, 3), torch.float16, "cuda", "channels_last", gen).requires_grad_()
    b = make_tensor((64,), torch.float16, "cuda", gen=gen)
    go = make_tensor((2, 64, 18, 18), torch.float16, "cuda", "channels_last", gen)
    conv = lambda: ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 8)

    def step():
        out = conv()
        return (out.detach(),) + torch.autograd.grad(out, (x, w), go)

    results, _graph = capture_and_replay(step, [x.detach()], gen)
    want = step()
    for got, ref in zip(results, want):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("layer", ["resnext-4pg", "resnext-32pg-s2", "regnet-55g"])
def test_grouped_float32_under_tf32(layer, gen):
    # With PyTorch's TF32 policy for convolutions on, float32 groups that
    # merge into whole 32-channel tiles run on the tensor cores in TF32: close
    # to float64 at TF32's precision, channels_last; the others stay exact.
    c, k, groups, ks, s, h = LAYERS[layer]
    x = make_tensor((2, c, h, h), torch.float32, "cuda", "channels_last", gen)
    w = make_tensor((k, c // groups, ks, ks), torch.float32, "cuda", "channels_last", gen)
    args = ([s, s], [ks // 2, ks // 2], [1, 1], groups)
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        got = ops.conv2d(x, w, None, *args)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    want = F.conv2d(x.double(), w.double(), None, s, ks // 2, 1, groups)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None, s, ks // 2, 1, groups)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert ((got.double() - want).abs() <= 2.0**-9 * bound + 1e-6).all()


@pytest.mark.parametrize("weight_layout", ["contiguous", "channels_last", "transposed", "sliced"])
@pytest.mark.parametrize("layer", ["resnext-4pg", "resnext-16pg-s2", "resnext-32pg-s2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_merged_groups_weight_in_one_pass(dtype, layer, weight_layout, gen):
    # The implicit GEMM's grouped routes multiply a block-diagonal weight:
    # groups merged into 32-channel ones for the forward (groups of 16; those
    # of 4 and 8 go to grouped_mma.h's kernel), the whole dense
    # weight for the float32 input gradient of up to 32 groups. One kernel
    # writes it from a weight of any strides (no zero fill and copy).
    # float32 under TF32, as PyTorch's policy allows by default.
    c, k, groups, ks, s, h = LAYERS[layer]
    x = make_tensor((2, c, h, h), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c // groups, ks, ks), dtype, "cuda", weight_layout, gen)
    go = make_tensor((2, k, (h - 1) // s + 1, (h - 1) // s + 1), dtype, "cuda", "channels_last", gen)
    args = ([s, s], [1, 1], [1, 1], groups)
    tol = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-9
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        launched = kernels_launched(lambda: ops.conv2d(x, w, None, *args))
        got = ops.conv2d(x, w, None, *args)
        gi = ops.conv2d_grad_input(go, x, w, *args)
        gi_launched = kernels_launched(lambda: ops.conv2d_grad_input(go, x, w, *args))
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    if c // groups < 32 and "cutlass" in launched:  # merged groups (the tiled kernel takes some layers)
        assert "block_diagonal_kernel" in launched and "at::native" not in launched, launched
    if dtype == torch.float32 and layer == "resnext-32pg-s2" and torch.cuda.get_device_capability() == (9, 0):
        # By stride phases on the Hopper forward, the phases' weight written
        # from the grouped one: no dense weight.
        assert "fprop_tma_kernel" in gi_launched and "block_diagonal_kernel" not in gi_launched, gi_launched
    want = F.conv2d(x.double(), w.double(), None, s, 1, 1, groups)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None, s, 1, 1, groups)
    assert ((got.double() - want).abs() <= tol * bound + 1e-6).all()
    gi_want = torch.nn.grad.conv2d_input(x.shape, w.double(), go.double(), s, 1, 1, groups)
    gi_bound = torch.nn.grad.conv2d_input(x.shape, w.double().abs(), go.double().abs(), s, 1, 1, groups)
    assert ((gi.double() - gi_want).abs() <= tol * gi_bound + 1e-6).all()


@pytest.mark.parametrize("dtype, groups, direct", [(torch.float16, 32, True), (torch.bfloat16, 32, True),
                                                   (torch.float32, 8, True), (torch.float16, 8, False)])
def test_grouped_weight_gradient_route(dtype, groups, direct, gen):
    # The direct weight-gradient kernel goes before the implicit GEMM's dense
    # problem from 8 groups on in float32, from 32 in 16-bit (engines_cuda.cpp);
    # a 7x7 window (taps in chunks of 3 per row) at stride 2 either way.
    c = 8 * groups
    x = make_tensor((3, c, 19, 17), dtype, "cuda", "channels_last", gen)
    w = make_tensor((c, 8, 7, 7), dtype, "cuda", "channels_last", gen)
    go = make_tensor((3, c, 8, 6), dtype, "cuda", "channels_last", gen)  # (19 + 2 - 7) / 2 + 1, (17 - 7) / 2 + 1
    args = ([2, 2], [1, 0], [1, 1], groups)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        gw = ops.conv2d_grad_weight(go, x, w, *args)
        torch.cuda.synchronize()
    names = " ".join(e.name for e in prof.events())
    assert ("grad_weight_kernel" in names) == direct, names[:300]
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    want = torch.autograd.grad(F.conv2d(x64, w64, None, [2, 2], [1, 0], 1, groups), w64, go.double())[0]
    tol = {torch.float16: 1e-2, torch.bfloat16: 4e-2}.get(dtype, 1e-5)
    torch.testing.assert_close(gw.double(), want, rtol=tol, atol=tol * float(want.abs().max()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
def test_tiny_grouped_gradients_take_the_direct_kernels(dtype, layout, gen):
    # At most 2^20 multiply-adds a pass (engines_cuda.cpp): both gradients go
    # to the direct kernels first, here where the tensor-core routes would
    # otherwise take them (3 groups of 8 channels, a 3x3 window at stride 1).
    x = make_tensor((2, 24, 9, 7), dtype, "cuda", layout, gen)
    w = make_tensor((24, 8, 3, 3), dtype, "cuda", layout, gen)
    go = make_tensor((2, 24, 9, 7), dtype, "cuda", layout, gen)
    args = ([1, 1], [1, 1], [1, 1], 3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        gi = ops.conv2d_grad_input(go, x, w, *args)
        gw = ops.conv2d_grad_weight(go, x, w, *args)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if names:  # (none under compute-sanitizer)
        joined = " ".join(names)
        assert "grad_input_kernel" in joined and "grad_weight_kernel" in joined, joined[:300]
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    want_gi, want_gw = torch.autograd.grad(F.conv2d(x64, w64, None, 1, 1, 1, 3), (x64, w64), go.double())
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format  # F.conv2d's
    assert gi.is_contiguous(memory_format=fmt) and gw.is_contiguous(memory_format=fmt)
    tol = {torch.float16: 1e-2, torch.bfloat16: 4e-2}.get(dtype, 1e-5)
    for got, want in ((gi, want_gi), (gw, want_gw)):
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * float(want.abs().max()))


def mma_kernel_ran(fn):
    """fn's result and whether a tensor-core kernel for groups of 8
    (grouped_mma.h) ran in it, or on an sm_90 device the Hopper forward of
    merged groups, which float32 groups of 8 with a stride take first
    (implicit_gemm.h's hopper_grouped_forward_first), or
    the one-launch route for tiny NCHW problems
    (tiny_direct.h), which goes before every other; None where the profiler
    saw no kernel at all (under compute-sanitizer, which holds the profiling
    interface)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not names:
        return out, None
    return out, any(k in n for n in names for k in ("grouped_mma_forward_kernel", "grouped_mma16_forward_kernel",
                                                    "fprop_tma_kernel", "tiny_forward_kernel"))


# The bound of a product's error: |got - want| <= tol * (|x| conv |w|) + 1e-6.
MMA_TOL = {torch.float16: 2.0**-9, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-9}


@pytest.mark.parametrize("idx", range(12))
@pytest.mark.parametrize("width", [8, 4, 16])
@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16"),
                                   pytest.param(torch.float32, id="tf32")])
def test_groups_of_8_on_tensor_cores(dtype, width, idx, rng, gen, seed):
    # C / groups == K / groups == 8 (or 4, an even number of groups: two
    # groups a tile, block-diagonal; or 16 in 16-bit; in 16-bit 16 channels
    # a warp for groups of 16 and for 4 and 8 when C is a multiple of 64),
    # RegNet's group counts and ResNeXt's 32, and windows of at most 10 taps
    # run on the tensor-core kernels: random windows (1x1 to 3x3, 2x5, 1x3),
    # strides, paddings, dilations, plane sizes whose positions fill no
    # whole tile, both layouts, bias or none; float32 under TF32 only (its
    # groups of 16 take the other routes, and are checked the same).
    groups = rng.choice({8: [2, 3, 6, 13, 32], 4: [2, 6, 10, 26, 32], 16: [2, 3, 5, 32]}[width])
    kernel = rng.choice([(3, 3), (3, 3), (1, 1), (2, 2), (1, 3), (3, 1), (2, 5)])
    stride = (rng.choice([1, 2, 3]), rng.choice([1, 2]))
    dilation = (rng.choice([1, 1, 2]), rng.choice([1, 1, 2]))
    padding = tuple(rng.randint(0, (k - 1) * d) for k, d in zip(kernel, dilation))
    size = tuple((k - 1) * d + 1 + rng.randint(0, 11) for k, d in zip(kernel, dilation))
    layout = rng.choice(["channels_last", "contiguous"])
    x = make_tensor((rng.choice([1, 2, 3]), width * groups, *size), dtype, "cuda", layout, gen)
    w_layout = rng.choice(["channels_last", "contiguous"])
    w = make_tensor((width * groups, width, *kernel), dtype, "cuda", w_layout, gen)
    b = make_tensor((width * groups,), dtype, "cuda", gen=gen) if rng.random() < 0.7 else None
    args = (list(stride), list(padding), list(dilation), groups)
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        got, ran = mma_kernel_ran(lambda: ops.conv2d(x, w, b, *args))
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    assert ran is not False or (width == 16 and dtype == torch.float32), f"seed={seed}"
    want = F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride, padding, dilation, groups)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else b.double().abs(), stride, padding,
                     dilation, groups)
    assert got.shape == want.shape
    fmt = torch.channels_last if "channels_last" in (layout, w_layout) else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt), f"seed={seed}"
    err = (got.double() - want).abs() - MMA_TOL[dtype] * bound
    assert (err <= 1e-6).all(), f"seed={seed} worst {float(err.max())}"


@pytest.mark.parametrize("case", ["f32-exact", "5x5", "tf32-16-per-group", "32-per-group", "misaligned-1x1-weight",
                                  "merged", "odd-groups-of-4"])
def test_groups_of_8_cases_the_tensor_core_kernel_declines(case, gen):
    # Outside its conditions the layer keeps the other routes, and is right;
    # groups that a merge into 32 channels divides (4 groups of 8) run on it
    # too.
    dtype = torch.float32 if case in ("f32-exact", "tf32-16-per-group") else torch.float16
    cg = {"tf32-16-per-group": 16, "32-per-group": 32, "odd-groups-of-4": 4}.get(case, 8)
    groups = 4 if case == "merged" else 3
    ks = 5 if case == "5x5" else (1 if case.endswith("1x1-weight") else 3)
    x = make_tensor((2, groups * cg, 11, 9), dtype, "cuda", "channels_last", gen)
    w = make_tensor((groups * cg, cg, ks, ks), dtype, "cuda", "offset" if case.startswith("misaligned") else "contiguous",
                    gen)
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = case != "f32-exact"
        got, ran = mma_kernel_ran(lambda: ops.conv2d(x, w, None, [1, 1], [ks // 2, ks // 2], [1, 1], groups))
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    assert ran is not (case != "merged")
    want = F.conv2d(x.double(), w.double(), None, 1, ks // 2, 1, groups)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * float(want.abs().max()))


ACTIVATIONS = {"identity": lambda t: t, "relu": F.relu, "relu6": F.relu6, "silu": F.silu,
               "hardswish": F.hardswish, "gelu": F.gelu, "sigmoid": torch.sigmoid}


@pytest.mark.parametrize("residual", [False, True], ids=["no-residual", "residual"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="f16"), pytest.param(torch.float32, id="tf32")])
def test_groups_of_8_fused_epilogue_in_the_kernel(dtype, activation, residual, rng, gen, seed):
    # conv2d_fused on groups the tensor-core kernels take (13 groups of 8, 6
    # groups of 4; in 16-bit 5 groups of 16, and 32 groups of 4 and 16 of 8,
    # 16 channels a warp), at stride 1 or 2: the residual and the activation
    # applied in its epilogue, against act(conv + bias + residual) in float64.
    width, groups = rng.choice([(8, 13), (4, 6)] + ([(16, 5), (4, 32), (8, 16)] if dtype != torch.float32 else []))
    stride = rng.choice([1, 2])
    c = width * groups
    x = make_tensor((2, c, 11, 9), dtype, "cuda", "channels_last", gen)
    w = make_tensor((c, width, 3, 3), dtype, "cuda", "channels_last", gen)
    b = make_tensor((c,), dtype, "cuda", gen=gen)
    r = make_tensor((2, c, 10 // stride + 1, 8 // stride + 1), dtype, "cuda", "channels_last", gen) if residual else None
    args = ([stride, stride], [1, 1], [1, 1], groups)
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        got, ran = mma_kernel_ran(lambda: ops.conv2d_fused(x, w, b, *args, activation, r))
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    assert ran is not False, f"seed={seed}"
    pre = F.conv2d(x.double(), w.double(), b.double(), stride, 1, 1, groups)
    bound = F.conv2d(x.double().abs(), w.double().abs(), b.double().abs(), stride, 1, 1, groups)
    if r is not None:
        pre, bound = pre + r.double(), bound + r.double().abs()
    want = ACTIVATIONS[activation](pre)
    assert got.is_contiguous(memory_format=torch.channels_last)
    # The activations here change a value by at most 1.5x its input's change (hardswish).
    err = (got.double() - want).abs() - 1.5 * MMA_TOL[dtype] * bound - 2.0**-10 * want.abs()
    assert (err <= 1e-6).all(), f"seed={seed} worst {float(err.max())}"
