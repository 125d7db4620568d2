"""The bad-input corpus: with the cases of test_errors.py, at least 30
malformed or extreme calls per op (its backward ops counted with it), each
with a stated outcome.

- ERRORS: a RuntimeError naming the op and the argument (also from the meta
  kernels where marked), after which the device still gives right results.
  Absurd sizes included: strides and dilations up to 2**63 - 1, outputs that
  overflow 64 bits, outputs of more than 2**31 elements too large to allocate
  (the allocator's error, nothing written), wrong devices (meta next to CPU;
  CPU next to CUDA in test_errors.py), wrong grad shapes for the backward ops.
- ODD_VALUES: valid calls on odd data that must give the reference's values:
  NaN and Inf in every tensor, zero-size dims, zero-stride (expanded)
  tensors, and geometries where almost every tap falls on the padding
  (dilation 2**40 with padding 2**40, stride 2**63 - 1).
- META_SHAPES: outputs of more than 2**31 elements computed by the meta
  kernels (64-bit shape arithmetic), without allocating them.
- WRAPPER_ERRORS: the Python wrappers' ValueErrors.

`python3 tests/python/test_bad_input_corpus.py` prints the count per op.
"""

import collections
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import customconv
from test_errors import (
    CASES as BASIC_CASES,
    MIXED_DEVICE_CASES,
    check_raises_and_device_stays_usable,
    col2im,
    conv,
    depthwise,
    depthwise_grad,
    filter2d,
    grad_op,
    im2col,
    kernel_too_large,
    t,
    trilinear,
    trilinear_backward,
)
from testlib import (
    DEVICES,
    ConvConfig,
    FilterConfig,
    TrilinearConfig,
    assert_matches,
    check_against_reference,
    conv2d_reductions,
    conv2d_reference,
    f64,
    filter2d_reductions,
    filter2d_reference,
    make_points,
    make_tensor,
    ops,
    sync,
    trilinear_reductions,
    trilinear_reference,
)

F32, F64 = torch.float32, torch.float64
I64_MAX = 2**63 - 1
BIG = 2**40
# An output too large for any machine (2**48 bytes, more than a 47-bit address
# space, so even an overcommitting allocator refuses it).
UNALLOCATABLE = r"(can't allocate memory|out of memory|tried to allocate)"

OPS = ("conv2d", "im2col", "col2im", "depthwise_conv2d", "filter2d", "trilinear_interpolation")


def family(case: str) -> str:
    """The op a case belongs to (a backward op belongs to its forward op)."""
    name = case.split("-")[0]
    for op in sorted(OPS, key=len, reverse=True):
        if name.startswith(op):
            return op
    raise AssertionError(f"case {case!r} names no op")


def autograd_grad(out_fn, wrong_grad_shape):
    """torch.autograd.grad of out_fn()'s output with a grad_output of the wrong shape."""
    out, inputs = out_fn()
    return torch.autograd.grad(out, inputs, torch.ones(wrong_grad_shape, device=out.device))


def double_backward(out_fn):
    """Differentiates a gradient of out_fn()'s output a second time."""
    out, inputs = out_fn()
    grads = torch.autograd.grad(out, inputs, torch.randn_like(out), create_graph=True)
    return torch.autograd.grad(sum(g.sum() for g in grads), inputs)


def leaves(device, *shapes):
    return [t(device, *s).requires_grad_() for s in shapes]


def conv_out(device):
    x, w = leaves(device, (2, 4, 5, 5), (6, 2, 3, 3))
    return ops.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 2), (x, w)


def depthwise_out(device):
    x, w = leaves(device, (2, 4, 5, 5), (8, 1, 3, 3))
    return ops.depthwise_conv2d(x, w, None, [1, 1], [1, 1], [1, 1]), (x, w)


def depthwise_bias_out(device):
    x, w, b = leaves(device, (2, 4, 5, 5), (8, 1, 3, 3), (8,))
    return ops.depthwise_conv2d(x, w, b, [1, 1], [1, 1], [1, 1]), (w, b)


def filter2d_out(device):
    x, k = leaves(device, (2, 5, 6), (3, 3))
    return ops.filter2d(x, k, "reflect"), (x, k)


def trilinear_out(device):
    f, p = leaves(device, (4, 8, 5), (4, 3))
    return ops.trilinear_interpolation(f, p), (f, p)


def im2col_out(device):
    (x,) = leaves(device, (2, 3, 6, 6))
    return ops.im2col(x, [2, 2], [1, 1], [0, 0], [1, 1]), (x,)


def col2im_out(device):
    (c,) = leaves(device, (2, 12, 25))
    return ops.col2im(c, [6, 6], [2, 2], [1, 1], [0, 0], [1, 1]), (c,)


DOUBLE_BACKWARD = r"double backward \(differentiating a gradient of this op\) is not supported"
GRAD_SHAPE = r"Mismatch in shape: grad_output\[0\] has a shape of"

