"""Bad input gets a clear RuntimeError that names the op and the argument,
never a crash, a hang or a huge allocation; the fake (meta) kernels apply the
same rules; on CUDA, the next valid call after an error still works and gives
right results."""

import re

import pytest
import torch

import customconv
from testlib import DEVICES, check_small_conv2d, check_small_direct_ops, cuda, ops, sync

F32, F64 = torch.float32, torch.float64
BIG = 2**62


def t(device, *shape, dtype=F32):
    """Random values of `shape` (an integer dtype gets small integers)."""
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, device=device) == 1
    return torch.randint(-3, 4, shape, dtype=dtype, device=device)


def conv(device, x=(2, 4, 5, 5), w=(6, 2, 3, 3), b=(6,), stride=(1, 1), padding=(1, 1),
         dilation=(1, 1), groups=2, xdt=F32, wdt=F32, bdt=F32):
    """customconv::conv2d on tensors of the given shapes and dtypes (valid by default)."""
    return ops.conv2d(t(device, *x, dtype=xdt), t(device, *w, dtype=wdt),
                      None if b is None else t(device, *b, dtype=bdt),
                      list(stride), list(padding), list(dilation), groups)


def im2col(device, x=(2, 3, 6, 6), kernel=(2, 2), stride=(1, 1), padding=(0, 0),
           dilation=(1, 1), dtype=F32):
    return ops.im2col(t(device, *x, dtype=dtype), list(kernel), list(stride), list(padding),
                      list(dilation))


def col2im(device, c=(2, 12, 25), size=(6, 6), kernel=(2, 2), stride=(1, 1), padding=(0, 0),
           dilation=(1, 1), dtype=F32):
    return ops.col2im(t(device, *c, dtype=dtype), list(size), list(kernel), list(stride),
                      list(padding), list(dilation))


def grad_op(name, device, go=(2, 6, 5, 5), x=(2, 4, 5, 5), w=(6, 2, 3, 3), stride=(1, 1),
            padding=(1, 1), dilation=(1, 1), groups=2, godt=F32):
    return getattr(ops, name)(t(device, *go, dtype=godt), t(device, *x), t(device, *w),
                              list(stride), list(padding), list(dilation), groups)


def depthwise(device, x=(2, 4, 5, 5), w=(8, 1, 3, 3), b=(8,), stride=(1, 1), padding=(1, 1),
              dilation=(1, 1), xdt=F32, wdt=F32, bdt=F32):
    """customconv::depthwise_conv2d on tensors of the given shapes and dtypes (valid by default)."""
    return ops.depthwise_conv2d(t(device, *x, dtype=xdt), t(device, *w, dtype=wdt),
                                None if b is None else t(device, *b, dtype=bdt),
                                list(stride), list(padding), list(dilation))


def depthwise_grad(name, device, go=(2, 8, 5, 5), x=(2, 4, 5, 5), w=(8, 1, 3, 3),
                   stride=(1, 1), padding=(1, 1), dilation=(1, 1), godt=F32):
    return getattr(ops, name)(t(device, *go, dtype=godt), t(device, *x), t(device, *w),
                              list(stride), list(padding), list(dilation))


def filter2d(device, x=(2, 5, 6), k=(3, 3), border="zeros", xdt=F32, kdt=F32):
    return ops.filter2d(t(device, *x, dtype=xdt), t(device, *k, dtype=kdt), border)


def trilinear(device, feats=(4, 8, 5), points=(4, 3), fdt=F32, pdt=F32):
    return ops.trilinear_interpolation(t(device, *feats, dtype=fdt), t(device, *points, dtype=pdt))


def trilinear_backward(device, go=(4, 5), feats=(4, 8, 5), points=(4, 3), godt=F32):
    return ops.trilinear_interpolation_backward(t(device, *go, dtype=godt), t(device, *feats),
                                                t(device, *points))


def trilinear_with_derivatives(device, feats=(4, 8, 5), points=(4, 3)):
    return ops.trilinear_interpolation_with_derivatives(t(device, *feats), t(device, *points))


def trilinear_grad_feats(device, go=(4, 5), points=(4, 3), godt=F32):
    return ops.trilinear_interpolation_grad_feats(t(device, *go, dtype=godt), t(device, *points))


def trilinear_from_derivatives(device, go=(4, 5), deriv=(4, 3, 5), points=(4, 3), dt=F32,
                               ddt=F32):
    return ops.trilinear_interpolation_backward_from_derivatives(
        t(device, *go, dtype=dt), t(device, *deriv, dtype=ddt), t(device, *points, dtype=dt))


BORDER_LIST = r'border must be one of "zeros", "reflect", "replicate", "circular"; got '


def kernel_too_large(op, extent, axis):
    """The message for a (dilated) kernel longer than the padded input: it names
    the op, the kernel's extent, the axis and the padded input."""
    return rf"{op}: .*kernel.*\b{extent} along {axis}\b.*padded input"


