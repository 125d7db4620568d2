"""Bad input gets a clear RuntimeError that names the op and the argument,
never a crash, a hang or a huge allocation; the fake (meta) kernels apply the
same rules; on CUDA, the next valid call after an error still works and gives
right results."""

import re

import pytest
import torch

import customconv
from testlib import DEVICES, check_small_conv2d, cuda, ops, sync

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
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_a_clear_error(device, case):
    call, message, _ = CASES[case]
    with pytest.raises(RuntimeError, match=message):
        call(device)
        sync(device)
    # The device is still usable: a valid call gives right results.
    check_small_conv2d(device)


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
}


@cuda
@pytest.mark.parametrize("case", sorted(MIXED_DEVICE_CASES))
def test_tensors_on_different_devices_raise_a_clear_error(case):
    call, message = MIXED_DEVICE_CASES[case]
    with pytest.raises(RuntimeError, match=message):
        call()
        sync("cuda")
    check_small_conv2d("cuda")


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


@pytest.mark.parametrize("device", DEVICES)
def test_errors_in_backward_are_clear_and_leave_the_device_usable(device):
    # A grad_output of the wrong shape reaching the backward op directly.
    x = t(device, 2, 4, 5, 5).requires_grad_()
    w = t(device, 6, 2, 3, 3).requires_grad_()
    out = ops.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 2)
    with pytest.raises(RuntimeError, match=re.escape("conv2d_grad_input: grad_output has shape [2, 6, 4, 4]")):
        ops.conv2d_grad_input(t(device, 2, 6, 4, 4), x.detach(), w.detach(), [1, 1], [1, 1],
                              [1, 1], 2)
    (gx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    sync(device)
    assert torch.isfinite(gx).all()
    check_small_conv2d(device)