# name -> (call(device), regex the message must match, whether the meta kernels raise it too).
ERRORS = {
    # ---------------------------------------------------------------- conv2d
    "conv2d-input-0-dims": (lambda d: conv(d, x=()), r"conv2d: input must have 3 or 4 dims; got 0",
                            True),
    "conv2d-weight-0-dims": (lambda d: conv(d, w=()), r"conv2d: weight must have 4 dims; got 0", True),
    "conv2d-stride-int64-max-and-negative": (
        lambda d: conv(d, stride=(I64_MAX, -1)), r"conv2d: stride must be positive", True),
    "conv2d-stride-0-values": (lambda d: conv(d, stride=()),
                               r"conv2d: stride must be a list of 2 integers", True),
    "conv2d-padding-int64-min": (lambda d: conv(d, padding=(-(2**63), 0)),
                                 r"conv2d: padding must be non-negative", True),
    "conv2d-dilation-2**62-negative": (lambda d: conv(d, dilation=(-(2**62), 1)),
                                       r"conv2d: dilation must be positive", True),
    "conv2d-kernel-larger-than-input-both-axes": (
        lambda d: conv(d, x=(2, 4, 2, 2), w=(6, 2, 3, 3), padding=(0, 0)),
        kernel_too_large("conv2d", 3, "height"), True),
    "conv2d-empty-plane-without-padding": (
        lambda d: conv(d, x=(2, 4, 0, 5), padding=(0, 0)), kernel_too_large("conv2d", 3, "height"),
        True),
    "conv2d-weight-empty-kernel": (lambda d: conv(d, w=(6, 2, 0, 3)),
                                   r"conv2d: kernel_size must be positive; got \(0, 3\)", True),
    "conv2d-groups-int64-max": (lambda d: conv(d, groups=I64_MAX),
                                r"conv2d: groups \(9223372036854775807\) must divide the input", True),
    "conv2d-float16-input-bfloat16-weight": (
        lambda d: conv(d, xdt=torch.float16, wdt=torch.bfloat16, bdt=torch.float16),
        r"conv2d: weight has dtype BFloat16 but input has dtype Half", True),
    "conv2d-weight-on-meta": (
        lambda d: ops.conv2d(t(d, 2, 4, 5, 5), t("meta", 6, 4, 3, 3)),
        r"conv2d: weight is on meta but input is on (cpu|cuda)", False),
    "conv2d-bias-on-meta": (
        lambda d: ops.conv2d(t(d, 2, 4, 5, 5), t(d, 6, 4, 3, 3), t("meta", 6)),
        r"conv2d: bias is on meta but input is on (cpu|cuda)", False),
    "conv2d-output-too-large-to-allocate": (
        lambda d: conv(d, x=(1, 1, 1, 1), w=(1, 1, 1, 1), b=None, padding=(2**22, 2**22), groups=1),
        UNALLOCATABLE, False),
    "conv2d_grad_input-grad-output-float16": (
        lambda d: grad_op("conv2d_grad_input", d, godt=torch.float16),
        r"conv2d_grad_input: grad_output has dtype Half but input has dtype Float", True),
    "conv2d_grad_input-grad-output-unbatched-for-batched-input": (
        lambda d: grad_op("conv2d_grad_input", d, go=(6, 5, 5)),
        r"conv2d_grad_input: grad_output must have 4 dims; got 3", True),
    "conv2d_grad_input-grad-output-on-meta": (
        lambda d: ops.conv2d_grad_input(t("meta", 2, 6, 5, 5), t(d, 2, 4, 5, 5), t(d, 6, 2, 3, 3),
                                        [1, 1], [1, 1], [1, 1], 2),
        r"conv2d_grad_input: grad_output is on meta but input is on (cpu|cuda)", False),
    "conv2d_grad_weight-grad-output-wrong-width": (
        lambda d: grad_op("conv2d_grad_weight", d, go=(2, 6, 5, 6)),
        r"conv2d_grad_weight: grad_output has shape \[2, 6, 5, 6\]", True),
    "conv2d_grad_weight-padding-negative": (
        lambda d: grad_op("conv2d_grad_weight", d, padding=(-1, 1)),
        r"conv2d_grad_weight: padding must be non-negative", True),
    "conv2d_grad_bias-grad-output-5-dims": (
        lambda d: ops.conv2d_grad_bias(t(d, 1, 2, 6, 5, 5)),
        r"conv2d_grad_bias: grad_output must have 3 or 4 dims; got 5", True),
    "conv2d-autograd-grad-output-wrong-shape": (
        lambda d: autograd_grad(lambda: conv_out(d), (2, 6, 5, 4)), GRAD_SHAPE, False),
    "conv2d-double-backward": (lambda d: double_backward(lambda: conv_out(d)),
                               r"customconv::conv2d_grad_(input|weight): " + DOUBLE_BACKWARD, False),
    # ---------------------------------------------------------------- im2col
    "im2col-input-0-dims": (lambda d: im2col(d, x=()), r"im2col: input must have 3 or 4 dims; got 0",
                            True),
    "im2col-input-1-dim": (lambda d: im2col(d, x=(6,)), r"im2col: input must have 3 or 4 dims; got 1",
                           True),
    "im2col-kernel-negative": (lambda d: im2col(d, kernel=(-1, 2)),
                               r"im2col: kernel_size must be positive; got \(-1, 2\)", True),
    "im2col-kernel-0-values": (lambda d: im2col(d, kernel=()),
                               r"im2col: kernel_size must be a list of 2 integers", True),
    "im2col-stride-negative": (lambda d: im2col(d, stride=(-1, 1)), r"im2col: stride must be positive",
                               True),
    "im2col-stride-int64-min": (lambda d: im2col(d, stride=(1, -(2**63))),
                                r"im2col: stride must be positive", True),
    "im2col-padding-3-values": (lambda d: im2col(d, padding=(0, 0, 0)),
                                r"im2col: padding must be a list of 2 integers", True),
    "im2col-padding-2**62-too-large": (lambda d: im2col(d, padding=(2**62, 0)),
                                       r"im2col: padding .* is too large", True),
    "im2col-dilation-negative": (lambda d: im2col(d, dilation=(1, -3)),
                                 r"im2col: dilation must be positive", True),
    "im2col-dilation-3-values": (lambda d: im2col(d, dilation=(1, 1, 1)),
                                 r"im2col: dilation must be a list of 2 integers", True),
    "im2col-dilation-int64-max-overflows": (
        lambda d: im2col(d, dilation=(I64_MAX, 1)), r"im2col: dilation \* \(kernel_size - 1\)", True),
    "im2col-kernel-2**40-larger-than-input": (
        lambda d: im2col(d, kernel=(BIG, 1)), kernel_too_large("im2col", BIG, "height"), True),
    "im2col-kernel-area-overflows": (
        lambda d: im2col(d, x=(1, 1, 1, 1), kernel=(2**32, 2**32), padding=(2**31, 2**31)),
        r"im2col: the output size overflows 64-bit", False),
    "im2col-empty-plane-without-padding": (
        lambda d: im2col(d, x=(2, 3, 0, 6)), kernel_too_large("im2col", 2, "height"), True),
    "im2col-bool-dtype": (lambda d: im2col(d, dtype=torch.bool),
                          r"im2col: input must be float32, float64, float16 or bfloat16; got Bool",
                          True),
    "im2col-complex-dtype": (
        lambda d: im2col(d, dtype=torch.complex64),
        r"im2col: input must be float32, float64, float16 or bfloat16; got ComplexFloat", True),
    "im2col-int8-dtype": (lambda d: im2col(d, dtype=torch.int8),
                          r"im2col: input must be float32, float64, float16 or bfloat16; got Char",
                          True),
    "im2col-output-too-large-to-allocate": (
        lambda d: im2col(d, x=(1, 1, 1, 1), kernel=(1, 1), padding=(2**22, 2**22)), UNALLOCATABLE,
        False),
    "im2col-autograd-grad-output-wrong-shape": (
        lambda d: autograd_grad(lambda: im2col_out(d), (2, 12, 24)), GRAD_SHAPE, False),
    # ---------------------------------------------------------------- col2im
    "col2im-columns-0-dims": (lambda d: col2im(d, c=()),
                              r"col2im: columns must have 2 or 3 dims; got 0", True),
    "col2im-output-size-negative": (lambda d: col2im(d, size=(6, -6)),
                                    r"col2im: output_size must be positive; got \(6, -6\)", True),
    "col2im-output-size-0-values": (lambda d: col2im(d, size=()),
                                    r"col2im: output_size must be a list of 2 integers", True),
    "col2im-output-size-2**40-positions-overflow": (
        lambda d: col2im(d, c=(1, 1, 1), size=(BIG, BIG), kernel=(1, 1)),
        r"col2im: columns.size\(2\) is 1 but output_size \(1099511627776, 1099511627776\) .* has "
        r"1099511627776 x 1099511627776 window positions", True),
    "col2im-kernel-negative": (lambda d: col2im(d, kernel=(2, -2)),
                               r"col2im: kernel_size must be positive", True),
    "col2im-kernel-3-values": (lambda d: col2im(d, kernel=(2, 2, 1)),
                               r"col2im: kernel_size must be a list of 2 integers", True),
    "col2im-stride-negative": (lambda d: col2im(d, stride=(1, -1)), r"col2im: stride must be positive",
                               True),
    "col2im-padding-2**62-too-large": (lambda d: col2im(d, padding=(0, 2**62)),
                                       r"col2im: padding .* is too large", True),
    "col2im-dilation-zero": (lambda d: col2im(d, dilation=(0, 1)), r"col2im: dilation must be positive",
                             True),
    "col2im-dilation-int64-max-overflows": (
        lambda d: col2im(d, dilation=(1, I64_MAX)), r"col2im: dilation \* \(kernel_size - 1\)", True),
    "col2im-dilation-2**40-larger-than-output": (
        lambda d: col2im(d, dilation=(BIG, 1)), kernel_too_large("col2im", BIG + 1, "height"), True),
    "col2im-length-zero": (lambda d: col2im(d, c=(2, 12, 0)),
                           r"col2im: columns.size\(2\) is 0 but output_size \(6, 6\)", True),
    "col2im-bool-dtype": (lambda d: col2im(d, dtype=torch.bool),
                          r"col2im: columns must be float32, float64, float16 or bfloat16; got Bool",
                          True),
    "col2im-output-too-large-to-allocate": (
        lambda d: ops.col2im(t(d, 1, 1, 1).expand(1, 1, 2**46), [2**23, 2**23], [1, 1], [1, 1],
                             [0, 0], [1, 1]), UNALLOCATABLE, False),
    "col2im-autograd-grad-output-wrong-shape": (
        lambda d: autograd_grad(lambda: col2im_out(d), (2, 3, 6, 5)), GRAD_SHAPE, False),
    # ---------------------------------------------------------------- depthwise_conv2d
    "depthwise_conv2d-input-0-dims": (lambda d: depthwise(d, x=()),
                                      r"depthwise_conv2d: input must have 3 or 4 dims; got 0", True),
    "depthwise_conv2d-stride-int64-min": (lambda d: depthwise(d, stride=(-(2**63), 1)),
                                          r"depthwise_conv2d: stride must be positive", True),
    "depthwise_conv2d-dilation-int64-max-overflows": (
        lambda d: depthwise(d, dilation=(1, I64_MAX)),
        r"depthwise_conv2d: dilation \* \(kernel_size - 1\)", True),
    "depthwise_conv2d-padding-2**62-too-large": (
        lambda d: depthwise(d, padding=(2**62, 2**62)), r"depthwise_conv2d: padding .* is too large",
        True),
    "depthwise_conv2d-weight-empty-kernel": (
        lambda d: depthwise(d, w=(8, 1, 3, 0)),
        r"depthwise_conv2d: kernel_size must be positive; got \(3, 0\)", True),
    "depthwise_conv2d-empty-plane-without-padding": (
        lambda d: depthwise(d, x=(2, 4, 5, 0), padding=(0, 0)),
        kernel_too_large("depthwise_conv2d", 3, "width"), True),
    "depthwise_conv2d-weight-on-meta": (
        lambda d: ops.depthwise_conv2d(t(d, 2, 4, 5, 5), t("meta", 8, 1, 3, 3)),
        r"depthwise_conv2d: weight is on meta but input is on (cpu|cuda)", False),
    "depthwise_conv2d-output-too-large-to-allocate": (
        lambda d: depthwise(d, x=(1, 1, 1, 1), w=(1, 1, 1, 1), b=None, padding=(2**22, 2**22)),
        UNALLOCATABLE, False),
    "depthwise_conv2d_grad_input-grad-output-on-meta": (
        lambda d: ops.depthwise_conv2d_grad_input(t("meta", 2, 8, 5, 5), t(d, 2, 4, 5, 5),
                                                  t(d, 8, 1, 3, 3), [1, 1], [1, 1], [1, 1]),
        r"depthwise_conv2d_grad_input: grad_output is on meta but input is on (cpu|cuda)", False),
    "depthwise_conv2d_grad_weight-grad-output-float16": (
        lambda d: depthwise_grad("depthwise_conv2d_grad_weight", d, godt=torch.float16),
        r"depthwise_conv2d_grad_weight: grad_output has dtype Half but input has dtype Float", True),
    "depthwise_conv2d-autograd-grad-output-wrong-shape": (
        lambda d: autograd_grad(lambda: depthwise_out(d), (2, 8, 5)), GRAD_SHAPE, False),
    "depthwise_conv2d-double-backward": (
        lambda d: double_backward(lambda: depthwise_out(d)),
        r"customconv::depthwise_conv2d_grad_(input|weight): " + DOUBLE_BACKWARD, False),
    "depthwise_conv2d-with-bias-double-backward": (
        lambda d: double_backward(lambda: depthwise_bias_out(d)),
        r"customconv::depthwise_conv2d_grad_weight_bias: " + DOUBLE_BACKWARD, False),
    # ---------------------------------------------------------------- filter2d
    "filter2d-kernel-0-dims": (lambda d: filter2d(d, k=()), r"filter2d: kernel must have 2 dims; got 0",
                               True),
    "filter2d-kernel-zero-width": (
        lambda d: filter2d(d, k=(3, 0)), r"filter2d: kernel sizes must be odd; got \(3, 0\)", True),
    "filter2d-border-with-trailing-space": (lambda d: filter2d(d, border="zeros "),
                                            r'filter2d: border must be one of .*; got "zeros "', True),
    "filter2d-border-padding-mode-name": (lambda d: filter2d(d, border="constant"),
                                          r'filter2d: border must be one of .*; got "constant"', True),
    "filter2d-border-with-nul": (lambda d: filter2d(d, border="zeros\0"),
                                 r"filter2d: border must be one of", True),
    "filter2d-reflect-on-empty-plane": (
        lambda d: filter2d(d, x=(2, 0, 6), border="reflect"),
        r"filter2d: border 'reflect' needs the padding \(1, 1\)", True),
    "filter2d-circular-on-empty-plane": (
        lambda d: filter2d(d, x=(2, 6, 0), border="circular"),
        r"filter2d: border 'circular' needs the padding \(1, 1\)", True),
    "filter2d-bool-dtype": (
        lambda d: filter2d(d, xdt=torch.bool, kdt=torch.bool),
        r"filter2d: input must be float32, float64, float16 or bfloat16; got Bool", True),
    "filter2d-kernel-on-meta": (
        lambda d: ops.filter2d(t(d, 2, 5, 6), t("meta", 3, 3)),
        r"filter2d: kernel is on meta but input is on (cpu|cuda)", False),
    "filter2d-output-too-large-to-allocate": (
        lambda d: ops.filter2d(t(d, 1, 1).expand(2**23, 2**23), t(d, 1, 1)), UNALLOCATABLE, False),
    "filter2d_grad_input-grad-output-1-dim": (
        lambda d: ops.filter2d_grad_input(t(d, 6), t(d, 3, 3), "zeros"),
        r"filter2d_grad_input: grad_output must have at least 2 dims", True),
    "filter2d_grad_input-kernel-float64": (
        lambda d: ops.filter2d_grad_input(t(d, 2, 5, 6), t(d, 3, 3, dtype=F64), "zeros"),
        r"filter2d_grad_input: kernel has dtype Double but grad_output has dtype Float", True),
    "filter2d_grad_kernel-unknown-border": (
        lambda d: ops.filter2d_grad_kernel(t(d, 2, 5, 6), t(d, 2, 5, 6), t(d, 3, 3), "wrap"),
        r'filter2d_grad_kernel: border must be one of .*; got "wrap"', True),
    "filter2d_grad_kernel-kernel-even": (
        lambda d: ops.filter2d_grad_kernel(t(d, 2, 5, 6), t(d, 2, 5, 6), t(d, 4, 3), "zeros"),
        r"filter2d_grad_kernel: kernel sizes must be odd; got \(4, 3\)", True),
    "filter2d_grad_kernel-grad-output-on-meta": (
        lambda d: ops.filter2d_grad_kernel(t("meta", 2, 5, 6), t(d, 2, 5, 6), t(d, 3, 3), "zeros"),
        r"filter2d_grad_kernel: grad_output is on meta but input is on (cpu|cuda)", False),
    "filter2d-autograd-grad-output-wrong-shape": (
        lambda d: autograd_grad(lambda: filter2d_out(d), (2, 6, 5)), GRAD_SHAPE, False),
    "filter2d-double-backward": (
        lambda d: double_backward(lambda: filter2d_out(d)),
        r"customconv::filter2d_grad_(input|kernel): " + DOUBLE_BACKWARD, False),
    # ---------------------------------------------------------------- trilinear_interpolation
    "trilinear_interpolation-feats-0-dims": (
        lambda d: trilinear(d, feats=()), r"trilinear_interpolation: feats must have 3 dims; got 0",
        True),
    "trilinear_interpolation-points-3-dims": (
        lambda d: trilinear(d, points=(4, 3, 1)),
        r"trilinear_interpolation: points must have 2 dims; got 3", True),
    "trilinear_interpolation-points-0-coordinates": (
        lambda d: trilinear(d, points=(4, 0)),
        r"trilinear_interpolation: points must be \(N, 3\); got shape \[4, 0\]", True),
    "trilinear_interpolation-feats-0-corners": (
        lambda d: trilinear(d, feats=(4, 0, 5)),
        r"trilinear_interpolation: feats must be \(N, 8, F\)", True),
    "trilinear_interpolation-empty-feats-nonempty-points": (
        lambda d: trilinear(d, feats=(0, 8, 5), points=(4, 3)),
        r"trilinear_interpolation: feats has 0 cubes but points has 4 points", True),
    "trilinear_interpolation-bool-dtype": (
        lambda d: trilinear(d, fdt=torch.bool, pdt=torch.bool),
        r"trilinear_interpolation: feats must be float32, float64, float16 or bfloat16; got Bool",
        True),
    "trilinear_interpolation-points-bfloat16": (
        lambda d: trilinear(d, pdt=torch.bfloat16),
        r"trilinear_interpolation: points has dtype BFloat16 but feats has dtype Float", True),
    "trilinear_interpolation-points-on-meta": (
        lambda d: ops.trilinear_interpolation(t(d, 4, 8, 5), t("meta", 4, 3)),
        r"trilinear_interpolation: points is on meta but feats is on (cpu|cuda)", False),
    "trilinear_interpolation-output-too-large-to-allocate": (
        lambda d: ops.trilinear_interpolation(t(d, 1, 1, 1).expand(2**23, 8, 2**23),
                                              t(d, 1, 1).expand(2**23, 3)), UNALLOCATABLE, False),
    "trilinear_interpolation_backward-grad-output-wrong-n": (
        lambda d: trilinear_backward(d, go=(5, 5)),
        r"trilinear_interpolation_backward: grad_output has shape \[5, 5\] but the output is "
        r"\(4, 5\)", True),
    "trilinear_interpolation_backward-grad-output-on-meta": (
        lambda d: ops.trilinear_interpolation_backward(t("meta", 4, 5), t(d, 4, 8, 5), t(d, 4, 3)),
        r"trilinear_interpolation_backward: grad_output is on meta but feats is on (cpu|cuda)", False),
    "trilinear_interpolation_backward-feats-7-corners": (
        lambda d: trilinear_backward(d, feats=(4, 7, 5)),
        r"trilinear_interpolation_backward: feats must be \(N, 8, F\)", True),
    "trilinear_interpolation-autograd-grad-output-wrong-shape": (
        lambda d: autograd_grad(lambda: trilinear_out(d), (4, 6)), GRAD_SHAPE, False),
    "trilinear_interpolation-double-backward": (
        lambda d: double_backward(lambda: trilinear_out(d)),
        r"customconv::trilinear_interpolation_backward: " + DOUBLE_BACKWARD, False),
}

