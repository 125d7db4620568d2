"""customconv::conv2d_fused == activation(F.conv2d(input, weight, bias, ...) + residual):
every activation, with and without bias and residual, every device and dtype, NCHW
and channels_last, dense, 1x1, strided, grouped and depthwise layers (the routes
with the epilogue in the kernel and the ones without), against the unfused
composition of PyTorch's ops in float64; gradients by gradcheck in float64; bad
arguments refused with errors that name them."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from testlib import DEVICE_DTYPES, DEVICES, capture_and_replay, cuda, f64, make_tensor, ops, sync, tolerance_factor

ACTIVATIONS = ("identity", "relu", "relu6", "silu", "hardswish", "gelu", "sigmoid")

REFERENCE = {
    "identity": lambda x: x,
    "relu": torch.relu,
    "relu6": F.relu6,
    "silu": F.silu,
    "hardswish": F.hardswish,
    "gelu": F.gelu,
    "sigmoid": torch.sigmoid,
}

# name -> (N, C, H, W, K, kernel, stride, padding, dilation, groups). Channel
# counts are multiples of 8, so that channels_last 16-bit cases reach the GPU's
# implicit GEMMs (whose epilogue applies the activation and the residual); the
# 1x1 and small-plane cases take their split reduction, "large-plane" the
# direct epilogue, "wide" whole and partial channel blocks of the CPU's direct
# kernel; "grouped" merges groups into 32-channel groups; "grouped-8"
# does not merge (direct kernels, then the epilogue as a second pass).
GEOMETRIES = {
    "3x3": (2, 16, 9, 10, 32, (3, 3), 1, 1, 1, 1),
    "1x1": (2, 32, 8, 8, 64, (1, 1), 1, 0, 1, 1),
    "strided": (2, 16, 11, 12, 24, (3, 3), 2, 1, 1, 1),
    "large-plane": (4, 16, 64, 64, 32, (3, 3), 1, 1, 1, 1),
    "wide": (2, 16, 10, 11, 80, (3, 3), 1, 1, 1, 1),  # a whole 64-channel block and a part
    "dilated-rect": (1, 8, 12, 13, 16, (2, 3), 1, (1, 2), (2, 1), 1),
    "grouped": (2, 64, 8, 9, 64, (3, 3), 1, 1, 1, 2),
    "grouped-8": (2, 24, 7, 7, 24, (3, 3), 1, 1, 1, 3),
    "depthwise": (2, 16, 10, 9, 16, (3, 3), 1, 1, 1, 16),
    "depthwise-m2-strided": (2, 8, 11, 10, 16, (5, 5), 2, 2, 1, 8),
    "stem": (2, 3, 16, 16, 16, (7, 7), 2, 3, 1, 1),
}


def make_case(geometry, device, dtype, layout, bias, residual, gen, requires_grad=False):
    n, c, h, w, k, ks, stride, padding, dilation, groups = GEOMETRIES[geometry]
    x = make_tensor((n, c, h, w), dtype, device, layout, gen, requires_grad)
    wt = make_tensor((k, c // groups) + ks, dtype, device, layout, gen, requires_grad)
    b = make_tensor((k,), dtype, device, "contiguous", gen, requires_grad) if bias else None
    args = dict(stride=[stride] * 2 if isinstance(stride, int) else list(stride),
                padding=[padding] * 2 if isinstance(padding, int) else list(padding),
                dilation=[dilation] * 2 if isinstance(dilation, int) else list(dilation),
                groups=groups)
    out_shape = F.conv2d(x.detach()[:, :, :, :].to("cpu", torch.float64), f64(wt), None,
                         **args).shape
    r = make_tensor(out_shape, dtype, device, layout, gen, requires_grad) if residual else None
    return x, wt, b, r, args


def reference(x, wt, b, r, args, activation):
    """The unfused composition in float64, and the same on absolute values (the
    error bound of the convolution's sum)."""
    pre = F.conv2d(f64(x), f64(wt), f64(b), **args)
    bound = F.conv2d(f64(x).abs(), f64(wt).abs(), None if b is None else f64(b).abs(), **args)
    if r is not None:
        pre = pre + f64(r)
        bound = bound + f64(r).abs()
    return REFERENCE[activation](pre), bound


def check(out, expected, bound, dtype, reduction, ctx, tf32=False):
    assert out.dtype == dtype, ctx
    assert tuple(out.shape) == tuple(expected.shape), ctx
    # Every activation's slope is at most 1.5 (hardswish at 3); the output is
    # rounded once more to the dtype.
    tol = tolerance_factor(dtype, reduction)
    if tf32:
        tol = max(tol, 4 * (2.0**-11 + reduction * 2.0**-24))
    allowed = tol * (1.5 * bound + expected.abs()) + 1e-300
    err = (f64(out) - expected).abs()
    assert torch.isfinite(f64(out)).all(), ctx
    worst = (err / allowed).max().item()
    assert worst <= 1.0, f"{ctx}: error {worst:.3g} of the tolerance"


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_conv2d_fused_matches_the_unfused_composition(device, dtype, geometry, layout, gen):
    for activation, (bias, residual) in itertools.product(
            ACTIVATIONS, [(True, False), (True, True), (False, True), (False, False)]):
        x, wt, b, r, args = make_case(geometry, device, dtype, layout, bias, residual, gen)
        out = ops.conv2d_fused(x, wt, b, args["stride"], args["padding"], args["dilation"],
                               args["groups"], activation, r)
        sync(device)
        expected, bound = reference(x, wt, b, r, args, activation)
        reduction = wt.shape[1] * wt.shape[2] * wt.shape[3] + 2
        ctx = f"{geometry} {layout} {dtype} {activation} bias={bias} residual={residual}"
        check(out, expected, bound, dtype, reduction, ctx)
        # F.conv2d's memory format rule.
        want_cl = layout == "channels_last"
        assert out.is_contiguous(memory_format=torch.channels_last if want_cl
                                 else torch.contiguous_format), ctx


@cuda
@pytest.mark.parametrize("geometry", ["3x3", "1x1", "large-plane", "grouped", "strided"])
def test_conv2d_fused_float32_under_tf32_on_cuda(geometry, gen):
    """float32 with TF32 allowed takes the tensor-core kernels and their epilogue."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        for activation in ACTIVATIONS:
            x, wt, b, r, args = make_case(geometry, "cuda", torch.float32, "channels_last",
                                          True, activation in ("relu", "silu", "identity"), gen)
            out = ops.conv2d_fused(x, wt, b, args["stride"], args["padding"], args["dilation"],
                                   args["groups"], activation, r)
            expected, bound = reference(x, wt, b, r, args, activation)
            reduction = wt.shape[1] * wt.shape[2] * wt.shape[3] + 2
            check(out, expected, bound, torch.float32, reduction, f"{geometry} {activation}",
                  tf32=True)
    finally:
        torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_fused_unbatched_and_empty(device, gen):
    x = make_tensor((8, 6, 7), torch.float32, device, "contiguous", gen)
    wt = make_tensor((8, 8, 3, 3), torch.float32, device, "contiguous", gen)
    r = make_tensor((8, 4, 5), torch.float32, device, "contiguous", gen)
    out = ops.conv2d_fused(x, wt, None, [1, 1], [0, 0], [1, 1], 1, "silu", r)
    expected = F.silu(F.conv2d(f64(x), f64(wt)) + f64(r))
    torch.testing.assert_close(f64(out), expected, rtol=1e-5, atol=1e-5)
    empty = make_tensor((0, 8, 6, 7), torch.float32, device, "contiguous", gen)
    out = ops.conv2d_fused(empty, wt, None, [1, 1], [1, 1], [1, 1], 1, "relu", None)
    assert out.shape == (0, 8, 6, 7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_conv2d_fused_gradcheck(device, activation, gen):
    for geometry, layout in (("strided", "contiguous"), ("depthwise", "channels_last")):
        n, c, h, w, k, ks, stride, padding, dilation, groups = GEOMETRIES[geometry]
        # Small sizes for gradcheck's numerical Jacobian.
        x = make_tensor((1, c, 5, 6), torch.float64, device, layout, gen, True)
        wt = make_tensor((k, c // groups) + ks, torch.float64, device, layout, gen, True)
        b = make_tensor((k,), torch.float64, device, "contiguous", gen, True)
        out_shape = F.conv2d(x.detach(), wt.detach(), None, stride, padding, dilation,
                             groups).shape
        r = make_tensor(out_shape, torch.float64, device, layout, gen, True)

        def fn(x, wt, b, r):
            return ops.conv2d_fused(x, wt, b, [stride] * 2, [padding] * 2, [dilation] * 2,
                                    groups, activation, r)

        assert torch.autograd.gradcheck(fn, (x, wt, b, r), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_fused_grad_and_no_grad_agree(device, gen):
    """The training route (convolution, then the activation as an ATen op)
    gives the inference route's values."""
    x, wt, b, r, args = make_case("3x3", device, torch.float32, "channels_last", True, True, gen)
    call = lambda: ops.conv2d_fused(x, wt, b, args["stride"], args["padding"],  # noqa: E731
                                    args["dilation"], args["groups"], "gelu", r)
    with torch.no_grad():
        a = call()
    wt.requires_grad_(True)
    out = call()
    assert out.requires_grad
    torch.testing.assert_close(out.detach(), a, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert wt.grad is not None and torch.isfinite(wt.grad).all()


@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_fused_refuses_bad_arguments(device, gen):
    x = make_tensor((2, 4, 6, 6), torch.float32, device, "contiguous", gen)
    wt = make_tensor((8, 4, 3, 3), torch.float32, device, "contiguous", gen)
    good = make_tensor((2, 8, 4, 4), torch.float32, device, "contiguous", gen)
    call = lambda act="relu", r=None: ops.conv2d_fused(  # noqa: E731
        x, wt, None, [1, 1], [0, 0], [1, 1], 1, act, r)
    call(r=good)
    with pytest.raises(RuntimeError, match=r"activation must be one of .*got \"tanh\""):
        call("tanh")
    with pytest.raises(RuntimeError, match=r"activation must be one of"):
        call("")
    with pytest.raises(RuntimeError, match=r"conv2d_fused: residual has shape"):
        call(r=good[:, :, :3])
    with pytest.raises(RuntimeError, match=r"conv2d_fused: residual has shape"):
        call(r=good[:1])
    with pytest.raises(RuntimeError, match=r"conv2d_fused: residual"):
        call(r=good.double())
    with pytest.raises(RuntimeError, match=r"conv2d_fused: residual"):
        call(r=good[0])
    with pytest.raises(RuntimeError, match=r"conv2d_fused: .*weight"):
        ops.conv2d_fused(x, wt[:, :3], None, [1, 1], [0, 0], [1, 1], 1, "relu", None)
    if device == "cuda":
        with pytest.raises(RuntimeError, match=r"conv2d_fused: residual"):
            call(r=good.cpu())
    # Meta (fake) kernels refuse the same way.
    with pytest.raises(RuntimeError, match=r"activation must be one of"):
        ops.conv2d_fused(x.to("meta"), wt.to("meta"), None, [1, 1], [0, 0], [1, 1], 1, "tanh",
                         None)
    with pytest.raises(RuntimeError, match=r"conv2d_fused: residual has shape"):
        ops.conv2d_fused(x.to("meta"), wt.to("meta"), None, [1, 1], [0, 0], [1, 1], 1, "relu",
                         good[:, :2].to("meta"))


@cuda
def test_conv2d_fused_captures_in_a_cuda_graph(gen):
    x, wt, b, r, args = make_case("large-plane", "cuda", torch.float16, "channels_last", True,
                                  True, gen)
    call = lambda: ops.conv2d_fused(x, wt, b, args["stride"], args["padding"],  # noqa: E731
                                    args["dilation"], args["groups"], "silu", r)
    expected = call()
    (out,), _graph = capture_and_replay(lambda: (call(),), [x], gen)
    torch.testing.assert_close(out, call(), rtol=0, atol=0)
    assert not torch.equal(out, expected)


# Depthwise geometries that reach each CUDA depthwise kernel (ops/correlation/
# README.md), where the activation is applied as the sums are stored:
# (N, C, H, W, kernel, stride, padding, dilation, dtype).
DEPTHWISE_ROUTES = {
    "tensor-core-f16-7x7": (2, 8, 64, 64, 7, 1, 3, 1, torch.float16),
    "tensor-core-bf16-5x5": (2, 8, 32, 64, 5, 1, 2, 1, torch.bfloat16),
    "streamed-tile-f32-7x7": (1, 16, 512, 512, 7, 1, 3, 1, torch.float32),
    "staged-tile-f32-7x7": (1, 4, 128, 256, 7, 1, 3, 1, torch.float32),
    "shared-taps-f32-7x7": (2, 32, 56, 56, 7, 1, 3, 1, torch.float32),
    "register-blocked-f32-5x5-small-planes": (2, 96, 7, 7, 5, 1, 2, 1, torch.float32),
    "register-blocked-f16-3x3-s2": (2, 16, 28, 30, 3, 2, 1, 1, torch.float16),
    "register-blocked-f64-3x3": (2, 8, 14, 15, 3, 1, 1, 1, torch.float64),
    "large-kernel-f32-13x13": (1, 8, 56, 56, 13, 1, 6, 1, torch.float32),
    "large-kernel-f16-31x31": (1, 8, 56, 56, 31, 1, 15, 1, torch.float16),
    "tiled-dilated-strided": (2, 8, 20, 21, 3, 3, 2, 2, torch.float32),
    "tiled-f64-7x7": (1, 8, 20, 20, 7, 1, 3, 1, torch.float64),
    "direct-81x81": (1, 2, 90, 90, 81, 1, 40, 1, torch.float32),
}


@cuda
@pytest.mark.parametrize("route", sorted(DEPTHWISE_ROUTES))
def test_conv2d_fused_depthwise_kernels_apply_the_activation(route, gen):
    n, c, h, w, k, stride, padding, dilation, dtype = DEPTHWISE_ROUTES[route]
    for activation, layout in zip(ACTIVATIONS, ["contiguous", "channels_last"] * 4):
        x = make_tensor((n, c, h, w), dtype, "cuda", layout, gen)
        wt = make_tensor((c, 1, k, k), dtype, "cuda", "contiguous", gen)
        b = make_tensor((c,), dtype, "cuda", "contiguous", gen)
        args = dict(stride=[stride] * 2, padding=[padding] * 2, dilation=[dilation] * 2,
                    groups=c)
        out = ops.conv2d_fused(x, wt, b, args["stride"], args["padding"], args["dilation"], c,
                               activation, None)
        expected, bound = reference(x, wt, b, None, args, activation)
        check(out, expected, bound, dtype, k * k + 1, f"{route} {activation} {layout}")