# name -> (call(device), regex the message must match, whether the meta kernels
# must raise it too: checks of sizes that only real data would need, such as
# 64-bit overflow of the element count, are made by the real kernels).
CASES = {
    # ---------------------------------------------------------------- conv2d
    "conv2d-input-2-dims": (lambda d: conv(d, x=(4, 5)),
                            r"conv2d: input must have 3 or 4 dims; got 2", True),
    "conv2d-input-5-dims": (lambda d: conv(d, x=(1, 2, 4, 5, 5)),
                            r"conv2d: input must have 3 or 4 dims; got 5", True),
    "conv2d-weight-3-dims": (lambda d: conv(d, w=(6, 2, 3)),
                             r"conv2d: weight must have 4 dims; got 3", True),
    "conv2d-weight-5-dims": (lambda d: conv(d, w=(6, 2, 3, 3, 1)),
                             r"conv2d: weight must have 4 dims; got 5", True),
    "conv2d-channels-not-weight-times-groups": (
        lambda d: conv(d, w=(6, 3, 3, 3), groups=1),
        r"conv2d: input has 4 channels but weight.size\(1\) \* groups = 3 \* 1", True),
    "conv2d-channels-not-weight-times-groups-grouped": (
        lambda d: conv(d, w=(6, 1, 3, 3), groups=2),
        r"conv2d: input has 4 channels but weight.size\(1\) \* groups = 1 \* 2", True),
    "conv2d-unbatched-channels-mismatch": (
        lambda d: conv(d, x=(3, 5, 5), w=(6, 2, 3, 3), groups=1),
        r"conv2d: input has 3 channels but weight.size\(1\) \* groups = 2 \* 1", True),
    "conv2d-groups-zero": (lambda d: conv(d, groups=0), r"conv2d: groups must be positive; got 0", True),
    "conv2d-groups-negative": (lambda d: conv(d, groups=-2),
                               r"conv2d: groups must be positive; got -2", True),
    "conv2d-groups-not-dividing-channels": (
        lambda d: conv(d, w=(6, 1, 3, 3), groups=3),
        r"conv2d: groups \(3\) must divide the input channels \(4\)", True),
    "conv2d-groups-not-dividing-out-channels": (
        lambda d: conv(d, w=(5, 2, 3, 3), b=(5,), groups=2),
        r"conv2d: groups \(2\) must divide the output channels", True),
    "conv2d-stride-zero": (lambda d: conv(d, stride=(0, 1)), r"conv2d: stride must be positive", True),
    "conv2d-stride-negative": (lambda d: conv(d, stride=(1, -1)),
                               r"conv2d: stride must be positive", True),
    "conv2d-dilation-zero": (lambda d: conv(d, dilation=(1, 0)),
                             r"conv2d: dilation must be positive", True),
    "conv2d-dilation-negative": (lambda d: conv(d, dilation=(-1, 1)),
                                 r"conv2d: dilation must be positive", True),
    "conv2d-padding-negative": (lambda d: conv(d, padding=(0, -1)),
                                r"conv2d: padding must be non-negative", True),
    "conv2d-stride-3-values": (lambda d: conv(d, stride=(1, 2, 3)),
                               r"conv2d: stride must be a list of 2 integers", True),
    "conv2d-padding-0-values": (lambda d: conv(d, padding=()),
                                r"conv2d: padding must be a list of 2 integers", True),
    "conv2d-dilation-3-values": (lambda d: conv(d, dilation=(1, 1, 1)),
                                 r"conv2d: dilation must be a list of 2 integers", True),
    "conv2d-kernel-larger-than-padded-input": (
        lambda d: conv(d, w=(6, 2, 8, 3), padding=(1, 1)),
        kernel_too_large("conv2d", 8, "height"), True),
    "conv2d-kernel-larger-than-input-width": (
        lambda d: conv(d, x=(2, 4, 9, 2), w=(6, 2, 1, 3), padding=(0, 0)),
        kernel_too_large("conv2d", 3, "width"), True),
    "conv2d-dilation-2**40": (
        lambda d: conv(d, dilation=(2**40, 1)),
        kernel_too_large("conv2d", 2**40 * 2 + 1, "height"), True),
    "conv2d-dilation-2**62-overflows": (
        lambda d: conv(d, dilation=(1, BIG)), r"conv2d: dilation \* \(kernel_size - 1\)", True),
    "conv2d-dilation-int64-max-overflows": (
        lambda d: conv(d, dilation=(2**63 - 1, 1)), r"conv2d: dilation \* \(kernel_size - 1\)", True),
    "conv2d-padding-2**62-too-large": (
        lambda d: conv(d, padding=(BIG, 0)), r"conv2d: padding .* is too large", True),
    "conv2d-output-size-overflows": (
        lambda d: conv(d, padding=(2**31, 2**31)), r"conv2d: the output size overflows 64-bit", False),
    "conv2d-bias-wrong-size": (lambda d: conv(d, b=(5,)),
                               r"conv2d: bias has 5 elements but there are 6 output channels", True),
    "conv2d-bias-2-dims": (lambda d: conv(d, b=(6, 1)), r"conv2d: bias must have 1 dims; got 2", True),
    "conv2d-bias-0-dims": (lambda d: conv(d, b=()), r"conv2d: bias must have 1 dims; got 0", True),
    "conv2d-weight-float64-input-float32": (
        lambda d: conv(d, wdt=F64),
        r"conv2d: weight has dtype Double but input has dtype Float", True),
    "conv2d-bias-float64": (lambda d: conv(d, bdt=F64),
                            r"conv2d: bias has dtype Double but input has dtype Float", True),
    "conv2d-input-bfloat16-weight-float32": (
        lambda d: conv(d, xdt=torch.bfloat16, bdt=torch.bfloat16),
        r"conv2d: weight has dtype Float but input has dtype BFloat16", True),
    "conv2d-integer-dtype": (
        lambda d: conv(d, xdt=torch.int64, wdt=torch.int64, bdt=torch.int64),
        r"conv2d: input must be float32, float64, float16 or bfloat16; got Long", True),
    "conv2d-integer-weight": (lambda d: conv(d, wdt=torch.int32),
                              r"conv2d: weight has dtype Int but input has dtype Float", True),
    "conv2d-bool-dtype": (
        lambda d: conv(d, xdt=torch.bool, wdt=torch.bool, b=None),
        r"conv2d: input must be float32, float64, float16 or bfloat16; got Bool", True),
    "conv2d-complex-dtype": (
        lambda d: conv(d, xdt=torch.complex64, wdt=torch.complex64, b=None),
        r"conv2d: input must be float32, float64, float16 or bfloat16; got ComplexFloat", True),
    # ---------------------------------------------------------------- im2col
    "im2col-input-2-dims": (lambda d: im2col(d, x=(6, 6)), r"im2col: input must have 3 or 4 dims; got 2", True),
    "im2col-input-5-dims": (lambda d: im2col(d, x=(1, 2, 3, 6, 6)),
                            r"im2col: input must have 3 or 4 dims; got 5", True),
    "im2col-kernel-zero": (lambda d: im2col(d, kernel=(0, 2)), r"im2col: kernel_size must be positive", True),
    "im2col-kernel-3-values": (lambda d: im2col(d, kernel=(1, 2, 3)),
                               r"im2col: kernel_size must be a list of 2 integers", True),
    "im2col-stride-zero": (lambda d: im2col(d, stride=(1, 0)), r"im2col: stride must be positive", True),
    "im2col-stride-3-values": (lambda d: im2col(d, stride=(1, 2, 3)),
                               r"im2col: stride must be a list of 2 integers", True),
    "im2col-padding-negative": (lambda d: im2col(d, padding=(-1, 0)),
                                r"im2col: padding must be non-negative", True),
    "im2col-dilation-zero": (lambda d: im2col(d, dilation=(0, 0)),
                             r"im2col: dilation must be positive", True),
    "im2col-kernel-larger-than-input": (
        lambda d: im2col(d, kernel=(3, 7)),
        kernel_too_large("im2col", 7, "width"), True),
    "im2col-dilation-2**40": (lambda d: im2col(d, dilation=(1, 2**40)),
                              kernel_too_large("im2col", 2**40 + 1, "width"), True),
    "im2col-output-size-overflows": (lambda d: im2col(d, padding=(2**31, 2**31)),
                                     r"im2col: the output size overflows 64-bit", False),
    "im2col-integer-dtype": (lambda d: im2col(d, dtype=torch.int32),
                             r"im2col: input must be float32, float64, float16 or bfloat16; got Int", True),
    # ---------------------------------------------------------------- col2im
    "col2im-columns-4-dims": (lambda d: col2im(d, c=(1, 2, 12, 25)),
                              r"col2im: columns must have 2 or 3 dims; got 4", True),
    "col2im-columns-1-dim": (lambda d: col2im(d, c=(25,)),
                             r"col2im: columns must have 2 or 3 dims; got 1", True),
    "col2im-rows-not-multiple-of-kernel": (
        lambda d: col2im(d, c=(2, 7, 25)),
        r"col2im: columns.size\(1\) \(7\) must be a multiple of kh \* kw = 4", True),
    "col2im-unbatched-rows-not-multiple-of-kernel": (
        lambda d: col2im(d, c=(10, 25), kernel=(3, 1), size=(7, 5)),
        r"col2im: columns.size\(0\) \(10\) must be a multiple of kh \* kw = 3", True),
    "col2im-length-not-matching-output-size": (
        lambda d: col2im(d, c=(2, 12, 24)),
        r"col2im: columns.size\(2\) is 24 but output_size \(6, 6\) .* has 5 x 5 = 25 window positions", True),
    "col2im-unbatched-length-not-matching-output-size": (
        lambda d: col2im(d, c=(12, 25), stride=(2, 1)),
        r"col2im: columns.size\(1\) is 25 but output_size \(6, 6\) .* has 3 x 5 = 15", True),
    "col2im-output-size-zero": (lambda d: col2im(d, size=(0, 6)),
                                r"col2im: output_size must be positive", True),
    "col2im-output-size-3-values": (lambda d: col2im(d, size=(6, 6, 6)),
                                    r"col2im: output_size must be a list of 2 integers", True),
    "col2im-kernel-zero": (lambda d: col2im(d, kernel=(2, 0)),
                           r"col2im: kernel_size must be positive", True),
    "col2im-kernel-larger-than-output": (
        lambda d: col2im(d, c=(2, 16, 1), kernel=(8, 2), size=(6, 6)),
        kernel_too_large("col2im", 8, "height"), True),
    "col2im-kernel-area-overflows": (
        lambda d: col2im(d, c=(2, 4, 1), kernel=(2**32, 2**32)),
        r"col2im: kernel_size overflows 64-bit", True),
    "col2im-stride-zero": (lambda d: col2im(d, stride=(0, 1)), r"col2im: stride must be positive", True),
    "col2im-padding-negative": (lambda d: col2im(d, padding=(0, -2)),
                                r"col2im: padding must be non-negative", True),
    "col2im-dilation-3-values": (lambda d: col2im(d, dilation=(1, 1, 1)),
                                 r"col2im: dilation must be a list of 2 integers", True),
    "col2im-integer-dtype": (lambda d: col2im(d, dtype=torch.int64),
                             r"col2im: columns must be float32, float64, float16 or bfloat16; got Long", True),
    # ---------------------------------------------------------------- backward ops
    "conv2d_grad_input-grad-output-wrong-shape": (
        lambda d: grad_op("conv2d_grad_input", d, go=(2, 6, 5, 4)),
        r"conv2d_grad_input: grad_output has shape \[2, 6, 5, 4\] but the convolution's output is "
        r"\(2, 6, 5, 5\)", True),
    "conv2d_grad_input-grad-output-wrong-batch": (
        lambda d: grad_op("conv2d_grad_input", d, go=(3, 6, 5, 5)),
        r"conv2d_grad_input: grad_output has shape \[3, 6, 5, 5\]", True),
    "conv2d_grad_input-grad-output-wrong-channels": (
        lambda d: grad_op("conv2d_grad_input", d, go=(2, 5, 5, 5)),
        r"conv2d_grad_input: grad_output has shape \[2, 5, 5, 5\]", True),
    "conv2d_grad_input-grad-output-wrong-dims": (
        lambda d: grad_op("conv2d_grad_input", d, go=(6, 5, 5)),
        r"conv2d_grad_input: grad_output must have 4 dims; got 3", True),
    "conv2d_grad_input-grad-output-float64": (
        lambda d: grad_op("conv2d_grad_input", d, godt=F64),
        r"conv2d_grad_input: grad_output has dtype Double but input has dtype Float", True),
    "conv2d_grad_input-channels-mismatch": (
        lambda d: grad_op("conv2d_grad_input", d, w=(6, 3, 3, 3)),
        r"conv2d_grad_input: input has 4 channels but weight.size\(1\) \* groups", True),
    "conv2d_grad_input-stride-3-values": (
        lambda d: grad_op("conv2d_grad_input", d, stride=(1, 1, 1)),
        r"conv2d_grad_input: stride must be a list of 2 integers", True),
    "conv2d_grad_weight-grad-output-wrong-shape": (
        lambda d: grad_op("conv2d_grad_weight", d, go=(2, 6, 4, 5)),
        r"conv2d_grad_weight: grad_output has shape \[2, 6, 4, 5\] but the convolution's output is "
        r"\(2, 6, 5, 5\)", True),
    "conv2d_grad_weight-grad-output-wrong-dims": (
        lambda d: grad_op("conv2d_grad_weight", d, go=(1, 2, 6, 5, 5)),
        r"conv2d_grad_weight: grad_output must have 4 dims; got 5", True),
    "conv2d_grad_weight-grad-output-integer": (
        lambda d: grad_op("conv2d_grad_weight", d, godt=torch.int32),
        r"conv2d_grad_weight: grad_output has dtype Int but input has dtype Float", True),
    "conv2d_grad_weight-groups-zero": (
        lambda d: grad_op("conv2d_grad_weight", d, groups=0),
        r"conv2d_grad_weight: groups must be positive", True),
    "conv2d_grad_weight-dilation-2**40": (
        lambda d: grad_op("conv2d_grad_weight", d, dilation=(2**40, 2**40)),
        kernel_too_large("conv2d_grad_weight", 2**41 + 1, "height"), True),
    "conv2d_grad_bias-grad-output-2-dims": (
        lambda d: ops.conv2d_grad_bias(t(d, 6, 5)),
        r"conv2d_grad_bias: grad_output must have 3 or 4 dims; got 2", True),
    "conv2d_grad_bias-grad-output-integer": (
        lambda d: ops.conv2d_grad_bias(t(d, 2, 6, 5, 5, dtype=torch.int64)),
        r"conv2d_grad_bias: grad_output must be float32, float64, float16 or bfloat16; got Long", True),
    # ---------------------------------------------------------------- depthwise_conv2d
    "depthwise_conv2d-input-2-dims": (lambda d: depthwise(d, x=(5, 5)),
                                      r"depthwise_conv2d: input must have 3 or 4 dims; got 2", True),
    "depthwise_conv2d-input-5-dims": (lambda d: depthwise(d, x=(1, 2, 4, 5, 5)),
                                      r"depthwise_conv2d: input must have 3 or 4 dims; got 5", True),
    "depthwise_conv2d-input-zero-channels": (
        lambda d: depthwise(d, x=(2, 0, 5, 5)),
        r"depthwise_conv2d: input must have at least one channel", True),
    "depthwise_conv2d-weight-3-dims": (lambda d: depthwise(d, w=(8, 1, 3)),
                                       r"depthwise_conv2d: weight must have 4 dims; got 3", True),
    "depthwise_conv2d-weight-5-dims": (lambda d: depthwise(d, w=(8, 1, 3, 3, 1)),
                                       r"depthwise_conv2d: weight must have 4 dims; got 5", True),
    "depthwise_conv2d-weight-2-channels-per-group": (
        lambda d: depthwise(d, w=(8, 2, 3, 3)),
        r"depthwise_conv2d: weight must be \(C\*m, 1, kh, kw\); got shape \[8, 2, 3, 3\]", True),
    "depthwise_conv2d-weight-as-conv2d-weight": (
        lambda d: depthwise(d, w=(8, 4, 3, 3)),
        r"depthwise_conv2d: weight must be \(C\*m, 1, kh, kw\); got shape \[8, 4, 3, 3\]", True),
    "depthwise_conv2d-out-channels-not-multiple-of-channels": (
        lambda d: depthwise(d, w=(6, 1, 3, 3), b=(6,)),
        r"depthwise_conv2d: weight.size\(0\) \(6\) must be a positive multiple of the input "
        r"channels \(4\)", True),
    "depthwise_conv2d-out-channels-fewer-than-channels": (
        lambda d: depthwise(d, w=(2, 1, 3, 3), b=None),
        r"depthwise_conv2d: weight.size\(0\) \(2\) must be a positive multiple", True),
    "depthwise_conv2d-out-channels-zero": (
        lambda d: depthwise(d, w=(0, 1, 3, 3), b=None),
        r"depthwise_conv2d: weight.size\(0\) \(0\) must be a positive multiple", True),
    "depthwise_conv2d-unbatched-out-channels-not-multiple": (
        lambda d: depthwise(d, x=(3, 5, 5), w=(4, 1, 3, 3), b=(4,)),
        r"depthwise_conv2d: weight.size\(0\) \(4\) must be a positive multiple of the input "
        r"channels \(3\)", True),
    "depthwise_conv2d-stride-zero": (lambda d: depthwise(d, stride=(0, 1)),
                                     r"depthwise_conv2d: stride must be positive", True),
    "depthwise_conv2d-stride-negative": (lambda d: depthwise(d, stride=(1, -2)),
                                         r"depthwise_conv2d: stride must be positive", True),
    "depthwise_conv2d-dilation-zero": (lambda d: depthwise(d, dilation=(0, 1)),
                                       r"depthwise_conv2d: dilation must be positive", True),
    "depthwise_conv2d-dilation-negative": (lambda d: depthwise(d, dilation=(1, -1)),
                                           r"depthwise_conv2d: dilation must be positive", True),
    "depthwise_conv2d-padding-negative": (lambda d: depthwise(d, padding=(-1, 0)),
                                          r"depthwise_conv2d: padding must be non-negative", True),
    "depthwise_conv2d-stride-3-values": (
        lambda d: depthwise(d, stride=(1, 1, 1)),
        r"depthwise_conv2d: stride must be a list of 2 integers", True),
    "depthwise_conv2d-kernel-larger-than-padded-input": (
        lambda d: depthwise(d, w=(8, 1, 8, 3)),
        kernel_too_large("depthwise_conv2d", 8, "height"), True),
    "depthwise_conv2d-dilated-kernel-wider-than-input": (
        lambda d: depthwise(d, w=(8, 1, 1, 3), padding=(0, 0), dilation=(1, 3)),
        kernel_too_large("depthwise_conv2d", 7, "width"), True),
    "depthwise_conv2d-dilation-2**40": (
        lambda d: depthwise(d, dilation=(2**40, 1)),
        kernel_too_large("depthwise_conv2d", 2**41 + 1, "height"), True),
    "depthwise_conv2d-bias-wrong-size": (
        lambda d: depthwise(d, b=(7,)),
        r"depthwise_conv2d: bias has 7 elements but there are 8 output channels", True),
    "depthwise_conv2d-bias-channels-not-out-channels": (
        lambda d: depthwise(d, b=(4,)),
        r"depthwise_conv2d: bias has 4 elements but there are 8 output channels", True),
    "depthwise_conv2d-bias-2-dims": (lambda d: depthwise(d, b=(8, 1)),
                                     r"depthwise_conv2d: bias must have 1 dims; got 2", True),
    "depthwise_conv2d-weight-float64-input-float32": (
        lambda d: depthwise(d, wdt=F64),
        r"depthwise_conv2d: weight has dtype Double but input has dtype Float", True),
    "depthwise_conv2d-bias-float64": (
        lambda d: depthwise(d, bdt=F64),
        r"depthwise_conv2d: bias has dtype Double but input has dtype Float", True),
    "depthwise_conv2d-input-float16-weight-float32": (
        lambda d: depthwise(d, xdt=torch.float16, bdt=torch.float16),
        r"depthwise_conv2d: weight has dtype Float but input has dtype Half", True),
    "depthwise_conv2d-integer-dtype": (
        lambda d: depthwise(d, xdt=torch.int64, wdt=torch.int64, bdt=torch.int64),
        r"depthwise_conv2d: input must be float32, float64, float16 or bfloat16; got Long", True),
    "depthwise_conv2d_grad_input-grad-output-wrong-shape": (
        lambda d: depthwise_grad("depthwise_conv2d_grad_input", d, go=(2, 8, 5, 4)),
        r"depthwise_conv2d_grad_input: grad_output has shape \[2, 8, 5, 4\] but the "
        r"convolution's output is \(2, 8, 5, 5\)", True),
    "depthwise_conv2d_grad_input-grad-output-float64": (
        lambda d: depthwise_grad("depthwise_conv2d_grad_input", d, godt=F64),
        r"depthwise_conv2d_grad_input: grad_output has dtype Double but input has dtype Float", True),
    "depthwise_conv2d_grad_input-weight-not-depthwise": (
        lambda d: depthwise_grad("depthwise_conv2d_grad_input", d, w=(8, 4, 3, 3)),
        r"depthwise_conv2d_grad_input: weight must be \(C\*m, 1, kh, kw\)", True),
    "depthwise_conv2d_grad_weight-grad-output-wrong-channels": (
        lambda d: depthwise_grad("depthwise_conv2d_grad_weight", d, go=(2, 4, 5, 5)),
        r"depthwise_conv2d_grad_weight: grad_output has shape \[2, 4, 5, 5\]", True),
    "depthwise_conv2d_grad_weight-grad-output-wrong-dims": (
        lambda d: depthwise_grad("depthwise_conv2d_grad_weight", d, go=(8, 5, 5)),
        r"depthwise_conv2d_grad_weight: grad_output must have 4 dims; got 3", True),
    "depthwise_conv2d_grad_weight-stride-zero": (
        lambda d: depthwise_grad("depthwise_conv2d_grad_weight", d, stride=(0, 0)),
        r"depthwise_conv2d_grad_weight: stride must be positive", True),
    "depthwise_conv2d_grad_weight_bias-grad-output-wrong-channels": (
        lambda d: depthwise_grad("depthwise_conv2d_grad_weight_bias", d, go=(2, 4, 5, 5)),
        r"depthwise_conv2d_grad_weight_bias: grad_output has shape \[2, 4, 5, 5\]", True),
    "depthwise_conv2d_grad_weight_bias-stride-zero": (
        lambda d: depthwise_grad("depthwise_conv2d_grad_weight_bias", d, stride=(0, 0)),
        r"depthwise_conv2d_grad_weight_bias: stride must be positive", True),
    # ---------------------------------------------------------------- filter2d
    "filter2d-input-1-dim": (lambda d: filter2d(d, x=(5,)),
                             r"filter2d: input must have at least 2 dims \(\.\.\., H, W\); got 1", True),
    "filter2d-input-0-dims": (lambda d: filter2d(d, x=()),
                              r"filter2d: input must have at least 2 dims \(\.\.\., H, W\); got 0", True),
    "filter2d-kernel-3-dims": (lambda d: filter2d(d, k=(1, 3, 3)),
                               r"filter2d: kernel must have 2 dims; got 3", True),
    "filter2d-kernel-1-dim": (lambda d: filter2d(d, k=(3,)),
                              r"filter2d: kernel must have 2 dims; got 1", True),
    "filter2d-kernel-even-height": (lambda d: filter2d(d, k=(2, 3)),
                                    r"filter2d: kernel sizes must be odd; got \(2, 3\)", True),
    "filter2d-kernel-even-width": (lambda d: filter2d(d, k=(3, 4)),
                                   r"filter2d: kernel sizes must be odd; got \(3, 4\)", True),
    "filter2d-kernel-empty": (lambda d: filter2d(d, k=(0, 3)),
                              r"filter2d: kernel sizes must be odd; got \(0, 3\)", True),
    "filter2d-unknown-border": (lambda d: filter2d(d, border="mirror"),
                                r"filter2d: " + BORDER_LIST + r'"mirror"', True),
    "filter2d-border-constant": (lambda d: filter2d(d, border="constant"),
                                 r"filter2d: " + BORDER_LIST + r'"constant"', True),
    "filter2d-border-uppercase": (lambda d: filter2d(d, border="Zeros"),
                                  r"filter2d: " + BORDER_LIST + r'"Zeros"', True),
    "filter2d-border-empty": (lambda d: filter2d(d, border=""), r"filter2d: " + BORDER_LIST + '""',
                              True),
    "filter2d-reflect-padding-equal-to-height": (
        lambda d: filter2d(d, x=(2, 2, 6), k=(5, 3), border="reflect"),
        r"filter2d: border 'reflect' needs the padding \(2, 1\) = kernel size // 2 to be smaller "
        r"than the plane \(2, 6\)", True),
    "filter2d-reflect-padding-larger-than-width": (
        lambda d: filter2d(d, x=(6, 2), k=(1, 7), border="reflect"),
        r"filter2d: border 'reflect' needs the padding \(0, 3\) .* smaller than the plane \(6, 2\)",
        True),
    "filter2d-reflect-31x31-on-15x20": (
        lambda d: filter2d(d, x=(15, 20), k=(31, 31), border="reflect"),
        r"filter2d: border 'reflect' needs the padding \(15, 15\)", True),
    "filter2d-circular-padding-larger-than-height": (
        lambda d: filter2d(d, x=(2, 2, 6), k=(7, 3), border="circular"),
        r"filter2d: border 'circular' needs the padding \(3, 1\) = kernel size // 2 to be at most "
        r"the plane size \(2, 6\)", True),
    "filter2d-circular-padding-larger-than-width": (
        lambda d: filter2d(d, x=(3, 4, 1), k=(3, 5), border="circular"),
        r"filter2d: border 'circular' needs the padding \(1, 2\) .* at most the plane size "
        r"\(4, 1\)", True),
    "filter2d-kernel-float64-input-float32": (
        lambda d: filter2d(d, kdt=F64), r"filter2d: kernel has dtype Double but input has dtype Float",
        True),
    "filter2d-input-bfloat16-kernel-float32": (
        lambda d: filter2d(d, xdt=torch.bfloat16),
        r"filter2d: kernel has dtype Float but input has dtype BFloat16", True),
    "filter2d-integer-dtype": (
        lambda d: filter2d(d, xdt=torch.int32, kdt=torch.int32),
        r"filter2d: input must be float32, float64, float16 or bfloat16; got Int", True),
    "filter2d_grad_input-unknown-border": (
        lambda d: ops.filter2d_grad_input(t(d, 2, 5, 6), t(d, 3, 3), "wrap"),
        r"filter2d_grad_input: " + BORDER_LIST + r'"wrap"', True),
    "filter2d_grad_input-reflect-plane-too-small": (
        lambda d: ops.filter2d_grad_input(t(d, 2, 5, 1), t(d, 3, 3), "reflect"),
        r"filter2d_grad_input: border 'reflect' needs the padding \(1, 1\)", True),
    "filter2d_grad_input-kernel-even": (
        lambda d: ops.filter2d_grad_input(t(d, 2, 5, 6), t(d, 3, 2), "zeros"),
        r"filter2d_grad_input: kernel sizes must be odd; got \(3, 2\)", True),
    "filter2d_grad_kernel-grad-output-wrong-shape": (
        lambda d: ops.filter2d_grad_kernel(t(d, 2, 5, 5), t(d, 2, 5, 6), t(d, 3, 3), "zeros"),
        r"filter2d_grad_kernel: grad_output has shape \[2, 5, 5\] but input has shape \[2, 5, 6\]",
        True),
    "filter2d_grad_kernel-grad-output-float64": (
        lambda d: ops.filter2d_grad_kernel(t(d, 2, 5, 6, dtype=F64), t(d, 2, 5, 6), t(d, 3, 3),
                                           "zeros"),
        r"filter2d_grad_kernel: grad_output has dtype Double but input has dtype Float", True),
    "filter2d_grad_kernel-more-than-65535-taps": (
        lambda d: ops.filter2d_grad_kernel(t(d, 1, 3, 4), t(d, 1, 3, 4), t(d, 257, 257), "zeros"),
        r"filter2d_grad_kernel: kernel of 257 x 257 = 66049 taps; the kernel gradient supports at "
        r"most 65535 taps", True),
    "filter2d_grad_kernel-circular-plane-too-small": (
        lambda d: ops.filter2d_grad_kernel(t(d, 2, 1, 6), t(d, 2, 1, 6), t(d, 5, 3), "circular"),
        r"filter2d_grad_kernel: border 'circular' needs the padding \(2, 1\)", True),
    # ---------------------------------------------------------------- trilinear_interpolation
    "trilinear_interpolation-feats-2-dims": (
        lambda d: trilinear(d, feats=(4, 8)),
        r"trilinear_interpolation: feats must have 3 dims; got 2", True),
    "trilinear_interpolation-feats-4-dims": (
        lambda d: trilinear(d, feats=(4, 2, 2, 2)),
        r"trilinear_interpolation: feats must have 3 dims; got 4", True),
    "trilinear_interpolation-feats-7-corners": (
        lambda d: trilinear(d, feats=(4, 7, 5)),
        r"trilinear_interpolation: feats must be \(N, 8, F\), one row of features per cube corner; "
        r"got shape \[4, 7, 5\]", True),
    "trilinear_interpolation-feats-transposed": (
        lambda d: trilinear(d, feats=(4, 5, 8)),
        r"trilinear_interpolation: feats must be \(N, 8, F\).*got shape \[4, 5, 8\]", True),
    "trilinear_interpolation-points-1-dim": (
        lambda d: trilinear(d, points=(12,)),
        r"trilinear_interpolation: points must have 2 dims; got 1", True),
    "trilinear_interpolation-points-2-coordinates": (
        lambda d: trilinear(d, points=(4, 2)),
        r"trilinear_interpolation: points must be \(N, 3\); got shape \[4, 2\]", True),
    "trilinear_interpolation-points-transposed": (
        lambda d: trilinear(d, feats=(3, 8, 5), points=(4, 3)[::-1]),
        r"trilinear_interpolation: points must be \(N, 3\); got shape \[3, 4\]", True),
    "trilinear_interpolation-n-mismatch": (
        lambda d: trilinear(d, points=(5, 3)),
        r"trilinear_interpolation: feats has 4 cubes but points has 5 points; N must match", True),
    "trilinear_interpolation-n-mismatch-empty-points": (
        lambda d: trilinear(d, points=(0, 3)),
        r"trilinear_interpolation: feats has 4 cubes but points has 0 points", True),
    "trilinear_interpolation-points-float64": (
        lambda d: trilinear(d, pdt=F64),
        r"trilinear_interpolation: points has dtype Double but feats has dtype Float", True),
    "trilinear_interpolation-feats-float16-points-float32": (
        lambda d: trilinear(d, fdt=torch.float16),
        r"trilinear_interpolation: points has dtype Float but feats has dtype Half", True),
    "trilinear_interpolation-integer-dtype": (
        lambda d: trilinear(d, fdt=torch.int64, pdt=torch.int64),
        r"trilinear_interpolation: feats must be float32, float64, float16 or bfloat16; got Long", True),
    "trilinear_interpolation_backward-grad-output-wrong-shape": (
        lambda d: trilinear_backward(d, go=(4, 6)),
        r"trilinear_interpolation_backward: grad_output has shape \[4, 6\] but the output is "
        r"\(4, 5\)", True),
    "trilinear_interpolation_backward-grad-output-3-dims": (
        lambda d: trilinear_backward(d, go=(4, 5, 1)),
        r"trilinear_interpolation_backward: grad_output must have 2 dims; got 3", True),
    "trilinear_interpolation_backward-grad-output-float64": (
        lambda d: trilinear_backward(d, godt=F64),
        r"trilinear_interpolation_backward: grad_output has dtype Double but feats has dtype Float",
        True),
    "trilinear_interpolation_backward-n-mismatch": (
        lambda d: trilinear_backward(d, points=(3, 3)),
        r"trilinear_interpolation_backward: feats has 4 cubes but points has 3 points", True),
    "trilinear_interpolation_with_derivatives-feats-7-corners": (
        lambda d: trilinear_with_derivatives(d, feats=(4, 7, 5)),
        r"trilinear_interpolation_with_derivatives: feats must be \(N, 8, F\)", True),
    "trilinear_interpolation_backward_from_derivatives-derivatives-float64": (
        lambda d: trilinear_from_derivatives(d, ddt=F64),
        r"trilinear_interpolation_backward_from_derivatives: derivatives has dtype Double but "
        r"grad_output has dtype Float; the derivatives must be Float", True),
    "trilinear_interpolation_backward_from_derivatives-bfloat16-derivatives": (
        lambda d: trilinear_from_derivatives(d, dt=torch.bfloat16, ddt=torch.bfloat16),
        r"trilinear_interpolation_backward_from_derivatives: derivatives has dtype BFloat16 but "
        r"grad_output has dtype BFloat16; the derivatives must be Float", True),
    "trilinear_interpolation_backward_from_derivatives-feats-given": (
        lambda d: trilinear_from_derivatives(d, deriv=(4, 8, 5)),
        r"trilinear_interpolation_backward_from_derivatives: derivatives must be \(N, 3, F\) "
        r"with N = 4 points; got shape \[4, 8, 5\]", True),
    "trilinear_interpolation_backward_from_derivatives-grad-output-wrong-shape": (
        lambda d: trilinear_from_derivatives(d, go=(4, 6)),
        r"trilinear_interpolation_backward_from_derivatives: grad_output has shape \[4, 6\] but "
        r"the output is \(4, 5\)", True),
    "trilinear_interpolation_grad_feats-n-mismatch": (
        lambda d: trilinear_grad_feats(d, go=(5, 5)),
        r"trilinear_interpolation_grad_feats: grad_output has 5 rows but points has 4 points", True),
    "trilinear_interpolation_grad_feats-grad-output-float64": (
        lambda d: trilinear_grad_feats(d, godt=F64),
        r"trilinear_interpolation_grad_feats: points has dtype Float but grad_output has dtype "
        r"Double", True),
    "trilinear_interpolation_grad_feats-grad-output-3-dims": (
        lambda d: trilinear_grad_feats(d, go=(4, 5, 1)),
        r"trilinear_interpolation_grad_feats: grad_output must have 2 dims; got 3", True),
    "trilinear_interpolation_backward_from_derivatives-points-2-columns": (
        lambda d: trilinear_from_derivatives(d, points=(4, 2)),
        r"trilinear_interpolation_backward_from_derivatives: points must be \(N, 3\)", True),
}