assert not set(ERRORS) & set(BASIC_CASES), set(ERRORS) & set(BASIC_CASES)


def corpus_param(case):
    """The case as a test parameter; those that must fail to allocate are marked
    `unallocatable` (compute-sanitizer reports each refused allocation as an
    API error, so its runs leave them out)."""
    marks = [pytest.mark.unallocatable] if ERRORS[case][1] is UNALLOCATABLE else []
    return pytest.param(case, marks=marks)


@pytest.mark.parametrize("case", [corpus_param(c) for c in sorted(ERRORS)])
@pytest.mark.parametrize("device", DEVICES)
def test_malformed_call_raises_a_clear_error_and_leaves_the_device_usable(device, case):
    call, message, _ = ERRORS[case]
    check_raises_and_device_stays_usable(lambda: call(device), message, device, case)


@pytest.mark.parametrize("case", sorted(c for c, (_, _, meta) in ERRORS.items() if meta))
def test_meta_kernels_raise_the_same_errors_on_the_corpus(case):
    call, message, _ = ERRORS[case]
    with pytest.raises(RuntimeError, match=message):
        call("meta")


# ---------------------------------------------------------------- odd but valid values


def nonfinite(shape, dtype, device, gen, fraction=0.1, layout="contiguous"):
    """Random values with NaN, +Inf and -Inf at a `fraction` of the places."""
    def sprinkle(v):
        mask = torch.rand(v.shape, generator=gen, dtype=F64) < fraction
        pick = torch.randint(0, 3, v.shape, generator=gen)
        specials = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=F64)
        return torch.where(mask, specials[pick], v)

    return make_tensor(shape, dtype, device, layout, gen, requires_grad=True, map_values=sprinkle)


