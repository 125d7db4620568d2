"""customconv::conv2d against F.conv2d: forward and the gradients of input,
weight and bias, on random and on hand-picked configurations, for every
supported device and dtype. The reference is F.conv2d in float64 on the CPU
on the same values."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import customconv
from testlib import (
    DEVICE_DTYPES,
    ConvConfig,
    DEVICES,
    capture_and_replay,
    check_conv_case,
    check_under_no_grad_and_inference_mode,
    cuda,
    make_tensor,
    ops,
    random_conv2d_config,
)

N_RANDOM = 40


def run_conv2d_case(cfg, device, dtype, gen, ctx, call="ops", need=("x", "w", "b")):
    """Runs cfg forward and backward; checks every result against F.conv2d."""
    stride, padding, dilation, groups = cfg.args()

    def conv2d(input, weight, bias):
        if call == "ops":
            return ops.conv2d(input, weight, bias, stride, padding, dilation, groups)
        if call == "ops-kwargs":
            return ops.conv2d(input, weight, bias=bias, stride=stride, padding=padding,
                              dilation=dilation, groups=groups)
        # The functional wrapper: F.conv2d's signature with tuples.
        return customconv.conv2d(input, weight, bias, cfg.stride, cfg.padding, cfg.dilation,
                                 cfg.groups)

    check_conv_case(conv2d, cfg, device, dtype, gen, ctx, need)


@pytest.mark.parametrize("idx", range(N_RANDOM))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_conv2d_matches_torch_on_random_configs(device, dtype, idx, rng, gen, seed):
    cfg = random_conv2d_config(rng)
    call = rng.choice(["ops", "ops", "ops-kwargs", "functional"])
    ctx = f"seed={seed} {device} {dtype} call={call} {cfg}"
    run_conv2d_case(cfg, device, dtype, gen, ctx, call)


@pytest.mark.parametrize("weight_layout", ["contiguous", "channels_last", "transposed"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_cpu_1x1_on_channels_last_is_one_gemm_with_a_channels_last_output(dtype, bias,
                                                                          weight_layout, gen, seed):
    # The CPU's channels_last GEMM route (ops/conv2d/channels_last_gemm.h): the
    # input read in place as an (N*H*W, C) matrix, the output written channels_last.
    cfg = ConvConfig(batch=3, in_channels=16, out_channels=24, groups=1, kernel=(1, 1),
                     stride=(1, 1), padding=(0, 0), dilation=(1, 1), size=(7, 9), bias=bias,
                     input_layout="channels_last", weight_layout=weight_layout,
                     grad_layout="channels_last")
    out = check_conv_case(lambda input, weight, bias: ops.conv2d(input, weight, bias, *cfg.args()),
                          cfg, "cpu", dtype, gen, f"seed={seed} {cfg}")
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("idx", range(20))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_cpu_channels_last_windows_gathered_into_rows_match_torch(dtype, idx, rng, gen, seed):
    # The same route for k x k windows with stride, padding and dilation: each
    # output position's window gathered into a row of columns, then one GEMM,
    # for the forward and the weight gradient (checked by check_conv_case).
    # (16 channels and more: fewer keep the column route.)
    cfg = random_conv2d_config(rng, kind="plain", input_layout="channels_last",
                               batch=rng.choice([1, 2, 3]), in_channels=rng.choice([16, 24, 40]))
    out = check_conv_case(lambda input, weight, bias: ops.conv2d(input, weight, bias, *cfg.args()),
                          cfg, "cpu", dtype, gen, f"seed={seed} {cfg}")
    # (A 1x1 output: both layouts are the same memory.)
    ambiguous = min(cfg.output_size) == 1
    assert out.is_contiguous(memory_format=torch.channels_last) or ambiguous, cfg


@pytest.mark.parametrize("window", [
    dict(kernel=(3, 3), padding=(1, 1), dilation=(1, 1)),
    dict(kernel=(3, 3), padding=(0, 0), dilation=(1, 1)),
    dict(kernel=(1, 3), padding=(0, 1), dilation=(1, 1)),
    dict(kernel=(3, 3), padding=(1, 1), dilation=(1, 2)),
], ids=["3x3-pad1", "3x3-unpadded", "1x3", "3x3-dilated-w"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_cpu_channels_last_stride1_shifted_tap_gemms_match_torch(dtype, window, gen, seed):
    # Stride 1 on planes the padding enlarges by at most a fifth: one GEMM per
    # tap on the padded input's rows, shifted by the tap's offset, accumulated
    # into an output grid (channels_last_gemm.cpp), and the weight gradient as
    # its transpose (grad_output on the grid); bias on and off.
    for with_bias in (True, False):
        cfg = ConvConfig(batch=3, in_channels=16, out_channels=24, groups=1, stride=(1, 1),
                         size=(30, 33), bias=with_bias, input_layout="channels_last",
                         weight_layout="contiguous", grad_layout="channels_last", **window)
        call = lambda input, weight, bias: ops.conv2d(input, weight, bias, *cfg.args())  # noqa: E731
        out = check_conv_case(call, cfg, "cpu", dtype, gen, f"seed={seed} {cfg}")
        assert out.is_contiguous(memory_format=torch.channels_last), cfg


def formats(t: torch.Tensor):
    return t.is_contiguous(), t.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("layouts", [("contiguous", "contiguous"), ("channels_last", "contiguous"),
                                     ("contiguous", "channels_last"), ("channels_last", "channels_last")],
                         ids=["nchw", "input-cl", "weight-cl", "both-cl"])
@pytest.mark.parametrize("window", [(1, 1, 1), (3, 1, 1), (3, 2, 4)], ids=["1x1", "3x3", "3x3-g4"])
@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_output_memory_format_is_f_conv2ds_and_the_meta_kernels(device, window, layouts, gen):
    # channels_last when the input or the weight is (F.conv2d's rule), on every
    # route (one GEMM, im2col + GEMM, grouped, depthwise), and the meta kernel says the same.
    k, s, groups = window
    x = make_tensor((2, 16, 7, 6), torch.float32, device, layouts[0], gen)
    w = make_tensor((8, 16 // groups, k, k), torch.float32, device, layouts[1], gen)
    b = make_tensor((8,), torch.float32, device, gen=gen)
    args = ([s, s], [k // 2, k // 2], [1, 1], groups)
    out = ops.conv2d(x, w, b, *args)
    want = F.conv2d(x, w, b, s, k // 2, 1, groups)
    assert out.stride() == want.stride(), (out.stride(), want.stride())
    assert ops.conv2d(x.to("meta"), w.to("meta"), b.to("meta"), *args).stride() == want.stride()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    depthwise = make_tensor((16, 1, 3, 3), torch.float32, device, layouts[1], gen)
    want = F.conv2d(x, depthwise, None, 1, 1, 1, 16)
    got = ops.conv2d(x, depthwise, None, [1, 1], [1, 1], [1, 1], 16)
    assert got.stride() == want.stride()
    # depthwise_conv2d itself, its gradients and its meta kernels follow the same rule.
    got = ops.depthwise_conv2d(x, depthwise, None, [1, 1], [1, 1], [1, 1])
    assert got.stride() == want.stride()
    meta = [t.to("meta") for t in (x, depthwise)]
    assert ops.depthwise_conv2d(*meta, None, [1, 1], [1, 1], [1, 1]).stride() == want.stride()
    xg, wg = x.clone().requires_grad_(), depthwise.clone().requires_grad_()
    go = torch.randn_like(want)
    want_gx, want_gw = torch.autograd.grad(F.conv2d(xg, wg, None, 1, 1, 1, 16), (xg, wg), go)
    win = ([1, 1], [1, 1], [1, 1])
    for got, want_g, meta_g in (
            (ops.depthwise_conv2d_grad_input(go, x, depthwise, *win), want_gx,
             ops.depthwise_conv2d_grad_input(go.to("meta"), *meta, *win)),
            (ops.depthwise_conv2d_grad_weight(go, x, depthwise, *win), want_gw,
             ops.depthwise_conv2d_grad_weight(go.to("meta"), *meta, *win))):
        assert formats(got) == formats(want_g) == formats(meta_g), (got.stride(), want_g.stride())


@pytest.mark.parametrize("layouts", [("contiguous", "contiguous"), ("channels_last", "contiguous"),
                                     ("contiguous", "channels_last"), ("channels_last", "channels_last")],
                         ids=["nchw", "input-cl", "weight-cl", "both-cl"])
@pytest.mark.parametrize("window", [(1, 1, 1), (1, 2, 1), (3, 1, 1), (3, 2, 1), (3, 2, 4)],
                         ids=["1x1", "1x1-s2", "3x3", "3x3-s2", "3x3-g4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_gradients_take_f_conv2ds_memory_format_and_the_meta_kernels(device, dtype, window,
                                                                            layouts, gen):
    # grad_input and grad_weight are channels_last when the input or the weight
    # is (F.conv2d's backward), on every route: one GEMM (1x1), the engines
    # (channels_last float16 on CUDA), im2col + GEMM, grouped; the meta kernels agree.
    if dtype == torch.float16 and device == "cpu":
        dtype = torch.bfloat16
    k, s, groups = window
    x = make_tensor((2, 16, 7, 6), dtype, device, layouts[0], gen, True)
    w = make_tensor((8, 16 // groups, k, k), dtype, device, layouts[1], gen, True)
    args = ([s, s], [k // 2, k // 2], [1, 1], groups)
    want = F.conv2d(x, w, None, s, k // 2, 1, groups)
    go = make_tensor(want.shape, dtype, device, "channels_last", gen)
    want_gx, want_gw = torch.autograd.grad(want, (x, w), go)
    gx = ops.conv2d_grad_input(go, x, w, *args)
    gw = ops.conv2d_grad_weight(go, x, w, *args)
    assert formats(gx) == formats(want_gx), (gx.stride(), want_gx.stride())
    assert formats(gw) == formats(want_gw), (gw.stride(), want_gw.stride())
    meta = [t.detach().to("meta") for t in (go, x, w)]
    assert formats(ops.conv2d_grad_input(*meta, *args)) == formats(want_gx)
    assert formats(ops.conv2d_grad_weight(*meta, *args)) == formats(want_gw)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(gx, want_gx, **tol)
    torch.testing.assert_close(gw, want_gw, **tol)


def test_conv2d_compiled_for_training_on_channels_last_keeps_the_traced_strides(gen):
    # torch.compile checks every custom op's output strides against its meta
    # kernel's: the CPU's one-GEMM 1x1 route and the column route alike.
    for k in (1, 3):
        x = make_tensor((2, 16, 5, 5), torch.float32, "cpu", "channels_last", gen, True)
        w = make_tensor((8, 16, k, k), torch.float32, "cpu", gen=gen, requires_grad=True)
        b = make_tensor((8,), torch.float32, "cpu", gen=gen, requires_grad=True)
        fn = lambda x, w, b: ops.conv2d(x, w, b, [1, 1], [k // 2, k // 2], [1, 1], 1)  # noqa: E731
        torch._dynamo.reset()
        y = torch.compile(fn, fullgraph=True)(x, w, b)
        y.sum().backward()
        assert y.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(y, F.conv2d(x, w, b, 1, k // 2), rtol=1e-4, atol=1e-4)


EDGE_CASES = {
    "batch0": dict(batch=0),
    "batch1": dict(batch=1),
    "unbatched": dict(batch=None),
    "unbatched_grouped_channels_last": dict(batch=None, kind="grouped", input_layout="channels_last"),
    "groups_eq_channels": dict(groups=4, in_channels=4, out_channels=4),
    "groups_eq_channels_multiplier3": dict(groups=3, in_channels=3, out_channels=9),
    "groups_several_out_channels_per_group": dict(groups=2, in_channels=6, out_channels=10),
    "kernel_1x1": dict(kernel=(1, 1)),
    "kernel_1x5": dict(kernel=(1, 5), size=(4, 9), dilation=(1, 1)),
    "kernel_5x2_dilated": dict(kernel=(5, 2), dilation=(2, 3), size=(11, 6)),
    "kernel_covers_whole_input": dict(kernel=(3, 4), size=(3, 4), padding=(0, 0), dilation=(1, 1)),
    "stride_skips_input_rows": dict(kernel=(1, 2), stride=(3, 4), padding=(0, 0), size=(8, 9)),
    "padding_larger_than_kernel": dict(kernel=(2, 1), padding=(3, 2), size=(2, 2)),
    "output_1x1": dict(kernel=(3, 3), stride=(5, 5), padding=(1, 1), dilation=(1, 1), size=(2, 2)),
    "channels_last_input_and_weight": dict(input_layout="channels_last",
                                           weight_layout="channels_last", batch=3),
    "transposed_input": dict(input_layout="transposed", batch=2),
    "sliced_input_and_grad": dict(input_layout="sliced", grad_layout="sliced", batch=2),
    "expanded_input_and_grad": dict(input_layout="expanded", grad_layout="expanded", batch=3),
    "no_bias": dict(bias=False),
    "one_channel_in_and_out": dict(in_channels=1, out_channels=1, groups=1),
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_conv2d_matches_torch_on_edge_cases(device, dtype, case, rng, gen, seed):
    cfg = random_conv2d_config(rng, **EDGE_CASES[case])
    ctx = f"seed={seed} {device} {dtype} case={case} {cfg}"
    run_conv2d_case(cfg, device, dtype, gen, ctx)


# Each of conv2d's internal routes (see ops/conv2d/conv2d.h), pinned.
_POINTWISE = dict(kernel=(1, 1), stride=(1, 1), padding=(0, 0), size=(8, 16))  # L = 128
_LARGE_PLANE = dict(kernel=(3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1), size=(32, 33))
ROUTE_CASES = {
    # 1x1, stride 1, no padding, planes of >= 128: GEMMs straight on the NCHW tensors.
    "pointwise": dict(_POINTWISE, kind="plain", batch=3),
    "pointwise_grouped_more_images_than_groups": dict(_POINTWISE, kind="grouped", batch=3, groups=2),
    "pointwise_grouped_more_groups_than_images": dict(_POINTWISE, groups=4, in_channels=8,
                                                      out_channels=4, batch=2),
    "pointwise_strided_takes_columns": dict(kernel=(1, 1), stride=(2, 2), padding=(0, 0)),
    "pointwise_small_plane_takes_columns": dict(_POINTWISE, kind="grouped", size=(7, 7), batch=3),
    # One image: its one GEMM in place at any plane size.
    "pointwise_small_plane_one_image": dict(_POINTWISE, kind="plain", size=(5, 7), batch=1),
    # Planes of one position (squeeze-and-excitation on pooled data), NCHW and
    # channels_last at once: the pointwise GEMM over the images.
    "pointwise_one_position_planes": dict(_POINTWISE, kind="plain", size=(1, 1), batch=5),
    # Output planes of >= 1024 positions: per-image columns.
    "large_plane": dict(_LARGE_PLANE, kind="plain", batch=2),
    "large_plane_more_images_than_groups": dict(_LARGE_PLANE, groups=2, in_channels=4,
                                                out_channels=2, batch=3),
    "large_plane_more_groups_than_images": dict(_LARGE_PLANE, groups=3, in_channels=3,
                                                out_channels=6, batch=2),
    "large_plane_unbatched": dict(_LARGE_PLANE, kind="plain", batch=None),
    # Small planes, n*L >= 1024: on a GPU the weight gradient splits its
    # reduction into slices (odd length: the last slice takes a remainder).
    "sliced_weight_gradient": dict(kernel=(3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1),
                                   size=(19, 21), kind="plain", batch=3),
    # groups == C_in: the depthwise kernels.
    "depthwise_multiplier2": dict(kind="depthwise", groups=3, in_channels=3, out_channels=6),
}


@pytest.mark.parametrize("case", sorted(ROUTE_CASES))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_conv2d_matches_torch_on_each_route(device, dtype, case, rng, gen, seed):
    cfg = random_conv2d_config(rng, **ROUTE_CASES[case])
    ctx = f"seed={seed} {device} {dtype} route={case} {cfg}"
    run_conv2d_case(cfg, device, dtype, gen, ctx)


@cuda
@pytest.mark.parametrize("shape", ["3x3", "1x1"])
def test_conv2d_float32_follows_pytorchs_tf32_policy_for_convolutions(shape, gen):
    # Like F.conv2d, float32 GEMMs use TF32 exactly when cuDNN's convolutions
    # may (torch.backends.cudnn.allow_tf32; conv.fp32_precision in the new API),
    # so swapping nn.Conv2d for ours keeps the precision class.
    k = 3 if shape == "3x3" else 1
    x = make_tensor((4, 64, 40, 40), torch.float32, "cuda", gen=gen)
    w = make_tensor((64, 64, k, k), torch.float32, "cuda", gen=gen)
    ref = F.conv2d(x.double(), w.double(), padding=k // 2)
    scale = F.conv2d(x.double().abs(), w.double().abs(), padding=k // 2)

    def rel_err(out):
        return ((out.double() - ref).abs() / scale).max().item()

    errors = {}
    saved = torch.backends.cudnn.allow_tf32
    try:
        for mode in ("ieee", "tf32"):
            torch.backends.cudnn.allow_tf32 = mode == "tf32"
            ours = ops.conv2d(x, w, None, [1, 1], [k // 2] * 2, [1, 1], 1)
            theirs = F.conv2d(x, w, padding=k // 2)
            errors[mode] = (rel_err(ours), rel_err(theirs))
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    (ieee_ours, ieee_torch), (tf32_ours, tf32_torch) = errors["ieee"], errors["tf32"]
    assert ieee_ours < 1e-5, errors  # float32 arithmetic
    assert tf32_ours > 1e-5, errors  # TF32 (10-bit mantissa) arithmetic
    assert tf32_ours < 4 * tf32_torch + 1e-6, errors


@pytest.mark.parametrize("need", [("x",), ("w",), ("b",), ("x", "b"), ("w", "b"), ()])
@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_gradients_only_of_inputs_that_require_grad(device, need, rng, gen, seed):
    cfg = random_conv2d_config(rng, bias=True, batch=2)
    ctx = f"seed={seed} {device} requires_grad={need} {cfg}"
    run_conv2d_case(cfg, device, torch.float64, gen, ctx, need=need)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_accepts_schema_defaults_and_single_int_pairs(device, gen):
    x = make_tensor((2, 4, 7, 6), torch.float64, device, gen=gen)
    w = make_tensor((6, 4, 3, 2), torch.float64, device, gen=gen)
    wg = make_tensor((6, 2, 3, 2), torch.float64, device, gen=gen)  # for groups=2
    b = make_tensor((6,), torch.float64, device, gen=gen)
    xr, wr, wgr, br = (t.cpu() for t in (x, w, wg, b))
    cases = [
        (ops.conv2d(x, w), F.conv2d(xr, wr)),
        (ops.conv2d(x, w, b), F.conv2d(xr, wr, br)),
        (ops.conv2d(x, w, None, 2), F.conv2d(xr, wr, None, 2)),
        (ops.conv2d(x, w, b, [2], [1], [2]), F.conv2d(xr, wr, br, 2, 1, 2)),
        (ops.conv2d(x, wg, b, padding=[1, 0], groups=2), F.conv2d(xr, wgr, br, 1, (1, 0), 1, 2)),
        (ops.conv2d(x, wg, b, dilation=2, groups=2), F.conv2d(xr, wgr, br, dilation=2, groups=2)),
        (customconv.conv2d(x, wg, b, padding="same", dilation=(2, 1), groups=2),
         F.conv2d(xr, wgr, br, padding="same", dilation=(2, 1), groups=2)),
        (customconv.conv2d(x, wg, b, 2, "valid", 1, 2), F.conv2d(xr, wgr, br, 2, "valid", 1, 2)),
        (customconv.conv2d(x, w, b, (1, 2), (0, 1)), F.conv2d(xr, wr, br, (1, 2), (0, 1))),
    ]
    for i, (got, want) in enumerate(cases):
        assert got.shape == want.shape, f"case {i}: {tuple(got.shape)} vs {tuple(want.shape)}"
        torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=1e-12, msg=f"case {i}")


@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_under_inference_mode_and_no_grad_matches_torch(device, gen):
    x = make_tensor((3, 4, 6, 6), torch.float64, device, "channels_last", gen, True)
    w = make_tensor((4, 2, 3, 3), torch.float64, device, gen=gen, requires_grad=True)
    want = F.conv2d(x.detach().cpu(), w.detach().cpu(), None, 1, 1, 1, 2)
    check_under_no_grad_and_inference_mode(
        lambda: ops.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 2), want)


CHUNKED_SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.nn.functional as F
    import customconv
    device = sys.argv[1]
    torch.set_num_threads(2)
    torch.manual_seed(int(sys.argv[2]))
    # ~0.4 MiB of columns per image with a 1 MiB workspace: chunks of 2 images
    # (and a last chunk of 1); the second case needs more than the limit per
    # image, so every chunk holds one image; the third, channels_last (the
    # CPU's gathered rows, forward and weight gradient), ~0.3 MiB per image;
    # the fourth, channels_last with stride 1 (the CPU's shifted taps, forward
    # and weight gradient), ~0.34 MiB of padded plane per image: chunks of 3.
    for n, c, k, hw, fmt, st, dil in [(5, 3, 6, 40, torch.contiguous_format, [1, 2], [2, 1]),
                                      (3, 8, 16, 48, torch.contiguous_format, [1, 2], [2, 1]),
                                      (4, 16, 8, 24, torch.channels_last, [1, 2], [2, 1]),
                                      (5, 16, 8, 40, torch.channels_last, [1, 1], [1, 1])]:
        x = torch.randn(n, c, hw, hw, dtype=torch.float64, device=device)
        x = x.contiguous(memory_format=fmt).requires_grad_()
        w = torch.randn(k, c, 3, 3, dtype=torch.float64, device=device, requires_grad=True)
        b = torch.randn(k, dtype=torch.float64, device=device, requires_grad=True)
        out = torch.ops.customconv.conv2d(x, w, b, st, [1, 1], dil, 1)
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, (x, w, b), g)
        xr, wr, br = (t.detach().cpu().requires_grad_() for t in (x, w, b))
        ref = F.conv2d(xr, wr, br, st, 1, dil)
        rgrads = torch.autograd.grad(ref, (xr, wr, br), g.cpu())
        for name, a, e in zip(("output", "grad_input", "grad_weight", "grad_bias"),
                              (out,) + grads, (ref,) + rgrads):
            torch.testing.assert_close(a.detach().cpu(), e.detach(), rtol=1e-10, atol=1e-10,
                                       msg=lambda m: f"{name} (n={n}, c={c}, k={k}): {m}")
    print("ok")
    """
)