# Cases of the direct-kernel ops: after them, one call of each of those ops must work too.
DIRECT_OPS = ("depthwise_conv2d", "filter2d", "trilinear_interpolation")


def check_raises_and_device_stays_usable(call, message, device, case):
    """call() raises a RuntimeError matching `message` (at the latest when the
    device is synchronized); then a valid conv2d call (and, for a case of a
    direct-kernel op, a valid call of each of them) gives right results."""
    with pytest.raises(RuntimeError, match=message):
        call()
        sync(device)
    # The device is still usable: a valid call gives right results.
    check_small_conv2d(device)
    if case.startswith(DIRECT_OPS):
        check_small_direct_ops(device)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_a_clear_error(device, case):
    call, message, _ = CASES[case]
    check_raises_and_device_stays_usable(lambda: call(device), message, device, case)


@pytest.mark.parametrize("case", sorted(c for c, (_, _, meta) in CASES.items() if meta))
def test_meta_kernels_raise_the_same_errors(case):
    call, message, _ = CASES[case]
    with pytest.raises(RuntimeError, match=message):
        call("meta")


# ---------------------------------------------------------------- mixed devices (CUDA)

MIXED_DEVICE_CASES = {
    "conv2d-weight-on-cpu": (
        lambda: ops.conv2d(t("cuda", 2, 4, 5, 5), t("cpu", 6, 4, 3, 3)),
        r"conv2d: weight is on cpu but input is on cuda:\d; all tensors must be on one device"),
    "conv2d-input-on-cpu": (
        lambda: ops.conv2d(t("cpu", 2, 4, 5, 5), t("cuda", 6, 4, 3, 3)),
        r"conv2d: weight is on cuda:\d but input is on cpu"),
    "conv2d-bias-on-cpu": (
        lambda: ops.conv2d(t("cuda", 2, 4, 5, 5), t("cuda", 6, 4, 3, 3), t("cpu", 6)),
        r"conv2d: bias is on cpu but input is on cuda:\d"),
    "conv2d-input-and-bias-on-cpu": (
        lambda: ops.conv2d(t("cpu", 2, 4, 5, 5), t("cuda", 6, 4, 3, 3), t("cpu", 6)),
        r"conv2d: weight is on cuda:\d but input is on cpu"),
    "conv2d_grad_input-grad-output-on-cpu": (
        lambda: ops.conv2d_grad_input(t("cpu", 2, 6, 3, 3), t("cuda", 2, 4, 5, 5),
                                      t("cuda", 6, 4, 3, 3), [1, 1], [0, 0], [1, 1], 1),
        r"conv2d_grad_input: .* is on .* but .* is on .*; all tensors must be on one device"),
    "conv2d_grad_weight-input-on-cpu": (
        lambda: ops.conv2d_grad_weight(t("cuda", 2, 6, 3, 3), t("cpu", 2, 4, 5, 5),
                                       t("cuda", 6, 4, 3, 3), [1, 1], [0, 0], [1, 1], 1),
        r"conv2d_grad_weight: .* is on .* but .* is on .*; all tensors must be on one device"),
    "depthwise_conv2d-weight-on-cpu": (
        lambda: ops.depthwise_conv2d(t("cuda", 2, 4, 5, 5), t("cpu", 8, 1, 3, 3)),
        r"depthwise_conv2d: weight is on cpu but input is on cuda:\d; all tensors must be on one "
        r"device"),
    "depthwise_conv2d-input-on-cpu": (
        lambda: ops.depthwise_conv2d(t("cpu", 2, 4, 5, 5), t("cuda", 8, 1, 3, 3)),
        r"depthwise_conv2d: weight is on cuda:\d but input is on cpu"),
    "depthwise_conv2d-bias-on-cpu": (
        lambda: ops.depthwise_conv2d(t("cuda", 2, 4, 5, 5), t("cuda", 8, 1, 3, 3), t("cpu", 8)),
        r"depthwise_conv2d: bias is on cpu but input is on cuda:\d"),
    "depthwise_conv2d_grad_weight-input-on-cpu": (
        lambda: ops.depthwise_conv2d_grad_weight(t("cuda", 2, 8, 3, 3), t("cpu", 2, 4, 5, 5),
                                                 t("cuda", 8, 1, 3, 3), [1, 1], [0, 0], [1, 1]),
        r"depthwise_conv2d_grad_weight: .* is on .* but .* is on .*; all tensors must be on one "
        r"device"),
    "depthwise_conv2d_grad_input-grad-output-on-cpu": (
        lambda: ops.depthwise_conv2d_grad_input(t("cpu", 2, 8, 3, 3), t("cuda", 2, 4, 5, 5),
                                                t("cuda", 8, 1, 3, 3), [1, 1], [0, 0], [1, 1]),
        r"depthwise_conv2d_grad_input: .* is on .* but .* is on .*; all tensors must be on one "
        r"device"),
    "filter2d-kernel-on-cpu": (
        lambda: ops.filter2d(t("cuda", 2, 5, 6), t("cpu", 3, 3), "reflect"),
        r"filter2d: kernel is on cpu but input is on cuda:\d; all tensors must be on one device"),
    "filter2d-input-on-cpu": (
        lambda: ops.filter2d(t("cpu", 2, 5, 6), t("cuda", 3, 3)),
        r"filter2d: kernel is on cuda:\d but input is on cpu"),
    "filter2d_grad_input-kernel-on-cpu": (
        lambda: ops.filter2d_grad_input(t("cuda", 2, 5, 6), t("cpu", 3, 3), "zeros"),
        r"filter2d_grad_input: kernel is on cpu but .* is on cuda:\d"),
    "filter2d_grad_kernel-grad-output-on-cpu": (
        lambda: ops.filter2d_grad_kernel(t("cpu", 2, 5, 6), t("cuda", 2, 5, 6), t("cuda", 3, 3),
                                         "zeros"),
        r"filter2d_grad_kernel: grad_output is on cpu but input is on cuda:\d"),
    "trilinear_interpolation-points-on-cpu": (
        lambda: ops.trilinear_interpolation(t("cuda", 4, 8, 5), t("cpu", 4, 3)),
        r"trilinear_interpolation: points is on cpu but feats is on cuda:\d; all tensors must be "
        r"on one device"),
    "trilinear_interpolation-feats-on-cpu": (
        lambda: ops.trilinear_interpolation(t("cpu", 4, 8, 5), t("cuda", 4, 3)),
        r"trilinear_interpolation: points is on cuda:\d but feats is on cpu"),
    "trilinear_interpolation_backward-grad-output-on-cpu": (
        lambda: ops.trilinear_interpolation_backward(t("cpu", 4, 5), t("cuda", 4, 8, 5),
                                                     t("cuda", 4, 3)),
        r"trilinear_interpolation_backward: grad_output is on cpu but feats is on cuda:\d"),
    "trilinear_interpolation_backward_from_derivatives-derivatives-on-cpu": (
        lambda: ops.trilinear_interpolation_backward_from_derivatives(
            t("cuda", 4, 5), t("cpu", 4, 3, 5), t("cuda", 4, 3)),
        r"trilinear_interpolation_backward_from_derivatives: derivatives is on cpu but "
        r"grad_output is on cuda:\d"),
    "trilinear_interpolation_grad_feats-points-on-cpu": (
        lambda: ops.trilinear_interpolation_grad_feats(t("cuda", 4, 5), t("cpu", 4, 3)),
        r"trilinear_interpolation_grad_feats: points is on cpu but grad_output is on cuda:\d"),
}