def assert_matches_where_both_finite(got, expected, bound, dtype, reduction, what, ctx):
    """For NaN / Inf in a weight or kernel tap: where that tap meets zeros
    rather than data (the zero padding, or the zeros between the samples of
    a strided grad output that an input gradient correlates), 0 * NaN is NaN
    in F.conv2d's and F.pad's reference, while a kernel that skips such taps
    gives the finite sum of the others, and one that multiplies them gives
    NaN where the reference (which skips the strided zeros) does not. So:
    wherever both are finite, `got` matches the reference; and the
    non-finite values do not vanish altogether."""
    g = f64(got)
    keep = torch.isfinite(g) & torch.isfinite(expected) & torch.isfinite(bound)
    assert_matches(torch.where(keep, g, 0.0).to(dtype), torch.where(keep, expected, 0.0),
                   torch.where(keep, bound, 0.0), dtype, reduction, what, ctx)
    if not bool(torch.isfinite(expected).all()):
        assert not bool(torch.isfinite(g).all()), f"{what}: NaN / Inf vanished [{ctx}]"


CONV = ConvConfig(batch=2, in_channels=4, out_channels=8, groups=2, kernel=(3, 2), stride=(2, 1),
                  padding=(1, 1), dilation=(1, 2), size=(7, 6), bias=True)