@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_matches_torch_when_the_workspace_limit_splits_the_batch(device, seed):
    # Two intra-op threads: this case is large enough for the parallel CPU kernels.
    env = dict(os.environ, CUSTOMCONV_WORKSPACE_MB="1", OMP_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, "-c", CHUNKED_SCRIPT, device, str(seed)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, (
        f"seed={seed} device={device}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    )


@cuda
def test_ops_capture_into_a_cuda_graph_and_replay_with_new_inputs(gen):
    # Every kernel must launch on the current stream (capture fails on the
    # legacy default stream) and allocate nothing outside PyTorch's allocator.
    dt = torch.float64
    x = make_tensor((2, 4, 9, 8), dt, "cuda", gen=gen)
    w = make_tensor((6, 2, 3, 2), dt, "cuda", gen=gen)
    b = make_tensor((6,), dt, "cuda", gen=gen)
    go = make_tensor((2, 6, 5, 6), dt, "cuda", gen=gen)
    args = ([2, 1], [1, 0], [1, 2], 2)

    def step(x, go):
        out = ops.conv2d(x, w, b, *args)
        cols = ops.im2col(out, [2, 2], [1, 1], [0, 0], [1, 1])
        img = ops.col2im(cols, [5, 6], [2, 2], [1, 1], [0, 0], [1, 1])
        return (out, img, ops.conv2d_grad_input(go, x, w, *args),
                ops.conv2d_grad_weight(go, x, w, *args), ops.conv2d_grad_bias(go))

    results, _graph = capture_and_replay(lambda: step(x, go), (x, go), gen)
    for i, (got, want) in enumerate(zip(results, step(x, go))):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m: f"result {i}: {m}")
    xr, wr, br = (t.cpu().requires_grad_() for t in (x, w, b))
    ref = F.conv2d(xr, wr, br, (2, 1), (1, 0), (1, 2), 2)
    torch.testing.assert_close(results[0].cpu(), ref.detach(), rtol=1e-10, atol=1e-10)
    gx, gw, gb = torch.autograd.grad(ref, (xr, wr, br), go.cpu())
    for got, want in zip(results[2:], (gx, gw, gb)):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