@cuda
@pytest.mark.parametrize("case", sorted(MIXED_DEVICE_CASES))
def test_tensors_on_different_devices_raise_a_clear_error(case):
    call, message = MIXED_DEVICE_CASES[case]
    check_raises_and_device_stays_usable(call, message, "cuda", case)


@cuda
def test_mixed_devices_in_autograd_raise_a_clear_error():
    x = t("cuda", 2, 4, 5, 5).requires_grad_()
    w = t("cpu", 6, 4, 3, 3).requires_grad_()
    with pytest.raises(RuntimeError, match=r"conv2d: weight is on cpu but input is on cuda"):
        customconv.conv2d(x, w)
    check_small_conv2d("cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_functional_wrappers_refuse_bad_string_padding(device):
    x, w = t(device, 1, 2, 5, 5), t(device, 3, 2, 3, 3)
    with pytest.raises(ValueError, match="padding"):
        customconv.conv2d(x, w, padding="full")
    with pytest.raises(ValueError, match="stride 1"):
        customconv.conv2d(x, w, stride=2, padding="same")


def check_backward_op_error_leaves_autograd_usable(device, forward, backward_op, x_shape, w_shape,
                                                   bad_grad_shape, message, follow_up):
    """With x and w (random, of the given shapes) requiring grad and
    out = forward(x, w): backward_op(grad_output, x, w) with a grad_output of
    the wrong shape raises a RuntimeError containing `message`; then out's
    gradient for x is finite, and follow_up(device) passes."""
    x = t(device, *x_shape).requires_grad_()
    w = t(device, *w_shape).requires_grad_()
    out = forward(x, w)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        backward_op(t(device, *bad_grad_shape), x.detach(), w.detach())
    (gx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    sync(device)
    assert torch.isfinite(gx).all()
    follow_up(device)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_in_backward_are_clear_and_leave_the_device_usable(device):
    # A grad_output of the wrong shape reaching the backward op directly.
    check_backward_op_error_leaves_autograd_usable(
        device, lambda x, w: ops.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 2),
        lambda go, x, w: ops.conv2d_grad_input(go, x, w, [1, 1], [1, 1], [1, 1], 2),
        (2, 4, 5, 5), (6, 2, 3, 3), (2, 6, 4, 4),
        "conv2d_grad_input: grad_output has shape [2, 6, 4, 4]", check_small_conv2d)


@cuda
@pytest.mark.parametrize("op", DIRECT_OPS)
def test_direct_ops_with_mixed_devices_in_autograd_raise_a_clear_error(op):
    cuda_t = lambda *s: t("cuda", *s).requires_grad_()  # noqa: E731
    cpu_t = lambda *s: t("cpu", *s).requires_grad_()  # noqa: E731
    calls = {
        "depthwise_conv2d": (lambda: customconv.depthwise_conv2d(cuda_t(2, 4, 5, 5), cpu_t(8, 1, 3, 3)),
                             r"depthwise_conv2d: weight is on cpu but input is on cuda"),
        "filter2d": (lambda: customconv.filter2d(cuda_t(2, 5, 6), cpu_t(3, 3)),
                     r"filter2d: kernel is on cpu but input is on cuda"),
        "trilinear_interpolation": (
            lambda: customconv.trilinear_interpolation(cuda_t(4, 8, 5), cpu_t(4, 3)),
            r"trilinear_interpolation: points is on cpu but feats is on cuda"),
    }
    call, message = calls[op]
    with pytest.raises(RuntimeError, match=message):
        call()
    check_small_direct_ops("cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_nn_modules_of_the_direct_ops_report_bad_input_clearly(device):
    module = customconv.nn.Filter2d(torch.ones(3, 3), border="mirror").to(device)
    with pytest.raises(RuntimeError, match=r"filter2d: " + BORDER_LIST + r'"mirror"'):
        module(t(device, 2, 5, 5))
    with pytest.raises(RuntimeError, match=r"trilinear_interpolation: feats has 4 cubes but points "
                                           r"has 3 points"):
        customconv.nn.TrilinearInterpolation()(t(device, 4, 8, 2), t(device, 3, 3))
    conv = customconv.nn.DepthwiseConv2d(4, 8, 3).to(device)
    with pytest.raises(RuntimeError, match=r"depthwise_conv2d: weight.size\(0\) \(8\) must be a "
                                           r"positive multiple of the input channels \(3\)"):
        conv(t(device, 2, 3, 5, 5))
    check_small_direct_ops(device)


@pytest.mark.parametrize("device", DEVICES)
def test_direct_ops_errors_in_backward_are_clear_and_leave_the_device_usable(device):
    check_backward_op_error_leaves_autograd_usable(
        device, lambda x, w: ops.depthwise_conv2d(x, w, None, [1, 1], [1, 1], [1, 1]),
        lambda go, x, w: ops.depthwise_conv2d_grad_input(go, x, w, [1, 1], [1, 1], [1, 1]),
        (2, 4, 5, 5), (8, 1, 3, 3), (2, 8, 4, 4),
        "depthwise_conv2d_grad_input: grad_output has shape [2, 8, 4, 4]", check_small_direct_ops)