DEPTHWISE = ConvConfig(batch=2, in_channels=3, out_channels=6, groups=3, kernel=(3, 3),
                       stride=(1, 2), padding=(1, 1), dilation=(2, 1), size=(8, 7), bias=True)

# Stride 1, dilation 1, "same" padding: the register-blocked CUDA kernels,
# with widths that do not (14) and do (16) take vectors.
DEPTHWISE_SAME_3X3 = dataclasses.replace(DEPTHWISE, stride=(1, 1), dilation=(1, 1),
                                         size=(29, 14))
DEPTHWISE_SAME_5X5 = dataclasses.replace(DEPTHWISE, kernel=(5, 5), stride=(1, 1),
                                         padding=(2, 2), dilation=(1, 1), size=(20, 16))


def conv_call(op, cfg):
    stride, padding, dilation, groups = cfg.args()
    if op == "conv2d":
        return lambda input, weight, bias: ops.conv2d(input, weight, bias, stride, padding,
                                                      dilation, groups)
    return lambda input, weight, bias: ops.depthwise_conv2d(input, weight, bias, stride, padding,
                                                            dilation)


def run_conv(op, cfg, device, dtype, gen, ctx, make=None, reference_cfg=None):
    """op (conv2d or depthwise_conv2d) on cfg, forward and backward, against
    F.conv2d on reference_cfg (default cfg: the same geometry). `make(name,
    shape)` makes the tensor arguments (default: random, in cfg's layouts)."""
    make = make or (lambda name, shape: make_tensor(shape, dtype, device, "contiguous", gen, True))
    x = make("input", cfg.input_shape)
    w = make("weight", cfg.weight_shape)
    b = make("bias", (cfg.out_channels,)) if cfg.bias else None
    ref_cfg = reference_cfg or cfg
    return check_against_reference(conv_call(op, cfg), dict(input=x, weight=w, bias=b),
                                   lambda g: conv2d_reference(ref_cfg, x, w, b, g),
                                   conv2d_reductions(cfg), dtype, device, gen, ctx)


def conv_nonfinite_input(op, cfg):
    def case(device, dtype, gen, ctx):
        x = nonfinite(cfg.input_shape, dtype, device, gen)
        w = make_tensor(cfg.weight_shape, dtype, device, gen=gen, requires_grad=True)
        b = make_tensor((cfg.out_channels,), dtype, device, gen=gen, requires_grad=True)
        modes = dict(output="inf_or_nan", grad_input="inf_or_nan", grad_weight="inf_or_nan",
                     grad_bias="inf_or_nan")
        check_against_reference(conv_call(op, cfg), dict(input=x, weight=w, bias=b),
                                lambda g: conv2d_reference(cfg, x, w, b, g), conv2d_reductions(cfg),
                                dtype, device, gen, ctx, nonfinite=modes)
    return case


def conv_nonfinite_weight(op, cfg):
    def case(device, dtype, gen, ctx):
        x = make_tensor(cfg.input_shape, dtype, device, gen=gen, requires_grad=True)
        w = nonfinite(cfg.weight_shape, dtype, device, gen, fraction=0.05)
        out = conv_call(op, cfg)(x, w, None)
        g = make_tensor(out.shape, dtype, device, gen=gen)
        gx, gw = torch.autograd.grad(out, (x, w), g)
        sync(device)
        ref = conv2d_reference(cfg, x, w, None, g)
        red = conv2d_reductions(cfg)
        for name, got in (("output", out), ("grad_input", gx), ("grad_weight", gw)):
            assert_matches_where_both_finite(got, *ref[name], dtype, red[name], name, ctx)
    return case


def conv_with(op, cfg, **changes):
    """A run_conv case on cfg with fields replaced."""
    new = dataclasses.replace(cfg, **changes)
    return lambda device, dtype, gen, ctx: run_conv(op, new, device, dtype, gen, ctx)


def conv_expanded(op, cfg):
    """Every tensor argument expanded from one element (all strides 0)."""
    def case(device, dtype, gen, ctx):
        def make(name, shape):
            one = make_tensor((1,) * len(shape), dtype, device, gen=gen)
            return one.expand(shape).requires_grad_()
        run_conv(op, cfg, device, dtype, gen, ctx, make)
    return case


def conv_far_taps(op, cfg, stride=None, dilation=None):
    """Padding and dilation 2**40 (only the middle tap of 3 meets the input)
    or stride 2**63 - 1 (one output position): the reference uses small values
    with the same effect."""
    huge, small = {}, {}
    if dilation:
        huge.update(kernel=(3, 3), padding=(dilation, dilation), dilation=(dilation, dilation))
        reach = max(cfg.size) + 1
        small.update(kernel=(3, 3), padding=(reach, reach), dilation=(reach, reach))
    if stride:
        huge.update(stride=(stride, stride))
        small.update(stride=(max(cfg.size) + 8, max(cfg.size) + 8))
    big_cfg, ref_cfg = dataclasses.replace(cfg, **huge), dataclasses.replace(cfg, **small)

    def case(device, dtype, gen, ctx):
        run_conv(op, big_cfg, device, dtype, gen, ctx, reference_cfg=ref_cfg)
    return case


def conv_no_output_channels():
    """conv2d with a weight of no output channels: an empty output (F.conv2d
    refuses such a weight), a zero input gradient, an empty weight gradient."""
    def case(device, dtype, gen, ctx):
        x = make_tensor((2, 4, 5, 5), dtype, device, gen=gen, requires_grad=True)
        w = make_tensor((0, 4, 3, 3), dtype, device, gen=gen, requires_grad=True)
        out = ops.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1)
        assert out.shape == (2, 0, 5, 5), ctx
        gx, gw = torch.autograd.grad(out, (x, w), torch.ones_like(out))
        assert gw.shape == w.shape and torch.equal(gx, torch.zeros_like(x)), ctx
    return case


def conv_empty_channels():
    """conv2d with no input channels: every output is the bias (an empty sum
    plus the bias; F.conv2d returns an empty tensor of the wrong shape here)."""
    def case(device, dtype, gen, ctx):
        x = make_tensor((2, 0, 5, 5), dtype, device, gen=gen, requires_grad=True)
        w = make_tensor((3, 0, 3, 3), dtype, device, gen=gen, requires_grad=True)
        b = make_tensor((3,), dtype, device, gen=gen, requires_grad=True)
        out = ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1)
        assert out.shape == (2, 3, 5, 5), ctx
        torch.testing.assert_close(out, b[None, :, None, None].expand(out.shape).detach())
        gx, gw, gb = torch.autograd.grad(out, (x, w, b), torch.ones_like(out))
        assert gx.shape == x.shape and gw.shape == w.shape, ctx
        torch.testing.assert_close(gb, torch.full_like(gb, 50))
    return case


def conv_empty_plane_with_padding(op):
    """An empty (0-row) plane with padding: the output reads padding only, so
    it is the bias (F.conv2d refuses empty planes; F.pad + F.conv2d agree)."""
    def case(device, dtype, gen, ctx):
        x = make_tensor((2, 3, 0, 4), dtype, device, gen=gen, requires_grad=True)
        w = make_tensor((3 if op == "depthwise_conv2d" else 5, 1 if op == "depthwise_conv2d" else 3,
                         1, 3), dtype, device, gen=gen, requires_grad=True)
        b = make_tensor((w.shape[0],), dtype, device, gen=gen, requires_grad=True)
        call = conv_call(op, ConvConfig(2, 3, w.shape[0], 3 if op == "depthwise_conv2d" else 1,
                                        (1, 3), (1, 1), (1, 1), (1, 1), (0, 4), True))
        out = call(x, w, b)
        groups = 3 if op == "depthwise_conv2d" else 1
        ref = F.conv2d(F.pad(f64(x), (1, 1, 1, 1)), f64(w), f64(b), groups=groups)
        assert out.shape == ref.shape, (out.shape, ref.shape, ctx)
        torch.testing.assert_close(f64(out), ref)
        gx, gw, gb = torch.autograd.grad(out, (x, w, b), torch.ones_like(out))
        assert gx.shape == x.shape, ctx
        torch.testing.assert_close(f64(gw), torch.zeros_like(f64(gw)))
    return case


def with_channels(fn, x, rows):
    """fn(x) in float64, also for x with no channels (F.unfold and F.fold
    refuse those): then fn of one channel of `rows` rows, sliced to none."""
    if x.shape[1] > 0:
        return fn(x)
    return fn(torch.zeros((x.shape[0], rows) + tuple(x.shape[2:]), dtype=F64))[:, :0]


def window_case(op, kernel=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), size=(7, 6),
                batch=2, channels=3, ref_geometry=None, values=False, grad_values=False,
                expand=False):
    """im2col (op "im2col") or col2im ("col2im") on a geometry, forward and
    backward, against F.unfold / F.fold on ref_geometry (default: the same).
    With `values` / `grad_values` the argument / grad_output holds NaN and
    Inf; with `expand` the argument is one element expanded (strides 0)."""
    geometry = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation)
    ref = dict(geometry, **(ref_geometry or {}))
    taps = kernel[0] * kernel[1]
    unfold = lambda x: with_channels(lambda v: F.unfold(v, **ref), x, 1)  # noqa: E731
    fold = lambda c: with_channels(lambda v: F.fold(v, size, **ref), c, taps)  # noqa: E731

    def case(device, dtype, gen, ctx):
        image = (batch, channels) + size
        shape = image if op == "im2col" else unfold(torch.zeros(image, dtype=F64)).shape
        if expand:
            arg = make_tensor((1,) * len(shape), dtype, device, gen=gen).expand(shape)
            arg = arg.requires_grad_()
        elif values:
            arg = nonfinite(shape, dtype, device, gen)
        else:
            arg = make_tensor(shape, dtype, device, "sliced", gen, requires_grad=True)
        a = [list(v) for v in (kernel, stride, padding, dilation)]
        out = ops.im2col(arg, *a) if op == "im2col" else ops.col2im(arg, list(size), *a)
        g = nonfinite(out.shape, dtype, device, gen) if grad_values else \
            make_tensor(out.shape, dtype, device, gen=gen)
        (grad,) = torch.autograd.grad(out, arg, g.detach())
        sync(device)
        x64, g64 = f64(arg), f64(g)
        finite = lambda v: v.abs().nan_to_num(0.0, 0.0, 0.0)  # noqa: E731
        mode = "inf_or_nan" if values or grad_values else None
        if op == "im2col":  # output: a copy; gradient: a sum
            copies = (("output", out, unfold(x64)),)
            sums = (("grad_input", grad, fold(g64), fold(finite(g64))),)
        else:
            copies = (("grad_columns", grad, unfold(g64)),)
            sums = (("output", out, fold(x64), fold(finite(x64))),)
        for what, got, want in copies:
            torch.testing.assert_close(f64(got), want, rtol=0, atol=0, equal_nan=True,
                                       msg=lambda m: f"{what} [{ctx}]: {m}")
        for what, got, want, bound in sums:
            assert_matches(got, want, bound, dtype, taps, what, ctx, device, mode)
    return case


def filter2d_case(border, size=(6, 5), kernel=(3, 5), lead=(2,), input_values=False,
                  kernel_values=False, expand=False):
    cfg = FilterConfig(lead=lead, size=size, kernel=kernel, border=border)

    def case(device, dtype, gen, ctx):
        if expand:
            x = make_tensor((1,) * len(cfg.input_shape), dtype, device, gen=gen)
            x = x.expand(cfg.input_shape).requires_grad_()
            k = make_tensor((1, 1), dtype, device, gen=gen).expand(cfg.kernel).requires_grad_()
        else:
            x = (nonfinite(cfg.input_shape, dtype, device, gen) if input_values
                 else make_tensor(cfg.input_shape, dtype, device, gen=gen, requires_grad=True))
            k = (nonfinite(cfg.kernel, dtype, device, gen, fraction=0.1) if kernel_values
                 else make_tensor(cfg.kernel, dtype, device, gen=gen, requires_grad=True))
        call = lambda input, kernel: ops.filter2d(input, kernel, border)  # noqa: E731
        if kernel_values:
            out = call(x, k)
            g = make_tensor(out.shape, dtype, device, gen=gen)
            gx, gk = torch.autograd.grad(out, (x, k), g)
            sync(device)
            ref = filter2d_reference(cfg, x, k, g)
            red = filter2d_reductions(cfg)
            for name, got in (("output", out), ("grad_input", gx), ("grad_kernel", gk)):
                assert_matches_where_both_finite(got, *ref[name], dtype, red[name], name, ctx)
            return
        modes = None
        if input_values:
            modes = dict(output="inf_or_nan", grad_input="inf_or_nan", grad_kernel="inf_or_nan")
        check_against_reference(call, dict(input=x, kernel=k),
                                lambda g: filter2d_reference(cfg, x, k, g),
                                filter2d_reductions(cfg), dtype, device, gen, ctx,
                                nonfinite=modes)
    return case


def filter2d_empty_plane(border, size):
    """An empty plane (the reference's reshape refuses it): an empty output,
    a zero kernel gradient (a sum over nothing)."""
    def case(device, dtype, gen, ctx):
        x = make_tensor((2,) + size, dtype, device, gen=gen, requires_grad=True)
        k = make_tensor((3, 5), dtype, device, gen=gen, requires_grad=True)
        out = ops.filter2d(x, k, border)
        assert out.shape == x.shape, ctx
        gx, gk = torch.autograd.grad(out, (x, k), torch.ones_like(out))
        assert gx.shape == x.shape and torch.equal(gk, torch.zeros_like(k)), ctx
    return case


def trilinear_case(n=40, features=7, points="inside", feats_values=False, points_values=False,
                   expand=False, scale=None):
    cfg = TrilinearConfig(n=n, features=features, points=points)

    def case(device, dtype, gen, ctx):
        if expand:
            feats = make_tensor((1, 1, 1), dtype, device, gen=gen).expand(cfg.feats_shape)
            pts = make_tensor((1, 1), dtype, device, gen=gen, uniform=(-1, 1)).expand(n, 3)
            feats, pts = feats.requires_grad_(), pts.requires_grad_()
        else:
            feats = (nonfinite(cfg.feats_shape, dtype, device, gen, fraction=0.05) if feats_values
                     else make_tensor(cfg.feats_shape, dtype, device, gen=gen, requires_grad=True))
            pts = (nonfinite((n, 3), dtype, device, gen) if points_values
                   else make_points(cfg, dtype, device, gen, requires_grad=True))
        if scale:
            pts = (pts.detach() * scale).requires_grad_()
        modes = None
        if feats_values or points_values or scale:
            modes = dict(output="inf_or_nan", grad_feats="inf_or_nan", grad_points="inf_or_nan")
        check_against_reference(ops.trilinear_interpolation, dict(feats=feats, points=pts),
                                lambda g: trilinear_reference(feats, pts, g),
                                trilinear_reductions(features), dtype, device, gen, ctx,
                                nonfinite=modes)
    return case


# name -> case(device, dtype, gen, ctx), each run in float32 and float64.
ODD_VALUES = {
    "conv2d-nan-inf-in-input": conv_nonfinite_input("conv2d", CONV),
    "conv2d-nan-inf-in-weight": conv_nonfinite_weight("conv2d", CONV),
    "conv2d-batch-0": conv_with("conv2d", CONV, batch=0),
    "conv2d-no-output-channels": conv_no_output_channels(),
    "conv2d-no-input-channels": conv_empty_channels(),
    "conv2d-empty-plane-with-padding": conv_empty_plane_with_padding("conv2d"),
    "conv2d-every-tensor-expanded": conv_expanded("conv2d", CONV),
    "conv2d-padding-and-dilation-2**40": conv_far_taps("conv2d", CONV, dilation=BIG),
    "conv2d-stride-int64-max": conv_far_taps("conv2d", CONV, stride=I64_MAX),
    "conv2d-stride-2**40-dilation-2**40": conv_far_taps("conv2d", CONV, stride=BIG, dilation=BIG),
    "im2col-nan-inf-in-input": window_case("im2col", values=True),
    "im2col-nan-inf-in-grad-output": window_case("im2col", grad_values=True),
    "im2col-batch-0": window_case("im2col", batch=0),
    "im2col-no-channels": window_case("im2col", channels=0),
    "im2col-input-expanded": window_case("im2col", expand=True),
    "im2col-padding-and-dilation-2**40": window_case(
        "im2col", kernel=(3, 3), padding=(BIG, BIG), dilation=(BIG, BIG),
        ref_geometry=dict(padding=(8, 8), dilation=(8, 8))),
    "im2col-stride-int64-max": window_case("im2col", stride=(I64_MAX, I64_MAX),
                                           ref_geometry=dict(stride=(16, 16))),
    "col2im-nan-inf-in-columns": window_case("col2im", values=True),
    "col2im-nan-inf-in-grad-output": window_case("col2im", grad_values=True),
    "col2im-batch-0": window_case("col2im", batch=0),
    "col2im-no-channels": window_case("col2im", channels=0),
    "col2im-columns-expanded": window_case("col2im", expand=True),
    "col2im-padding-and-dilation-2**40": window_case(
        "col2im", kernel=(3, 3), padding=(BIG, BIG), dilation=(BIG, BIG),
        ref_geometry=dict(padding=(8, 8), dilation=(8, 8))),
    "col2im-stride-int64-max": window_case("col2im", stride=(I64_MAX, I64_MAX),
                                           ref_geometry=dict(stride=(16, 16))),
    "depthwise_conv2d-nan-inf-in-input": conv_nonfinite_input("depthwise_conv2d", DEPTHWISE),
    "depthwise_conv2d-nan-inf-in-weight": conv_nonfinite_weight("depthwise_conv2d", DEPTHWISE),
    "depthwise_conv2d-nan-inf-in-input-3x3-same": conv_nonfinite_input(
        "depthwise_conv2d", DEPTHWISE_SAME_3X3),
    "depthwise_conv2d-nan-inf-in-input-5x5-same-width16": conv_nonfinite_input(
        "depthwise_conv2d", DEPTHWISE_SAME_5X5),
    "depthwise_conv2d-batch-0": conv_with("depthwise_conv2d", DEPTHWISE, batch=0),
    "depthwise_conv2d-empty-plane-with-padding": conv_empty_plane_with_padding("depthwise_conv2d"),
    "depthwise_conv2d-every-tensor-expanded": conv_expanded("depthwise_conv2d", DEPTHWISE),
    "depthwise_conv2d-padding-and-dilation-2**40": conv_far_taps("depthwise_conv2d", DEPTHWISE,
                                                                 dilation=BIG),
    "depthwise_conv2d-stride-int64-max": conv_far_taps("depthwise_conv2d", DEPTHWISE,
                                                       stride=I64_MAX),
    "depthwise_conv2d-stride-2**40-dilation-2**40": conv_far_taps(
        "depthwise_conv2d", DEPTHWISE, stride=BIG, dilation=BIG),
    "filter2d-nan-inf-in-input-reflect": filter2d_case("reflect", input_values=True),
    "filter2d-nan-inf-in-input-circular": filter2d_case("circular", input_values=True),
    "filter2d-nan-inf-in-kernel-zeros": filter2d_case("zeros", kernel_values=True),
    "filter2d-nan-inf-in-kernel-replicate": filter2d_case("replicate", kernel_values=True),
    "filter2d-empty-leading-dim": filter2d_case("reflect", lead=(3, 0)),
    "filter2d-empty-plane-zeros": filter2d_empty_plane("zeros", (0, 5)),
    "filter2d-empty-plane-replicate": filter2d_empty_plane("replicate", (4, 0)),
    "filter2d-input-and-kernel-expanded": filter2d_case("circular", expand=True),
    "filter2d-kernel-larger-than-plane-zeros": filter2d_case("zeros", size=(2, 3), kernel=(31, 31)),
    "trilinear_interpolation-nan-inf-in-feats": trilinear_case(feats_values=True),
    "trilinear_interpolation-nan-inf-in-points": trilinear_case(points_values=True),
    "trilinear_interpolation-points-1e12-outside": trilinear_case(scale=1e12),
    "trilinear_interpolation-n-0": trilinear_case(n=0),
    "trilinear_interpolation-f-0": trilinear_case(features=0),
    "trilinear_interpolation-expanded": trilinear_case(expand=True),
}


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", sorted(ODD_VALUES))
@pytest.mark.parametrize("device", DEVICES)
def test_odd_but_valid_input_gives_the_reference_values(device, case, dtype, gen, seed):
    ODD_VALUES[case](device, dtype, gen, f"seed={seed} {case} {device} {dtype}")
    sync(device)


# ---------------------------------------------------------------- meta shapes past 2**31


def meta(*shape):
    return torch.empty(shape, device="meta")


# name -> (call() on meta tensors, expected output shape)
META_SHAPES = {
    "conv2d-output-of-2**33-elements": (
        lambda: ops.conv2d(meta(2, 3, 2**15, 2**15), meta(4, 3, 3, 3), None, [1, 1], [1, 1], [1, 1], 1),
        (2, 4, 2**15, 2**15)),
    "conv2d_grad_weight-of-2**36-element-input": (
        lambda: ops.conv2d_grad_weight(meta(16, 8, 2**14, 2**14), meta(16, 16, 2**14, 2**14),
                                       meta(8, 16, 1, 1), [1, 1], [0, 0], [1, 1], 1), (8, 16, 1, 1)),
    "im2col-output-of-2**36-elements": (
        lambda: ops.im2col(meta(1, 4, 2**15, 2**15), [2, 2], [1, 1], [1, 1], [1, 1]),
        (1, 16, (2**15 + 1) ** 2)),
    "col2im-output-of-2**32-elements": (
        lambda: ops.col2im(meta(1, 4, 2**32), [2**16, 2**16], [1, 1], [1, 1], [0, 0], [1, 1]),
        (1, 4, 2**16, 2**16)),
    "depthwise_conv2d-output-of-2**34-elements": (
        lambda: ops.depthwise_conv2d(meta(1, 8, 2**15, 2**15), meta(16, 1, 3, 3), None, [1, 1],
                                     [1, 1], [1, 1]), (1, 16, 2**15, 2**15)),
    "filter2d-output-of-2**34-elements": (
        lambda: ops.filter2d(meta(16, 2**15, 2**15), meta(3, 3), "reflect"), (16, 2**15, 2**15)),
    "trilinear_interpolation-output-of-2**33-elements": (
        lambda: ops.trilinear_interpolation(meta(2**27, 8, 64), meta(2**27, 3)), (2**27, 64)),
}


@pytest.mark.parametrize("case", sorted(META_SHAPES))
def test_meta_kernels_give_shapes_past_2_31_elements(case):
    call, shape = META_SHAPES[case]
    out = call()
    assert out.device.type == "meta" and tuple(out.shape) == shape, (case, out.shape)


# ---------------------------------------------------------------- the Python wrappers

WRAPPER_ERRORS = {
    "conv2d-functional-padding-full": (
        lambda d: customconv.conv2d(t(d, 1, 2, 5, 5), t(d, 3, 2, 3, 3), padding="full"),
        r"padding must be 'valid', 'same' or integers; got 'full'"),
    "conv2d-functional-same-with-stride-2": (
        lambda d: customconv.conv2d(t(d, 1, 2, 5, 5), t(d, 3, 2, 3, 3), stride=2, padding="same"),
        r"padding='same' needs stride 1"),
    "depthwise_conv2d-functional-padding-full": (
        lambda d: customconv.depthwise_conv2d(t(d, 1, 2, 5, 5), t(d, 2, 1, 3, 3), padding="full"),
        r"padding must be 'valid', 'same' or integers"),
    "depthwise_conv2d-module-groups-not-channels": (
        lambda d: customconv.nn.DepthwiseConv2d(3, 6, 3, groups=1),
        r"DepthwiseConv2d: groups must equal in_channels \(3\)"),
    "depthwise_conv2d-module-out-channels-not-multiple": (
        lambda d: customconv.nn.DepthwiseConv2d(3, 5, 3),
        r"out_channels \(5\) must be a multiple of in_channels \(3\)"),
    "filter2d-module-kernel-3-dims": (
        lambda d: customconv.nn.Filter2d(t(d, 1, 3, 3)), r"Filter2d: kernel must be 2-D"),
}


@pytest.mark.parametrize("case", sorted(WRAPPER_ERRORS))
@pytest.mark.parametrize("device", DEVICES)
def test_python_wrappers_refuse_bad_arguments_with_a_value_error(device, case):
    call, message = WRAPPER_ERRORS[case]
    with pytest.raises(ValueError, match=message):
        call(device)


# ---------------------------------------------------------------- the count


def corpus_counts():
    """Cases per op and kind (test_errors.py's included)."""
    kinds = {"errors (test_errors.py)": BASIC_CASES, "mixed CPU/CUDA devices (test_errors.py)":
             MIXED_DEVICE_CASES, "errors": ERRORS, "odd values": ODD_VALUES,
             "meta shapes": META_SHAPES, "wrapper errors": WRAPPER_ERRORS}
    counts = {op: collections.Counter() for op in OPS}
    for kind, cases in kinds.items():
        for case in cases:
            counts[family(case)][kind] += 1
    return counts


def test_the_corpus_has_at_least_30_cases_per_op():
    counts = corpus_counts()
    for op, c in counts.items():
        print(f"{op}: {sum(c.values())} ({', '.join(f'{k} {v}' for k, v in c.items())})")
    short = {op: sum(c.values()) for op, c in counts.items() if sum(c.values()) < 30}
    assert not short, short


if __name__ == "__main__":
    total = 0
    for op, c in corpus_counts().items():
        n = sum(c.values())
        total += n
        print(f"{op:24s} {n:4d}  " + ", ".join(f"{k}: {v}" for k, v in c.items()))
    print(f"{'total':24s} {total:4d}")
